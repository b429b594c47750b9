"""A timestamped CSV log cut into time windows, one folder a window (``stitchrec windows``).

``cut_windows`` reads a CSV log with a header row and writes ``DIR/window-000/``,
``window-001/``, ... in time order, each holding ``part-00000.csv`` (or ``.parquet``) with the
header and columns of the input and the window's rows in input order, so that a config's
``[data] raw`` can point at one window; and ``DIR/windows.json`` describing them.

Windows (``by``), for a row with timestamp ``t`` (seconds since the epoch, UTC):

* ``day``: the UTC calendar day, ``floor(t / 86400)``; named ``2024-01-05``.
* ``week``: the week from Monday 00:00 UTC, ``floor((floor(t / 86400) + 3) / 7)`` (1970-01-01
  was a Thursday); named by its ISO week, ``2024-W01``.
* ``month`` / ``year``: the UTC calendar month / year; named ``2024-01`` / ``2024``.
* ``rows:N``: the rows in time order (ties in input order), ``N`` a window; the last window
  holds the rest. Named ``rows-<first>-<last>`` by the 0-based positions in that order.

Only periods holding rows become windows. With ``min_rows = M``, a window of fewer than ``M``
rows is merged into the next one (repeatedly, until the merged window has ``M`` rows); a last
window still under ``M`` is merged into the one before it. A merged window is named
``<first period>..<last period>``. Folder numbers have at least 3 digits, more when there are
over 1000 windows, so that the names sort in time order.

``windows.json``: ``{"input", "time", "time_format", "by", "min_rows", "format", "rows",
"count", "windows": [...]}``, a window ``{"folder", "name", "periods", "rows", "first",
"last", "first_utc", "last_utc", "count"}``: ``first`` / ``last`` its earliest and latest
timestamp (seconds) and ``count`` per ``count`` column ``{"distinct": D, "new": K}``, the
number of distinct values in the window and of those in no earlier window (empty cells are not
values): the churn a model trained window after window meets.

The log is read twice in blocks (``pyarrow.csv``), so it need not fit in memory. The first pass
keeps 8 bytes a row (its period, then its window) plus 4 bytes a row and the distinct values of
each ``count`` column; under ``rows:N`` also the timestamps and their time order (16 bytes a
row). The second pass appends each block's rows to their windows' part files. A 4,000,000-row
log (97 MB of CSV) cut by week peaks at 301 MB resident, 196 MB of it the interpreter with
pandas and pyarrow.

The output is written into a hidden folder beside ``DIR`` (``serving.version_files.atomic_dir``,
which also writes ``DIR/assets.extra/stitchrec.done`` listing the files) and renamed into place
once complete, so a failing run leaves no ``DIR``; an existing ``DIR`` is replaced only when it
is an earlier output of ``cut_windows``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from features.cells import timestamp_seconds
from features.read_report import DataError, short_list
from features.schema_fields import TIME_FORMATS
from features.window_files import FORMATS, PartWriters, csv_header, read_blocks
from serving.version_files import MARKER, atomic_dir

CALENDAR = ("day", "week", "month", "year")
REPORT = "windows.json"
_ROWS = re.compile(r"^rows:(\d+)$")
_FOLDER = re.compile(r"^window-\d{3,}$")
_STEP = 1 << 20  # rows a step of the whole-log array operations, to bound their temporaries
_MAX_SECONDS = 6e10  # about year 3870: calendar periods stay within int32


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """How ``cut_windows`` cuts a log.

    Attributes:
      time: the timestamp column.
      by: ``"day"``, ``"week"``, ``"month"``, ``"year"`` or ``"rows:N"`` (module docstring).
      time_format: how the timestamp text reads, as a schema's ``time_format``: ``"unix"``
        integer seconds or ``"iso"`` ISO-8601 date-times (no offset: UTC).
      count: categorical columns whose distinct and new values are counted per window.
      min_rows: windows under this many rows are merged (0 or 1: none is).
      output_format: the part files' format, ``"csv"`` or ``"parquet"``.
      block_size: bytes of CSV parsed at a time.
    """

    time: str = "timestamp"
    by: str = "day"
    time_format: str = "unix"
    count: tuple[str, ...] = ()
    min_rows: int = 0
    output_format: str = "csv"
    block_size: int = 1 << 20

    def __post_init__(self) -> None:
        m = _ROWS.match(self.by)
        if self.by not in CALENDAR and not (m and int(m.group(1)) >= 1):
            raise ValueError(
                f"by must be one of {list(CALENDAR)} or rows:N with N >= 1, got {self.by!r}"
            )
        if self.time_format not in TIME_FORMATS:
            raise ValueError(f"time_format must be one of {TIME_FORMATS}, got {self.time_format!r}")
        if self.output_format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.output_format!r}")
        if isinstance(self.min_rows, bool) or not isinstance(self.min_rows, int):
            raise ValueError(f"min_rows must be an integer >= 0, got {self.min_rows!r}")
        if self.min_rows < 0:
            raise ValueError(f"min_rows must be an integer >= 0, got {self.min_rows}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    @property
    def rows_per_window(self) -> int | None:
        """``N`` of ``rows:N``, None for a calendar unit."""
        m = _ROWS.match(self.by)
        return int(m.group(1)) if m else None


# --------------------------------------------------------------------------------------------
# The first pass: timestamps and counted values


@dataclasses.dataclass
class Scan:
    """What the first pass found.

    Attributes:
      period: per row, the index of its period in ``keys`` (int32 [n]).
      keys: the periods in time order (int64 [P]): calendar keys (``period_keys``), or the
        0-based window number of ``rows:N``.
      rows, first, last: per period its rows and earliest and latest timestamp (int64 [P]).
      codes: per ``count`` column, per row the code of its value (int32 [n], -1: empty cell).
    """

    period: np.ndarray
    keys: np.ndarray
    rows: np.ndarray
    first: np.ndarray
    last: np.ndarray
    codes: dict[str, np.ndarray]


def scan_log(path: Path, names: list[str], spec: WindowSpec) -> Scan:
    """The first pass over the log ``path`` (header ``names``): every row's period and counted
    values; DataError at the first timestamp that does not parse."""
    columns = list(dict.fromkeys([spec.time, *spec.count]))
    calendar = spec.rows_per_window is None
    per_row: list[np.ndarray] = []  # calendar: int32 period keys; rows:N: int64 timestamps
    periods: dict[int, list[int]] = {}  # calendar: key -> [rows, first, last]
    codes: dict[str, list[np.ndarray]] = {c: [] for c in spec.count}
    tables: dict[str, dict[str, int]] = {c: {} for c in spec.count}
    rows = 0
    for batch in read_blocks(path, names, columns, spec.block_size):
        secs = _block_seconds(batch.column(spec.time), path, spec, rows)
        if calendar:
            keys = period_keys(secs, spec)
            _add_periods(periods, keys, secs)
            per_row.append(keys.astype(np.int32))
        else:
            per_row.append(secs)
        for c in spec.count:
            codes[c].append(_codes(batch.column(c), tables[c]))
        rows += batch.num_rows
    if not rows:
        raise DataError(f"{path} has a header but no data rows: expected rows to cut")
    coded = {c: np.concatenate(v) for c, v in codes.items()}
    if calendar:
        return _calendar_scan(per_row, periods, coded)
    return _rows_scan(np.concatenate(per_row), spec.rows_per_window, coded)


def _block_seconds(arr: pa.Array, path: Path, spec: WindowSpec, before: int) -> np.ndarray:
    """A block's timestamps as int64 seconds (``before``: the rows of the earlier blocks)."""
    secs, bad, expected = timestamp_seconds(arr, spec.time_format)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        value = arr[i].as_py()
        held = "an empty cell" if value is None else repr(value)
        raise DataError(
            f"{path}: data row {before + i + 1} (header not counted): column {spec.time!r} "
            f"holds {held}: expected {expected} (time_format {spec.time_format!r})"
        )
    out = secs.to_numpy(zero_copy_only=False).astype(np.int64)
    if spec.rows_per_window is None and len(out) and max(-out.min(), out.max()) > _MAX_SECONDS:
        i = int(np.flatnonzero(np.abs(out) > _MAX_SECONDS)[0])
        raise DataError(
            f"{path}: data row {before + i + 1} (header not counted): column {spec.time!r} "
            f"holds {arr[i].as_py()!r}: expected unix seconds within -6e10 .. 6e10 (years 69 "
            f"to 3871; are they milliseconds?)"
        )
    return out


