"""V"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from features.cells import _is_null, _RawBatch
from features.joins import _apply_joins, _Plan, _plan_file, _short, _SideTable
from features.read_report import DataError
from features.schema import Schema

_DELIMITER_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe", " ": "space"}


# --------------------------------------------------------------------------------------------
# CSV


def _string_convert_options(names: Sequence[str]) -> pacsv.ConvertOptions:
    """Every column as a string; only an empty cell is null ("NA", "nan" stay text)."""
    return pacsv.ConvertOptions(
        column_types={n: pa.string() for n in names},
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
    )


def _read_header(path: Path, delimiter: str) -> list[str]:
    """The column names on the first line of a CSV file (BOM and line end stripped)."""
    with pa.input_stream(str(path), compression="detect") as stream:
        chunks = []
        while True:
            chunk = stream.read(65536)
            chunks.append(chunk)
            if not chunk or b"\n" in chunk:
                break
    raw = b"".join(chunks).split(b"\n", 1)[0]
    if not raw.strip():
        raise DataError(
            f"file {str(path)!r} is empty or starts with a blank line: expected a header line "
            f"naming the columns"
        )
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r")
    return next(csv.reader([text], delimiter=delimiter))


class _LineMap:
    """Maps the rows pyarrow yields to 1-based line numbers, around rows it skipped."""

    def __init__(self, first_line: int) -> None:
        self.next = first_line  # the line of the next row pyarrow will yield, if not skipped
        self.skipped: list[int] = []  # lines of rows the invalid-row handler skipped, ascending
        self._p = 0  # skipped[_p:] are the skipped lines at or after `next`

    def take(self, n: int) -> np.ndarray:
        """The line numbers of the next ``n`` yielded rows."""
        while self._p < len(self.skipped) and self.skipped[self._p] < self.next:
            self._p += 1
        pending = np.array(self.skipped[self._p :], dtype=np.int64)
        cand = np.arange(self.next, self.next + n + len(pending), dtype=np.int64)
        lines = cand[~np.isin(cand, pending)][:n]
        if n:
            self.next = int(lines[-1]) + 1
        return lines


def _delimiter_name(d: str) -> str:
    return _DELIMITER_NAMES.get(d, repr(d))


def _column_count_message(file: Path, names: list[str], row: Any, delimiter: str) -> str:
    """The message for a line with the wrong number of columns."""
    exp, act = row.expected_columns, row.actual_columns
    line = f"line {row.number}" if row.number is not None and row.number >= 0 else "a line"
    if act < exp:
        detail = f"no value for column(s) {_short(names[act:exp])} (a truncated or short line)"
    else:
        detail = f"{act - exp} value(s) after the last column {names[exp - 1]!r}"
    text = row.text if len(row.text) <= 200 else row.text[:200] + "..."
    return (
        f"{file}: {line}: expected {exp} {_delimiter_name(delimiter)}-separated columns, "
        f"found {act}: {detail}: {text!r}"
    )


def _csv_batches(file: Path, schema: Schema, cache: dict[Any, _SideTable]) -> Iterator[_RawBatch]:
    """Streams one CSV file as raw string columns, one chunk per parsed block.

    Lines with the wrong number of columns are skipped by the parser and handed on as
    ``earlier_bad`` of the chunk they precede (or of a last, empty chunk).
    """
    src = schema.source
    names = _read_header(file, src.delimiter) if src.header else list(src.columns or ())
    plan = _plan_file(schema, file, names, cache)
    lines = _LineMap(2 if src.header else 1)
    rejected: list[tuple[int, str]] = []

    def on_invalid_row(row: Any) -> str:
        known = row.number is not None and row.number >= 0
        if known:
            lines.skipped.append(row.number)
        message = _column_count_message(file, names, row, src.delimiter)
        rejected.append((row.number if known else lines.next, message))
        return "skip"

    read_opts = pacsv.ReadOptions(use_threads=False, column_names=None if src.header else names)
    parse_opts = pacsv.ParseOptions(
        delimiter=src.delimiter, ignore_empty_lines=False, invalid_row_handler=on_invalid_row
    )
    try:
        reader = pacsv.open_csv(
            pa.input_stream(str(file), compression="detect"),
            read_options=read_opts,
            parse_options=parse_opts,
            convert_options=_string_convert_options(names),
        )
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            yield _csv_chunk(batch, plan, lines, rejected)
    except pa.ArrowException as e:
        if "Empty CSV file" in str(e):
            raise DataError(f"file {str(file)!r} is empty: expected lines of data") from None
        raise DataError(f"{file}: could not parse CSV at or after line {lines.next}: {e}") from None
    if rejected:
        yield _RawBatch({}, np.zeros(0, np.int64), "line", plan.notes, list(rejected))


def _csv_chunk(
    batch: pa.RecordBatch, plan: _Plan, lines: _LineMap, rejected: list[tuple[int, str]]
) -> _RawBatch:
    """One parsed block as a raw chunk: blank lines dropped, joined columns added.

    Takes from ``rejected`` the rejected lines that come before the block's last row (all of
    them if the block has no rows).
    """
    line_no = lines.take(batch.num_rows)
    upto = lines.next if batch.num_rows else None
    earlier = [r for r in rejected if upto is None or r[0] < upto]
    rejected[:] = [r for r in rejected if upto is not None and r[0] >= upto]
    blank = np.ones(batch.num_rows, dtype=bool)
    for col in batch.columns:
        blank &= _is_null(col)
        if not blank.any():
            break
    cols = {c: batch.column(c) for c in plan.read}
    if blank.any():
        keep = pa.array(~blank)
        cols = {c: a.filter(keep) for c, a in cols.items()}
        line_no = line_no[~blank]
    return _RawBatch(_apply_joins(cols, plan), line_no, "line", plan.notes, earlier)
