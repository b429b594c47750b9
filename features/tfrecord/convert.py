"""``parquet_to_tfrecord``: existing Parquet shards written as TFRecord shards, one task per
output file on a runner (``features.tasks``: this process or a Dask cluster), TensorFlow-free.

The Parquet rows are read and validated as training reads them
(``features.shard_reader.iter_record_batches``: labels 0/1, finite numerics, cells of the
field's type), so the TFRecord shards hold exactly the rows and values ``make_dataset`` yields.
File ``k`` holds rows ``[k R, (k + 1) R)`` of the concatenation of the Parquet files (``R =
rows_per_shard``), in blocks counted from the file's start, so its bytes are those one writer
streaming every row would write; the driver writes the manifest once every file is complete.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path

from features.schema import Schema
from features.shard_reader import count_rows, input_fields, iter_record_batches
from features.tasks import TaskRunner, runner_or_local
from features.tfrecord.manifest import (
    MANIFEST_SUFFIX,
    SUFFIX,
    TFRecordFile,
    manifest_path,
    write_manifest,
)
from features.tfrecord.writer import BLOCK_ROWS, TFRecordShardWriter, field_types

#: rows per TFRecord file written from Parquet shards: about 80 MiB of the synthetic layout
ROWS_PER_FILE = 262_144


@dataclasses.dataclass(frozen=True)
class _FileTask:
    parquet: tuple[str, ...]
    rows: tuple[int, int]
    out_dir: str
    prefix: str
    index: int
    block_rows: int


def write_tfrecord_file(task: _FileTask, schema: Schema) -> TFRecordFile:
    """Writes file ``task.index`` of the shards. A task function."""
    lo, hi = task.rows
    writer = TFRecordShardWriter(
        task.out_dir,
        hi - lo,
        task.prefix,
        schema=schema,
        block_rows=task.block_rows,
        first_index=task.index,
        clean=False,
    )
    files = [Path(p) for p in task.parquet]
    try:
        for batch in iter_record_batches(schema, files, input_fields(schema), row_range=task.rows):
            writer.write(batch)
    except BaseException:
        writer.abort()
        raise
    [written] = writer.finish()
    return written


def parquet_to_tfrecord(
    schema: Schema,
    parquet_files: Sequence[Path],
    out_dir: str | Path,
    *,
    rows_per_shard: int = ROWS_PER_FILE,
    prefix: str = "part",
    block_rows: int = BLOCK_ROWS,
    runner: TaskRunner | None = None,
) -> list[Path]:
    """Writes the rows of ``parquet_files`` (in order) as TFRecord shards into ``out_dir``, one
    task per file on ``runner`` (default: this process); returns the file paths. ``schema`` is
    the shards' (``Schema.as_parquet()``).

    Raises DataError for a Parquet row training would refuse; the output then has no manifest,
    so no reader takes it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"^{re.escape(prefix)}(-\d+{re.escape(SUFFIX)}|{MANIFEST_SUFFIX})$")
    for f in out.iterdir():
        if f.is_file() and stale.match(f.name):
            f.unlink()
    total = count_rows(list(parquet_files)) if parquet_files else 0
    names = tuple(str(p) for p in parquet_files)
    tasks = [
        _FileTask(
            names,
            (k * rows_per_shard, min((k + 1) * rows_per_shard, total)),
            str(out),
            prefix,
            k,
            block_rows,
        )
        for k in range(math.ceil(total / rows_per_shard))
    ]
    files = runner_or_local(runner).map(
        write_tfrecord_file, tasks, shared=schema, label="tfrecord: write shards"
    )
    types = field_types(input_fields(schema))
    write_manifest(manifest_path(out, prefix), block_rows, types, files)
    return [f.path for f in files]
