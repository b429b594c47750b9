"""The data layer of StitchRec, and cross-feature learning on top of it.

The data layer:

* ``schema``: feature schemas (TOML) and their field kinds, crosses and sequences included
  (``schema_fields``: the field and source specs, each checked on its own).
* ``readers``: streaming CSV/TSV/Parquet reads into typed, validated Arrow batches, built from
  ``file_batches`` (one file's raw columns), ``csv_format`` (CSV helpers), ``joins`` (side
  tables), ``cells`` (the schema's Arrow types and cell conversion) and ``read_report``
  (``DataError``, ``ReadReport``); ``shards`` writes Parquet shards (``convert``).
* ``stats`` (dataset statistics), ``dataset`` (the tf.data input) and ``preprocessing`` (Keras
  preprocessing of the schema's fields, crosses computed from raw features).
* ``vocab_state``: vocabularies carried across data windows, with decayed counts, admission,
  eviction and ids that stay stable.
* ``synthetic``: the synthetic click log with planted effects (``synthetic_config``: settings
  and schema; ``synthetic_model``: the click model and its ground truth).

The subpackage ``features.crosses`` learns which field crosses matter (FIVES, the interaction
screen, PCF-GNN pre-training) and reads and writes the cross artifacts; the data layer never
imports it.

tensorflow-recommenders needs tf-keras, which TensorFlow only picks when ``TF_USE_LEGACY_KERAS=1``
is set before TensorFlow is first imported: every StitchRec package sets it on import.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
