"""``convert``: raw files -> validated Parquet shards split into train, validation and test, as a
job of independent tasks (``features.tasks``) that any runner runs with the same result.

The job, for inputs cut into chunks (``features.partitions``):

1. (files of several chunks only) each chunk's line ends are counted, which gives the line
   every chunk starts at, so messages name the file's own line numbers;
2. each chunk is read and validated (``features.partitions.chunk_events``) into a temporary
   Arrow file of its good rows, with its count of good and bad rows and the messages of its
   first bad rows; the driver replays the chunks' bad rows in input order through one
   ``max_bad_rows`` budget, so the error and the counts are those of reading the inputs
   front to back, whichever chunk a worker read first;
3. the driver numbers the good rows in input order; row ``r`` goes to test, validation or train
   by ``split_mask`` / ``validation_mask`` of ``(seed, r)`` (``features.shards``; with
   ``validation_split = "recent"`` the validation rows are the non-test rows of the last
   ``validation_fraction`` of the input), and each
   split's rows, in order, fill shards ``part-00000.parquet``, ... of ``rows_per_shard`` rows
   in row groups of ``ROW_GROUP_ROWS``; one task writes each shard.

Every task's output is written under a temporary name and renamed when complete, and the
temporary chunk files are removed at the end, so a failed or repeated task leaves nothing
half-written.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from features import partitions
from features.cells import arrow_schema
from features.read_report import BadRowBudget, ReadReport
from features.readers import list_files
from features.schema import Schema
from features.shards import VALIDATION_SPLITS, recent_start, split_codes, write_parquet_file
from features.tasks import TaskRunner, atomic_path, runner_or_local

SPLITS = ("train", "validation", "test")
_IPC = pa.ipc.IpcWriteOptions(compression="lz4")
_STALE = re.compile(r"^part-\d+\.parquet$")
_CODE_BLOCK = 1 << 22  # rows whose split codes the driver computes at a time


@dataclasses.dataclass(frozen=True)
class ReadTask:
    chunk: partitions.Chunk
    first_line: int
    out: str
    keep: int  # messages of bad rows kept
    batch_rows: int


def read_chunk(task: ReadTask, schema: Schema) -> partitions.ChunkRead:
    """Reads one chunk into an Arrow file of its good rows. A task function."""
    events = partitions.chunk_events(schema, task.chunk, {}, task.first_line, task.batch_rows)
    with (
        atomic_path(Path(task.out)) as tmp,
        pa.OSFile(str(tmp), "wb") as sink,
        pa.ipc.new_file(sink, arrow_schema(schema), options=_IPC) as writer,
    ):
        return partitions.consume_chunk(events, task.keep, writer.write_batch)


@dataclasses.dataclass(frozen=True)
class _Piece:
    chunk_file: str
    offset: int  # global index of the chunk's first good row
    rows: int  # good rows in the chunk
    take: tuple[int, int]  # [lo, hi) among the chunk's rows of the split


@dataclasses.dataclass(frozen=True)
class _WriteTask:
    split: int
    pieces: tuple[_Piece, ...]
    out: str
    split_args: tuple[int, float, float, int]  # seed, test, validation fractions, recent_from


def write_shard(task: _WriteTask) -> str:
    """Writes one shard from the chunk files' rows of its split. A task function."""

    def batches() -> Any:
        for p in task.pieces:
            codes = split_codes(task.split_args[0], p.offset, p.rows, *task.split_args[1:])
            rows = np.flatnonzero(codes == task.split)[p.take[0] : p.take[1]]
            if not rows.size:
                continue
            with pa.memory_map(p.chunk_file) as source:
                table = pa.ipc.open_file(source).read_all()
            yield from table.take(pa.array(rows)).to_batches()

    out = Path(task.out)
    with atomic_path(out) as tmp:
        write_parquet_file(batches(), tmp)
    return str(out)


def _split_counts(rows: Sequence[int], split_args: tuple[int, float, float, int]) -> np.ndarray:
    """``[chunks, 3]``: each chunk's good rows in train, validation and test."""
    out = np.zeros((len(rows), 3), np.int64)
    offset = 0
    seed, rest = split_args[0], split_args[1:]
    for i, n in enumerate(rows):
        for lo in range(0, n, _CODE_BLOCK):
            m = min(_CODE_BLOCK, n - lo)
            out[i] += np.bincount(split_codes(seed, offset + lo, m, *rest), minlength=3)
        offset += n
    return out


def _plan_writes(
    rows: Sequence[int],
    counts: np.ndarray,
    chunk_files: Sequence[str],
    out: Path,
    rows_per_shard: int,
    split_args: tuple[int, float, float, int],
) -> list[_WriteTask]:
    """One task per shard of every split: its rows' pieces of the chunks, in input order."""
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    tasks = []
    for s, name in enumerate(SPLITS):
        before = np.concatenate([[0], np.cumsum(counts[:, s])]).astype(np.int64)
        total = int(before[-1])
        for k in range(math.ceil(total / rows_per_shard)):
            lo, hi = k * rows_per_shard, min((k + 1) * rows_per_shard, total)
            pieces = []
            for i in range(len(rows)):
                a, b = max(lo, before[i]), min(hi, before[i + 1])
                if a < b:
                    take = (int(a - before[i]), int(b - before[i]))
                    pieces.append(_Piece(chunk_files[i], int(offsets[i]), int(rows[i]), take))
            path = out / name / f"part-{k:05d}.parquet"
            tasks.append(_WriteTask(s, tuple(pieces), str(path), split_args))
    return tasks


