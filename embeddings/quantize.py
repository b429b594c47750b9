"""Row-wise quantized embedding tables for serving: int8 with a per-row scale and offset, or fp16.

``int8`` (asymmetric, per row, the 8-bit row-wise form of FBGEMM's embedding tables): with
``mn`` and ``mx`` the smallest and largest value of a row, ``offset`` is ``mn`` rounded down to
float16 and ``scale`` is ``(mx - offset) / 255`` rounded up to float16; ``q = round((x - offset)
/ scale) - 128`` in ``[-128, 127]``. Stored: the int8 table plus float16 ``scale`` and ``offset``
per row, ``dim + 4`` bytes a row against ``4 * dim`` in float32 (3.56x smaller at ``dim`` 32,
3.76x at 64). A row read back is ``(q + 128) * scale + offset``, within ``scale / 2`` of ``x``
per element (the rounding directions keep every code in range; a constant row whose value is a
float16 comes back exactly). ``fp16``: the table as float16, read back as float32.

``QuantizedTable`` holds one such table (or a float32 one: mode ``fp32``); its call gathers the
compact rows of the indices with their scale and offset and dequantizes only those, so memory
holds the compact table. ``QuantizedEmbedding`` is the serving form of one embedding layer
(``full``, ``hashing``, ``qr``, ``bh``, or AMTL's compact ``AMTLServingEmbedding``) with its
tables as ``QuantizedTable`` s: the layer's own index arithmetic (OOV path, hash, quotient /
remainder split, binary-code blocks) runs unchanged. ``quantized_form(collection, mode,
min_rows)`` returns a new ``EmbeddingCollection`` whose tables of at least ``min_rows`` rows are
quantized (smaller ones stay float32); the collection given is left as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from embeddings.amtl import AMTLEmbedding, AMTLServingEmbedding
from embeddings.binary_hash import BinaryHashEmbedding
from embeddings.collection import EmbeddingCollection
from embeddings.common import check_choice, check_int, flat_ids, pool_and_regularize
from embeddings.full import FullEmbedding, oov_safe
from embeddings.hashing import HashingEmbedding
from embeddings.qr import QREmbedding

#: the modes of ``quantize_rows`` / ``quantized_form``
MODES = ("int8", "fp16")
#: the modes of a ``QuantizedTable`` (``fp32``: a table kept as it is)
TABLE_MODES = (*MODES, "fp32")
DEFAULT_MIN_ROWS = 1024
_DTYPES = {"int8": tf.int8, "fp16": tf.float16, "fp32": tf.float32}
_FP16_MAX = float(np.finfo(np.float16).max)
_INT32_MAX = 2**31 - 1
_CHUNK_ROWS = 1 << 16


def quantize_rows(
    table: np.ndarray, mode: str
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(q, scale, offset)`` of a float ``[rows, dim]`` table (module docstring).

    ``int8``: ``q`` int8 ``[rows, dim]``, ``scale`` and ``offset`` float16 ``[rows]``.
    ``fp16`` / ``fp32``: ``q`` the table as float16 / float32, ``scale`` and ``offset`` None.

    Raises:
      ValueError: an unknown mode, a table that is not 2-D or not finite, or a value beyond
        float16's range.
    """
    check_choice("mode", mode, TABLE_MODES)
    table = np.asarray(table)
    if table.ndim != 2 or table.shape[1] < 1 or not np.all(np.isfinite(table)):
        raise ValueError(f"table must be a finite 2-D array of rows, got shape {table.shape}")
    biggest = float(np.abs(table).max()) if table.size else 0.0
    if mode != "fp32" and biggest > _FP16_MAX / 2:
        raise ValueError(f"table holds {biggest:g}, beyond float16's range ({_FP16_MAX:g})")
    if mode != "int8":
        return table.astype(_DTYPES[mode].as_numpy_dtype), None, None
    rows = table.shape[0]
    q = np.empty(table.shape, np.int8)
    scale, offset = np.empty(rows, np.float16), np.empty(rows, np.float16)
    for start in range(0, rows, _CHUNK_ROWS):  # float64 arithmetic, a chunk at a time
        x = table[start : start + _CHUNK_ROWS].astype(np.float64)
        mn, mx = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
        lo, step = _params(mn, mx)
        q[start : start + len(x)] = _codes(x, lo, step)
        scale[start : start + len(x)], offset[start : start + len(x)] = step[:, 0], lo[:, 0]
    return q, scale, offset


