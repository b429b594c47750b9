"""CSV/TSV format helpers of the readers: string-only conversion options, the header line,
delimiter names, record line numbers and the wrong-column-count message.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from features.read_report import DataError, short_list

_DELIMITER_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe", " ": "space"}


# --------------------------------------------------------------------------------------------
# CSV


def string_convert_options(names: Sequence[str], as_bytes: bool = False) -> pacsv.ConvertOptions:
    """Every column as a string (``as_bytes``: as binary, its UTF-8 checked cell by cell with
    ``decode_utf8``); only an empty cell is null ("NA", "nan" stay text)."""
    return pacsv.ConvertOptions(
        column_types={n: pa.binary() if as_bytes else pa.string() for n in names},
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
    )


def decode_utf8(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A binary column as a string column, and the mask of its cells that are not UTF-8
    (null in the result)."""
    try:
        return arr.cast(pa.string()), np.zeros(len(arr), dtype=bool)
    except pa.ArrowInvalid:
        pass
    out: list[str | None] = []
    bad = np.zeros(len(arr), dtype=bool)
    for i, v in enumerate(arr.to_pylist()):
        try:
            out.append(None if v is None else v.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
            bad[i] = True
    return pa.array(out, pa.string()), bad


def compressed_stream_message(path: Path, after_line: int, error: Exception) -> str:
    """The message for a compressed file whose data ends early or is corrupt, found after
    ``after_line`` lines were read (0: in its first block of lines)."""
    where = f"after line {after_line}" if after_line else "in its first block of lines"
    return (
        f"file {str(path)!r}: its compressed data is truncated or corrupt {where} ({error}); "
        f"expected a complete {path.suffix or 'compressed'} file (was it cut short?)"
    )


def printable(text: str, limit: int = 200) -> str:
    """``text`` with every character that is not printable (control bytes, the U+FFFD that
    stands for bytes that are not UTF-8) escaped as Python writes it, cut to ``limit``
    characters; a message shows it instead of raw binary."""
    out = "".join(
        ch if ch.isprintable() and ch != "\ufffd" else ascii(ch)[1:-1] for ch in text[:limit]
    )
    return out + "..." if len(text) > limit else out


def first_block(path: Path) -> bytes:
    """The file's first bytes (decompressed when its name says so), read in blocks of 64 KiB
    up to the block that holds its first line end (all of a file without one)."""
    with pa.input_stream(str(path), compression="detect") as stream:
        chunks = []
        while True:
            try:
                chunk = stream.read(65536)
            except OSError as e:  # a truncated or corrupt compressed file
                raise DataError(compressed_stream_message(path, 0, e)) from None
            chunks.append(chunk)
            if not chunk or b"\n" in chunk:
                break
    return b"".join(chunks)


def check_text(path: Path, block: bytes, delimiter: str) -> None:
    """DataError naming ``path`` when its first bytes ``block`` are not text: a Parquet file
    (it starts with Parquet's mark ``PAR1``) or other binary data (a NUL byte)."""
    delim = delimiter_name(delimiter)
    if block.startswith(b"PAR1"):
        reason = "it starts with 'PAR1', the mark of a Parquet file"
        hint = ' (a Parquet file is read with a schema whose [source] format is "parquet")'
    elif b"\0" in block:
        at = block.index(b"\0")
        reason = f"its byte at offset {at} is NUL, so it looks like a binary file"
        hint = ""
    else:
        return
    raise DataError(
        f"file {str(path)!r} could not be read as {delim}-separated CSV text: {reason}; "
        f"expected a {delim}-separated CSV text file{hint}"
    )


def read_header(path: Path, delimiter: str) -> list[str]:
    """The column names on the first line of a CSV file (BOM and line end stripped); DataError
    when the file is not text (``check_text``)."""
    block = first_block(path)
    check_text(path, block, delimiter)
    raw = block.split(b"\n", 1)[0]
    if not raw.strip():
        raise DataError(
            f"file {str(path)!r} is empty or starts with a blank line: expected a header line "
            f"naming the columns"
        )
    text = raw.decode("utf-8", errors="replace").lstrip("\ufeff").rstrip("\r")
    try:
        return next(csv.reader([text], delimiter=delimiter))
    except csv.Error as e:  # e.g. a carriage return inside the line
        raise DataError(
            f"file {str(path)!r}: its first line '{printable(text, 80)}' could not be read as a "
            f"{delimiter_name(delimiter)}-separated CSV header ({e}); expected a header line "
            f"naming the columns"
        ) from None


def unique_columns(names: list[str], path: Path) -> list[str]:
    """``names``, a file's header; DataError naming the first column that appears twice."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DataError(
                f"file {str(path)!r}: column {name!r} appears {names.count(name)} times in the "
                f"header line; expected each column name once"
            )
        seen.add(name)
    return names


class LineMap:
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


def delimiter_name(d: str) -> str:
    return _DELIMITER_NAMES.get(d, repr(d))


def column_count_message(file: Path, names: list[str], row: Any, delimiter: str) -> str:
    """The message for a line with the wrong number of columns."""
    exp, act = row.expected_columns, row.actual_columns
    line = f"line {row.number}" if row.number is not None and row.number >= 0 else "a line"
    if act < exp:
        detail = f"no value for column(s) {short_list(names[act:exp])} (a truncated or short line)"
    else:
        detail = f"{act - exp} value(s) after the last column {names[exp - 1]!r}"
    text = row.text if len(row.text) <= 200 else row.text[:200] + "..."
    return (
        f"{file}: {line}: expected {exp} {delimiter_name(delimiter)}-separated columns, "
        f"found {act}: {detail}: {text!r}"
    )
