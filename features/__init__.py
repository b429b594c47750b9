"""The data layer of StitchRec, and cross-feature learning on top of it.

The data layer: ``schema`` (feature schemas from TOML), ``readers`` (streaming CSV/TSV/Parquet
reads into typed, validated Arrow batches) with its parts ``read_report`` (``DataError``, the
bad-row report), ``cells`` (cell conversion), ``joins`` (side tables), ``csv_reader``, and
``shards`` (Parquet shard output and ``convert``), ``stats`` (dataset statistics), ``dataset``
(the tf.data input), ``preprocessing`` (Keras preprocessing of the schema's fields, crosses
included) and ``synthetic`` (synthetic data sets with planted effects).

The subpackage ``features.crosses`` learns which field crosses matter (FIVES, the interaction
screen, PCF-GNN) and writes the cross artifacts; the data layer never imports it.

tensorflow-recommenders needs tf-keras, which TensorFlow only picks when ``TF_USE_LEGACY_KERAS=1``
is set before TensorFlow is first imported: every StitchRec package sets it on import.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
