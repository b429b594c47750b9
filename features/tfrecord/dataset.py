"""``make_tfrecord_dataset``: the training input from TFRecord shards, TensorFlow ops only.

The signature and elements of ``features.dataset.make_dataset`` (``{field: [batch]}`` raw
tensors, the same values for the same rows), but no Python runs per batch: the epoch is planned
once (``features.tfrecord.plan``), then tf.data, from a source of one element per window,
reads each window's records (``TFRecordDataset``), parses them with one
``tf.io.parse_example`` of fixed-length block features, permutes the window's rows with
``tf.random.experimental.stateless_shuffle`` and gathers them into one ``[rows]`` tensor per
field, which ``rebatch`` cuts into batches (one copy of each batch's rows, no per-batch
function). A window holds whole batches
(``features.tfrecord.plan``), so every batch but the share's last has ``batch_size`` rows.
Windows are parsed in parallel (``num_parallel_calls=AUTOTUNE``), each read when its parse
starts, and batches prefetched. The dataset holds no Python function, so tf.data service can run it
(``features.tfrecord.service``), its dynamic sharding handing whole windows to its workers.
The pipeline is built by one function traced once per process and layout
(``_epoch_function``): each epoch's dataset is that graph run with the epoch's plan.

Memory: a window in flight holds its parsed rows twice (parsed and permuted), about 0.7 KiB
per row for 26 strings and 14 numbers; ``shuffle_buffer`` bounds a window's rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import tensorflow as tf

from features.dataset import input_fields
from features.schema import Schema
from features.tfrecord.encode import BYTES, FLOAT, INT64, list_type
from features.tfrecord.manifest import check_fields, list_tfrecord
from features.tfrecord.plan import Window, epoch_windows

_DTYPES = {FLOAT: tf.float32, BYTES: tf.string, INT64: tf.int64}
_ARROW = {FLOAT: pa.float32(), BYTES: pa.string(), INT64: pa.int64()}
_READ_BUFFER = 1 << 20
_OPTIONS = tf.data.Options()
_OPTIONS.autotune.enabled = False  # AUTOTUNE then means a fixed share of the cores
_OPTIONS.experimental_warm_start = True  # the first window is parsed from the iterator's creation


def _pack(windows: list[Window]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """(the segments of every window in order, as one flat table: ``path``, ``first`` and
    ``count``; the windows' metadata: ``starts``/``ends`` padded with empty ``[0, 0)`` ranges
    to the largest record count of a window, and ``segments``, the window's ``[first, end)``
    rows of that table; that record count)."""
    records = max([len(w.starts) for w in windows] + [1])
    segments: dict[str, list] = {"path": [], "first": [], "count": []}
    for w in windows:
        for path, first, count in w.segments:
            segments["path"].append(path)
            segments["first"].append(first)
            segments["count"].append(count)
    n = len(windows)
    count = np.array([len(w.segments) for w in windows], np.int64)
    meta = {
        "starts": np.zeros((n, records), np.int64),
        "ends": np.zeros((n, records), np.int64),
        "first_batch": np.array([w.first_batch for w in windows], np.int64),
        "seed": np.array([w.seed for w in windows], np.int64).reshape(n, 2),
        "segments": np.stack([np.cumsum(count) - count, np.cumsum(count)], axis=-1),
    }
    for i, w in enumerate(windows):
        meta["starts"][i, : len(w.starts)] = w.starts
        meta["ends"][i, : len(w.ends)] = w.ends
    flat = {
        "path": np.array(segments["path"], dtype=object).reshape(-1),
        **{k: np.array(segments[k], np.int64).reshape(-1) for k in ("first", "count")},
    }
    return flat, meta, records


def _segment(segment: dict[str, tf.Tensor]) -> tf.data.Dataset:
    """The records of one segment."""
    read = tf.data.TFRecordDataset(segment["path"], buffer_size=_READ_BUFFER)
    return read.skip(segment["first"]).take(segment["count"])


def _serialized_windows(
    table: dict[str, tf.Tensor], windows: dict[str, tf.Tensor], records: tf.Tensor
) -> tf.data.Dataset:
    """``(serialized, meta)``: each window's ``[records]`` records and its metadata, from a
    source of one element per window (its row of ``windows``) whose map reads the window's
    segments of ``table`` in order. The source is what tf.data service's dynamic sharding
    splits: its workers get whole windows."""

    def read(meta: dict[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        lo, hi = meta["segments"][0], meta["segments"][1]
        own = tf.data.Dataset.from_tensor_slices({k: v[lo:hi] for k, v in table.items()})
        own = own.flat_map(_segment).batch(records)
        return own.get_single_element(), meta

    # read when the parse asks for the window: no buffer of read windows ahead of the parse
    return tf.data.Dataset.from_tensor_slices(windows).map(read)


def _row_indices(meta: dict[str, tf.Tensor], block_rows: int) -> tf.Tensor:
    """Indices of the window's rows in its parsed ``[records * block_rows]`` values."""
    base = tf.range(tf.size(meta["starts"], out_type=tf.int64)) * block_rows
    return tf.ragged.range(base + meta["starts"], base + meta["ends"]).values


