"""FusionStitching-style fusion of memory-bound ops (see the compiler_opt issue)."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