def _round16(x: np.ndarray, direction: float) -> np.ndarray:
    """``x`` as float16, rounded toward ``direction`` (-inf: down, +inf: up)."""
    x16 = x.astype(np.float16)
    wrong = x16 > x if direction < 0 else x16 < x
    return np.where(wrong, np.nextafter(x16, np.float16(direction)), x16)


def _params(mn: np.ndarray, mx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float16 ``(offset, scale)`` of rows with smallest ``mn`` and largest ``mx`` values:
    ``offset <= mn`` and ``offset + 255 * scale >= mx``, so every code lies in ``[0, 255]``."""
    lo = _round16(mn, -np.inf)
    return lo, _round16((mx - lo.astype(np.float64)) / 255.0, np.inf)


def _codes(x: np.ndarray, lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    """int8 codes of ``x`` against its (broadcast) row ``offset`` / ``scale`` (float16)."""
    s = step.astype(np.float64)
    s = np.where(s > 0, s, 1.0)
    return (np.clip(np.round((x - lo.astype(np.float64)) / s), 0, 255) - 128).astype(np.int8)


def quantize_ragged(
    values: np.ndarray, row_splits: np.ndarray, mode: str
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``quantize_rows`` of a ragged table: ``values`` ``[total]`` cut by ``row_splits``
    ``[rows + 1]`` (AMTL's compact form); ``scale`` / ``offset`` per row, an empty row's 0."""
    check_choice("mode", mode, TABLE_MODES)
    x = np.asarray(values, np.float64).reshape(-1)
    splits = np.asarray(row_splits, np.int64).reshape(-1)
    if splits.size < 2 or splits[0] != 0 or splits[-1] != x.size or np.any(np.diff(splits) < 0):
        raise ValueError(f"row_splits must rise from 0 to {x.size}, got {splits.size} entries")
    if mode != "int8":
        flat = quantize_rows(x[None, :], mode)[0][0] if x.size else x
        return flat.astype(_DTYPES[mode].as_numpy_dtype), None, None
    if x.size and float(np.abs(x).max()) > _FP16_MAX / 2:
        raise ValueError(f"table holds {float(np.abs(x).max()):g}, beyond float16's range")
    lengths = np.diff(splits)
    row = np.repeat(np.arange(lengths.size), lengths)
    mn = np.zeros(lengths.size)
    mx = np.zeros(lengths.size)
    if x.size:
        full = lengths > 0
        mn[full] = np.minimum.reduceat(x, splits[:-1][full])
        mx[full] = np.maximum.reduceat(x, splits[:-1][full])
    lo, step = _params(mn, mx)
    return _codes(x, lo[row], step[row]), step, lo


def table_bytes(rows: int, dim: int, mode: str, total_values: int | None = None) -> int:
    """Bytes of a ``QuantizedTable``: ``rows * dim`` (or ``total_values``) entries of 1 (int8),
    2 (fp16) or 4 (fp32) bytes, plus 4 per row (int8's float16 scale and offset), plus ``rows + 1``
    row offsets of 4 or 8 bytes (ragged)."""
    entries = rows * dim if total_values is None else total_values
    n = entries * _DTYPES[mode].size + (4 * rows if mode == "int8" else 0)
    if total_values is not None:
        n += (rows + 1) * (4 if total_values <= _INT32_MAX else 8)
    return n


def dequantize_rows(
    q: np.ndarray, scale: np.ndarray | None, offset: np.ndarray | None
) -> np.ndarray:
    """float32 rows of ``quantize_rows``' output: ``(q + 128) * scale + offset`` for int8."""
    if scale is None:
        return np.asarray(q, np.float32)
    deq = (q.astype(np.float32) + np.float32(128)) * scale.astype(np.float32)[:, None]
    return deq + offset.astype(np.float32)[:, None]


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class QuantizedTable(tf.keras.layers.Layer):
    """One serving table, row-wise quantized: indices -> float32 rows.

    Dense (``total_values`` None): ``values`` ``[rows, dim]``; the call takes int indices of any
    shape ``S`` and returns ``S + [dim]``. Ragged (``total_values`` set, AMTL's compact form):
    ``values`` ``[total_values]`` and ``row_splits`` ``[rows + 1]``; the call takes indices
    ``[n]`` and returns ``[n, dim]``, each row zero-padded to ``dim``. Indices must lie in
    ``[0, rows)`` (the embedding layer's index arithmetic sees to it).

    Weights (non-trainable; ``QuantizedTable.of`` fills them): ``values`` int8 / float16 /
    float32 by ``mode``; ``scale`` and ``offset`` float16 ``[rows]`` with ``int8``.

    Args:
      rows: rows of the table.
      dim: width of a row (the longest, for a ragged table).
      mode: ``int8``, ``fp16`` or ``fp32``.
      total_values: entries of a ragged table, in ``[0, rows * dim]``; None: a dense table.
    """

    def __init__(
        self, rows: int, dim: int, mode: str, total_values: int | None = None, **kwargs: Any
    ):
        kwargs.pop("trainable", None)
        super().__init__(trainable=False, **kwargs)
        self.rows = check_int("rows", rows, 1)
        self.dim = check_int("dim", dim, 1)
        self.mode = check_choice("mode", mode, TABLE_MODES)
        if total_values is not None:
            check_int("total_values", total_values, 0, rows * dim)
        self.total_values = total_values

    @property
    def ragged(self) -> bool:
        return self.total_values is not None

    def build(self, input_shape: Any = None) -> None:
        shape = (self.total_values,) if self.ragged else (self.rows, self.dim)
        self.values = self.add_weight(
            name="values",
            shape=shape,
            dtype=_DTYPES[self.mode],
            initializer="zeros",
            trainable=False,
        )
        if self.mode == "int8":
            self.scale = self._row_weight("scale", tf.float16, self.rows)
            self.offset = self._row_weight("offset", tf.float16, self.rows)
        if self.ragged:
            dtype = tf.int32 if self.total_values <= _INT32_MAX else tf.int64
            self.row_splits = self._row_weight("row_splits", dtype, self.rows + 1)
        super().build(input_shape)

    def _row_weight(self, name: str, dtype: tf.DType, n: int) -> tf.Variable:
        return self.add_weight(
            name=name, shape=(n,), dtype=dtype, initializer="zeros", trainable=False
        )

    @classmethod
    def of(
        cls,
        table: np.ndarray,
        mode: str,
        row_splits: np.ndarray | None = None,
        dim: int | None = None,
        name: str | None = None,
    ) -> QuantizedTable:
        """A built table holding ``table`` (``[rows, dim]``, or ``[total]`` cut by
        ``row_splits`` into rows padded to ``dim``, default the longest) quantized by ``mode``."""
        if row_splits is None:
            q, scale, offset = quantize_rows(table, mode)
            layer = cls(q.shape[0], q.shape[1], mode, name=name)
        else:
            q, scale, offset = quantize_ragged(table, row_splits, mode)
            splits = np.asarray(row_splits, np.int64)
            dim = dim or max(1, int(np.diff(splits).max()))
            layer = cls(splits.size - 1, dim, mode, total_values=int(q.size), name=name)
        layer.build(None)
        layer.values.assign(q)
        if scale is not None:
            layer.scale.assign(scale)
            layer.offset.assign(offset)
        if row_splits is not None:
            layer.row_splits.assign(np.asarray(row_splits).astype(layer.row_splits.dtype.name))
        return layer

    def call(self, indices: tf.Tensor) -> tf.Tensor:
        if self.ragged:
            table = tf.RaggedTensor.from_row_splits(self.values, self.row_splits, validate=False)
            rows = tf.gather(table, indices)
            parts = tf.gather(tf.cast(indices, tf.int64), rows.value_rowids())
            flat = self._dequantize(rows.flat_values, parts, expand=False)
            return rows.with_flat_values(flat).to_tensor(0.0, shape=[None, self.dim])
        return self._dequantize(tf.gather(self.values, indices), indices, expand=True)

    def _dequantize(self, q: tf.Tensor, row: tf.Tensor, expand: bool) -> tf.Tensor:
        """float32 of gathered entries ``q``; ``row``: the table row of each (of each row of
        entries with ``expand``)."""
        x = tf.cast(q, tf.float32)
        if self.mode != "int8":
            return x
        scale = tf.cast(tf.gather(self.scale, row), tf.float32)
        offset = tf.cast(tf.gather(self.offset, row), tf.float32)
        if expand:
            scale, offset = scale[..., None], offset[..., None]
        return (x + 128.0) * scale + offset

    def memory_bytes(self) -> int:
        """Bytes of the weights: values, scale and offset, row offsets."""
        return table_bytes(self.rows, self.dim, self.mode, self.total_values)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "rows": self.rows,
            "dim": self.dim,
            "mode": self.mode,
            "total_values": self.total_values,
        }


