"""Schemas, streaming readers, statistics, synthetic data and the tf.data input of StitchRec.

tensorflow-recommenders needs tf-keras, which TensorFlow only picks when ``TF_USE_LEGACY_KERAS=1``
is set before TensorFlow is first imported: every StitchRec package sets it on import.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
