"""The gRPC inference server (see the serving issue); it loads SavedModels and never imports ranking/."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
