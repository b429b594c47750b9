"""The ``stitchrec`` command line and the pipelines behind it (``pipelines.cli``).

Commands: ``demo`` (the whole pipeline on synthetic data), ``generate`` (the synthetic
Criteo-layout dataset), ``convert`` (raw files to Parquet shards), ``stats`` (vocabularies and
numeric statistics), ``windows`` (a timestamped CSV log cut into time windows), ``train`` (a
model from a TOML config), ``tune`` (a hyper-parameter search whose trials are training runs),
``export`` (a run's SavedModel, or a pre-ranking + ranking cascade), ``evaluate`` (AUC and log
loss of a SavedModel), ``crosses fives`` (FIVES search for feature crosses), ``crosses
pcf-gnn`` (pair graph and PCF-GNN pre-training), ``serve`` (the gRPC model server), ``ab``
(offline A/B comparison of two models on logged data), ``skew`` (training/serving skew of a
run against prediction logs), ``daily`` (one day of continuous
training: train on a window, compare with the served version, export the next version),
``data-service dispatcher`` and ``data-service worker`` (tf.data service servers that make the
TFRecord training input's batches for ``train``) and ``fuse explain`` (the fusion plan of a
SavedModel signature).
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
