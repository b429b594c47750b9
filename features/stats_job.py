"""Dataset statistics as a job of tasks (``features.tasks``): each task accumulates the
statistics of one part of the data (``features.stats.StatsAccumulator``) and the parts are
merged in input order (``TaskRunner.map_reduce``: folded one by one in this process, in one
lane per worker on a cluster). Every grouping of the merges gives the same ``DatasetStats``, so
every runner does, and this process holds two parts' statistics at once however many parts
there are.

* ``shard_stats``: Parquet shards (training reads these), cut into row-group parts
  (``features.partitions.shard_parts``); the numeric fields' sample keys are the rows' indices
  in the concatenation of the shards, the same as ``compute_stats`` over the shards read in
  order, so the quantile boundaries equal those of one pass over the shards.
* ``raw_stats``: raw files read and validated chunk by chunk (``features.partitions``), bad
  rows replayed in input order through one ``max_bad_rows`` budget as ``stitchrec convert``
  does; a chunk's rows are keyed by their position in the chunk (row stream: the chunk).

Merged moments add the parts' float64 sums exactly (``features.exact_sum``), rounding once at
the end: the same in every grouping, and within rounding of one pass over the rows (whose
batches' sums are added the same way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features import partitions
from features.read_report import BadRowBudget, ReadReport
from features.readers import list_files
from features.schema import Schema
from features.shard_reader import input_fields, iter_record_batches
from features.stats import StatsAccumulator
from features.stats_types import DatasetStats
from features.tasks import TaskRunner, runner_or_local


@dataclasses.dataclass(frozen=True)
class _Settings:
    schema: Schema
    sample_size: int
    seed: int
    all_counts: bool

    def accumulator(self) -> StatsAccumulator:
        return StatsAccumulator(
            self.schema, sample_size=self.sample_size, seed=self.seed, all_counts=self.all_counts
        )


def merge_accumulators(a: StatsAccumulator, b: StatsAccumulator) -> StatsAccumulator:
    """``a`` with ``b``'s rows added (``a`` is consumed). A merge function of ``map_reduce``."""
    a.merge(b)
    return a


def merge_chunk_stats(
    a: tuple[StatsAccumulator, list[partitions.ChunkRead]],
    b: tuple[StatsAccumulator, list[partitions.ChunkRead]],
) -> tuple[StatsAccumulator, list[partitions.ChunkRead]]:
    """Two runs of chunks' statistics and reads, in chunk order (``a`` is consumed)."""
    a[0].merge(b[0])
    return a[0], a[1] + b[1]


def shard_part_stats(part: partitions.ShardPart, settings: _Settings) -> StatsAccumulator:
    """The statistics of one part of the shards. A task function."""
    acc = settings.accumulator()
    fields = input_fields(settings.schema)
    rows = (part.first_row, part.first_row + part.rows)
    start = part.offset
    for rb in iter_record_batches(settings.schema, [Path(part.path)], fields, row_range=rows):
        acc.update(rb, 0, start)
        start += rb.num_rows
    return acc


def shard_stats(
    schema: Schema,
    files: Sequence[Path],
    *,
    runner: TaskRunner | None = None,
    sample_size: int = 200_000,
    seed: int = 0,
    all_counts: bool = False,
    part_rows: int = partitions.CHUNK_ROWS,
) -> DatasetStats:
    """The statistics of validated Parquet ``files`` (``schema``: the shards' schema), as
    ``compute_stats`` gives them (see the module docstring for the moments)."""
    parts = partitions.shard_parts(files, part_rows)
    if not parts:
        raise ValueError("no rows to compute statistics from")
    settings = _Settings(schema, sample_size, seed, all_counts)
    acc = runner_or_local(runner).map_reduce(
        shard_part_stats, parts, merge_accumulators, shared=settings, label="stats"
    )
    return acc.finish()


@dataclasses.dataclass(frozen=True)
class _RawTask:
    chunk: partitions.Chunk
    stream: int
    first_line: int
    keep: int


def raw_chunk_stats(
    task: _RawTask, settings: _Settings
) -> tuple[StatsAccumulator, list[partitions.ChunkRead]]:
    """The statistics of one chunk of raw files, and what its read found. A task function."""
    acc = settings.accumulator()
    start = 0

    def add(batch: Any) -> None:
        nonlocal start
        acc.update(batch, task.stream, start)
        start += batch.num_rows

    events = partitions.chunk_events(settings.schema, task.chunk, {}, task.first_line)
    return acc, [partitions.consume_chunk(events, task.keep, add)]


def raw_stats(
    schema: Schema,
    inputs: str | Path | Sequence[str | Path],
    *,
    runner: TaskRunner | None = None,
    max_bad_rows: int = 0,
    report: ReadReport | None = None,
    sample_size: int = 200_000,
    seed: int = 0,
    chunk_bytes: int = partitions.CHUNK_BYTES,
    chunk_rows: int = partitions.CHUNK_ROWS,
) -> DatasetStats:
    """The statistics of raw files of ``schema``; bad rows raise DataError or are skipped and
    counted in ``report`` while there are at most ``max_bad_rows``, as ``read_batches``."""
    runner = runner_or_local(runner)
    report = report if report is not None else ReadReport()
    files = list_files(inputs, schema)
    chunks = partitions.plan_chunks(schema, files, chunk_bytes, chunk_rows)
    first = partitions.chunk_first_lines(chunks, runner, "stats: count lines")
    keep = partitions.messages_to_keep(max_bad_rows)
    tasks = [_RawTask(c, i + 1, first[i], keep) for i, c in enumerate(chunks)]
    settings = _Settings(schema, sample_size, seed, False)
    acc, reads = runner.map_reduce(
        raw_chunk_stats, tasks, merge_chunk_stats, shared=settings, label="stats"
    )
    partitions.replay_reads(chunks, reads, BadRowBudget(max_bad_rows, report), report)
    if report.rows == 0:
        raise partitions.no_rows_error(inputs, len(files), report)
    return acc.finish()