def _check_fractions(test_fraction: float, validation_fraction: float, split: str) -> None:
    if split not in VALIDATION_SPLITS:
        raise ValueError(
            f"validation_split must be one of {list(VALIDATION_SPLITS)}, got {split!r}"
        )
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")


def _prepare_folders(out: Path, fractions: dict[str, float]) -> list[str]:
    """Creates ``out/train`` and the splits with a share (a split's folder left by an earlier
    convert is kept and emptied of its shards too); returns the splits written."""
    written = []
    for name in SPLITS:
        folder = out / name
        if name == "train" or fractions[name] > 0 or folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            for f in folder.iterdir():
                if f.is_file() and _STALE.match(f.name):
                    f.unlink()
            written.append(name)
    return written


def convert(
    schema: Schema,
    inputs: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    *,
    test_fraction: float = 0.0,
    validation_fraction: float = 0.0,
    validation_split: str = "hash",
    seed: int = 0,
    rows_per_shard: int = 1_000_000,
    batch_rows: int = 65536,
    max_bad_rows: int = 0,
    report: ReadReport | None = None,
    runner: TaskRunner | None = None,
    chunk_bytes: int = partitions.CHUNK_BYTES,
    chunk_rows: int = partitions.CHUNK_ROWS,
) -> dict[str, list[Path]]:
    """Reads ``inputs`` (raw files of ``schema``) into Parquet shards under ``out_dir``.

    Good row ``r`` (0-based, input order) goes to ``out_dir/test/`` with probability
    ``test_fraction`` (``split_mask`` of ``seed`` and ``r``), to ``out_dir/validation/`` with
    probability ``validation_fraction`` of the other rows (``validation_mask``), else to
    ``out_dir/train/``. ``validation_split = "recent"``: the validation rows are instead the
    non-test rows among the last ``validation_fraction`` of the good rows in input order (files
    in the order given), for logs written in time order. Bad rows raise DataError, or are skipped and counted in ``report`` while
    there are at most ``max_bad_rows`` of them. The tasks run on ``runner`` (default: this
    process); the shards are the same whichever runs them. Returns ``{"train": [shard paths],
    "validation": [...], "test": [...]}``; read them back with
    ``read_batches(schema.as_parquet(), out_dir / "train")``.
    """
    _check_fractions(test_fraction, validation_fraction, validation_split)
    if not isinstance(rows_per_shard, int) or rows_per_shard < 1:
        raise ValueError(f"rows_per_shard must be an integer >= 1, got {rows_per_shard!r}")
    if not isinstance(max_bad_rows, int) or max_bad_rows < 0:
        raise ValueError(f"max_bad_rows must be an integer >= 0, got {max_bad_rows!r}")
    runner = runner_or_local(runner)
    report = report if report is not None else ReadReport()
    files = list_files(inputs, schema)
    chunks = partitions.plan_chunks(schema, files, chunk_bytes, chunk_rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".chunks-{uuid.uuid4().hex[:12]}"
    work.mkdir()
    try:
        results = _read_chunks(schema, chunks, work, max_bad_rows, batch_rows, runner)
        partitions.replay_reads(chunks, results, BadRowBudget(max_bad_rows, report), report)
        if report.rows == 0:
            raise partitions.no_rows_error(inputs, len(files), report)
        rows = [r.rows for r in results]
        fractions = {"train": 1.0, "validation": validation_fraction, "test": test_fraction}
        written = _prepare_folders(out, fractions)
        recent = validation_split == "recent" and validation_fraction > 0
        recent_from = recent_start(sum(rows), validation_fraction) if recent else -1
        split_args = (seed, test_fraction, validation_fraction, recent_from)
        counts = _split_counts(rows, split_args)
        chunk_files = [str(work / f"chunk-{i:06d}.arrow") for i in range(len(chunks))]
        tasks = _plan_writes(rows, counts, chunk_files, out, rows_per_shard, split_args)
        paths = runner.map(write_shard, tasks, label="convert: write shards")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by_split: dict[str, list[Path]] = {name: [] for name in SPLITS}
    for task, path in zip(tasks, paths, strict=True):
        by_split[SPLITS[task.split]].append(Path(path))
    return {name: by_split[name] if name in written else [] for name in SPLITS}


def _read_chunks(
    schema: Schema,
    chunks: Sequence[partitions.Chunk],
    work: Path,
    max_bad_rows: int,
    batch_rows: int,
    runner: TaskRunner,
) -> list[partitions.ChunkRead]:
    """Steps 1 and 2 of the job (see the module docstring)."""
    first = partitions.chunk_first_lines(chunks, runner, "convert: count lines")
    keep = partitions.messages_to_keep(max_bad_rows)
    tasks = [
        ReadTask(c, first[i], str(work / f"chunk-{i:06d}.arrow"), keep, batch_rows)
        for i, c in enumerate(chunks)
    ]
    return runner.map(read_chunk, tasks, shared=schema, label="convert: read chunks")
