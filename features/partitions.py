"""Input partitions of the data jobs: chunks of raw files and row ranges of Parquet shards.

A job's tasks are planned from the data alone, so the same input gives the same tasks on any
runner (``features.tasks``):

* a raw CSV/TSV file is cut into ``TextChunk`` byte ranges of about ``CHUNK_BYTES``, each
  starting at the beginning of a line (a compressed file is one chunk: its bytes cannot be cut);
  a raw Parquet file into ``ParquetChunk`` runs of whole row groups of about ``CHUNK_ROWS`` rows.
  ``chunk_events`` reads one chunk as ``features.readers`` reads a file: typed batches and the
  message of every bad row, in order, with the file's own line (or row) numbers. The line a
  text chunk starts at is the count of line ends before it (``count_line_ends``), so a quoted
  value spanning lines (which pyarrow's block reader does not support either) would shift the
  numbers of later chunks;
* Parquet shards (``stitchrec convert``'s output, already validated) are cut into ``ShardPart``
  row ranges of whole row groups, with each part's first row in the concatenation of the files
  (the global row index the data jobs key rows by).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from features.file_batches import csv_batches, parquet_batches
from features.joins import SideTable
from features.read_report import BadRowBudget, DataError, ReadReport, not_parquet
from features.readers import check_not_empty, typed_events
from features.schema import Schema
from features.tasks import TaskRunner

#: bytes of an uncompressed text file per chunk
CHUNK_BYTES = 64 << 20
#: rows of a Parquet file (raw input or shards) per chunk or part, in whole row groups
CHUNK_ROWS = 1 << 20
_SCAN = 1 << 16  # bytes read at a time when looking for a line end


@dataclasses.dataclass(frozen=True)
class TextChunk:
    """Bytes ``[start, end)`` of a CSV/TSV file (``whole``: the whole file, decompressed)."""

    path: str
    start: int
    end: int
    whole: bool = False

    @property
    def first_of_file(self) -> bool:
        return self.start == 0


@dataclasses.dataclass(frozen=True)
class ParquetChunk:
    """Row groups ``[first, last)`` of a raw Parquet file, whose first row is ``first_row``
    (0-based) of the file; ``error``: why the file's footer could not be read (the chunk's read
    raises it, in input order)."""

    path: str
    row_groups: tuple[int, int]
    first_row: int
    rows: int
    error: str = ""

    @property
    def first_of_file(self) -> bool:
        return self.row_groups[0] == 0


Chunk = TextChunk | ParquetChunk


def _compressed(path: Path) -> bool:
    try:
        pa.Codec.detect(str(path))
    except (TypeError, ValueError):
        return False
    return True


def text_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> list[TextChunk]:
    """``path`` cut at the first line end at or after every multiple of ``chunk_bytes``."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    size = path.stat().st_size
    if _compressed(path):
        return [TextChunk(str(path), 0, size, whole=True)]
    cuts = [0]
    with path.open("rb") as f:
        for k in range(1, size // chunk_bytes + 1):
            at = max(k * chunk_bytes, cuts[-1] + 1)
            cut = _line_end_after(f, at, size)
            if cut >= size:
                break
            if cut > cuts[-1]:
                cuts.append(cut)
    cuts.append(size)
    return [TextChunk(str(path), a, b) for a, b in itertools.pairwise(cuts)]


def _line_end_after(f: Any, at: int, size: int) -> int:
    """The offset just after the first ``\\n`` at or after byte ``at`` - 1 (``size`` if none)."""
    pos = at - 1
    while pos < size:
        f.seek(pos)
        block = f.read(_SCAN)
        i = block.find(b"\n")
        if i >= 0:
            return pos + i + 1
        pos += len(block)
    return size


def parquet_chunks(path: Path, chunk_rows: int = CHUNK_ROWS) -> list[ParquetChunk]:
    """Runs of whole row groups of ``path`` of at least ``chunk_rows`` rows (the last fewer)."""
    try:
        meta = pq.ParquetFile(str(path)).metadata
    except (pa.ArrowException, OSError) as e:
        return [ParquetChunk(str(path), (0, 0), 0, 0, str(e))]
    out: list[ParquetChunk] = []
    first_group, first_row, rows = 0, 0, 0
    for g in range(meta.num_row_groups):
        rows += meta.row_group(g).num_rows
        if rows >= chunk_rows:
            out.append(ParquetChunk(str(path), (first_group, g + 1), first_row, rows))
            first_group, first_row, rows = g + 1, first_row + rows, 0
    if rows or not out:
        out.append(ParquetChunk(str(path), (first_group, meta.num_row_groups), first_row, rows))
    return out


def plan_chunks(
    schema: Schema,
    files: Sequence[Path],
    chunk_bytes: int = CHUNK_BYTES,
    chunk_rows: int = CHUNK_ROWS,
) -> list[Chunk]:
    """The chunks of ``files`` (as ``features.readers.list_files`` gives them), in order."""
    out: list[Chunk] = []
    for f in files:
        f = Path(f)
        if schema.source.format == "parquet":
            out.extend(parquet_chunks(f, chunk_rows))
        else:
            out.extend(text_chunks(f, chunk_bytes))
    return out


def count_line_ends(chunk: Chunk) -> int:
    """The ``\\n`` bytes of a text chunk (0 for other chunks). A task function."""
    if not isinstance(chunk, TextChunk) or chunk.whole:
        return 0
    count = 0
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        left = chunk.end - chunk.start
        while left > 0:
            block = f.read(min(left, 8 << 20))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count


def first_lines(chunks: Sequence[Chunk], line_ends: Sequence[int]) -> list[int]:
    """The file line number each chunk starts at (1 for a file's first chunk)."""
    out, line = [], 1
    for chunk, ends in zip(chunks, line_ends, strict=True):
        if chunk.first_of_file:
            line = 1
        out.append(line)
        line += ends
    return out


def chunk_events(
    schema: Schema,
    chunk: Chunk,
    cache: dict[Any, SideTable],
    first_line: int = 1,
    batch_rows: int = 65_536,
) -> Iterator[pa.RecordBatch | str]:
    """One chunk read as ``features.readers.read_batches`` reads its file: typed batches and,
    before each, the messages (``str``) of its bad rows. Raises DataError as that read does (an
    empty file, a file that does not parse)."""
    path = Path(chunk.path)
    if chunk.first_of_file:
        check_not_empty(schema, path)
    if isinstance(chunk, ParquetChunk):
        if chunk.error:  # as features.file_batches.parquet_batches says it
            raise DataError(f"file {chunk.path!r} is not a readable Parquet file: {chunk.error}")
        raws = parquet_batches(path, schema, batch_rows, cache, chunk.row_groups, chunk.first_row)
    elif chunk.whole:
        raws = csv_batches(path, schema, cache)
    else:
        raws = csv_batches(path, schema, cache, (chunk.start, chunk.end), first_line)
    yield from typed_events(schema, path, raws)


@dataclasses.dataclass(frozen=True)
class ChunkRead:
    """What reading one chunk found: good rows, bad rows, the messages of the first bad rows and
    the DataError text that ended the read early (None when it read to the end)."""

    rows: int
    bad: int
    messages: list[str]
    error: str | None


#: stands for a bad row whose message a chunk did not keep: counted, never shown
_UNKEPT = "(a bad row past the messages kept)"


def consume_chunk(
    events: Iterator[pa.RecordBatch | str], keep: int, on_batch: Callable[[pa.RecordBatch], None]
) -> ChunkRead:
    """Reads ``chunk_events``: each typed batch to ``on_batch``, the first ``keep`` bad rows'
    messages kept, every bad row counted; a DataError ends the read and is recorded."""
    rows, bad, messages, error = 0, 0, [], None
    try:
        for event in events:
            if isinstance(event, str):
                bad += 1
                if len(messages) < keep:
                    messages.append(event)
            else:
                on_batch(event)
                rows += event.num_rows
    except DataError as e:
        error = str(e)
    return ChunkRead(rows, bad, messages, error)


def messages_to_keep(max_bad_rows: int) -> int:
    """Bad-row messages a chunk keeps: enough for the error past ``max_bad_rows`` (the row that
    passes the budget is among its chunk's first ``max_bad_rows + 1``) and for the ten examples
    of ``ReadReport``."""
    return max(max_bad_rows + 1, 10)


def replay_reads(
    chunks: Sequence[Chunk], reads: Sequence[ChunkRead], budget: BadRowBudget, report: ReadReport
) -> None:
    """The chunks' reads in input order, as one read of the inputs front to back: files and rows
    counted, every bad row given to ``budget`` (which raises past its limit, naming the row
    that passed it), a chunk's error raised where its read stopped."""
    for chunk, r in zip(chunks, reads, strict=True):
        if chunk.first_of_file:
            report.files += 1
        for j in range(r.bad):
            budget.add(r.messages[j] if j < len(r.messages) else _UNKEPT)
        report.rows += r.rows
        if r.error is not None:
            raise DataError(r.error)


def no_rows_error(inputs: Any, files: int, report: ReadReport) -> DataError:
    """The error of a read that found no good row (as ``features.readers.read_batches``)."""
    items = [inputs] if isinstance(inputs, str | Path) else list(inputs)
    skipped = f"; {report.bad_rows} bad rows were skipped" if report.bad_rows else ""
    return DataError(
        f"no rows were read from {', '.join(repr(str(p)) for p in items)} "
        f"({files} file(s){skipped})"
    )


def chunk_first_lines(chunks: Sequence[Chunk], runner: TaskRunner, label: str) -> list[int]:
    """The line each chunk starts at; the line ends of the chunks of files cut in several are
    counted as tasks on ``runner``."""
    several = {c.path for c in chunks if not c.first_of_file}
    count = [i for i, c in enumerate(chunks) if c.path in several]
    ends = [0] * len(chunks)
    if count:
        counted = runner.map(count_line_ends, [chunks[i] for i in count], label=label)
        for i, n in zip(count, counted, strict=True):
            ends[i] = n
    return first_lines(chunks, ends)


# --------------------------------------------------------------------------------------------
# Parquet shards


@dataclasses.dataclass(frozen=True)
class ShardPart:
    """Rows ``[first_row, first_row + rows)`` (0-based, whole row groups) of one Parquet shard,
    the ``offset``-th row onwards of the concatenation of the shards."""

    path: str
    first_row: int
    rows: int
    offset: int


def shard_parts(files: Sequence[Path], part_rows: int = CHUNK_ROWS) -> list[ShardPart]:
    """``files`` (validated Parquet shards) cut into parts of whole row groups of at least
    ``part_rows`` rows, in order; raises DataError for a file that is not readable Parquet."""
    out: list[ShardPart] = []
    offset = 0
    for f in files:
        for c in parquet_chunks(Path(f), part_rows):
            if c.error:  # as features.shard_reader.iter_record_batches says it
                raise not_parquet(f, c.error)
            if c.rows:
                out.append(ShardPart(str(f), c.first_row, c.rows, offset))
            offset += c.rows
    return out
