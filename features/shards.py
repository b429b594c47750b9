"""Parquet shard output: ``ShardWriter``, ``write_parquet_shards``, and ``convert``, which streams
raw inputs through ``read_batches`` into ``train``/``validation``/``test`` shards split by
``split_mask`` and ``validation_mask``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from features.read_report import ReadReport
from features.readers import read_batches
from features.schema import Schema

# --------------------------------------------------------------------------------------------
# Parquet output


# Row groups of at most this many rows: a worker reading its share of an epoch (training with
# [distribute] input = "shard") decodes whole row groups, so smaller groups waste less at the
# ends of its range; 65,536 rows keep pyarrow's reads efficient.
ROW_GROUP_ROWS = 65_536


class ShardWriter:
    """Writes batches to ``out_dir/{prefix}-00000.parquet``, ... of ``rows_per_shard`` rows.

    Shards are written under a hidden temporary name and renamed when complete. Creating the
    writer removes stale ``{prefix}-NNNNN.parquet`` shards of an earlier run in ``out_dir``.
    """

    def __init__(self, out_dir: str | Path, rows_per_shard: int, prefix: str) -> None:
        if not isinstance(rows_per_shard, int) or rows_per_shard < 1:
            raise ValueError(f"rows_per_shard must be an integer >= 1, got {rows_per_shard!r}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stale = re.compile(rf"^{re.escape(prefix)}-\d+\.parquet$")
        for f in self.out_dir.iterdir():
            if f.is_file() and stale.match(f.name):
                f.unlink()
        self.rows_per_shard = rows_per_shard
        self.prefix = prefix
        self.paths: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._in_shard = 0

    def write(self, batch: pa.RecordBatch) -> None:
        start = 0
        while start < batch.num_rows:
            if self._writer is None:
                self._open(batch.schema)
            take = min(batch.num_rows - start, self.rows_per_shard - self._in_shard)
            self._writer.write_batch(batch.slice(start, take), row_group_size=ROW_GROUP_ROWS)
            self._in_shard += take
            start += take
            if self._in_shard == self.rows_per_shard:
                self._finish()

    def _open(self, schema: pa.Schema) -> None:
        name = f"{self.prefix}-{len(self.paths):05d}.parquet"
        self._tmp = self.out_dir / f".{name}.tmp"
        self._writer = pq.ParquetWriter(str(self._tmp), schema)
        self._in_shard = 0

    def _finish(self) -> None:
        self._writer.close()
        final = self.out_dir / self._tmp.name[1:-4]
        self._tmp.replace(final)
        self.paths.append(final)
        self._writer, self._tmp = None, None

    def close(self) -> list[Path]:
        """Completes the last shard; returns all shard paths in order."""
        if self._writer is not None:
            self._finish()
        return list(self.paths)

    def abort(self) -> None:
        """Drops the unfinished shard (after an error)."""
        if self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)
            self._writer, self._tmp = None, None


def write_parquet_shards(
    batches: Iterable[pa.RecordBatch],
    out_dir: str | Path,
    *,
    rows_per_shard: int = 1_000_000,
    prefix: str = "part",
) -> list[Path]:
    """Writes ``batches`` to ``out_dir/{prefix}-00000.parquet``, ...; returns the shard paths.

    Each shard holds ``rows_per_shard`` rows (the last fewer); no batches, no shards. Creates
    ``out_dir`` and replaces shards of an earlier run there.
    """
    writer = ShardWriter(out_dir, rows_per_shard, prefix)
    try:
        for b in batches:
            writer.write(b)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


# --------------------------------------------------------------------------------------------
# convert


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of uint64 ``x`` (wrapping arithmetic), elementwise."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _split_u(seed: int, start: int, n: int) -> np.ndarray:
    """float64[n] in [0, 1): splitmix64 of the global row indices ``start ..`` keyed by ``seed``."""
    key = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    idx = np.arange(start, start + n, dtype=np.uint64)
    return (_splitmix64(idx ^ key) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def split_mask(seed: int, start: int, n: int, test_fraction: float) -> np.ndarray:
    """bool[n]: rows ``start .. start+n-1`` (global row indices) that go to the test split.

    A row is in test iff ``u < test_fraction`` with ``u`` in [0, 1) from splitmix64 of the row
    index keyed by ``seed``, so the split depends only on (seed, row index).
    """
    return _split_u(seed, start, n) < test_fraction


def validation_mask(
    seed: int, start: int, n: int, test_fraction: float, validation_fraction: float
) -> np.ndarray:
    """bool[n]: rows ``start .. start+n-1`` that go to the validation split.

    The same ``u`` as ``split_mask``: a row is in validation iff
    ``test_fraction <= u < test_fraction + validation_fraction * (1 - test_fraction)``, so the
    validation rows are never test rows and are ``validation_fraction`` of the training rows.
    """
    u = _split_u(seed, start, n)
    return (u >= test_fraction) & (u < test_fraction + validation_fraction * (1 - test_fraction))


def convert(
    schema: Schema,
    inputs: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    *,
    test_fraction: float = 0.0,
    validation_fraction: float = 0.0,
    seed: int = 0,
    rows_per_shard: int = 1_000_000,
    batch_rows: int = 65536,
    max_bad_rows: int = 0,
    report: ReadReport | None = None,
) -> dict[str, list[Path]]:
    """Streams ``inputs`` through ``read_batches`` into Parquet shards.

    Rows go to ``out_dir/test/`` with probability ``test_fraction`` (decided by ``split_mask``
    from ``seed`` and the row's global index, so independent of ``batch_rows``), to
    ``out_dir/validation/`` with probability ``validation_fraction`` of the remaining rows
    (``validation_mask``), else to ``out_dir/train/``. Returns ``{"train": [shard paths],
    "validation": [...], "test": [...]}``; read the shards back with
    ``read_batches(schema.as_parquet(), out_dir / "train")``.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    batches = read_batches(
        schema, inputs, batch_rows=batch_rows, max_bad_rows=max_bad_rows, report=report
    )
    out = Path(out_dir)
    writers = {"train": ShardWriter(out / "train", rows_per_shard, "part")}
    for name, fraction in (("test", test_fraction), ("validation", validation_fraction)):
        if fraction > 0 or (out / name).is_dir():  # a writer also clears stale shards
            writers[name] = ShardWriter(out / name, rows_per_shard, "part")
    seen = 0
    try:
        for b in batches:
            is_test = split_mask(seed, seen, b.num_rows, test_fraction)
            is_val = validation_mask(seed, seen, b.num_rows, test_fraction, validation_fraction)
            writers["train"].write(b.filter(pa.array(~(is_test | is_val))))
            if test_fraction > 0:
                writers["test"].write(b.filter(pa.array(is_test)))
            if validation_fraction > 0:
                writers["validation"].write(b.filter(pa.array(is_val)))
            seen += b.num_rows
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    closed = {name: w.close() for name, w in writers.items()}
    return {
        "train": closed["train"],
        "validation": closed.get("validation", []) if validation_fraction > 0 else [],
        "test": closed.get("test", []) if test_fraction > 0 else [],
    }