def _window_rows(
    serialized: tf.Tensor,
    meta: dict[str, tf.Tensor],
    features: dict[str, tf.io.FixedLenFeature],
    batch_size: int,
    shuffle: bool,
) -> dict[str, tf.Tensor]:
    """``{field: [rows]}``: the window's rows permuted (when ``shuffle``), the rows of its
    trained batches left out."""
    parsed = tf.io.parse_example(serialized, features)
    block_rows = next(iter(features.values())).shape[0]
    idx = _row_indices(meta, block_rows)
    if shuffle:
        idx = tf.random.experimental.stateless_shuffle(idx, seed=meta["seed"])
    idx = idx[meta["first_batch"] * batch_size :]
    return {name: tf.gather(tf.reshape(values, [-1]), idx) for name, values in parsed.items()}


_TABLE_SPEC = {
    "path": tf.TensorSpec([None], tf.string),
    "first": tf.TensorSpec([None], tf.int64),
    "count": tf.TensorSpec([None], tf.int64),
}
_WINDOWS_SPEC = {
    "starts": tf.TensorSpec([None, None], tf.int64),
    "ends": tf.TensorSpec([None, None], tf.int64),
    "first_batch": tf.TensorSpec([None], tf.int64),
    "seed": tf.TensorSpec([None, 2], tf.int64),
    "segments": tf.TensorSpec([None, 2], tf.int64),
}


@functools.lru_cache(maxsize=16)
def _epoch_function(
    layout: tuple[tuple[str, str], ...], block_rows: int, batch_size: int, shuffle: bool
) -> Any:
    """The function that builds an epoch's dataset from its plan (``_pack``'s table, windows
    and record count) for one layout (``(field, list type)`` pairs), traced once per process.
    Every epoch's dataset is then the graph of that trace run again with the epoch's plan: no
    map function is traced per epoch (tracing the three maps takes about 0.1 s, a fifth of an
    epoch of 200,000 rows)."""
    features = {n: tf.io.FixedLenFeature([block_rows], _DTYPES[k]) for n, k in layout}

    def window(serialized: tf.Tensor, meta: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return _window_rows(serialized, meta, features, batch_size, shuffle)

    @tf.function(
        input_signature=[_TABLE_SPEC, _WINDOWS_SPEC, tf.TensorSpec([], tf.int64)],
        autograph=False,
    )
    def epoch(table: Any, windows: Any, records: tf.Tensor) -> tf.data.Dataset:
        ds = _serialized_windows(table, windows, records)
        ds = ds.map(window, num_parallel_calls=tf.data.AUTOTUNE)
        # the plan already left out a short last batch under drop_remainder: [None] either way
        ds = ds.rebatch(batch_size).prefetch(tf.data.AUTOTUNE)
        # autotune's model sizes every element it records, walking each of a window's strings
        return ds.with_options(_OPTIONS)

    return epoch


def make_tfrecord_dataset(
    schema: Schema,
    paths: str | Path | Sequence[str | Path],
    *,
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    skip_batches: int = 0,
    shuffle_buffer: int = 262_144,
    drop_remainder: bool = False,
    shard: tuple[int, int] | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``{field: [batch]}`` raw tensors from TFRecord shards.

    Args: as ``features.dataset.make_dataset``, with ``paths`` TFRecord files, folders or
    glob patterns (``features.tfrecord.manifest.list_tfrecord``). ``shuffle``: files by
    ``(seed, epoch)``, rows within windows of ``shuffle_buffer`` rows (whole batches) by a
    stateless permutation of ``(seed, epoch, shard, window)``; not the Parquet input's order,
    but as fixed. ``skip_batches``: exact; whole windows before the resume point are not read
    (nor parsed). ``shard``: the equal row share of ``make_dataset``; files of other shares are
    not opened, and records before the share inside its first file are read but not parsed.

    Raises:
      FileNotFoundError: no TFRecord files under ``paths``.
      DataError: shards without a manifest, or lacking a field of ``schema``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    shards = list_tfrecord(paths)
    fields = input_fields(schema)
    check_fields(shards, schema, {f.name: list_type(f) for f in fields})
    windows = epoch_windows(
        shards,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        skip_batches=skip_batches,
        shuffle_buffer=shuffle_buffer,
        drop_remainder=drop_remainder,
        shard=shard,
    )
    layout = tuple((f.name, list_type(f)) for f in fields)
    epoch_dataset = _epoch_function(layout, shards.block_rows, batch_size, shuffle)
    segments, meta, records = _pack(windows)
    table = {
        "path": tf.constant(segments["path"].tolist(), tf.string, shape=[len(segments["path"])]),
        "first": segments["first"],
        "count": segments["count"],
    }
    return epoch_dataset(table, meta, np.int64(records))
