"""One data file as raw string/typed Arrow columns, before cell conversion: CSV/TSV (with any
one-character delimiter, optionally compressed) and Parquet, each with its joins applied and
the line (CSV) or row (Parquet) number of every record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from features.cells import is_list_type, is_null
from features.csv_format import (
    LineMap,
    check_text,
    column_count_message,
    compressed_stream_message,
    decode_utf8,
    delimiter_name,
    first_block,
    printable,
    read_header,
    string_convert_options,
    unique_columns,
)
from features.joins import ReadPlan, SideTable, apply_joins, plan_file
from features.read_report import DataError
from features.schema import Schema


@dataclasses.dataclass
class RawBatch:
    """One chunk of a file before conversion.

    ``cols`` holds n rows by source column name (joined columns included), ``positions`` their
    1-based ``unit`` numbers ("line" in a CSV file, "row" in Parquet), ``notes`` a note per
    joined column for messages, and ``earlier_bad`` (position, message) of rows the parser
    already rejected, to report in file order with the bad cells of ``cols``.
    """

    cols: dict[str, pa.Array]
    positions: np.ndarray
    unit: str
    notes: dict[str, str]
    earlier_bad: list[tuple[int, str]] = dataclasses.field(default_factory=list)


def csv_batches(
    file: Path,
    schema: Schema,
    cache: dict[Any, SideTable],
    byte_range: tuple[int, int] | None = None,
    first_line: int = 1,
) -> Iterator[RawBatch]:
    """Streams one CSV file as raw string columns, one chunk per parsed block.

    Lines with the wrong number of columns are skipped by the parser and handed on as
    ``earlier_bad`` of the chunk they precede (or of a last, empty chunk); so are lines whose
    read cells are not UTF-8. A file that is not text (``check_text``: a Parquet or other
    binary file), a line with the wrong number of columns that is not UTF-8 text, or a truncated
    or corrupt compressed file is one DataError.

    ``byte_range=(start, end)`` reads only those bytes of an uncompressed file, ``start`` at the
    beginning of a line, whose first line is line ``first_line`` of the file (the header, when
    the schema has one, is read from the file's first line and skipped when ``start`` is 0).
    """
    src = schema.source
    if src.header:
        names = unique_columns(read_header(file, src.delimiter), file)
    else:
        check_text(file, first_block(file), src.delimiter)
        names = list(src.columns or ())
    plan = plan_file(schema, file, names, cache)
    starts_file = byte_range is None or byte_range[0] == 0
    lines = LineMap(2 if src.header and starts_file else first_line if byte_range else 1)
    shift = 0 if starts_file else first_line - 1  # the parser counts the range's lines from 1
    rejected: list[tuple[int, str]] = []

    def on_invalid_row(row: Any) -> str:
        known = row.number is not None and row.number >= 0
        if known:
            row = row._replace(number=row.number + shift)
            lines.skipped.append(row.number)
        message = column_count_message(file, names, row, src.delimiter)
        rejected.append((row.number if known else lines.next, message))
        return "skip"

    header_in_stream = src.header and starts_file
    read_opts = pacsv.ReadOptions(
        use_threads=False, column_names=None if header_in_stream else names
    )
    parse_opts = pacsv.ParseOptions(
        delimiter=src.delimiter, ignore_empty_lines=False, invalid_row_handler=on_invalid_row
    )
    undecodable: list[BaseException] = []  # rows pyarrow could not hand to on_invalid_row
    try:
        with _undecodable_rows(on_invalid_row, undecodable):
            reader = pacsv.open_csv(
                _open_stream(file, byte_range),
                read_options=read_opts,
                parse_options=parse_opts,
                convert_options=string_convert_options(names, as_bytes=True),
            )
        while True:
            try:
                with _undecodable_rows(on_invalid_row, undecodable):
                    batch = reader.read_next_batch()
            except StopIteration:
                break
            yield _csv_chunk(file, batch, plan, lines, rejected)
    except pa.ArrowException as e:
        if undecodable:
            raise _undecodable_row_error(file, e, shift, lines.next, src.delimiter) from None
        raise _parse_error(file, e, lines.next, read_opts.block_size) from None
    except OSError as e:  # pyarrow's decompressor: a truncated or corrupt gzip/bz2 stream
        raise DataError(compressed_stream_message(file, lines.next - 1, e)) from None
    if rejected:
        yield RawBatch({}, np.zeros(0, np.int64), "line", plan.notes, list(rejected))


@contextlib.contextmanager
def _undecodable_rows(handler: Callable[[Any], str], caught: list[BaseException]) -> Iterator[None]:
    """While pyarrow reads: pyarrow decodes the text of a row with the wrong number of columns
    before it calls ``handler``; a row that is not UTF-8 raises there, which Python would print
    as "Exception ignored in" (pyarrow then fails the read). Such errors are collected in
    ``caught`` instead; any other goes to the hook that was in place."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.object is handler and isinstance(unraisable.exc_value, UnicodeDecodeError):
            caught.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


_ROW_ERROR = re.compile(r"Row #(-?\d+): Expected (\d+) columns, got (\d+): (.*)", re.S)


def _undecodable_row_error(
    file: Path, e: pa.ArrowException, shift: int, line: int, delimiter: str
) -> DataError:
    """The DataError of a line with the wrong number of columns that is not UTF-8 text (the
    read stopped at it: pyarrow cannot skip it); ``line``: the first line not yet read."""
    m = _ROW_ERROR.search(str(e))
    if m is None or int(m.group(1)) < 0:
        return DataError(
            f"{file}: a line at or after line {line} has the wrong number of columns and is not "
            f"UTF-8 text; expected UTF-8 text of {delimiter_name(delimiter)}-separated columns"
        )
    number, expected, found, text = int(m.group(1)) + shift, m.group(2), m.group(3), m.group(4)
    return DataError(
        f"{file}: line {number}: expected {expected} {delimiter_name(delimiter)}-separated "
        f"columns, found {found}, and the line is not UTF-8 text: '{printable(text, 200)}' "
        f"(\\ufffd: bytes that are not UTF-8); expected UTF-8 text"
    )


def _parse_error(file: Path, e: pa.ArrowException, line: int, block_size: int) -> DataError:
    """The DataError of pyarrow's CSV error ``e`` at or after ``line`` of ``file``."""
    if "Empty CSV file" in str(e):
        return DataError(f"file {str(file)!r} is empty: expected lines of data")
    if "straddl" in str(e):  # a row longer than pyarrow's block of text
        return DataError(
            f"{file}: a row at or after line {line} is longer than {block_size >> 20} MiB, the "
            "most one row may hold; expected shorter rows (an unclosed quote also makes one row "
            "of the rest of the file)"
        )
    return DataError(
        f"{file}: could not parse CSV at or after line {line}: {printable(str(e), 500)}"
    )


def _open_stream(file: Path, byte_range: tuple[int, int] | None) -> pa.NativeFile:
    """The file (decompressed when its name says so), or bytes ``[start, end)`` of it."""
    if byte_range is None:
        return pa.input_stream(str(file), compression="detect")
    start, end = byte_range
    return pa.BufferReader(pa.memory_map(str(file)).read_at(end - start, start))


def _csv_chunk(
    file: Path,
    batch: pa.RecordBatch,
    plan: ReadPlan,
    lines: LineMap,
    rejected: list[tuple[int, str]],
) -> RawBatch:
    """One parsed block as a raw chunk: blank lines dropped, read columns decoded from UTF-8
    (lines with a cell that is not UTF-8 go to ``earlier_bad``), joined columns added.

    Takes from ``rejected`` the rejected lines that come before the block's last row (all of
    them if the block has no rows).
    """
    line_no = lines.take(batch.num_rows)
    upto = lines.next if batch.num_rows else None
    earlier = [r for r in rejected if upto is None or r[0] < upto]
    rejected[:] = [r for r in rejected if upto is not None and r[0] >= upto]
    blank = np.ones(batch.num_rows, dtype=bool)
    for col in batch.columns:
        blank &= is_null(col)
        if not blank.any():
            break
    cols = {c: batch.column(c) for c in plan.read}
    if blank.any():
        keep = pa.array(~blank)
        cols = {c: a.filter(keep) for c, a in cols.items()}
        line_no = line_no[~blank]
    cols, line_no = _decode_columns(file, cols, line_no, earlier)
    return RawBatch(apply_joins(cols, plan), line_no, "line", plan.notes, earlier)


def _decode_columns(
    file: Path, cols: dict[str, pa.Array], line_no: np.ndarray, bad: list[tuple[int, str]]
) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Binary columns as strings; lines with a cell that is not UTF-8 are dropped and added
    to ``bad`` as (line, message naming the first such column)."""
    out: dict[str, pa.Array] = {}
    invalid = np.zeros(len(line_no), dtype=bool)
    for name, arr in cols.items():
        out[name], mask = decode_utf8(arr)
        for i in np.flatnonzero(mask & ~invalid).tolist():
            value = arr[i].as_py()
            shown = value if len(value) <= 60 else value[:60] + b"..."
            bad.append(
                (
                    int(line_no[i]),
                    f"{file}: line {line_no[i]}, column {name!r}: bad value {shown!r} is not "
                    "UTF-8 text; expected UTF-8 encoded text",
                )
            )
        invalid |= mask
    if not invalid.any():
        return out, line_no
    keep = pa.array(~invalid)
    return {c: a.filter(keep) for c, a in out.items()}, line_no[~invalid]


# --------------------------------------------------------------------------------------------
# Parquet


def sequence_columns(schema: Schema) -> set[str]:
    """The source columns of the schema's sequence fields (they may be Parquet lists)."""
    return {f.column for f in schema.sequences}


def check_scalar_columns(
    file: Path, arrow: pa.Schema, columns: list[str], lists: Collection[str] = ()
) -> None:
    """Raises DataError naming the file and column when one of ``columns`` is nested; the
    ``lists`` columns may also be lists of scalars (sequence fields)."""
    for name in columns:
        t = arrow.field(name).type
        if name in lists and is_list_type(t) and not pa.types.is_nested(t.value_type):
            continue
        if pa.types.is_nested(t):
            raise DataError(
                f"file {str(file)!r}: column {name!r} is a Parquet {t} column: expected one "
                f"scalar value (text or a number) per row, not a list, struct or map"
            )


def parquet_batches(
    file: Path,
    schema: Schema,
    batch_rows: int,
    cache: dict[Any, SideTable],
    row_groups: tuple[int, int] | None = None,
    first_row: int = 0,
) -> Iterator[RawBatch]:
    """Streams one Parquet file as raw columns (the needed ones) in chunks of ``batch_rows``.

    A read column of a nested type (list, struct, map) is one DataError for the whole file:
    every field holds one value per row, except that a sequence field's column may be a list of
    scalars. ``row_groups=(first, last)`` reads only those row groups, whose first row is row
    ``first_row`` (0-based) of the file.
    """
    try:
        pf = pq.ParquetFile(str(file))
        names = list(pf.schema_arrow.names)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"file {str(file)!r} is not a readable Parquet file: {e}") from None
    plan = plan_file(schema, file, names, cache)
    check_scalar_columns(file, pf.schema_arrow, plan.read, sequence_columns(schema))
    start = first_row if row_groups else 0
    groups = list(range(*row_groups)) if row_groups else None
    batches = pf.iter_batches(batch_size=batch_rows, columns=plan.read, row_groups=groups)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise DataError(
                f"file {str(file)!r}: Parquet data after row {start} could not be read "
                f"(truncated or corrupt file?): {e}"
            ) from None
        cols = {c: batch.column(c) for c in plan.read}
        rows = np.arange(start + 1, start + batch.num_rows + 1, dtype=np.int64)
        yield RawBatch(apply_joins(cols, plan), rows, "row", plan.notes)
        start += batch.num_rows
