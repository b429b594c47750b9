"""bench/compiler: op counts, cost-model bytes and plain-graph vs XLA times of DCN-v2."""

import os

# before any module of this package imports TensorFlow (tf.keras must be tf-keras)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