#: the layer classes ``quantized_form`` covers (an ``AMTLEmbedding`` by its serving form)
COVERED = (FullEmbedding, HashingEmbedding, QREmbedding, BinaryHashEmbedding, AMTLServingEmbedding)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class QuantizedEmbedding(tf.keras.layers.Layer):
    """The serving form of an embedding layer of ``COVERED`` with its tables quantized.

    Same calling convention and outputs (within the quantization error) as ``source``: ids int
    ``[batch]`` (any dense shape) -> ``[batch, dim]``, ragged ids pooled by its ``combiner``.
    A fresh unbuilt copy of ``source`` (it holds no weights) lends its index arithmetic.

    Args:
      source: the layer (or its serialized form) whose outputs this layer gives.
      tables: ``{name: QuantizedTable}`` (or serialized): ``table`` (full, hashing, bh),
        ``quotient`` and ``remainder`` (qr), ``values`` (AMTL's compact form).
    """

    def __init__(
        self,
        source: tf.keras.layers.Layer | dict[str, Any],
        tables: dict[str, QuantizedTable | dict[str, Any]],
        **kwargs: Any,
    ):
        kwargs.pop("trainable", None)
        super().__init__(trainable=False, **kwargs)
        if not isinstance(source, dict):
            source = tf.keras.layers.serialize(source)
        # a fresh, unbuilt copy holding no float tables (a build_config would build it)
        source = tf.keras.layers.deserialize(
            {k: v for k, v in source.items() if k != "build_config"}
        )
        if type(source) not in COVERED:
            raise ValueError(
                f"source must be one of {[c.__name__ for c in COVERED]}, got "
                f"{type(source).__name__}"
            )
        self.source_config = tf.keras.layers.serialize(source)
        self._source = _Untracked(source)  # not a dependency: nothing of it is saved
        self.tables = {
            k: t if isinstance(t, QuantizedTable) else tf.keras.layers.deserialize(t)
            for k, t in tables.items()
        }
        want = _TABLE_NAMES[type(source)]
        if sorted(self.tables) != sorted(want):
            raise ValueError(f"tables must be {list(want)}, got {sorted(self.tables)}")
        self.num_rows = source.num_rows
        self.dim = source.dim
        self.combiner = source.combiner
        self.l2 = 0.0  # serving: nothing to regularize (read by pool_and_regularize)

    @property
    def source(self) -> tf.keras.layers.Layer:
        return self._source.layer

    def call(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        src, flat = self.source, flat_ids(ids)
        if isinstance(src, QREmbedding):
            q, r = src.indices(flat)
            qv, rv = self.tables["quotient"](q), self.tables["remainder"](r)
            ops = {"mult": lambda: qv * rv, "add": lambda: qv + rv}
            vectors = ops.get(src.operation, lambda: tf.concat([qv, rv], axis=-1))()
        elif isinstance(src, BinaryHashEmbedding):
            rows = self.tables["table"](src.block_indices(flat))  # [n, n_blocks, block_dim]
            fused = src.fusion == "sum"
            vectors = tf.reduce_sum(rows, axis=1) if fused else tf.reshape(rows, [-1, src.dim])
        elif isinstance(src, AMTLServingEmbedding):
            vectors = self.tables["values"](oov_safe(flat, src.num_rows))
        else:
            vectors = self.tables["table"](src.row_index(flat))
        return pool_and_regularize(self, ids, vectors)

    def memory_bytes(self) -> dict[str, int]:
        n = sum(t.memory_bytes() for t in self.tables.values())
        return {"train": n, "serve": n}

    def get_config(self) -> dict[str, Any]:
        tables = {k: tf.keras.layers.serialize(t) for k, t in self.tables.items()}
        return {**super().get_config(), "source": self.source_config, "tables": tables}


class _Untracked:
    """Holds a layer out of Keras' and the checkpoint's sight."""

    __slots__ = ("layer",)

    def __init__(self, layer: tf.keras.layers.Layer):
        self.layer = layer


_TABLE_NAMES = {
    FullEmbedding: ("table",),
    HashingEmbedding: ("table",),
    BinaryHashEmbedding: ("table",),
    QREmbedding: ("quotient", "remainder"),
    AMTLServingEmbedding: ("values",),
}


def _float_tables(layer: tf.keras.layers.Layer) -> dict[str, tuple[np.ndarray, Any]]:
    """``{name: (values, row_splits or None)}`` of a built layer of ``COVERED``."""
    if isinstance(layer, QREmbedding):
        return {
            "quotient": (layer.quotient.numpy(), None),
            "remainder": (layer.remainder.numpy(), None),
        }
    if isinstance(layer, AMTLServingEmbedding):
        return {"values": (layer.values.numpy(), layer.row_splits.numpy())}
    return {"table": (layer.table.numpy(), None)}


def quantized_layer(
    layer: tf.keras.layers.Layer, mode: str, min_rows: int
) -> tuple[tf.keras.layers.Layer, list[dict[str, Any]]]:
    """``layer`` (built, of ``COVERED``; an ``AMTLEmbedding`` is taken in its serving form)
    with its tables of at least ``min_rows`` rows quantized by ``mode``, and one record per
    table: ``{"table", "rows", "dim", "mode", "bytes_fp32", "bytes"}``. A layer with no table
    that large is returned as it is."""
    check_choice("mode", mode, MODES)
    check_int("min_rows", min_rows, 0)
    if isinstance(layer, AMTLEmbedding):
        layer = layer.serving_form(name=layer.name)
    if type(layer) not in COVERED:
        raise ValueError(
            f"quantize: layer {layer.name!r} is a {type(layer).__name__}; quantized tables "
            f"cover {[c.__name__ for c in COVERED]} and AMTLEmbedding"
        )
    tables, records = {}, []
    for name, (values, splits) in _float_tables(layer).items():
        rows = values.shape[0] if splits is None else splits.size - 1
        kind = mode if rows >= min_rows else "fp32"
        table = QuantizedTable.of(values, kind, splits, dim=layer.dim, name=name)
        total = table.total_values
        records.append(
            {
                "table": name,
                "rows": int(rows),
                "dim": table.dim,
                "mode": kind,
                "bytes_fp32": table_bytes(table.rows, table.dim, "fp32", total),
                "bytes": table.memory_bytes(),
            }
        )
        tables[name] = table
    if all(t.mode == "fp32" for t in tables.values()):
        return layer, records
    return QuantizedEmbedding(layer, tables, name=layer.name), records


def quantized_form(
    collection: EmbeddingCollection, mode: str, min_rows: int = DEFAULT_MIN_ROWS
) -> tuple[EmbeddingCollection, dict[str, Any]]:
    """A new collection of the same fields whose tables of at least ``min_rows`` rows are
    quantized by ``mode`` (``int8`` or ``fp16``), and its record: ``{"mode", "min_rows",
    "tables": [{"field", "table", "rows", "dim", "mode", "bytes_fp32", "bytes"}, ...],
    "bytes_fp32", "bytes"}`` (bytes of every table, before and after).

    Raises:
      ValueError: an unknown mode, a negative ``min_rows``, or a layer quantization does not
        cover.
    """
    check_choice("mode", mode, MODES)
    check_int("min_rows", min_rows, 0)
    if not isinstance(collection, EmbeddingCollection):
        raise ValueError(
            f"quantize: the embedding block must be an EmbeddingCollection, got "
            f"{type(collection).__name__}"
        )
    layers, tables = {}, []
    for field, layer in collection.layers_by_field.items():
        layers[field], records = quantized_layer(layer, mode, min_rows)
        tables += [{"field": field, **r} for r in records]
    record = {
        "mode": mode,
        "min_rows": min_rows,
        "tables": tables,
        "bytes_fp32": sum(t["bytes_fp32"] for t in tables),
        "bytes": sum(t["bytes"] for t in tables),
    }
    return EmbeddingCollection(collection.tables, layers=layers, name=collection.name), record


def quantized_model(model: Any, mode: str, min_rows: int = DEFAULT_MIN_ROWS) -> tuple[Any, dict]:
    """``model`` (a ``RankingModel`` or ``MultiTaskModel``) with its ``embedding`` block and the
    tables of its behaviour sequences (``sequence_tables``, when a sequence has its own) in
    ``quantized_form`` (a new model sharing every other block), and the record of
    ``quantized_form`` over both. A model without an
    embedding block (a linear model: its per-id weights are one float a row) is returned as it
    is, with a record of no tables."""
    check_choice("mode", mode, MODES)
    check_int("min_rows", min_rows, 0)
    if getattr(model, "embedding", None) is None:
        empty = {"mode": mode, "min_rows": min_rows, "tables": [], "bytes_fp32": 0, "bytes": 0}
        return model, empty
    blocks, record = {}, None
    for name in ("embedding", "sequence_tables"):  # a history's own tables too
        collection = getattr(model, name, None)
        if collection is None:
            continue
        blocks[name], part = quantized_form(collection, mode, min_rows)
        if record is None:
            record = part
        else:
            record["tables"] += part["tables"]
            record["bytes_fp32"] += part["bytes_fp32"]
            record["bytes"] += part["bytes"]
    return model.with_blocks(**blocks), record
