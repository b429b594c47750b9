"""Parquet shard output (``ShardWriter``, ``write_parquet_shards``, ``write_parquet_file``) and
the per-row train/validation/test split of ``features.convert`` (``split_mask``,
``validation_mask``, ``split_codes``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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
# The per-row split


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of uint64 ``x`` (wrapping arithmetic), elementwise."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def row_uniform(seed: int, start: int, n: int) -> np.ndarray:
    """float64[n] in [0, 1): splitmix64 of the global row indices ``start ..`` keyed by ``seed``."""
    key = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    idx = np.arange(start, start + n, dtype=np.uint64)
    return (_splitmix64(idx ^ key) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def split_mask(seed: int, start: int, n: int, test_fraction: float) -> np.ndarray:
    """bool[n]: rows ``start .. start+n-1`` (global row indices) that go to the test split.

    A row is in test iff ``u < test_fraction`` with ``u`` in [0, 1) from splitmix64 of the row
    index keyed by ``seed``, so the split depends only on (seed, row index).
    """
    return row_uniform(seed, start, n) < test_fraction


def validation_mask(
    seed: int, start: int, n: int, test_fraction: float, validation_fraction: float
) -> np.ndarray:
    """bool[n]: rows ``start .. start+n-1`` that go to the validation split.

    The same ``u`` as ``split_mask``: a row is in validation iff
    ``test_fraction <= u < test_fraction + validation_fraction * (1 - test_fraction)``, so the
    validation rows are never test rows and are ``validation_fraction`` of the training rows.
    """
    u = row_uniform(seed, start, n)
    return (u >= test_fraction) & (u < test_fraction + validation_fraction * (1 - test_fraction))


#: how ``split_codes`` picks the validation rows: ``hash`` (a row-hash sample, like the test
#: rows) or ``recent`` (the last rows of the input, for logs in time order)
VALIDATION_SPLITS = ("hash", "recent")


def split_codes(
    seed: int,
    start: int,
    n: int,
    test_fraction: float,
    validation_fraction: float,
    recent_from: int = -1,
) -> np.ndarray:
    """int8[n]: the split of rows ``start .. start+n-1``: 0 train, 1 validation
    (``validation_mask``), 2 test (``split_mask``).

    ``recent_from`` >= 0: the validation rows are instead every row from that global index on
    that is not a test row (``validation_fraction`` is then not read)."""
    u = row_uniform(seed, start, n)
    codes = np.zeros(n, np.int8)
    if recent_from >= 0:
        codes[np.arange(start, start + n) >= recent_from] = 1
    else:
        codes[
            (u >= test_fraction) & (u < test_fraction + validation_fraction * (1 - test_fraction))
        ] = 1
    codes[u < test_fraction] = 2
    return codes


def recent_start(total_rows: int, validation_fraction: float) -> int:
    """The global index from which the last ``validation_fraction`` of ``total_rows`` rows
    start (``split_codes``' ``recent_from``): ``total_rows - round(fraction * total_rows)``."""
    return total_rows - round(validation_fraction * total_rows)


def write_parquet_file(batches: Iterable[pa.RecordBatch], path: str | Path) -> int:
    """Writes ``batches`` (at least one row, one Arrow schema) to the Parquet file ``path`` in
    row groups of exactly ``ROW_GROUP_ROWS`` rows (the last one fewer); returns the rows."""
    writer: pq.ParquetWriter | None = None
    pending: list[pa.RecordBatch] = []
    buffered = total = 0

    def flush(table: pa.Table) -> None:
        nonlocal writer
        if writer is None:
            writer = pq.ParquetWriter(str(path), table.schema)
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)

    try:
        for b in batches:
            pending.append(b)
            buffered += b.num_rows
            total += b.num_rows
            while buffered >= ROW_GROUP_ROWS:
                table = pa.Table.from_batches(pending)
                flush(table.slice(0, ROW_GROUP_ROWS))
                rest = table.slice(ROW_GROUP_ROWS)
                pending, buffered = rest.to_batches(), rest.num_rows
        if buffered:
            flush(pa.Table.from_batches(pending))
        if writer is None:
            raise ValueError(f"no rows to write to {path}")
    finally:
        if writer is not None:
            writer.close()
    return total
