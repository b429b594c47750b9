"""The prediction log's files: what the server writes and what ``stitchrec ab`` and
``stitchrec skew`` read.

A log folder holds one sub-folder per model, and in it Parquet files named
``part-<unix ms, 13 digits>-<pid>-<sequence, 6 digits>.parquet``. A file is written whole under a
hidden temporary name (``.part-...parquet.tmp``) and renamed when complete, so a reader never sees
a partial file; readers skip hidden names.

One row per scored row (a Rank call over N candidates gives N rows, sharing a request id):

============  ==========  ==========================================================
column        type        meaning
============  ==========  ==========================================================
request_id    string      the call's request id (``x-request-id``, or one the server made)
row           int32       the row's position in its request (0-based)
timestamp     float64     when the call started (Unix seconds)
protocol      string      ``grpc`` or ``http``
model         string      the model name
version       int64       the version that scored the row
signature     string      the signature that scored it
arm           string      the traffic arm (a version label; ``""`` without a split)
shadow        bool        True for a row scored by a shadow version (never returned)
feature.<f>   per input   the raw input ``f``: ``binary`` for strings, else its number type
output.<o>    float32 or  output ``o``: ``float32`` when it has one value per row, else a
              list        ``list<float32>`` of its values
============  ==========  ==========================================================
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from serving.calls import ScoredCall
from serving.config import LOG_COMPRESSIONS

FEATURE_PREFIX = "feature."
OUTPUT_PREFIX = "output."
META_COLUMNS = (
    "request_id",
    "row",
    "timestamp",
    "protocol",
    "model",
    "version",
    "signature",
    "arm",
    "shadow",
)
META_TYPES = {
    "request_id": pa.string(),
    "row": pa.int32(),
    "timestamp": pa.float64(),
    "protocol": pa.string(),
    "model": pa.string(),
    "version": pa.int64(),
    "signature": pa.string(),
    "arm": pa.string(),
    "shadow": pa.bool_(),
}
SUFFIX = ".parquet"
#: columns a file stores with a dictionary (their values repeat: a call's rows share them); the
#: features' and outputs' values are stored plain (Parquet's default, a dictionary per column,
#: costs twice the CPU per file and makes its files larger on high-cardinality ids)
DICTIONARY_COLUMNS = ("request_id", "protocol", "model", "signature", "arm")
#: the log files' Parquet compressions (``serving.config.LOG_COMPRESSIONS``)
COMPRESSIONS = LOG_COMPRESSIONS
#: with ``pause``: the most rows converted in one piece (a column of a piece: well under 1 ms)
PIECE_ROWS = 4096
#: with ``pause``: calls whose layout is read between two pauses
PIECE_CALLS = 16
_DTYPE = operator.attrgetter("dtype")


def file_name(unix_ms: int, pid: int, sequence: int) -> str:
    """A log file's name: ``part-<unix ms>-<pid>-<sequence>.parquet``."""
    return f"part-{unix_ms:013d}-{pid}-{sequence:06d}{SUFFIX}"


def feature_array(values: np.ndarray) -> pa.Array:
    """A feature's values ``[rows]`` as its log column (strings: ``binary``)."""
    flat = np.asarray(values)
    if flat.ndim > 1:  # the first value of each row
        flat = flat.reshape(len(flat), _width(flat))[:, 0]
    if flat.dtype.kind == "U":
        return pa.array(flat).cast(pa.binary())
    if flat.dtype == object or flat.dtype.kind == "S":
        try:  # bytes and str objects convert in Arrow's C code
            return pa.array(flat, type=pa.binary())
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # other objects: by their str()
            return pa.array(
                [v if isinstance(v, bytes) else str(v).encode() for v in flat], type=pa.binary()
            )
    return pa.array(flat)


def output_array(values: np.ndarray) -> pa.Array:
    """An output's values ``[rows, ...]`` as its log column (``float32`` or ``list<float32>``)."""
    arr = np.asarray(values, dtype=np.float32)
    rows = arr.shape[0] if arr.ndim else 1
    flat = arr.reshape(rows, _width(arr))
    if flat.shape[1] == 1:
        return pa.array(flat[:, 0], type=pa.float32())
    offsets = np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(offsets, pa.array(flat.reshape(-1), type=pa.float32()))


