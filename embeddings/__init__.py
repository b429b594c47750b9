"""Embedding layers: the full table now; hashing trick, QR, binary-code hash (BH) and AMTL to come."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