def _add_periods(periods: dict[int, list[int]], keys: np.ndarray, secs: np.ndarray) -> None:
    """Adds a block's rows to ``periods`` (key -> [rows, first, last])."""
    uniq, inv = np.unique(keys, return_inverse=True)
    count = np.bincount(inv, minlength=len(uniq))
    first = np.full(len(uniq), np.iinfo(np.int64).max)
    last = np.full(len(uniq), np.iinfo(np.int64).min)
    np.minimum.at(first, inv, secs)
    np.maximum.at(last, inv, secs)
    for k, n, a, b in zip(
        uniq.tolist(), count.tolist(), first.tolist(), last.tolist(), strict=True
    ):
        entry = periods.get(k)
        if entry is None:
            periods[k] = [n, a, b]
        else:
            entry[0], entry[1], entry[2] = entry[0] + n, min(entry[1], a), max(entry[2], b)


def _calendar_scan(
    blocks: list[np.ndarray], periods: dict[int, list[int]], codes: dict[str, np.ndarray]
) -> Scan:
    keys = np.array(sorted(periods), dtype=np.int64)
    table = np.array([periods[k] for k in keys.tolist()], dtype=np.int64).reshape(-1, 3)
    period = np.empty(sum(len(b) for b in blocks), dtype=np.int32)
    start = 0
    for i, b in enumerate(blocks):
        period[start : start + len(b)] = np.searchsorted(keys, b)
        start += len(b)
        blocks[i] = b[:0]  # freed as it goes
    return Scan(period, keys, table[:, 0], table[:, 1], table[:, 2], codes)


