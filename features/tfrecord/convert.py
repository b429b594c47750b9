"""``parquet_to_tfrecord``: existing Parquet shards streamed through ``TFRecordShardWriter``.

The Parquet rows are read and validated as training reads them
(``features.dataset.iter_record_batches``: labels 0/1, finite numerics, cells of the field's
type), so the TFRecord shards hold exactly the rows and values ``make_dataset`` yields.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from features.dataset import input_fields, iter_record_batches
from features.schema import Schema
from features.tfrecord.writer import BLOCK_ROWS, TFRecordShardWriter

#: rows per TFRecord file written from Parquet shards: about 80 MiB of the synthetic layout
ROWS_PER_FILE = 262_144


def parquet_to_tfrecord(
    schema: Schema,
    parquet_files: Sequence[Path],
    out_dir: str | Path,
    *,
    rows_per_shard: int = ROWS_PER_FILE,
    prefix: str = "part",
    block_rows: int = BLOCK_ROWS,
) -> list[Path]:
    """Writes the rows of ``parquet_files`` (in order) as TFRecord shards into ``out_dir``;
    returns the file paths. ``schema`` is the shards' (``Schema.as_parquet()``).

    Raises DataError for a Parquet row training would refuse (``iter_record_batches``); the
    unfinished output then has no manifest, so no reader takes it."""
    writer = TFRecordShardWriter(
        out_dir, rows_per_shard, prefix, schema=schema, block_rows=block_rows
    )
    try:
        for batch in iter_record_batches(schema, parquet_files, input_fields(schema)):
            writer.write(batch)
    except BaseException:
        writer.abort()
        raise
    return writer.close()
