"""A field's column with its missing cells filled, as Arrow: what the training input holds.

``filled_column`` casts a column to its field's raw type and fills missing cells explicitly,
never as NaN: ``""`` for strings (the OOV/missing row), ``-1`` for int64 categoricals (also the
OOV row), ``field.default`` for numeric fields and labels; a sequence field's list column
becomes its text form (values joined by its separator). ``features.dataset`` converts the
result to numpy for tf.data, ``features.tfrecord`` encodes it into TFRecord shards, so both
inputs hold the same values.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from features.cells import is_list_type, join_sequence
from features.schema import FeatureKind, FeatureSpec


def filled_column(column: pa.ChunkedArray | pa.Array, spec: FeatureSpec) -> pa.Array:
    """``column`` as float32 (numeric fields, labels), int64 (int64 fields) or string, with
    missing cells filled (see the module docstring); a chunked column may stay chunked."""
    if spec.kind in (FeatureKind.NUMERIC, FeatureKind.LABEL):
        column = pc.cast(column, pa.float32())
        return pc.fill_null(column, float(spec.default)) if column.null_count else column
    if spec.dtype == "int64":
        column = pc.cast(column, pa.int64())
        return pc.fill_null(column, -1) if column.null_count else column
    if spec.kind == FeatureKind.SEQUENCE and is_list_type(column.type):
        column = join_sequence(one_chunk(column), spec.separator)[0]
    column = pc.cast(column, pa.string())
    return pc.fill_null(column, "") if column.null_count else column


def one_chunk(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``column`` as one Arrow array."""
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    return column
