"""AMTL: the Adaptively-Masked Twins-based Layer (Yin et al., CIKM 2021, arXiv 2108.11513).

AMTL learns an embedding *length* ``k_i <= d`` per feature value ``i`` from the value's frequency,
so frequent values keep long vectors and rare ones short vectors; serving then stores only the
first ``k_i`` entries of each row.

Forward pass for a looked-up id ``i`` (``W`` the ``[num_rows, d]`` table, ``T`` the temperature):

* frequency features ``s_i = [norm(q_i), pct_i]`` where ``q_i`` is the training count of ``i``,
  ``norm(q_i) = (log1p(q_i) - mean) / std`` the z-score of ``log1p(count)`` over the field, and
  ``pct_i = 1 - i / (num_rows - 1)`` the frequency-rank percentile (ids are vocabulary indices in
  decreasing-frequency order, so the index *is* the rank; id 0, the OOV row, sits at the top and is
  told apart by its count);
* twin MLPs without shared weights, ``hAML`` (frequent values) and ``lAML`` (rare values), each
  ``s_i -> hidden ReLU layers -> d logits``, mixed by a frequency gate:
  ``h_i = a_i * hAML(s_i) + (1 - a_i) * lAML(s_i)``, ``a_i = sigmoid(norm(q_i))``;
* hard selection ``t_i = onehot(argmax h_i)``, relaxation ``t^_i = softmax(h_i / T)``,
  straight-through ``t~_i = t^_i + stop_gradient(t_i - t^_i)``;
* mask ``m_{i,q} = sum_{p >= q} t~_{i,p}``: ones up to the argmax ``p*`` and zeros after it, so the
  learned length is ``k_i = p* + 1``;
* output ``e_i * m_i`` with ``e_i = W[i]``.

Choices where the paper is silent (see also ../shared/papers.md):

* The MLP input uses the z-score of ``log1p(count)`` rather than raw ``log1p(count)``: an affine
  map of the same feature, better conditioned for an MLP with default initialisation.
* The mask is computed as ``m = m_hard + (m_soft - stop_gradient(m_soft))`` with
  ``m_soft = reverse_cumsum(t^)``. Its gradient is exactly the paper's (the reverse cumsum is
  linear), but the forward value is exactly 0/1 in floating point (``t^ + (t - t^)`` need not
  round back to exactly ``t``), so entries beyond ``k_i`` are exact zeros and the compact serving
  form reproduces the training layer bit for bit.
* Initial lengths: the last layer of both MLPs starts with a zero kernel and a bias of
  ``length_bias`` (> 0) on the last logit and 0 on the others, so every value starts at the full
  length ``k_i = d``. AMTL inserted behind a trained table (``from_full``) therefore starts from
  exactly the trained model's outputs, and training moves lengths from there. A moderate bias
  (default 1.0) keeps the softmax relaxation unsaturated, so the straight-through gradient flows
  from the first step.
* ``length_penalty`` (default 0, the paper's plain objective) optionally adds
  ``length_penalty * mean_{unique ids u in batch}(sum_q m_{u,q}) / d`` to the layer's losses: a
  memory price per stored entry, which pushes values whose extra dimensions do not pay for
  themselves in the task loss (typically rare ones) to shorter lengths.

``counts`` are data, not configuration: they live in the non-trainable weight ``counts`` (and the
cached ``count_stats`` = [mean, std] of ``log1p(counts)``), are filled from the constructor argument
at build time or by ``set_counts``, and are saved with checkpoints / SavedModels but are *not* part
of ``get_config``: a layer rebuilt from its config gets zero counts (every value then looks the same
to the MLPs) until a checkpoint or weights restore fills them.

Serving: ``serving_form()`` returns an ``AMTLServingEmbedding`` that holds only the compact form,
row ``i``'s first ``k_i`` entries concatenated (``values``) and the row offsets (``row_splits``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from embeddings.base import EmbeddingLayer
from embeddings.common import check_common_args, flat_ids, pool_and_regularize
from embeddings.full import FullEmbedding, oov_safe

_STD_EPS = 1e-6
_INT32_MAX = 2**31 - 1


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class AMTLEmbedding(EmbeddingLayer):
    """Embedding table with a learned, frequency-driven length per value (AMTL, CIKM'21).

    Calling convention of every layer of embeddings/ (embeddings/common.py): ids int ``[batch]``
    -> ``[batch, dim]`` (any dense shape ``S`` -> ``S + [dim]``); ids int ragged
    ``[batch, None]`` -> ``[batch, dim]`` pooled by ``combiner`` (empty row -> zeros); ids
    outside ``[0, num_rows)`` read row 0, the OOV row. The output of id ``i`` is ``W[i] * m_i``,
    ``m_i`` the 0/1 mask of the first ``k_i`` positions (module docstring).

    Args:
      num_rows: rows of the table, row 0 being the OOV row.
      dim: maximum embedding dimension ``d``; learned lengths are in ``1..d``.
      combiner: pooling of multi-valued (ragged) ids: ``mean`` or ``sum``.
      l2: L2 penalty on the masked rows looked up in a batch (added to the layer's losses, summed
        over entries and divided by the number of looked-up rows, as FullEmbedding).
      counts: optional sequence of ``num_rows`` training counts (id 0 = the OOV count; ids in
        decreasing-frequency order). Stored in the non-trainable weight ``counts``; not part of
        ``get_config`` (see the module docstring).
      hidden: widths of the hidden ReLU layers of each twin MLP.
      temperature: softmax temperature ``T`` of the relaxation (> 0).
      length_bias: initial bias of the last logit (> 0): every value starts at full length.
      length_penalty: optional weight of the memory price on the batch's lengths (>= 0).
      initializer: initializer of the table.
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        *,
        counts: Sequence[float] | np.ndarray | None = None,
        hidden: Sequence[int] = (32,),
        temperature: float = 1.0,
        length_bias: float = 1.0,
        length_penalty: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(num_rows, dim, **kwargs)
        hidden = tuple(hidden)
        if any(not isinstance(h, int | np.integer) or isinstance(h, bool) or h < 1 for h in hidden):
            raise ValueError(f"hidden must hold integers >= 1, got {hidden!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if not length_bias > 0:
            raise ValueError(f"length_bias must be > 0, got {length_bias!r}")
        if length_penalty < 0:
            raise ValueError(f"length_penalty must be >= 0, got {length_penalty!r}")
        self.hidden = tuple(int(h) for h in hidden)
        self.temperature = float(temperature)
        self.length_bias = float(length_bias)
        self.length_penalty = float(length_penalty)
        self._initial_counts = None if counts is None else self._check_counts(counts)
        last_bias = np.zeros(self.dim, np.float32)
        last_bias[-1] = self.length_bias
        self.h_aml = self._mlp("h_aml", last_bias)
        self.l_aml = self._mlp("l_aml", last_bias)

    def _mlp(self, prefix: str, last_bias: np.ndarray) -> list[tf.keras.layers.Dense]:
        layers = [
            tf.keras.layers.Dense(h, activation="relu", name=f"{prefix}_{j}")
            for j, h in enumerate(self.hidden)
        ]
        layers.append(
            tf.keras.layers.Dense(
                self.dim,
                kernel_initializer="zeros",
                bias_initializer=tf.keras.initializers.Constant(last_bias.tolist()),
                name=f"{prefix}_out",
            )
        )
        return layers

    def _check_counts(self, counts: Sequence[float] | np.ndarray) -> np.ndarray:
        arr = np.asarray(counts, dtype=np.float64).reshape(-1)
        if arr.shape[0] != self.num_rows:
            raise ValueError(
                f"counts must hold num_rows={self.num_rows} values, got {arr.shape[0]}"
            )
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError("counts must be finite and >= 0")
        return arr.astype(np.float32)

    # ------------------------------------------------------------------ weights

    def create_weights(self) -> None:
        self.add_table()
        self.counts = self.add_weight(
            name="counts", shape=(self.num_rows,), initializer="zeros", trainable=False
        )
        self.count_stats = self.add_weight(
            name="count_stats",
            shape=(2,),
            initializer=tf.keras.initializers.Constant([0.0, 1.0]),
            trainable=False,
        )
        self._build_mlps()

    def build(self, input_shape: Any = None) -> None:
        super().build(input_shape)
        if self._initial_counts is not None:
            self.set_counts(self._initial_counts)
            self._initial_counts = None

    def _build_mlps(self) -> None:
        for mlp in (self.h_aml, self.l_aml):
            width = 2
            for layer in mlp:
                if not layer.built:
                    with tf.name_scope(layer.name):
                        layer.build((None, width))
                width = layer.units

    def set_counts(self, counts: Sequence[float] | np.ndarray) -> None:
        """Fills the ``counts`` weight (and its cached ``log1p`` mean / std) with new counts."""
        arr = self._check_counts(counts)
        if not self.built:
            self._initial_counts = arr
            return
        logs = np.log1p(arr.astype(np.float64))
        self.counts.assign(arr)
        self.count_stats.assign(np.array([logs.mean(), logs.std()], np.float32))

    def warm_start_from(self, table_values: np.ndarray | tf.Tensor) -> None:
        """Copies a trained ``[num_rows, dim]`` table (e.g. a FullEmbedding's) into this layer."""
        values = np.asarray(table_values, dtype=np.float32)
        if values.shape != (self.num_rows, self.dim):
            raise ValueError(
                f"table_values must have shape {(self.num_rows, self.dim)}, got {values.shape}"
            )
        if not self.built:
            self.build(None)
        self.table.assign(values)

    @classmethod
    def from_full(
        cls,
        full_layer: FullEmbedding,
        counts: Sequence[float] | np.ndarray | None,
        **options: Any,
    ) -> AMTLEmbedding:
        """AMTL behind an already trained FullEmbedding: same shape, table copied (warm start).

        ``num_rows``, ``dim``, ``combiner`` and ``l2`` come from ``full_layer`` (``combiner`` and
        ``l2`` may be overridden in ``options``). Lengths start at ``dim``, so before any training
        the AMTL layer's outputs equal ``full_layer``'s exactly.
        """
        if not full_layer.built:
            raise ValueError("full_layer must be built (trained) before a warm start")
        kwargs = {"combiner": full_layer.combiner, "l2": full_layer.l2, **options}
        layer = cls(full_layer.num_rows, full_layer.dim, counts=counts, **kwargs)
        layer.warm_start_from(full_layer.table.numpy())
        return layer

    # ------------------------------------------------------------------ mask

    def _features(self, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``s`` ``[n, 2]`` and the gate ``a`` ``[n, 1]`` of in-range ids ``[n]`` (int64)."""
        logq = tf.math.log1p(tf.nn.embedding_lookup(self.counts, ids))
        z = (logq - self.count_stats[0]) / tf.maximum(self.count_stats[1], _STD_EPS)
        if self.num_rows > 1:
            pct = 1.0 - tf.cast(ids, tf.float32) / float(self.num_rows - 1)
        else:
            pct = tf.ones_like(z)
        return tf.stack([z, pct], axis=1), tf.sigmoid(z)[:, None]

    def _branch(self, mlp: list[tf.keras.layers.Dense], s: tf.Tensor) -> tf.Tensor:
        x = s
        for layer in mlp:
            x = layer(x)
        return x

    def gate(self, ids: tf.Tensor) -> tf.Tensor:
        """``a_i = sigmoid(norm(q_i))`` ``[n]`` for ids ``[n]`` (OOV path applied)."""
        if not self.built:
            self.build(None)
        return self._features(oov_safe(ids, self.num_rows))[1][:, 0]

    def logits(self, ids: tf.Tensor) -> tf.Tensor:
        """``h_i = a_i * hAML(s_i) + (1 - a_i) * lAML(s_i)``: ``[n, dim]`` for ids ``[n]``."""
        if not self.built:
            self.build(None)
        s, a = self._features(oov_safe(ids, self.num_rows))
        return a * self._branch(self.h_aml, s) + (1.0 - a) * self._branch(self.l_aml, s)

    def mask(self, ids: tf.Tensor) -> tf.Tensor:
        """Straight-through mask ``[n, dim]`` of in-range ids: exact 0/1 forward, soft gradient."""
        h = self.logits(ids)
        hard_len = tf.argmax(h, axis=-1, output_type=tf.int32) + 1
        m_hard = tf.sequence_mask(hard_len, self.dim, dtype=h.dtype)
        soft = tf.nn.softmax(h / self.temperature, axis=-1)
        m_soft = tf.math.cumsum(soft, axis=-1, reverse=True)
        return m_hard + (m_soft - tf.stop_gradient(m_soft))

    def call(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        flat = oov_safe(flat_ids(ids), self.num_rows)
        unique, where = tf.unique(flat)  # the MLPs run once per distinct id of the batch
        mask_u = self.mask(unique)
        masked = tf.nn.embedding_lookup(self.table, flat) * tf.gather(mask_u, where)
        out = pool_and_regularize(self, ids, masked)  # shape / pooling and the L2 loss
        if self.length_penalty > 0:
            mean_len = tf.reduce_sum(mask_u) / tf.cast(
                tf.maximum(tf.shape(mask_u)[0], 1) * self.dim, tf.float32
            )
            self.add_loss(self.length_penalty * mean_len)
        return out

    # ------------------------------------------------------------------ lengths / serving

    def lengths(self, chunk: int = 1 << 18) -> np.ndarray:
        """Learned lengths ``k_i`` (int64, ``1..dim``) of every id ``0..num_rows-1``, ``[num_rows]``."""
        if not self.built:
            self.build(None)
        parts = []
        for start in range(0, self.num_rows, chunk):
            ids = tf.range(start, min(start + chunk, self.num_rows), dtype=tf.int64)
            parts.append(tf.argmax(self.logits(ids), axis=-1).numpy() + 1)
        return np.concatenate(parts).astype(np.int64)

    def _mlp_params(self) -> int:
        total = 0
        for _ in range(2):
            width = 2
            for units in (*self.hidden, self.dim):
                total += width * units + units
                width = units
        return total

    def memory_bytes(self) -> dict[str, int]:
        """Bytes training holds and serving must hold (float32 values, int32/int64 offsets).

        ``train``: full table + both MLPs + ``counts`` + ``count_stats``, float32.
        ``serve``: the compact form of ``serving_form()``: ``sum_i k_i * 4`` bytes of values plus
        ``(num_rows + 1)`` row offsets, int32 (4 bytes each) while ``sum_i k_i < 2**31``, else int64
        (8 bytes). An unbuilt layer reports its initial lengths (``k_i = dim``).
        """
        train = 4 * (self.num_rows * self.dim + self._mlp_params() + self.num_rows + 2)
        total = int(self.lengths().sum()) if self.built else self.num_rows * self.dim
        return {"train": train, "serve": AMTLServingEmbedding.compact_bytes(self.num_rows, total)}

    def serving_form(self, name: str | None = None) -> AMTLServingEmbedding:
        """The compact serving layer: row ``i``'s first ``k_i`` entries only, same outputs."""
        if not self.built:
            self.build(None)
        k = self.lengths()
        table = self.table.numpy()
        keep = np.arange(self.dim)[None, :] < k[:, None]
        values = table[keep]  # row-major: row i's first k_i entries, rows in order
        row_splits = np.concatenate([[0], np.cumsum(k)])
        layer = AMTLServingEmbedding(
            self.num_rows,
            self.dim,
            combiner=self.combiner,
            total_values=int(values.shape[0]),
            name=name or f"{self.name}_serving",
        )
        layer.build(None)
        layer.values.assign(values)
        layer.row_splits.assign(row_splits.astype(layer.row_splits.dtype.as_numpy_dtype))
        return layer

    def options_config(self) -> dict[str, Any]:
        return {
            "hidden": list(self.hidden),
            "temperature": self.temperature,
            "length_bias": self.length_bias,
            "length_penalty": self.length_penalty,
        }


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class AMTLServingEmbedding(tf.keras.layers.Layer):
    """Compact serving form of a trained AMTLEmbedding: row ``i`` stores only ``k_i`` entries.

    Weights (non-trainable, filled by ``AMTLEmbedding.serving_form()`` or a restore):
    ``values`` float32 ``[total_values]`` (row ``i``'s first ``k_i`` entries, rows in order) and
    ``row_splits`` ``[num_rows + 1]``, int32 while ``total_values < 2**31``, else int64. The call
    gathers rows of ``RaggedTensor.from_row_splits(values, row_splits)`` and zero-pads each to
    ``dim``: ids int ``[batch]`` -> ``[batch, dim]`` (dense ``S`` -> ``S + [dim]``); ragged
    ``[batch, None]`` -> pooled ``[batch, dim]``; ids outside ``[0, num_rows)`` read row 0 (OOV).

    Args:
      num_rows: rows (ids) of the table.
      dim: output dimension (the training layer's maximum length).
      combiner: pooling of multi-valued ids: ``mean`` or ``sum``.
      total_values: ``sum_i k_i``, the length of ``values``.
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        combiner: str = "mean",
        total_values: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(trainable=False, **{k: v for k, v in kwargs.items() if k != "trainable"})
        check_common_args(num_rows, dim, combiner, 0.0)
        total_values = num_rows * dim if total_values is None else total_values
        if not num_rows <= total_values <= num_rows * dim:
            raise ValueError(
                f"total_values must be in [num_rows, num_rows * dim] = "
                f"[{num_rows}, {num_rows * dim}], got {total_values!r}"
            )
        self.num_rows = int(num_rows)
        self.dim = int(dim)
        self.combiner = combiner
        self.total_values = int(total_values)
        self.l2 = 0.0  # nothing to regularize (read by pool_and_regularize)
        self.splits_dtype = tf.int32 if self.total_values <= _INT32_MAX else tf.int64

    @staticmethod
    def compact_bytes(num_rows: int, total_values: int) -> int:
        """``total_values * 4`` + ``(num_rows + 1)`` offsets of 4 (int32) or 8 (int64) bytes."""
        offset = 4 if total_values <= _INT32_MAX else 8
        return total_values * 4 + (num_rows + 1) * offset

    def build(self, input_shape: Any = None) -> None:
        self.values = self.add_weight(
            name="values", shape=(self.total_values,), initializer="zeros", trainable=False
        )
        self.row_splits = self.add_weight(
            name="row_splits",
            shape=(self.num_rows + 1,),
            dtype=self.splits_dtype,
            initializer="zeros",
            trainable=False,
        )
        super().build(input_shape)

    def _lookup(self, ids: tf.Tensor) -> tf.Tensor:
        table = tf.RaggedTensor.from_row_splits(self.values, self.row_splits, validate=False)
        rows = tf.gather(table, oov_safe(ids, self.num_rows))
        return rows.to_tensor(default_value=0.0, shape=[None, self.dim])

    def call(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        return pool_and_regularize(self, ids, self._lookup(flat_ids(ids)))

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of ``values`` (float32) + ``row_splits``; training and serving hold the same."""
        n = self.compact_bytes(self.num_rows, self.total_values)
        return {"train": n, "serve": n}

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_rows": self.num_rows,
            "dim": self.dim,
            "combiner": self.combiner,
            "total_values": self.total_values,
        }