def _rows_scan(times: np.ndarray, n: int, codes: dict[str, np.ndarray]) -> Scan:
    """``rows:N``: the rows in time order (ties in input order), ``n`` a period."""
    order = np.argsort(times, kind="stable")
    total = len(times)
    period = np.empty(total, dtype=np.int32)
    for s in range(0, total, _STEP):
        period[order[s : s + _STEP]] = np.arange(s, min(s + _STEP, total)) // n
    starts = np.arange(0, total, n)
    ends = np.minimum(starts + n, total) - 1
    first, last = times[order[starts]], times[order[ends]]
    return Scan(period, np.arange(len(starts)), ends - starts + 1, first, last, codes)


def _codes(arr: pa.Array, table: dict[str, int]) -> np.ndarray:
    """The values of ``arr`` as codes of ``table`` (new values appended), -1 where empty."""
    enc = arr.dictionary_encode()
    lookup = np.array(
        [table.setdefault(v, len(table)) for v in enc.dictionary.to_pylist()] + [-1],
        dtype=np.int32,
    )
    idx = enc.indices.fill_null(len(lookup) - 1).to_numpy(zero_copy_only=False)
    return lookup[idx]


# --------------------------------------------------------------------------------------------
# Windows


def period_keys(times: np.ndarray, spec: WindowSpec) -> np.ndarray:
    """Each row's calendar period (int64, ascending in time; module docstring) for ``times``
    [n] (int64 seconds) under a calendar ``spec.by``."""
    days = np.floor_divide(times, 86400)
    if spec.by == "day":
        return days
    if spec.by == "week":
        return np.floor_divide(days + 3, 7)
    if spec.by not in ("month", "year"):
        raise ValueError(f"period_keys takes a calendar unit {CALENDAR}, got {spec.by!r}")
    unit = "datetime64[M]" if spec.by == "month" else "datetime64[Y]"
    return times.astype("datetime64[s]").astype(unit).astype(np.int64)


def period_name(key: int, spec: WindowSpec, rows: int) -> str:
    """The name of period ``key`` of ``period_keys`` in a log of ``rows`` rows."""
    n = spec.rows_per_window
    if n is not None:
        return f"rows-{key * n}-{min((key + 1) * n, rows) - 1}"
    if spec.by == "week":
        monday = datetime.date(1970, 1, 5) + datetime.timedelta(weeks=int(key) - 1)
        year, week, _ = monday.isocalendar()
        return f"{year}-W{week:02d}"
    unit = {"day": "D", "month": "M", "year": "Y"}[spec.by]
    return str(np.datetime64(int(key), unit))


def merge_small(rows: np.ndarray, min_rows: int) -> list[list[int]]:
    """Groups of consecutive periods (indices into ``rows``, the periods' row counts in time
    order) such that each group holds at least ``min_rows`` rows: a small period joins the
    next; a last group still under ``min_rows`` joins the one before it."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, r in enumerate(rows.tolist()):
        current.append(i)
        total += r
        if total >= min_rows:
            groups.append(current)
            current, total = [], 0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def _group_name(keys: list[int], spec: WindowSpec, rows: int) -> str:
    """A window's name: its period's, or ``<first>..<last>`` for merged calendar periods and
    ``rows-<first>-<last>`` for merged row windows."""
    first, last = period_name(keys[0], spec, rows), period_name(keys[-1], spec, rows)
    if len(keys) == 1:
        return first
    if spec.rows_per_window is not None:
        return f"{first.rsplit('-', 1)[0]}-{last.rsplit('-', 1)[1]}"
    return f"{first}..{last}"


def _utc(seconds: int) -> str:
    return np.datetime_as_string(np.datetime64(int(seconds), "s")) + "Z"


def _churn(window: np.ndarray, codes: np.ndarray, windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per window the number of distinct codes (>= 0) and of codes in no earlier window."""
    parts = [np.zeros(0, np.int64)]
    for s in range(0, len(codes), _STEP):
        c, w = codes[s : s + _STEP].astype(np.int64), window[s : s + _STEP]
        keep = c >= 0
        parts.append(np.unique(c[keep] * windows + w[keep]))
    pairs = np.unique(np.concatenate(parts))  # sorted by code, then window
    code, of_pair = pairs // windows, pairs % windows
    distinct = np.bincount(of_pair, minlength=windows)
    first = np.ones(len(pairs), dtype=bool)
    first[1:] = code[1:] != code[:-1]
    return distinct, np.bincount(of_pair[first], minlength=windows)


