"""Streaming readers: raw CSV/TSV/Parquet files to typed, validated Arrow RecordBatches.

``read_batches(schema, paths)`` streams files of any size (CSV with any one-character delimiter,
optionally gzip/bz2-compressed, or Parquet) and yields ``pa.RecordBatch`` es with exactly
``features.cells.arrow_schema(schema)``: one column per FeatureSpec, in schema order, named by
field name. The parts: ``features.file_batches`` (one file's raw columns), ``features.joins``
(side tables), ``features.cells`` (cell conversion), ``features.read_report`` (``DataError``,
``ReadReport``).

Every cell is checked. A bad cell (text in a numeric column, a label that is not 0/1, an
unparseable timestamp, NaN/Inf text) or a line with the wrong number of columns makes its row
bad; the first bad row raises ``DataError`` naming the file, the 1-based line (CSV) or row
(Parquet), the column, the value and what was expected. With ``max_bad_rows = N`` up to N bad
rows are skipped and counted in a ``ReadReport``; the (N+1)-th raises.

Missing (empty) cells stay null in categorical, multi_categorical, sequence, numeric and meta
fields (downstream code fills them); a missing label or timestamp makes the row bad, except a
``defined_on`` label on a row where its parent label is 0 (it reads 0). A sequence column of a
Parquet file may be a list column, read as its values joined by the field's separator. Rules
across fields make a row bad too: ``aligned_with`` sequences of different lengths, a
``defined_on`` label that is 1 where its parent is 0. Blank lines (and
lines whose every cell is empty) are skipped but still counted in line numbers. Line numbers
count records, so a quoted value spanning several lines shifts the numbers after it.

``features.shards.convert`` streams inputs into Parquet shards under ``out_dir/train`` and
``out_dir/test``; ``Schema.as_parquet()`` describes those shards so they can be read back with ``read_batches``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from features.cells import typed_batch
from features.completion import check_complete
from features.csv_format import delimiter_name
from features.file_batches import RawBatch, csv_batches, parquet_batches
from features.joins import SideTable
from features.read_report import BadRowBudget, DataError, ReadReport, short_list
from features.schema import Schema

__all__ = ["check_not_empty", "list_files", "read_batches", "rebatch", "typed_events"]


# --------------------------------------------------------------------------------------------
# Input files


def list_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    schema: Schema | None = None,
) -> list[Path]:
    """The data files named by ``paths``: files, directories or glob patterns.

    Each entry expands on its own, sorted: a directory to the files directly inside it (hidden
    ``.x`` and ``_x`` files, and the schema's join side tables, are left out); a glob pattern
    (``**`` recurses) to the matching files, side tables left out. Entries keep their order;
    a file named twice is read once. Raises DataError for a path that matches nothing, or for
    files in an unfinished conversion (``features.completion.check_complete``).
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise DataError("no input paths given: expected files, directories or glob patterns")
    out: list[Path] = []
    for item in items:
        for p in _expand_one(str(item), schema):
            if p not in out:
                out.append(p)
    check_complete(p.parent for p in out)
    return out


def _expand_one(item: str, schema: Schema | None) -> list[Path]:
    p = Path(item)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [
            f for f in sorted(p.iterdir()) if f.is_file() and not f.name.startswith((".", "_"))
        ]
        files = [f for f in files if not _is_side_table(f, schema)]
        if not files:
            raise DataError(_no_data_files(p, item))
        return files
    if any(ch in item for ch in "*?["):
        files = [Path(m) for m in sorted(glob.glob(item, recursive=True)) if Path(m).is_file()]
        files = [f for f in files if not _is_side_table(f, schema)]
        if not files:
            raise DataError(f"no files match {item!r}")
        return files
    raise DataError(f"input {item!r} does not exist (expected a file, directory or glob pattern)")


def _no_data_files(p: Path, item: str) -> str:
    """The message for a directory without data files directly inside it."""
    folders = sorted(f.name for f in p.iterdir() if f.is_dir())
    if not folders:
        return f"directory {item!r} has no data files"
    pattern = str(p / "**" / "*")
    return (
        f"directory {item!r} has no data files directly inside it, and its subfolders "
        f"{short_list(folders, limit=10)} are not searched: expected data files in it; name "
        f"the subfolders, or a glob pattern such as {pattern!r}"
    )


def _is_side_table(f: Path, schema: Schema | None) -> bool:
    if schema is None:
        return False
    return any((f.parent / j.path).resolve() == f.resolve() for j in schema.source.joins)


# --------------------------------------------------------------------------------------------
# read_batches


def read_batches(
    schema: Schema,
    paths: str | Path | Sequence[str | Path],
    *,
    batch_rows: int = 65536,
    max_bad_rows: int = 0,
    report: ReadReport | None = None,
) -> Iterator[pa.RecordBatch]:
    """Streams ``paths`` as batches of ``arrow_schema(schema)`` with at most ``batch_rows`` rows.

    Files are found eagerly (see ``list_files``; DataError if a path matches nothing) and read
    lazily in order. Every batch but the last has exactly ``batch_rows`` rows. Bad rows raise
    DataError, or are skipped and counted in ``report`` while there are at most
    ``max_bad_rows`` of them. If no good row is read at all, DataError.
    """
    if not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be an integer >= 1, got {batch_rows!r}")
    if not isinstance(max_bad_rows, int) or max_bad_rows < 0:
        raise ValueError(f"max_bad_rows must be an integer >= 0, got {max_bad_rows!r}")
    files = list_files(paths, schema)
    report = report if report is not None else ReadReport()
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    desc = ", ".join(repr(str(p)) for p in items)
    return _read(schema, files, desc, batch_rows, BadRowBudget(max_bad_rows, report), report)


def _read(
    schema: Schema,
    files: list[Path],
    desc: str,
    batch_rows: int,
    budget: BadRowBudget,
    report: ReadReport,
) -> Iterator[pa.RecordBatch]:
    rows = 0
    for batch in rebatch(_typed_batches(schema, files, batch_rows, budget, report), batch_rows):
        rows += batch.num_rows
        report.rows += batch.num_rows
        yield batch
    if rows == 0:
        skipped = f"; {budget.count} bad rows were skipped" if budget.count else ""
        raise DataError(f"no rows were read from {desc} ({len(files)} file(s){skipped})")


def _typed_batches(
    schema: Schema, files: list[Path], batch_rows: int, budget: BadRowBudget, report: ReadReport
) -> Iterator[pa.RecordBatch]:
    """Typed, validated batches of each file in turn (sizes as the file's chunks come).

    Bad rows are reported to ``budget`` in file order; it raises past its limit.
    """
    cache: dict[Any, SideTable] = {}
    for file in files:
        report.files += 1
        check_not_empty(schema, file)
        if schema.source.format == "parquet":
            raws = parquet_batches(file, schema, batch_rows, cache)
        else:
            raws = csv_batches(file, schema, cache)
        for event in typed_events(schema, file, raws):
            if isinstance(event, str):
                budget.add(event)
            else:
                yield event


def check_not_empty(schema: Schema, file: Path) -> None:
    """Raises DataError when ``file`` has no bytes."""
    if file.stat().st_size == 0:
        raise DataError(f"file {str(file)!r} is empty: expected {_expectation(schema)}")


def typed_events(
    schema: Schema, file: Path, raws: Iterable[RawBatch]
) -> Iterator[pa.RecordBatch | str]:
    """The typed batches of ``file``'s raw batches and the message of each bad row, in file
    order: a raw batch's bad rows (``str``, the ``DataError`` text) come before its typed batch
    of good rows (batches without good rows are not yielded)."""
    for raw in raws:
        typed, bad = None, []
        if len(raw.positions):
            typed, bad = typed_batch(schema, raw.cols, raw.notes)
        messages = raw.earlier_bad + [
            (int(raw.positions[i]), f"{file}: {raw.unit} {raw.positions[i]}, {text}")
            for i, text in bad
        ]
        for _, message in sorted(messages, key=lambda m: m[0]):
            yield message
        if typed is not None and typed.num_rows:
            yield typed


def _expectation(schema: Schema) -> str:
    src = schema.source
    if src.format == "parquet":
        return "a Parquet file"
    delim = delimiter_name(src.delimiter)
    if src.header:
        return f"a header line naming the {delim}-separated columns, then data lines"
    cols = list(src.columns or ())
    return f"lines of {len(cols)} {delim}-separated columns {short_list(cols, limit=10)}"


def rebatch(batches: Iterable[pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Regroups batches into batches of exactly ``batch_rows`` rows (the last may be shorter)."""
    buf: list[pa.RecordBatch] = []
    buffered = 0
    for b in batches:
        buf.append(b)
        buffered += b.num_rows
        if buffered < batch_rows:
            continue
        table = pa.Table.from_batches(buf)
        start = 0
        while buffered - start >= batch_rows:
            yield _one_batch(table.slice(start, batch_rows))
            start += batch_rows
        rest = table.slice(start)
        buf = [_one_batch(rest)] if rest.num_rows else []
        buffered = rest.num_rows
    if buffered:
        yield _one_batch(pa.Table.from_batches(buf))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0]