def _width(arr: np.ndarray) -> int:
    """Values per row of an array ``[rows, ...]`` (1 for ``[rows]`` or a scalar)."""
    return int(np.prod(arr.shape[1:], dtype=np.int64))


def _checked_rows(call: ScoredCall) -> int:
    """The rows of ``call``: every feature's and output's first dimension. Raises ValueError
    when they differ."""
    rows = {len(v) for v in call.features.values()}
    rows |= {np.shape(v)[0] if np.ndim(v) else 1 for v in call.outputs.values()}
    if len(rows) != 1:
        raise ValueError(f"call {call.request_id!r}: features and outputs differ in rows: {rows}")
    return rows.pop()


def call_table(call: ScoredCall) -> pa.Table:
    """The log rows of one scored call: the metadata columns, then its features and outputs in
    name order. Raises ValueError when the features and outputs differ in rows."""
    return calls_table([call])


def calls_table(calls: list[ScoredCall], pause: Callable[[], None] | None = None) -> pa.Table:
    """The log rows of ``calls``, in order: the rows of ``call_table`` of each, concatenated.
    Each run of consecutive calls with the same inputs and outputs (names, dtypes, widths) is
    converted together, a column in one piece, so the cost per row stays in Arrow's and NumPy's
    C code. Raises ValueError when a call's features and outputs differ in rows (and TypeError
    or an Arrow error for values a log column cannot hold).

    ``pause``: called between short steps (every ``PIECE_CALLS`` calls' layouts, every column
    of every piece of at most ``PIECE_ROWS`` rows). A converting thread passes a function that
    lets other threads have the interpreter lock (``time.sleep``), so that they wait for it
    about one step rather than Python's switch interval or a whole long conversion."""
    if not calls:
        raise ValueError("no calls to log")
    runs: list[list[tuple[ScoredCall, int]]] = []
    last = None
    for i, c in enumerate(calls):
        if pause is not None and i % PIECE_CALLS == PIECE_CALLS - 1:
            pause()
        layout = _layout(c)
        if layout != last:
            runs.append([])
            last = layout
        runs[-1].append((c, _checked_rows(c)))
    tables = [_group_table(part, pause) for run in runs for part in _pieces(run, pause)]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


def _pieces(
    run: list[tuple[ScoredCall, int]], pause: Callable[[], None] | None
) -> list[list[tuple[ScoredCall, int]]]:
    """``run`` (calls and their rows) whole without ``pause``; else cut into consecutive
    pieces of at most ``PIECE_ROWS`` rows (a longer call alone)."""
    if pause is None:
        return [run]
    pieces: list[list[tuple[ScoredCall, int]]] = [[]]
    rows = 0
    for c, n in run:
        if pieces[-1] and rows + n > PIECE_ROWS:
            pieces.append([])
            rows = 0
        pieces[-1].append((c, n))
        rows += n
    return pieces


def warm_up() -> None:
    """Converts and writes (to memory) a one-row call of every column kind once: what Arrow
    loads on its first such conversion and write (pandas, when installed) is then loaded, so a
    writer thread's first flush under traffic does not import it while holding the
    interpreter lock."""
    call = ScoredCall(
        request_id="warm-up",
        timestamp=0.0,
        protocol="grpc",
        model="m",
        version=1,
        signature="serving_default",
        arm="",
        shadow=False,
        features={"b": np.array([b"x"], object), "s": np.array(["x"]), "f": np.zeros(1)},
        outputs={"score": np.zeros(1, np.float32), "v": np.zeros((1, 2), np.float32)},
    )
    pq.write_table(calls_table([call]), pa.BufferOutputStream())


def _layout(call: ScoredCall) -> tuple:
    """What decides a call's columns: its features' names and dtypes (in the order the call
    holds them: two calls that differ only in that order start two runs), its outputs' names
    and widths."""
    features = call.features
    try:  # arrays: their dtypes read in C
        dtypes = tuple(map(_DTYPE, features.values()))
    except AttributeError:  # a value that is not an array
        dtypes = tuple(np.asarray(v).dtype for v in features.values())
    outputs = tuple((n, _width(np.asarray(v))) for n, v in call.outputs.items())
    return tuple(features), dtypes, outputs


