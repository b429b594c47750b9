"""Which records one epoch of TFRecord shards reads, cut into shuffle windows (no TensorFlow).

An epoch (or a worker's share of it, ``shard=(index, count)``) is planned in Python from the
manifest's row counts, so the tf.data pipeline (``features.tfrecord.dataset``) only reads,
parses and permutes:

* files in the order of ``numpy.random.default_rng([seed, epoch]).permutation`` (when
  shuffling; else sorted), their rows concatenated;
* the share: rows ``features.dataset.shard_range(rows, index, count)`` of that concatenation
  (every row without ``shard``); only records overlapping it are parsed, and only files
  overlapping it opened (``TFRecordDataset.skip`` reads, without parsing, the records before a
  window's first one in its file);
* windows: consecutive runs of ``window_rows`` rows of the share (``shuffle_buffer`` rounded
  down to whole batches, at least one batch), each permuted by
  ``stateless_shuffle`` keyed by ``default_rng([seed, epoch, index, count, window])``, then cut
  into batches. A window holds whole batches, so a batch never spans two windows; the last
  batch of the share may be short (dropped with ``drop_remainder``);
* ``skip_batches``: the windows before the one holding the first batch to train are left out
  of the plan (never read), and that window starts at its batch; exact, costs at most one
  window's parse.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from features.tfrecord.manifest import TFRecordShards

#: rows per window without shuffling (whole batches): parse work per tf.data element
UNSHUFFLED_WINDOW_ROWS = 65_536


@dataclasses.dataclass(frozen=True)
class Window:
    """One window of an epoch's share.

    ``segments``: ``(file, first record, records)`` read in order; ``starts``/``ends``: the
    rows of each read record that belong to the window (``[start, end)`` within the record);
    ``first_batch``: batches of the window already trained (skipped); ``batches``: batches in
    the window, the last one ``rows - (batches - 1) * batch_size`` rows; ``seed``: the
    permutation's stateless seed.
    """

    index: int
    segments: tuple[tuple[str, int, int], ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    rows: int
    first_batch: int
    batches: int
    seed: tuple[int, int]


def shard_rows(rows: int, shard: tuple[int, int] | None) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of the epoch's concatenation that ``shard`` reads (equal shares of
    ``rows // count`` rows; ``features.dataset.shard_range``)."""
    if shard is None:
        return 0, rows
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is not in [0, {count})")
    per = rows // count
    return index * per, (index + 1) * per


def file_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The epoch's file order: ``default_rng([seed, epoch]).permutation(n)``, as the Parquet
    input orders its files."""
    if not shuffle:
        return list(range(n))
    return [int(i) for i in np.random.default_rng([seed, epoch]).permutation(n)]


def _window_records(
    shards: TFRecordShards, order: list[int], g0: int, g1: int
) -> tuple[list[tuple[str, int, int]], list[int], list[int]]:
    """(segments, starts, ends) of the records holding global rows ``[g0, g1)``."""
    block = shards.block_rows
    segments, starts, ends = [], [], []
    offset = 0
    for i in order:
        f = shards.files[i]
        lo, hi = max(g0 - offset, 0), min(g1 - offset, f.rows)
        if lo < hi:
            first, last = lo // block, (hi - 1) // block
            segments.append((str(f.path), first, last - first + 1))
            for r in range(first, last + 1):
                starts.append(max(lo - r * block, 0))
                ends.append(min(hi - r * block, block))
        offset += f.rows
        if offset >= g1:
            break
    return segments, starts, ends


def epoch_windows(
    shards: TFRecordShards,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    skip_batches: int,
    shuffle_buffer: int,
    drop_remainder: bool,
    shard: tuple[int, int] | None,
) -> list[Window]:
    """The windows one epoch (or share) reads, in order (see the module docstring)."""
    order = file_order(len(shards.files), shuffle, seed, epoch)
    lo, hi = shard_rows(shards.rows, shard)
    index, count = shard or (0, 1)
    used = hi - lo
    if drop_remainder:
        used = used // batch_size * batch_size
    wanted = shuffle_buffer if shuffle else UNSHUFFLED_WINDOW_ROWS
    window_rows = max(wanted // batch_size, 1) * batch_size
    skip_rows = skip_batches * batch_size
    windows = []
    for w in range(skip_rows // window_rows, math.ceil(used / window_rows)):
        w0, w1 = w * window_rows, min((w + 1) * window_rows, used)
        segments, starts, ends = _window_records(shards, order, lo + w0, lo + w1)
        first = max(skip_rows - w0, 0) // batch_size
        key = np.random.default_rng([seed, epoch, index, count, w]).integers(0, 2**62, size=2)
        windows.append(
            Window(
                index=w,
                segments=tuple(segments),
                starts=tuple(starts),
                ends=tuple(ends),
                rows=w1 - w0,
                first_batch=first,
                batches=math.ceil((w1 - w0) / batch_size),
                seed=(int(key[0]), int(key[1])),
            )
        )
    return windows


def steps(rows: int, batch_size: int, shard: tuple[int, int] | None, drop_remainder: bool) -> int:
    """Batches one epoch (or share) of ``rows`` rows yields."""
    lo, hi = shard_rows(rows, shard)
    full, rest = divmod(hi - lo, batch_size)
    return full + (1 if rest and not drop_remainder else 0)
