"""Whether the ``row_id`` values of a scores folder (``stitchrec predict --row-id``) are unique,
checked as tasks on the job's engine, so that no process holds more than one bucket of them.

1. A task per score file (``bucket_ids``) gives each row its bucket, a hash of its id modulo
   ``buckets``, and writes the file's ``(id, position)`` rows sorted by bucket to an Arrow file
   under ``<folder>/.row-ids/``; ``position`` is the row's place in the whole output.
2. A task per bucket (``count_bucket``) reads its slice of every such file and groups the rows by
   their actual ids (a hash collision never counts as a repeat): its number of distinct ids and
   its first repeated id (the one whose first row comes first), with that id's row count.

The driver adds the distinct counts and keeps the repeated id that appears first in the output:
the answer, and the error, of counting every id in one process. ``BUCKET_ROWS`` bounds the rows
of a bucket.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from features.tasks import TaskRunner
from pipelines.errors import UsageError

#: the most rows a bucket task groups: 1M string ids took about 0.55 GB at its peak
BUCKET_ROWS = 1_000_000
_FOLDER = ".row-ids"
_HASH_SLICE = 65_536


@dataclasses.dataclass(frozen=True)
class _File:
    """A score file, the position of its first row in the output, where its buckets go."""

    path: str
    first: int
    out: str
    buckets: int


@dataclasses.dataclass(frozen=True)
class Repeat:
    """An id on ``rows`` rows, the first of them at ``position``."""

    position: int
    value: object
    rows: int


def _bucket_of(ids: pa.Array, buckets: int) -> np.ndarray:
    """Each id's bucket: pandas' hash of its value (the same in every process: numbers mixed
    bit by bit, strings by SipHash) modulo ``buckets``, hashed a slice at a time (a string
    id is a Python object while it is hashed, 100+ bytes)."""
    keys = np.empty(len(ids), np.uint64)
    for lo in range(0, len(ids), _HASH_SLICE):
        part = ids.slice(lo, _HASH_SLICE).to_numpy(zero_copy_only=False)
        keys[lo : lo + len(part)] = pd.util.hash_array(part)
    return (keys % np.uint64(buckets)).astype(np.int64)


def bucket_ids(task: _File) -> list[int]:
    """Writes the ``(id, position)`` rows of ``task.path`` sorted by bucket to ``task.out``;
    returns where each bucket starts there (``buckets + 1`` offsets)."""
    ids = pq.read_table(task.path, columns=["row_id"])["row_id"].combine_chunks()
    bucket = _bucket_of(ids, task.buckets)
    order = np.argsort(bucket, kind="stable")
    positions = np.arange(task.first, task.first + len(ids), dtype=np.int64)
    table = pa.table({"id": ids.take(pa.array(order)), "position": positions[order]})
    with pa.OSFile(task.out, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    starts = np.searchsorted(bucket[order], np.arange(task.buckets + 1), side="left")
    return [int(s) for s in starts]


def count_bucket(item: tuple[int, list[tuple[str, int, int]]]) -> tuple[int, Repeat | None]:
    """The distinct ids of bucket ``item[0]`` (its ``(file, start, stop)`` slices) and its
    first repeated id, or None."""
    _, slices = item
    parts = []
    for path, start, stop in slices:
        if stop > start:
            with pa.memory_map(path) as source:
                parts.append(pa.ipc.open_file(source).read_all().slice(start, stop - start))
    if not parts:
        return 0, None
    table = pa.concat_tables(parts)
    groups = table.group_by("id").aggregate([("position", "min"), ("position", "count")])
    counts = groups["position_count"].to_numpy()
    repeated = np.flatnonzero(counts > 1)
    if not len(repeated):
        return groups.num_rows, None
    first = repeated[np.argmin(groups["position_min"].to_numpy()[repeated])]
    value = groups["id"][int(first)].as_py()
    return groups.num_rows, Repeat(
        int(groups["position_min"][int(first)].as_py()), value, int(counts[first])
    )


def check_unique_ids(folder: Path, field: str, runner: TaskRunner) -> None:
    """Raises UsageError when the ``row_id`` values of the score files in ``folder`` (the
    ``--row-id`` field's values) repeat: ``stitchrec ab`` joins scores to logged rows by
    them. The work runs on ``runner``; its files are removed at the end."""
    files = sorted(folder.glob("part-*.parquet"))
    if not files:
        return
    rows = [pq.ParquetFile(f).metadata.num_rows for f in files]
    total = sum(rows)
    buckets = max(1, -(-total // BUCKET_ROWS))
    work = folder / _FOLDER
    work.mkdir()
    try:
        firsts = np.concatenate([[0], np.cumsum(rows)])[:-1]
        tasks = [
            _File(str(f), int(first), str(work / f"{f.stem}.arrow"), buckets)
            for f, first in zip(files, firsts, strict=True)
        ]
        starts = runner.map(bucket_ids, tasks, label="predict: bucket the row ids")
        items = [
            (b, [(t.out, s[b], s[b + 1]) for t, s in zip(tasks, starts, strict=True)])
            for b in range(buckets)
        ]
        counted = runner.map(count_bucket, items, label="predict: count the row ids")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    repeats = [r for _, r in counted if r is not None]
    if repeats:
        first = min(repeats, key=lambda r: r.position)
        distinct = sum(n for n, _ in counted)
        raise UsageError(
            f"--row-id {field!r}: {distinct:,} distinct values in {total:,} rows "
            f"({first.value!r} on {first.rows:,} rows); expected a field whose "
            "value is unique on every row (`stitchrec ab` joins scores to rows by it), or no "
            "--row-id (the row's position)"
        )
