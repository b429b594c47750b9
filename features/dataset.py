"""tf.data input from Parquet shards: batches of raw named tensors, shuffled by seed and epoch.

Each element is a dict ``{field name: tensor [batch]}`` holding the RAW values of every model
input and every label (``tf.string`` for string fields, ``tf.int64`` for int64 fields,
``tf.float32`` for numeric fields and labels), exactly what the exported SavedModel's serving
signature takes: the preprocessing (vocabulary lookup, hashing, bucketizing) runs inside the
model. A sequence field is its text form, values joined by its separator (a Parquet list column
is joined here).

Missing cells are filled explicitly, never as NaN: ``""`` for strings (the OOV/missing row),
``-1`` for int64 categoricals (also the OOV row), ``field.default`` for numeric fields.

The order is a pure function of ``(seed, epoch)``: files are shuffled, rows are shuffled inside a
buffer of ``shuffle_buffer`` rows, and ``skip_batches`` drops the first batches of the epoch without
converting them, which is how a resumed training run continues at the batch after its checkpoint.
Rows are read with ``pyarrow.parquet`` one record batch at a time, so memory holds about one
shuffle buffer, whatever the dataset's size.

The reader runs ``PREFETCH_BATCHES`` batches ahead of its consumer, with tf.data's autotuning
off: the one Python reader has nothing to tune, and with it on, dropping an iterator after the
consumer had paused (a training run's first step, which traces the model) took 1.7 to 2.2 s in
6 of 11 training runs measured (none of 6 with it off): a fixed cost at the end of an epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import tensorflow as tf

from features.schema import FeatureKind, FeatureSpec, Schema
from features.shard_reader import (
    column_to_numpy,
    count_rows,
    input_fields,
    iter_batches,
    iter_record_batches,
    list_parquet,
    shard_range,
    table_to_numpy,
)

__all__ = [
    "column_to_numpy",
    "count_rows",
    "field_tf_dtype",
    "input_fields",
    "input_signature",
    "iter_batches",
    "iter_record_batches",
    "list_parquet",
    "make_dataset",
    "shard_range",
    "table_to_numpy",
]

_TF_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
#: batches ``make_dataset`` reads ahead of its consumer
PREFETCH_BATCHES = 2


def field_tf_dtype(spec: FeatureSpec) -> tf.DType:
    """The raw dtype of a field in tf.data and in the serving signature."""
    if spec.kind in (FeatureKind.NUMERIC, FeatureKind.LABEL):
        return tf.float32
    return _TF_DTYPES[spec.dtype]


def input_signature(fields: Sequence[FeatureSpec]) -> dict[str, tf.TensorSpec]:
    """``{field: TensorSpec([None], raw dtype, name=field)}``: the serving signature's inputs."""
    return {f.name: tf.TensorSpec([None], field_tf_dtype(f), name=f.name) for f in fields}


def make_dataset(
    schema: Schema,
    paths: str | Path | Sequence[str | Path],
    *,
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    skip_batches: int = 0,
    shuffle_buffer: int = 262_144,
    drop_remainder: bool = False,
    shard: tuple[int, int] | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``{field: [batch]}`` raw tensors from Parquet shards.

    Args:
      schema: the schema of the shards (``Schema.as_parquet()`` of the raw dataset's schema).
      paths: Parquet files, directories or glob patterns.
      batch_size: rows per element (the last one may be smaller unless ``drop_remainder``).
      shuffle: shuffle files and rows, by ``(seed, epoch)``.
      skip_batches: drop this many leading batches (resume inside an epoch).
      shard: ``(index, count)``: only worker ``index``'s equal share of the epoch's rows
        (``shard_range`` over the epoch's file order, which every worker shares), shuffled by
        ``(seed, epoch, index, count)``; files and row groups of other shares are not read.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    files = list_parquet(paths)
    fields = input_fields(schema)
    signature = input_signature(fields)
    ds = tf.data.Dataset.from_generator(
        lambda: iter_batches(
            schema,
            files,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            skip_batches=skip_batches,
            shuffle_buffer=shuffle_buffer,
            drop_remainder=drop_remainder,
            shard=shard,
        ),
        output_signature=signature,
    )
    options = tf.data.Options()
    options.autotune.enabled = False  # the module docstring says why
    return ds.prefetch(PREFETCH_BATCHES).with_options(options)