def plan_windows(scan: Scan, spec: WindowSpec) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Each row's window (int32 [n]; ``scan.period`` rewritten in place) and the windows'
    entries of ``windows.json`` (without ``folder``), in time order."""
    groups = merge_small(scan.rows, spec.min_rows)
    of_period = np.empty(len(scan.keys), dtype=np.int32)
    for g, members in enumerate(groups):
        of_period[members] = g
    window = scan.period
    for s in range(0, len(window), _STEP):
        window[s : s + _STEP] = of_period[window[s : s + _STEP]]
    churn = {c: _churn(window, v, len(groups)) for c, v in scan.codes.items()}
    total = len(window)
    entries = []
    for g, members in enumerate(groups):
        first, last = int(scan.first[members].min()), int(scan.last[members].max())
        entries.append(
            {
                "name": _group_name([int(scan.keys[m]) for m in members], spec, total),
                "periods": len(members),
                "rows": int(scan.rows[members].sum()),
                "first": first,
                "last": last,
                "first_utc": _utc(first),
                "last_utc": _utc(last),
                "count": {
                    c: {"distinct": int(d[g]), "new": int(k[g])} for c, (d, k) in churn.items()
                },
            }
        )
    return window, entries


# --------------------------------------------------------------------------------------------
# Writing


def _check_output(out: Path) -> None:
    """DataError when ``out`` exists and is not an earlier output of ``cut_windows``."""
    if not out.exists():
        return
    if not out.is_dir():
        raise DataError(f"output {str(out)!r} is a file: expected a folder for the windows")
    marker = MARKER.parts[0]
    other = sorted(
        p.name
        for p in out.iterdir()
        if p.name not in (REPORT, marker) and not _FOLDER.match(p.name)
    )
    if other:
        what = f"it holds {short_list(other, 5)}"
    elif any(out.iterdir()) and not (out / REPORT).is_file():
        what = f"it has no {REPORT}"
    else:
        return
    raise DataError(
        f"output {str(out)!r} is not an earlier windows output ({what}): expected a new folder "
        f"or one written by the windows command (which is replaced)"
    )


def _require(path: Path, names: list[str], spec: WindowSpec) -> None:
    for column, role in [(spec.time, "the time"), *((c, "a --count column") for c in spec.count)]:
        if column not in names:
            raise DataError(
                f"{path}: no column {column!r} ({role}); the file's columns are {names}"
            )


def cut_windows(input_path: str | Path, output: str | Path, spec: WindowSpec) -> dict[str, Any]:
    """Cuts the CSV log ``input_path`` into the windows of ``spec`` under ``output`` (module
    docstring), atomically; returns the content of ``windows.json``."""
    path, out = Path(input_path), Path(output)
    if not path.is_file():
        raise DataError(f"input {str(path)!r} is not a file: expected a CSV log with a header")
    _check_output(out)
    names = csv_header(path)
    _require(path, names, spec)
    window, entries = plan_windows(scan_log(path, names, spec), spec)
    digits = max(3, len(str(len(entries) - 1)))
    for i, e in enumerate(entries):
        e["folder"] = f"window-{i:0{digits}d}"
    report = {
        "input": str(path),
        "time": spec.time,
        "time_format": spec.time_format,
        "by": spec.by,
        "min_rows": spec.min_rows,
        "format": spec.output_format,
        "rows": len(window),
        "count": list(spec.count),
        "windows": [{"folder": e.pop("folder"), **e} for e in entries],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        tmp.mkdir()
        _write_rows(path, names, window, [tmp / e["folder"] for e in report["windows"]], spec)
        (tmp / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    return report


def _write_rows(
    path: Path, names: list[str], window: np.ndarray, folders: list[Path], spec: WindowSpec
) -> None:
    """The second pass: each block's rows appended to their windows, in input order."""
    writers = PartWriters(folders, names, spec.output_format)
    start = 0
    try:
        for batch in read_blocks(path, names, None, spec.block_size):
            of_row = window[start : start + batch.num_rows]
            if len(of_row) != batch.num_rows:
                raise DataError(f"{path} changed while it was read: it has more rows now")
            start += batch.num_rows
            if not batch.num_rows:
                continue
            order = np.argsort(of_row, kind="stable")
            bounds = np.flatnonzero(np.diff(of_row[order])) + 1
            for idx in np.split(order, bounds):
                writers.write(int(of_row[idx[0]]), batch.take(pa.array(idx)))
        if start != len(window):
            raise DataError(f"{path} changed while it was read: it has fewer rows now")
    finally:
        writers.close()
