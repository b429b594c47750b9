"""FusionStitching-style fusion of memory-bound ops: the IR of a TensorFlow graph (``ir``), a cost
model (``cost``) and a fusion planner (``planner``); planned groups realized as XLA clusters or as
generated C++/CUDA ops (``realize``): elementwise loop ops (``loop_op``), row programs with
reductions (``row_op``) and the fused embedding op (``embedding_op``), compiled by ``toolchain``
and loaded through one ``registry``. ``compiler_opt.fuse(model, spec)`` returns a ranking
model with its embedding blocks fused (generated lookups or fused tables)."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# after the environment: importing the transformation loads TensorFlow
from compiler_opt.transform import FuseSpec, fuse

__all__ = ["FuseSpec", "fuse"]
