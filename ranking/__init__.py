"""Ranking models composed from blocks: LR, FM, DNN and DCN-v2 with a tensorflow-recommenders Ranking task."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
