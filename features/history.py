"""Behaviour-sequence columns for an interaction log: each row's previous items of its user.

``add_history`` reads a CSV log with a user, an item and a timestamp column and writes the same
rows, in the same order and with the same cells, plus:

* ``hist_<item>`` (or ``column``): the user's previous ``length`` items, newest first, joined
  with ``"|"``; empty for a user's first rows.
* with ``attributes`` (a CSV side table keyed by the item column, e.g. MovieLens movies.csv) and
  ``attribute`` (one of its columns): ``<attribute>_first``, the first ``"|"``-separated value
  of the row's own item's attribute (the first genre), and ``hist_<attribute>_first``, the same
  for every history item, aligned with the history column. An item missing from the side table,
  or with an empty attribute, reads ``(none)``.

No leakage: the history of a row holds only rows of the same user with a STRICTLY earlier
timestamp. Rows of one user with the same timestamp do not see each other; among earlier rows
with equal timestamps, the one later in the file counts as the newer. Timestamps are numbers
(e.g. unix seconds) or ISO 8601 text.

The output is written to a hidden temporary file in the output's folder and renamed into place
once complete, so a failing input never leaves a partial output.

Memory: the log is read whole (pandas, every cell as a Python string) and sorted in memory.
MovieLens ml-latest-small (100,836 rows, ``length = 20``) peaks at 330 MB resident, about 200 MB
of it the interpreter with pandas and pyarrow and 136 MB (1.4 KB a row) the log and its
histories; it grows in proportion to the rows and the history length (about 35 GB for a
25M-row log: split such a log by user first).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from pathlib import Path

import numpy as np
import pandas as pd

from features.csv_format import read_header, unique_columns
from features.read_report import DataError

SEPARATOR = "|"
MISSING_ATTRIBUTE = "(none)"


@dataclasses.dataclass(frozen=True)
class HistorySpec:
    """What ``add_history`` reads and writes.

    Attributes:
      user: the user column.
      item: the item column.
      time: the timestamp column (numbers or ISO 8601 text).
      length: the most previous items a row keeps (``N``, >= 1).
      column: the history column's name (None: ``hist_<item>``).
      attributes: a CSV side table with a column named like ``item`` (None: no attribute).
      attribute: the side table's column whose first ``"|"``-separated value is written.
    """

    user: str = "userId"
    item: str = "movieId"
    time: str = "timestamp"
    length: int = 20
    column: str | None = None
    attributes: str | Path | None = None
    attribute: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length must be an integer >= 1, got {self.length!r}")
        if (self.attributes is None) != (self.attribute is None):
            raise ValueError("attributes and attribute go together: give both or neither")

    @property
    def history_column(self) -> str:
        return self.column or f"hist_{self.item}"

    @property
    def attribute_columns(self) -> tuple[str, str] | None:
        """(the row's attribute column, the aligned history column), or None."""
        if self.attribute is None:
            return None
        return f"{self.attribute}_first", f"hist_{self.attribute}_first"


def _read_csv(path: Path, what: str) -> pd.DataFrame:
    """The CSV file ``path`` (``what`` it is, e.g. "input file"), every cell a string;
    DataError for a missing path, a folder, an empty file or one without rows, a header naming
    a column twice, or text that is not UTF-8 (naming its first such line)."""
    if not path.exists():
        raise DataError(f"{what} {str(path)!r} does not exist: expected a CSV file")
    if path.is_dir():
        raise DataError(f"{what} {str(path)!r} is a folder: expected a CSV file")
    unique_columns(read_header(path, ","), path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(
            f"{path} line {_first_non_utf8_line(path)} is not UTF-8 text: expected a UTF-8 CSV file"
        ) from None
    if frame.empty:
        raise DataError(f"{what} {str(path)!r} has a header and no rows: expected rows under it")
    return frame


def _first_non_utf8_line(path: Path) -> int:
    """The 1-based number of the first line of ``path`` that is not UTF-8 (0: none)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def _require(frame: pd.DataFrame, path: Path, columns: dict[str, str]) -> None:
    """``columns``: {column: what it is for}; DataError naming the first one missing."""
    for column, role in columns.items():
        if column not in frame.columns:
            raise DataError(
                f"{path}: no column {column!r} ({role}); the file's columns are "
                f"{list(frame.columns)}"
            )


def _times(frame: pd.DataFrame, path: Path, column: str) -> np.ndarray:
    """The timestamps as float64 seconds (numbers as given, ISO 8601 text parsed as UTC)."""
    text = frame[column]
    values = pd.to_numeric(text, errors="coerce")
    if values.isna().any():
        parsed = pd.to_datetime(text, utc=True, format="ISO8601", errors="coerce")
        if not parsed.isna().any():
            return (parsed - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
        bad = int(np.flatnonzero(values.isna().to_numpy())[0])
        raise DataError(
            f"{path} line {bad + 2}: column {column!r} holds {text.iloc[bad]!r}: expected a "
            f"number (e.g. unix seconds) or ISO 8601 text"
        )
    return values.to_numpy(dtype=np.float64)


def _check_items(items: pd.Series, path: Path, column: str) -> None:
    bad = (items == "") | items.str.contains(SEPARATOR, regex=False)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(
            f"{path} line {row + 2}: column {column!r} holds {items.iloc[row]!r}: expected a "
            f"non-empty value without {SEPARATOR!r} (it separates the history's values)"
        )


def _first_attribute(items: pd.Series, spec: HistorySpec) -> np.ndarray:
    """Each item's first attribute value, ``MISSING_ATTRIBUTE`` where it has none."""
    path = Path(spec.attributes)
    table = _read_csv(path, "attributes file")
    _require(table, path, {spec.item: "the item key", spec.attribute: "the attribute"})
    repeated = table[spec.item].duplicated(keep=False).to_numpy()
    if repeated.any():
        lines = np.flatnonzero(repeated)[:2] + 2
        key = table[spec.item].iloc[lines[0] - 2]
        raise DataError(
            f"attributes file {str(path)!r}: item {key!r} of column {spec.item!r} is on lines "
            f"{lines[0]} and {lines[1]}: expected one row per item (a table such as MovieLens "
            "movies.csv, whose attribute column lists an item's values)"
        )
    first = table[spec.attribute].str.split(SEPARATOR, n=1).str[0]
    first = first.where(first != "", MISSING_ATTRIBUTE)
    lookup = dict(zip(table[spec.item], first, strict=True))
    return np.array([lookup.get(i, MISSING_ATTRIBUTE) for i in items], dtype=object)


def previous_items(
    users: np.ndarray, times: np.ndarray, values: list[np.ndarray], length: int
) -> list[np.ndarray]:
    """For each of ``values`` (per-row arrays), each row's values of the same user's previous
    ``length`` rows with a strictly earlier time, newest first, joined with ``"|"``.

    ``users`` [n] (any comparable codes), ``times`` [n] float; rows are ordered by (user, time,
    position in the input), so among equal times the later row counts as the newer.
    """
    n = len(users)
    order = np.lexsort((np.arange(n), times, users))
    out = [np.full(n, "", dtype=object) for _ in values]
    window: collections.deque[int] = collections.deque(maxlen=length)
    pending: list[int] = []
    current = [""] * len(values)
    previous: tuple[object, float] | None = None
    for row in order:
        user, time = users[row], times[row]
        if previous is None or user != previous[0]:
            window.clear()
            pending.clear()
            current = [""] * len(values)
        elif time != previous[1]:
            window.extend(pending)
            pending.clear()
            newest_first = window.copy()
            newest_first.reverse()
            current = [SEPARATOR.join(v[i] for i in newest_first) for v in values]
        previous = (user, time)
        for column, text in zip(out, current, strict=True):
            column[row] = text
        pending.append(row)
    return out


def add_history(input_path: str | Path, output_path: str | Path, spec: HistorySpec) -> int:
    """Writes ``input_path``'s rows plus the history columns (module docstring) to
    ``output_path`` atomically; returns the number of rows."""
    path, out = Path(input_path), Path(output_path)
    frame = _read_csv(path, "input file")
    _require(frame, path, {spec.user: "the user", spec.item: "the item", spec.time: "the time"})
    new = [spec.history_column, *(spec.attribute_columns or ())]
    taken = [c for c in new if c in frame.columns]
    if taken:
        raise DataError(f"{path}: already has the column(s) {taken} the history would add")
    times = _times(frame, path, spec.time)
    items = frame[spec.item]
    _check_items(items, path, spec.item)
    values = [items.to_numpy(dtype=object)]
    if spec.attribute_columns is not None:
        values.append(_first_attribute(items, spec))
    users = pd.factorize(frame[spec.user])[0]
    columns = previous_items(users, times, values, spec.length)
    frame[spec.history_column] = columns[0]
    if spec.attribute_columns is not None:
        target, aligned = spec.attribute_columns
        frame[target] = values[1]
        frame[aligned] = columns[1]
    _write_atomically(frame, out)
    return len(frame)


def _write_atomically(frame: pd.DataFrame, out: Path) -> None:
    """CSV into a hidden file beside ``out``, renamed to ``out`` once complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    try:
        frame.to_csv(tmp, index=False)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
