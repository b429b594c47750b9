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

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from serving.calls import ScoredCall

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


def file_name(unix_ms: int, pid: int, sequence: int) -> str:
    """A log file's name: ``part-<unix ms>-<pid>-<sequence>.parquet``."""
    return f"part-{unix_ms:013d}-{pid}-{sequence:06d}{SUFFIX}"


def feature_array(values: np.ndarray) -> pa.Array:
    """A feature's values ``[rows]`` as its log column (strings: ``binary``)."""
    flat = np.asarray(values).reshape(len(values), -1)[:, 0] if np.ndim(values) > 1 else values
    if flat.dtype == object or flat.dtype.kind in "SU":
        return pa.array(
            [v if isinstance(v, bytes) else str(v).encode() for v in flat], type=pa.binary()
        )
    return pa.array(np.asarray(flat))


def output_array(values: np.ndarray) -> pa.Array:
    """An output's values ``[rows, ...]`` as its log column (``float32`` or ``list<float32>``)."""
    arr = np.asarray(values, dtype=np.float32)
    rows = arr.shape[0] if arr.ndim else 1
    flat = arr.reshape(rows, -1)
    if flat.shape[1] == 1:
        return pa.array(flat[:, 0], type=pa.float32())
    return pa.array(list(flat), type=pa.list_(pa.float32()))


def call_table(call: ScoredCall) -> pa.Table:
    """The log rows of one scored call: the metadata columns, then its features and outputs in
    name order. Raises ValueError when the features and outputs differ in rows."""
    rows = {len(np.asarray(v)) for v in call.features.values()}
    rows |= {np.asarray(v).shape[0] if np.ndim(v) else 1 for v in call.outputs.values()}
    if len(rows) != 1:
        raise ValueError(f"call {call.request_id!r}: features and outputs differ in rows: {rows}")
    n = rows.pop()
    meta = {
        "request_id": [call.request_id] * n,
        "row": np.arange(n, dtype=np.int32),
        "timestamp": [call.timestamp] * n,
        "protocol": [call.protocol] * n,
        "model": [call.model] * n,
        "version": [call.version] * n,
        "signature": [call.signature] * n,
        "arm": [call.arm] * n,
        "shadow": [call.shadow] * n,
    }
    columns = {c: pa.array(v, type=META_TYPES[c]) for c, v in meta.items()}
    for name in sorted(call.features):
        columns[FEATURE_PREFIX + name] = feature_array(call.features[name])
    for name in sorted(call.outputs):
        columns[OUTPUT_PREFIX + name] = output_array(call.outputs[name])
    return pa.table(columns)


def write_file(path: str | Path, table: pa.Table) -> Path:
    """Writes ``table`` to ``path`` atomically (a hidden temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
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