def _group_table(
    run: list[tuple[ScoredCall, int]], pause: Callable[[], None] | None = None
) -> pa.Table:
    """``calls_table`` of calls of one layout, each with its rows (``pause`` after each
    column)."""
    calls = [c for c, _ in run]
    counts = np.array([n for _, n in run], dtype=np.int64)
    total = int(counts.sum())
    starts = np.cumsum(counts) - counts
    call_of_row = pa.array(np.repeat(np.arange(len(calls)), counts))

    columns = {}
    for c in META_COLUMNS:  # a call's value on each of its rows; "row": the row's position
        if c == "row":
            columns[c] = pa.array(np.arange(total) - np.repeat(starts, counts), META_TYPES[c])
        else:  # one value per call, spread over its rows by Arrow
            per_call = pa.array([getattr(k, c) for k in calls], type=META_TYPES[c])
            columns[c] = per_call.take(call_of_row)
        if pause is not None:
            pause()
    first = calls[0]
    for name in sorted(first.features):
        parts = [np.asarray(c.features[name]) for c in calls]
        columns[FEATURE_PREFIX + name] = feature_array(np.concatenate(parts))
        if pause is not None:
            pause()
    for name in sorted(first.outputs):  # one width per run (its layout): reshaped once
        width = _width(np.asarray(first.outputs[name]))
        parts = [np.asarray(c.outputs[name], dtype=np.float32).reshape(-1) for c in calls]
        columns[OUTPUT_PREFIX + name] = output_array(np.concatenate(parts).reshape(total, width))
        if pause is not None:
            pause()
    return pa.table(columns)


def parquet_options(columns: Iterable[str], compression: str = "snappy") -> dict:
    """The ``pyarrow.parquet.write_table`` options of a log file of ``columns``: the
    ``DICTIONARY_COLUMNS`` dictionary-encoded, the others plain; min/max statistics for the
    metadata columns only (what a reader filters a log on); ``compression``, one of
    ``COMPRESSIONS``."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"log compression must be one of {COMPRESSIONS}, got {compression!r}")
    names = set(columns)
    return {
        "use_dictionary": [c for c in DICTIONARY_COLUMNS if c in names],
        "write_statistics": [c for c in META_COLUMNS if c in names],
        "compression": compression,
    }


def write_file(path: str | Path, table: pa.Table, compression: str = "snappy") -> Path:
    """Writes ``table`` to ``path`` atomically (a hidden temporary file, then a rename), with
    ``parquet_options``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, **parquet_options(table.column_names, compression))
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def log_files(paths: Iterable[str | Path], model: str | None = None) -> list[Path]:
    """The complete log files under ``paths`` (folders or files), in name order; with ``model``
    only that model's. Raises FileNotFoundError naming a path that does not exist."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"prediction log path {str(p)!r} does not exist")
        if p.is_file():
            found.append(p)
            continue
        for f in sorted(p.rglob(f"*{SUFFIX}")):
            if f.name.startswith("."):
                continue
            if model is not None and f.parent.name != model:
                continue
            found.append(f)
    return sorted(found, key=lambda f: (f.name, str(f)))


def read_logs(paths: Iterable[str | Path], model: str | None = None) -> pa.Table:
    """Every row of the log files under ``paths`` (see ``log_files``) as one table.

    Raises ValueError when there is no file, or a file lacks a metadata column.
    """
    files = log_files(paths, model)
    if not files:
        raise ValueError(
            f"no prediction log files (*{SUFFIX}) under {[str(p) for p in paths]}"
            + (f" for model {model!r}" if model else "")
        )
    tables = []
    for f in files:
        t = pq.read_table(f)
        missing = [c for c in META_COLUMNS if c not in t.column_names]
        if missing:
            raise ValueError(f"{f}: not a prediction log file: no column(s) {missing}")
        tables.append(t)
    return pa.concat_tables(tables, promote_options="permissive")


def features_of(table: pa.Table) -> Mapping[str, pa.ChunkedArray]:
    """``{feature name: column}`` of a log table (the ``feature.`` prefix removed)."""
    return {
        n[len(FEATURE_PREFIX) :]: table.column(n)
        for n in table.column_names
        if n.startswith(FEATURE_PREFIX)
    }


def outputs_of(table: pa.Table) -> Mapping[str, pa.ChunkedArray]:
    """``{output name: column}`` of a log table (the ``output.`` prefix removed)."""
    return {
        n[len(OUTPUT_PREFIX) :]: table.column(n)
        for n in table.column_names
        if n.startswith(OUTPUT_PREFIX)
    }
