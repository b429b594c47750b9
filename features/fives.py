"""FIVES: Feature Interaction Via Edge Search (Xie et al., KDD'21, arXiv 2007.14573).

FIVES finds which field crosses matter by learning the edges of a feature graph with one node
per field. Layer ``k`` of a graph network over that graph holds order-(k+1) interactions::

    n_i^(0) = e_i                                                  field embedding   [batch, d]
    p_i^(k) = sum_j A^(k)_ij W^(k)_j e_j / max(1, #{j: phi(A^(k)_ij) = 1})     (Eq. 2, MEAN)
    n_i^(k) = p_i^(k) * n_i^(k-1)                                  element-wise: order k+1
    logit   = MLP(concat_{i, k=0..K-1} n_i^(k))

with a learnable adjacency logit tensor ``H^(k)`` [F, F] per layer (Eq. 7, 8)::

    A^(1) = sigma(H^(1) / tau)
    A^(k) = rescale_tau(D^-1 phi(A^(k-1)) sigma(H^(k)))            k >= 2
    rescale_tau(a) = sigma(logit(a) / tau),   phi(a) = [a >= 0.5] (straight-through gradient)

``tau`` is annealed geometrically from ``tau_start`` (1) to ``tau_end`` (0.02) over the search,
closing the gap between the soft edges used in propagation and the binarized ones read out. The
diagonal (a field with itself) is masked. The search alternates (Algorithm 1, DARTS-style first
order): a step on the model weights (embeddings, W, MLP) on a training batch, then a step on the
adjacency logits H on a validation batch, whose loss adds ``sparsity * mean(A)`` (our addition,
a small push that turns edges nobody needs off; 0 disables it).

Crosses are read off the adjacencies (the paper's Fig. 2): an active edge i->l at layer 1 gives
the pair {i, l}; with an active edge i->j at layer 2 it gives the triple {i, l, j}, and so on.
A cross's ``strength`` is the product of its soft edges at tau = 1 along the path (the weight of
the product term e_i * W e_l * W e_j in n_i^(k)), maximized over the paths that give the same
field set; ``active`` says every edge on a best path is on after binarization. The ranking puts
all orders in one list, by strength.

Inputs: each field becomes ids (``encode``): categorical values by a training vocabulary (values
seen ``min_count`` times, at most ``max_vocab``; 1 = other, 0 = missing), a multi-categorical
cell as one value (its whole string), numeric values by ``numeric_bins`` training quantiles
(0 = missing). Fields with a single value or all values missing are skipped and reported; a
split without both classes is an error.

Shapes: ``ids`` int32 [batch, F]; ``H`` [K-1, F, F]; ``W`` [K-1, F, d, d]; logits [batch].
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import tensorflow as tf

from features.crosses import Cross, CrossArtifact
from features.schema import FeatureKind, Schema

Log = Callable[[str], None]
CONTRIBUTION_ROWS = 20_000  # validation rows that measure each cross's contribution
# The settings under which the search can see pure triples (docs/fives.md, "Pure triples"):
# a linear readout, cross strength by contribution, W^(k) starting at (F - 1) I, larger
# embeddings at a larger scale, every edge firmly on at the start and no sparsity push.
TRIPLE_SEARCH: dict[str, Any] = {
    "mlp": (),
    "strength": "contribution",
    "w_init": "degree",
    "embedding_dim": 16,
    "embedding_stddev": 0.3,
    "learning_rate": 0.01,
    "init_logit": 3.0,
    "sparsity": 0.0,
    "weight_decay": 1e-4,
}


class FivesDataError(ValueError):
    """The search data cannot be used (no fields left, a split with one class); says why."""


@dataclasses.dataclass(frozen=True)
class FivesConfig:
    """Search settings.

    Attributes:
      max_order: K, the highest cross order (layers: K - 1; the default 3 finds pairs and
        triples).
      embedding_dim: field embedding size d.
      mlp: hidden sizes of the readout MLP.
      dropout: dropout in the readout MLP (the paper's notes: 0.3).
      weight_decay: L2 on the embedding rows looked up in a batch and on W (the notes: 1e-4).
      epochs, batch_size: passes over the training split, rows per step.
      warmup_epochs: the first epochs update the model weights only (H frozen, tau at
        ``tau_start``), so the dense starting graph has learned something the adjacency
        updates can judge (the DARTS warm-up; the paper does not say).
      learning_rate: Adam step of the model weights (alpha_1).
      arch_learning_rate: Adam step of the adjacency logits H (alpha_2).
      tau_start, tau_end: temperature annealed geometrically over all steps.
      init_logit: starting value of every H entry (> 0: every edge starts on).
      sparsity: weight of mean(A) in the adjacency loss (0: none; not in the paper).
      validation_fraction: rows held out for the adjacency updates.
      numeric_bins: quantile buckets of numeric fields.
      max_vocab, min_count: vocabulary of categorical fields.
      seed: initialization, the split and the data order.
      screen_orders: cross orders also tested exhaustively by ``features.interaction_screen``
        (orders above ``max_order`` are skipped; ``()``: no screen). The screen finds pure
        interactions, which the edge search cannot (it needs an active sub-cross first).
      screen_alpha: family-wise error rate of the screen's tests (Bonferroni over each order).
      screen_max_cells: table cells per tested field set (sets the values kept per field).
      screen_rows: training rows the screen reads (0: all).
      screen_max_sets: an order with more field sets than this is not screened (reported):
        the screen's time grows with the sets times the rows (9,139 triples of 39 fields over
        640k rows: about 60 s).
    """

    max_order: int = 3
    embedding_dim: int = 8
    mlp: tuple[int, ...] = (64,)
    dropout: float = 0.0
    weight_decay: float = 1e-5
    epochs: int = 4
    warmup_epochs: int = 0
    finetune_epochs: int = 0
    batch_size: int = 2048
    learning_rate: float = 3e-3
    arch_learning_rate: float = 3e-2
    tau_start: float = 1.0
    tau_end: float = 0.02
    init_logit: float = 0.5
    sparsity: float = 0.01
    embedding_stddev: float = 0.05
    strength: str = "adjacency"
    w_init: str = "identity"
    heredity: bool = True
    validation_fraction: float = 0.2
    numeric_bins: int = 10
    max_vocab: int = 1_000
    min_count: int = 5
    seed: int = 0
    screen_orders: tuple[int, ...] = (2, 3)
    screen_alpha: float = 0.01
    screen_max_cells: int = 4096
    screen_rows: int = 0
    screen_max_sets: int = 20_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "mlp", tuple(int(u) for u in self.mlp))
        orders = self.screen_orders
        if isinstance(orders, int) and not isinstance(orders, bool):
            orders = (orders,)
        if not isinstance(orders, (tuple, list)) or any(
            not isinstance(o, int) or isinstance(o, bool) or o < 2 for o in orders
        ):
            raise ValueError(
                f"fives: screen_orders must be a list of integers >= 2 (or empty), got {orders!r}"
            )
        object.__setattr__(self, "screen_orders", tuple(sorted(set(orders))))
        if not 0 < self.screen_alpha < 1:
            raise ValueError(f"fives: screen_alpha must be in (0, 1), got {self.screen_alpha!r}")
        for key, lo in (("screen_max_cells", 4), ("screen_rows", 0), ("screen_max_sets", 1)):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"fives: {key} must be an integer >= {lo}, got {v!r}")
        ints = {
            "max_order": 2,
            "embedding_dim": 1,
            "epochs": 1,
            "batch_size": 1,
            "numeric_bins": 2,
            "max_vocab": 1,
            "min_count": 1,
        }
        for key, lo in ints.items():
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"fives: {key} must be an integer >= {lo}, got {v!r}")
        if any(u < 1 for u in self.mlp):
            raise ValueError(f"fives: mlp sizes must be >= 1, got {list(self.mlp)}")
        for key in ("learning_rate", "arch_learning_rate", "tau_start", "tau_end"):
            if not getattr(self, key) > 0:
                raise ValueError(f"fives: {key} must be > 0, got {getattr(self, key)}")
        if not isinstance(self.warmup_epochs, int) or not 0 <= self.warmup_epochs < self.epochs:
            raise ValueError(
                f"fives: warmup_epochs must be an integer in [0, epochs={self.epochs}), got "
                f"{self.warmup_epochs!r}"
            )
        if not isinstance(self.finetune_epochs, int) or self.finetune_epochs < 0:
            raise ValueError(
                f"fives: finetune_epochs must be an integer >= 0, got {self.finetune_epochs!r}"
            )
        if self.tau_end > self.tau_start:
            raise ValueError(
                f"fives: tau_end ({self.tau_end}) must be <= tau_start ({self.tau_start})"
            )
        if not 0 <= self.dropout < 1:
            raise ValueError(f"fives: dropout must be in [0, 1), got {self.dropout}")
        if self.weight_decay < 0 or self.sparsity < 0:
            raise ValueError("fives: weight_decay and sparsity must be >= 0")
        if self.strength not in ("adjacency", "contribution"):
            raise ValueError(
                f"fives: strength must be 'adjacency' or 'contribution', got {self.strength!r}"
            )
        if self.strength == "contribution" and (self.mlp or self.max_order > 3):
            raise ValueError(
                f"fives: strength = 'contribution' needs a linear readout (mlp = []) and "
                f"max_order <= 3, got mlp {list(self.mlp)} and max_order {self.max_order}"
            )
        if self.w_init not in ("identity", "degree"):
            raise ValueError(f"fives: w_init must be 'identity' or 'degree', got {self.w_init!r}")
        if not self.embedding_stddev > 0:
            raise ValueError(f"fives: embedding_stddev must be > 0, got {self.embedding_stddev}")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(
                f"fives: validation_fraction must be in (0, 1), got {self.validation_fraction}"
            )


# ---------------------------------------------------------------------------------------------
# Encoding fields as ids
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FieldEncoder:
    """Raw columns -> ids ``[rows, F]`` (see the module docstring); fit on training rows."""

    fields: list[str]
    kinds: list[str]  # "categorical" | "numeric"
    vocabs: dict[str, pa.Array]
    boundaries: dict[str, list[float]]
    skipped: list[dict[str, str]]

    @property
    def vocab_sizes(self) -> list[int]:
        """Rows per field: 0 missing, 1 other (categorical), then values or buckets."""
        out = []
        for name, kind in zip(self.fields, self.kinds, strict=True):
            if kind == "numeric":
                out.append(len(self.boundaries[name]) + 2)
            else:
                out.append(len(self.vocabs[name]) + 2)
        return out

    def transform(self, table: pa.Table) -> np.ndarray:
        cols = []
        for name, kind in zip(self.fields, self.kinds, strict=True):
            col = table.column(name)
            if kind == "numeric":
                v = _float_values(col)
                b = np.asarray(self.boundaries[name], np.float32)
                ids = np.searchsorted(b, v, side="right") + 1
                ids[~np.isfinite(v)] = 0
            else:
                s = _string_values(col)
                idx = pc.index_in(s, value_set=self.vocabs[name])
                ids = pc.fill_null(pc.add(idx, 2), 1).to_numpy(zero_copy_only=False)
                missing = pc.fill_null(pc.equal(s, ""), True).to_numpy(zero_copy_only=False)
                ids = np.where(missing, 0, ids)
            cols.append(np.asarray(ids, np.int32))
        return np.stack(cols, axis=1) if cols else np.zeros((table.num_rows, 0), np.int32)


def _string_values(col: pa.ChunkedArray) -> pa.ChunkedArray:
    col = pc.cast(col, pa.string())
    if pa.types.is_integer(col.type):  # pragma: no cover - cast above makes it a string
        return col
    return col


def _float_values(col: pa.ChunkedArray) -> np.ndarray:
    v = pc.cast(col, pa.float32())
    return pc.fill_null(v, float("nan")).to_numpy(zero_copy_only=False).astype(np.float32)


def read_table(schema: Schema, files: Sequence[Any], max_rows: int = 0) -> pa.Table:
    """The model inputs and label of Parquet ``files`` as one Arrow table (validated batches,
    the first ``max_rows`` rows when > 0)."""
    from features.dataset import iter_record_batches

    batches, rows = [], 0
    for rb in iter_record_batches(schema, list(files)):
        batches.append(rb)
        rows += rb.num_rows
        if max_rows and rows >= max_rows:
            break
    if not batches:
        raise FivesDataError(f"fives: no rows in {[str(f) for f in files]}")
    table = pa.Table.from_batches(batches)
    return table.slice(0, max_rows) if max_rows else table


def searchable_fields(schema: Schema) -> list[str]:
    """The schema's categorical, multi-categorical and numeric model inputs (not crosses)."""
    return [f.name for f in schema.model_inputs]


def fit_encoder(
    schema: Schema,
    table: pa.Table,
    fields: Sequence[str] | None = None,
    numeric_bins: int = 10,
    max_vocab: int = 1_000,
    min_count: int = 5,
) -> FieldEncoder:
    """Vocabularies and numeric quantiles of ``table``; skips (and reports) useless fields.

    A field is skipped when its rows are all missing, or when they hold a single value (a
    numeric field with one distinct finite value, a categorical field with one distinct value).
    """
    names = list(fields) if fields is not None else searchable_fields(schema)
    kept, kinds, skipped = [], [], []
    vocabs: dict[str, pa.Array] = {}
    boundaries: dict[str, list[float]] = {}
    for name in names:
        spec = schema.field(name)
        if not spec.is_model_input:
            raise ValueError(
                f"fives: field {name!r} is {spec.kind.value}; only categorical, "
                f"multi_categorical and numeric fields can be crossed"
            )
        if name not in table.column_names:
            raise ValueError(f"fives: the data has no column {name!r}")
        col = table.column(name)
        if spec.kind == FeatureKind.NUMERIC:
            v = _float_values(col)
            v = v[np.isfinite(v)]
            if v.size == 0:
                skipped.append({"field": name, "reason": "all values missing"})
                continue
            if np.unique(v[: min(v.size, 1_000_000)]).size < 2:
                skipped.append({"field": name, "reason": "a single value"})
                continue
            qs = np.linspace(0, 1, numeric_bins + 1)[1:-1]
            b = np.unique(np.quantile(v, qs).astype(np.float32))
            boundaries[name] = [float(x) for x in b]
            kinds.append("numeric")
        else:
            s = pc.drop_null(_string_values(col))
            s = pc.filter(s, pc.not_equal(s, ""))
            if len(s) == 0:
                skipped.append({"field": name, "reason": "all values missing"})
                continue
            counts = pc.value_counts(s)
            values, freq = counts.field("values"), counts.field("counts").to_numpy()
            if len(values) < 2:
                skipped.append({"field": name, "reason": "a single value"})
                continue
            order = np.lexsort((np.arange(len(freq)), -freq))
            order = order[freq[order] >= min_count][:max_vocab]
            vocabs[name] = values.take(pa.array(order, pa.int64()))
            kinds.append("categorical")
        kept.append(name)
    return FieldEncoder(kept, kinds, vocabs, boundaries, skipped)


# ---------------------------------------------------------------------------------------------
# The math: adjacency (Eq. 7-8) and propagation (Eq. 2), as plain functions
# ---------------------------------------------------------------------------------------------


def rescale(a: tf.Tensor, tau: tf.Tensor | float) -> tf.Tensor:
    """Eq. 8: ``sigma(logit(a) / tau)``; a in (0, 1)."""
    a = tf.clip_by_value(a, 1e-6, 1.0 - 1e-6)
    return tf.sigmoid((tf.math.log(a) - tf.math.log1p(-a)) / tau)


def binarize(a: tf.Tensor) -> tf.Tensor:
    """``phi(a) = [a >= 0.5]`` forward, identity gradient (straight-through)."""
    hard = tf.cast(a >= 0.5, a.dtype)
    return a + tf.stop_gradient(hard - a)


def adjacency(h: tf.Tensor, tau: tf.Tensor | float, heredity: bool = True) -> list[tf.Tensor]:
    """Eq. 7: soft adjacency per layer from the logits ``h`` [L, F, F]; diagonal masked.

    ``heredity=False`` drops Eq. 7's dependence on the layer below: every layer is
    ``sigma(H^(k) / tau)`` (each layer-k edge has its own logit).
    """
    num_fields = tf.shape(h)[1]
    off_diag = 1.0 - tf.eye(num_fields, dtype=h.dtype)
    out = [tf.sigmoid(h[0] / tau) * off_diag]
    for k in range(1, h.shape[0]):
        if not heredity:
            out.append(tf.sigmoid(h[k] / tau) * off_diag)
            continue
        prev = binarize(out[-1])
        degree = tf.reduce_sum(tf.stop_gradient(tf.round(prev)), axis=1, keepdims=True)
        mean = tf.matmul(prev, tf.sigmoid(h[k])) / tf.maximum(degree, 1.0)
        out.append(rescale(mean, tau) * off_diag * tf.cast(degree > 0, h.dtype))
    return out


def propagate(e: tf.Tensor, adj: list[tf.Tensor], w: tf.Tensor) -> list[tf.Tensor]:
    """Eq. 2: node states ``[n^(0), .., n^(L)]``, each [batch, F, d], from embeddings ``e``."""
    states = [e]
    for k, a in enumerate(adj):
        we = tf.einsum("bfd,fde->bfe", e, w[k])
        active = tf.reduce_sum(tf.stop_gradient(tf.round(binarize(a))), axis=1)
        p = tf.einsum("ij,bjd->bid", a, we) / tf.maximum(active, 1.0)[None, :, None]
        states.append(p * states[-1])
    return states


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FivesNetwork(tf.keras.layers.Layer):
    """The FIVES graph network: ids [batch, F] -> logits [batch] (see the module docstring).

    Args:
      vocab_sizes: rows of each field's embedding.
      embedding_dim: d.
      max_order: K (K - 1 propagation layers with their own adjacency logits).
      mlp: readout hidden sizes.
      dropout: readout dropout.
      init_logit: starting adjacency logit.
      weight_decay: L2 on the looked-up embedding rows and W (added to ``losses``).
    """

    def __init__(
        self,
        vocab_sizes: Sequence[int],
        embedding_dim: int = 8,
        max_order: int = 3,
        mlp: Sequence[int] = (64,),
        dropout: float = 0.0,
        init_logit: float = 0.5,
        weight_decay: float = 0.0,
        embedding_stddev: float = 0.05,
        w_init: str = "identity",
        heredity: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.vocab_sizes = [int(v) for v in vocab_sizes]
        if len(self.vocab_sizes) < 2 or min(self.vocab_sizes) < 1:
            raise ValueError(
                f"FivesNetwork needs two or more fields with >= 1 row, got {self.vocab_sizes}"
            )
        if embedding_dim < 1 or max_order < 2:
            raise ValueError(
                f"embedding_dim must be >= 1 and max_order >= 2, got {embedding_dim}, {max_order}"
            )
        if not 0 <= dropout < 1 or weight_decay < 0:
            raise ValueError(
                f"dropout in [0, 1) and weight_decay >= 0, got {dropout}, {weight_decay}"
            )
        self.embedding_dim = int(embedding_dim)
        self.max_order = int(max_order)
        self.mlp_sizes = [int(u) for u in mlp]
        self.dropout = float(dropout)
        self.init_logit = float(init_logit)
        self.weight_decay = float(weight_decay)
        if not embedding_stddev > 0:
            raise ValueError(f"embedding_stddev must be > 0, got {embedding_stddev}")
        self.embedding_stddev = float(embedding_stddev)
        if w_init not in ("identity", "degree"):
            raise ValueError(f"w_init must be 'identity' or 'degree', got {w_init!r}")
        self.w_init = w_init
        self.heredity = bool(heredity)
        self.offsets = tf.constant(np.cumsum([0, *self.vocab_sizes[:-1]]), tf.int32)
        self.hidden = [tf.keras.layers.Dense(u, activation="relu") for u in self.mlp_sizes]
        self.drop = tf.keras.layers.Dropout(self.dropout)
        self.out = tf.keras.layers.Dense(1)

    @property
    def num_fields(self) -> int:
        return len(self.vocab_sizes)

    def build(self, input_shape: Any) -> None:
        f, d, layers = self.num_fields, self.embedding_dim, self.max_order - 1
        self.table = self.add_weight(
            name="embeddings",
            shape=(sum(self.vocab_sizes), d),
            initializer=tf.keras.initializers.RandomNormal(stddev=self.embedding_stddev),
        )
        scale = float(f - 1) if self.w_init == "degree" else 1.0
        eye = np.tile(scale * np.eye(d, dtype=np.float32), (layers, f, 1, 1))
        self.w = self.add_weight(
            name="w",
            shape=(layers, f, d, d),
            initializer=tf.keras.initializers.Constant(eye),
        )
        self.h = self.add_weight(
            name="adjacency_logits",
            shape=(layers, f, f),
            initializer=tf.keras.initializers.Constant(self.init_logit),
        )
        self.tau = self.add_weight(
            name="tau", shape=(), initializer=tf.keras.initializers.Constant(1.0), trainable=False
        )
        width = f * d * self.max_order
        for layer in self.hidden:
            layer.build((None, width))
            width = layer.units
        self.out.build((None, width))
        super().build(input_shape)

    @property
    def arch_variables(self) -> list[tf.Variable]:
        return [self.h]

    @property
    def weight_variables(self) -> list[tf.Variable]:
        return [v for v in self.trainable_variables if v is not self.h]

    def call(self, ids: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        ids = tf.cast(ids, tf.int32)
        e = tf.gather(self.table, ids + self.offsets)
        adj = adjacency(self.h, self.tau, self.heredity)
        states = propagate(e, adj, self.w)
        z = tf.concat(
            [tf.reshape(s, (-1, self.num_fields * self.embedding_dim)) for s in states], 1
        )
        for layer in self.hidden:
            z = self.drop(layer(z), training=training)
        if self.weight_decay:
            self.add_loss(
                self.weight_decay
                * (tf.reduce_mean(tf.reduce_sum(tf.square(e), [1, 2])) + tf.nn.l2_loss(self.w))
            )
        return self.out(z)[:, 0]

    def adjacency_at(self, tau: float = 1.0) -> list[np.ndarray]:
        """Soft adjacencies [F, F] per layer at temperature ``tau`` (binarization is the same
        at every tau: a >= 0.5 iff its logit >= 0)."""
        return [a.numpy() for a in adjacency(tf.convert_to_tensor(self.h), tau, self.heredity)]

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocab_sizes": self.vocab_sizes,
            "embedding_dim": self.embedding_dim,
            "max_order": self.max_order,
            "mlp": self.mlp_sizes,
            "dropout": self.dropout,
            "init_logit": self.init_logit,
            "weight_decay": self.weight_decay,
            "embedding_stddev": self.embedding_stddev,
            "w_init": self.w_init,
            "heredity": self.heredity,
        }


# ---------------------------------------------------------------------------------------------
# Reading crosses off the adjacencies
# ---------------------------------------------------------------------------------------------


def extract_crosses(
    adj: Sequence[np.ndarray], fields: Sequence[str], beam: int = 8
) -> list[tuple[tuple[str, ...], float, bool]]:
    """Ranked ``(fields, strength, active)`` of every cross the adjacencies ``adj`` hold.

    Order k+1 crosses are the paths root i -> l_1 (layer 1) -> ... with one neighbour per layer
    among the ``beam`` strongest of each layer (all of them when F <= beam + 1): strength
    ``prod_k A^(k)[i, l_k]``, the best path per field set. Sorted by strength, then order.
    """
    f = len(fields)
    best: dict[frozenset[int], tuple[float, tuple[int, ...], bool]] = {}
    for i in range(f):
        tops = [
            [j for j in np.argsort(-a[i], kind="stable")[: max(beam, 1)] if j != i] for a in adj
        ]
        for depth in range(1, len(adj) + 1):
            for path in itertools.product(*tops[:depth]):
                members = (i, *path)
                if len(set(members)) != len(members):
                    continue
                s = float(np.prod([adj[k][i, j] for k, j in enumerate(path)]))
                active = all(adj[k][i, j] >= 0.5 for k, j in enumerate(path))
                key = frozenset(members)
                if key not in best or s > best[key][0]:
                    best[key] = (s, members, active)
    ranked = sorted(best.values(), key=lambda t: (-t[0], -len(t[1]), t[1]))
    return [(tuple(fields[m] for m in sorted(members)), s, act) for s, members, act in ranked]


def contributions(
    net: FivesNetwork, ids: np.ndarray, fields: Sequence[str], chunk: int = 128
) -> list[tuple[tuple[str, ...], float, bool]]:
    """Ranked ``(fields, strength, active)`` of pairs and triples by what they add to the logit.

    Needs a linear readout (``mlp = ()``) and ``max_order <= 3``. The logit is then a sum of
    product terms, each a function of the values of one field set::

        logit = b + sum_i w0_i . e_i
                  + sum_{i,l} w1_i . (e_i * a1_il W1_l e_l)                         pairs {i, l}
                  + sum_{i,l,j} w2_i . (e_i * a1_il W1_l e_l * a2_ij W2_j e_j)    {i, l, j}

    with ``a`` the network's adjacency divided by the node's active degree (as in ``propagate``).
    Each term is measured on centered embeddings ``e_i - mean(e_i)`` (the mean over ``ids``):
    with independent fields that is its pure interaction part (the ANOVA projection: its mean
    over any one field's values is zero), so a cross's main effects and, for a triple, its pair
    effects do not count towards it. A cross's contribution is the sum of its terms over every path that gives its field set
    (a pair from nodes i and l; a triple from its 6 orderings; a layer-2 term with l = j belongs
    to the pair {i, l}); its raw strength is that contribution's standard deviation over ``ids``
    (logit units), and ``strength`` divides by the largest one, so the top cross has 1.
    ``active``: every edge of some path is on after binarization.

    Shapes: ``ids`` int32 [rows, F]; per chunk the layer-2 terms are [chunk, F, F, F].
    """
    if net.mlp_sizes or net.max_order > 3:
        raise ValueError(
            f"contributions need a linear readout (mlp = ()) and max_order <= 3, got mlp "
            f"{net.mlp_sizes} and max_order {net.max_order}"
        )
    f, d, layers = net.num_fields, net.embedding_dim, net.max_order - 1
    adj = adjacency(tf.convert_to_tensor(net.h), net.tau, net.heredity)
    hard = [np.asarray(a.numpy() >= 0.5) for a in adj]
    norm = []
    for a in adj:
        active = tf.reduce_sum(tf.round(binarize(a)), axis=1)
        norm.append(a / tf.maximum(active, 1.0)[:, None])
    kernel = tf.reshape(net.out.kernel[:, 0], (layers + 1, f, d))
    s1 = np.zeros((f, f))
    q1 = np.zeros((f, f))
    s2 = np.zeros((f, f, f))
    q2 = np.zeros((f, f, f))
    rows = 0
    mean = np.zeros((f, d))
    for start in range(0, len(ids), chunk):
        x = tf.cast(ids[start : start + chunk], tf.int32)
        mean += tf.reduce_sum(tf.gather(net.table, x + net.offsets), 0).numpy()
    mean = tf.constant(mean / max(len(ids), 1), net.table.dtype)
    for start in range(0, len(ids), chunk):
        x = tf.cast(ids[start : start + chunk], tf.int32)
        e = tf.gather(net.table, x + net.offsets) - mean  # [b, F, d], centered
        we1 = tf.einsum("bfd,fde->bfe", e, net.w[0])
        # t1[b, i, l] = a1_il * w1_i . (e_i * W1_l e_l)
        t1 = tf.einsum("il,bid,bld->bil", norm[0], e * kernel[1][None], we1)
        pair = t1 + tf.transpose(t1, (0, 2, 1))
        if layers == 2:
            we2 = tf.einsum("bfd,fde->bfe", e, net.w[1])
            # t2[b, i, l, j] = a1_il a2_ij w2_i . (e_i * W1_l e_l * W2_j e_j)
            t2 = tf.einsum(
                "il,ij,bid,bld,bjd->bilj", norm[0], norm[1], e * kernel[2][None], we1, we2
            )
            diag = tf.linalg.diag_part(t2)  # [b, i, l]: l = j, the pair {i, l}
            pair += diag + tf.transpose(diag, (0, 2, 1))
            t2 = t2 - tf.linalg.diag(diag)
            sym = tf.add_n([tf.transpose(t2, (0, *p)) for p in itertools.permutations((1, 2, 3))])
            s2 += tf.reduce_sum(sym, 0).numpy()
            q2 += tf.reduce_sum(tf.square(sym), 0).numpy()
        s1 += tf.reduce_sum(pair, 0).numpy()
        q1 += tf.reduce_sum(tf.square(pair), 0).numpy()
        rows += int(x.shape[0])
    n = max(rows, 1)
    std1 = np.sqrt(np.maximum(q1 / n - (s1 / n) ** 2, 0.0))
    std2 = np.sqrt(np.maximum(q2 / n - (s2 / n) ** 2, 0.0))
    out: list[tuple[float, tuple[int, ...], bool]] = []
    for i, k in itertools.combinations(range(f), 2):
        act = bool(hard[0][i, k] or hard[0][k, i])
        out.append((float(std1[i, k]), (i, k), act))
    if layers == 2:
        for i, k, j in itertools.combinations(range(f), 3):
            act = any(
                hard[0][a, b] and hard[1][a, c] for a, b, c in itertools.permutations((i, k, j))
            )
            out.append((float(std2[i, k, j]), (i, k, j), act))
    top = max((s for s, _, _ in out), default=0.0) or 1.0
    ranked = sorted(out, key=lambda t: (-t[0], -len(t[1]), t[1]))
    return [(tuple(fields[m] for m in members), s / top, act) for s, members, act in ranked]


# ---------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FivesResult:
    """A finished search: the network, the encoder, the ranked crosses and the history."""

    network: FivesNetwork
    encoder: FieldEncoder
    crosses: list[Cross]
    history: list[dict[str, Any]]
    config: FivesConfig
    rows: dict[str, int]
    seconds: float
    # the edge search's own ranking before the interaction screen (the paper's read-out;
    # ``distinct`` left at 0)
    edge_crosses: list[Cross] = dataclasses.field(default_factory=list)
    # what the interaction screen tested and selected (``screen_and_rank``); empty: no screen
    screen: dict[str, Any] = dataclasses.field(default_factory=dict)

    def predict(self, ids: np.ndarray, batch_size: int = 16384) -> np.ndarray:
        """Click probabilities of encoded rows ``ids`` [rows, F] (FIVES as a predictor)."""
        out = [
            tf.sigmoid(self.network(ids[i : i + batch_size], training=False)).numpy()
            for i in range(0, len(ids), batch_size)
        ]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def artifact(self, schema_name: str) -> CrossArtifact:
        cfg = dataclasses.asdict(self.config)
        return CrossArtifact(
            method="fives",
            schema=schema_name,
            fields=list(self.encoder.fields),
            crosses=self.crosses,
            boundaries=dict(self.encoder.boundaries),
            skipped=list(self.encoder.skipped),
            search={
                "paper": "FIVES, Xie et al., KDD'21 (arXiv 2007.14573)",
                "config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                "rows": self.rows,
                "seconds": round(self.seconds, 2),
                "history": self.history,
                **({"screen": self.screen} if self.screen else {}),
            },
        )


def _check_labels(y: np.ndarray, split: str) -> None:
    pos = int(np.sum(y > 0.5))
    if pos == 0 or pos == y.size:
        what = "no positive" if pos == 0 else "no negative"
        raise FivesDataError(
            f"fives: the {split} split ({y.size:,} rows) has {what} labels; the search needs "
            f"both classes in the training and validation splits (more rows, or another "
            f"validation_fraction / seed)"
        )


def auc(y: np.ndarray, p: np.ndarray) -> float:
    """Rank AUC (ties get the average rank)."""
    from scipy.stats import rankdata

    y = np.asarray(y) > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(p)
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def split_rows(rows: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) row indices: a seeded random ``fraction`` goes to validation."""
    rng = np.random.default_rng(seed)
    is_val = rng.random(rows) < fraction
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def search(
    schema: Schema,
    table: pa.Table,
    config: FivesConfig = FivesConfig(),
    fields: Sequence[str] | None = None,
    log: Log = print,
    top_k_log: int = 5,
) -> FivesResult:
    """Runs the FIVES search on ``table`` (columns named by field, label included).

    Splits the rows into training and validation (``validation_fraction``), encodes the fields
    (fit on the training rows), and alternates weight and adjacency updates for ``epochs``
    epochs while annealing tau; logs one line per epoch. Returns the ranked crosses.

    Raises:
      FivesDataError: fewer than two usable fields, or a split without both classes.
    """
    t0 = time.time()
    label = schema.label.name
    if label not in table.column_names:
        raise FivesDataError(f"fives: the data has no label column {label!r}")
    if table.num_rows < 2:
        raise FivesDataError(f"fives: {table.num_rows} rows; the search needs more")
    y_all = _float_values(table.column(label))
    train_idx, val_idx = split_rows(table.num_rows, config.validation_fraction, config.seed)
    _check_labels(y_all[train_idx], "training")
    _check_labels(y_all[val_idx], "validation")
    train_table = table.take(pa.array(train_idx))
    encoder = fit_encoder(
        schema, train_table, fields, config.numeric_bins, config.max_vocab, config.min_count
    )
    for s in encoder.skipped:
        log(f"fives: skipping field {s['field']!r}: {s['reason']}")
    if len(encoder.fields) < 2:
        raise FivesDataError(
            f"fives: {len(encoder.fields)} usable field(s) ({encoder.fields}) after skipping "
            f"{[s['field'] for s in encoder.skipped]}; a cross needs two or more"
        )
    x_train = encoder.transform(train_table)
    x_val = encoder.transform(table.take(pa.array(val_idx)))
    y_train, y_val = y_all[train_idx], y_all[val_idx]
    log(
        f"fives: {len(encoder.fields)} fields, {len(train_idx):,} training and {len(val_idx):,} "
        f"validation rows, max order {config.max_order}, {config.epochs} epochs "
        f"(encoded in {time.time() - t0:.1f}s)"
    )
    tf.keras.utils.set_random_seed(config.seed)
    net = FivesNetwork(
        encoder.vocab_sizes,
        embedding_dim=config.embedding_dim,
        max_order=config.max_order,
        mlp=config.mlp,
        dropout=config.dropout,
        init_logit=config.init_logit,
        weight_decay=config.weight_decay,
        embedding_stddev=config.embedding_stddev,
        w_init=config.w_init,
        heredity=config.heredity,
        name="fives",
    )
    net(x_train[:2])
    with tf.init_scope():
        bias = math.log(max(y_train.mean(), 1e-6) / max(1 - y_train.mean(), 1e-6))
        net.out.bias.assign([bias])
    opt_w = tf.keras.optimizers.Adam(config.learning_rate)
    opt_h = tf.keras.optimizers.Adam(config.arch_learning_rate)
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    weight_vars, arch_vars = net.weight_variables, net.arch_variables
    off_diag = tf.constant(1.0 - np.eye(net.num_fields), tf.float32)

    @tf.function(reduce_retracing=True)
    def weight_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = bce(yb, net(xb, training=True))
            total = loss + tf.add_n(net.losses) if net.losses else loss
        opt_w.apply_gradients(zip(tape.gradient(total, weight_vars), weight_vars, strict=True))
        return loss

    @tf.function(reduce_retracing=True)
    def arch_step(xv: tf.Tensor, yv: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            val_loss = bce(yv, net(xv, training=False))
            adj = adjacency(net.h, net.tau, net.heredity)
            density = tf.add_n([tf.reduce_sum(a * off_diag) for a in adj]) / (
                len(adj) * tf.reduce_sum(off_diag)
            )
            arch_loss = val_loss + config.sparsity * density
        opt_h.apply_gradients(zip(tape.gradient(arch_loss, arch_vars), arch_vars, strict=True))
        return val_loss

    def rank(net: FivesNetwork) -> list[tuple[tuple[str, ...], float, bool]]:
        if config.strength == "contribution":
            return contributions(net, x_val[:CONTRIBUTION_ROWS], encoder.fields)
        return extract_crosses(net.adjacency_at(1.0), encoder.fields)

    bs = config.batch_size
    steps_per_epoch = max(1, math.ceil(len(x_train) / bs))
    total_steps = steps_per_epoch * (config.epochs - config.warmup_epochs)
    rng = np.random.default_rng(config.seed + 1)
    history: list[dict[str, Any]] = []
    global_step = 0
    val_pos = 0
    val_order = rng.permutation(len(x_val))
    epochs = config.epochs + config.finetune_epochs
    for epoch in range(epochs):
        t_epoch = time.time()
        order = rng.permutation(len(x_train))
        losses, val_losses = [], []
        warmup = epoch < config.warmup_epochs
        finetune = epoch >= config.epochs
        for s in range(steps_per_epoch):
            idx = order[s * bs : (s + 1) * bs]
            losses.append(float(weight_step(tf.constant(x_train[idx]), tf.constant(y_train[idx]))))
            if warmup or finetune:
                continue
            frac = global_step / max(total_steps - 1, 1)
            net.tau.assign(config.tau_start * (config.tau_end / config.tau_start) ** frac)
            if val_pos + bs > len(val_order):
                val_order, val_pos = rng.permutation(len(x_val)), 0
            vidx = val_order[val_pos : val_pos + bs]
            val_pos += bs
            val_losses.append(float(arch_step(tf.constant(x_val[vidx]), tf.constant(y_val[vidx]))))
            global_step += 1
        p_val = _predict(net, x_val)
        adj = net.adjacency_at(1.0)
        active = [int(np.sum(a >= 0.5)) for a in adj]
        ranked = rank(net)
        entry = {
            "epoch": epoch + 1,
            "tau": round(float(net.tau.numpy()), 4),
            "train_loss": round(float(np.mean(losses)), 5),
            "val_loss": round(float(np.mean(val_losses)), 5) if val_losses else None,
            "val_auc": round(auc(y_val, p_val), 5),
            "active_edges": active,
            "seconds": round(time.time() - t_epoch, 2),
        }
        history.append(entry)
        top = ", ".join(f"{'x'.join(c)}:{s:.2f}" for c, s, _ in ranked[:top_k_log])
        log(
            f"fives: epoch {epoch + 1}/{epochs} tau {entry['tau']:.3f} "
            f"loss {entry['train_loss']:.4f} "
            + (
                f"val loss {entry['val_loss']:.4f} "
                if val_losses
                else ("(fine-tune) " if finetune else "(warm-up) ")
            )
            + f"val auc {entry['val_auc']:.4f} active edges {active} "
            f"({entry['seconds']:.1f}s); top: {top}"
        )
    ranked = edge_ranked = rank(net)
    extras: dict[frozenset[str], tuple[str, float | None]] = {}
    screen_report: dict[str, Any] = {}
    if orders := [o for o in config.screen_orders if o <= min(config.max_order, x_train.shape[1])]:
        ranked, extras, screen_report = screen_and_rank(
            ranked, orders, config, encoder.fields, (x_train, y_train), (x_val, y_val), log
        )
    crosses = _with_distinct(ranked, encoder, x_train, extras=extras)
    return FivesResult(
        network=net,
        encoder=encoder,
        crosses=crosses,
        history=history,
        config=config,
        rows={"train": len(train_idx), "validation": len(val_idx)},
        seconds=time.time() - t0,
        edge_crosses=(
            _with_distinct(edge_ranked, encoder, x_train, limit=0)
            if edge_ranked is not ranked
            else crosses
        ),
        screen=screen_report,
    )


def screen_and_rank(
    ranked: list[tuple[tuple[str, ...], float, bool]],
    orders: Sequence[int],
    config: FivesConfig,
    fields: Sequence[str],
    train: tuple[np.ndarray, np.ndarray],
    validation: tuple[np.ndarray, np.ndarray],
    log: Log = print,
) -> tuple[
    list[tuple[tuple[str, ...], float, bool]],
    dict[frozenset[str], tuple[str, float | None]],
    dict[str, Any],
]:
    """Adds the interaction screen's significant crosses to a FIVES ranking and re-ranks.

    The screen (``features.interaction_screen``) tests every field set of each of ``orders``
    on the training rows. FIVES's active crosses and the screen's significant ones are
    measured on the validation rows (the pure-interaction effect, eta^2, cross-fitted against
    the training rows: one scale for every order); a screened cross whose effect does not
    recur there (<= 0) is not selected. The selected crosses come first, largest effect
    first; FIVES's other crosses follow in its order. Returns the new ranking,
    ``{field set: (source, effect)}`` and a report.
    """
    from features import interaction_screen as isc

    t0 = time.time()
    x_tr, y_tr = train
    x_va, y_va = validation
    if config.screen_rows and config.screen_rows < len(x_tr):
        x_tr, y_tr = x_tr[: config.screen_rows], y_tr[: config.screen_rows]
    caps: dict[int, isc.ValueCaps] = {}
    significant: list[tuple[str, ...]] = []
    report: dict[str, Any] = {"orders": {}}
    for order in orders:
        sets = math.comb(len(fields), order)
        if sets > config.screen_max_sets:
            reason = (
                f"{len(fields)} fields give {sets:,} sets of {order}, over screen_max_sets = "
                f"{config.screen_max_sets:,} (raise it, or search fewer --fields)"
            )
            report["orders"][str(order)] = {"skipped": reason}
            log(f"interaction screen: order {order} skipped: {reason}")
            continue
        tested, caps[order] = isc.screen(
            x_tr, y_tr, fields, order, config.screen_max_cells, log=log
        )
        zc = isc.critical_z(config.screen_alpha, len(tested))
        hits = [c for c in tested if c.z > zc]
        significant += [c.fields for c in hits]
        report["orders"][str(order)] = {
            "tested": len(tested),
            "critical_z": round(zc, 3),
            "significant": len(hits),
            "top": [("x".join(c.fields), round(c.z, 2)) for c in tested[:10]],
        }
        log(
            f"interaction screen: order {order}: {len(hits)} of {len(tested):,} significant "
            f"(z > {zc:.2f}); top: "
            + ", ".join(f"{'x'.join(c.fields)}:{c.z:.1f}" for c in tested[:5])
        )
    fives_active = {frozenset(f): f for f, st, active in ranked if active}
    screened = {frozenset(f): f for f in significant}
    candidates = list(fives_active) + [k for k in screened if k not in fives_active]
    for k in candidates:  # active FIVES crosses of an order the screen did not fit caps for
        if len(k) not in caps:
            caps[len(k)] = isc.fit_caps(x_tr, isc.levels_for(len(k), config.screen_max_cells))
    names = [fives_active.get(k) or screened[k] for k in candidates]
    measured = isc.held_out_effects((x_tr, y_tr), (x_va, y_va), fields, names, caps)
    strength = {frozenset(f): st for f, st, _ in ranked}
    extras: dict[frozenset[str], tuple[str, float | None]] = {}
    head, dropped = [], []
    for k, fs, effect in zip(candidates, names, measured, strict=True):
        if k not in fives_active and effect <= 0:
            dropped.append(("x".join(fs), round(effect, 6)))  # did not recur on new rows
            continue
        source = "+".join(
            s for s, on in (("fives", k in fives_active), ("screen", k in screened)) if on
        )
        extras[k] = (source, effect)
        head.append((fs, strength.get(k, 0.0), True, effect))
    head.sort(key=lambda c: -c[3])
    out = [(fs, st, active) for fs, st, active, _ in head]
    out += [(f, st, False) for f, st, _ in ranked if frozenset(f) not in extras]
    report["not_replicated"] = dropped
    report.update(
        selected=len(head),
        from_screen_only=sum(1 for fs, *_ in head if frozenset(fs) not in fives_active),
        seconds=round(time.time() - t0, 2),
    )
    log(
        f"interaction screen: {len(head)} selected crosses ({len(fives_active)} active in FIVES, "
        f"{report['from_screen_only']} from the screen only) ranked by held-out effect; "
        f"{len(dropped)} significant but not recurring on the validation rows "
        f"({report['seconds']:.1f}s)"
    )
    return out, extras, report


def _predict(net: FivesNetwork, ids: np.ndarray, batch_size: int = 16384) -> np.ndarray:
    out = [
        tf.sigmoid(net(ids[i : i + batch_size], training=False)).numpy()
        for i in range(0, len(ids), batch_size)
    ]
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def _with_distinct(
    ranked: list[tuple[tuple[str, ...], float, bool]],
    encoder: FieldEncoder,
    ids: np.ndarray,
    limit: int = 200,
    extras: dict[frozenset[str], tuple[str, float | None]] | None = None,
) -> list[Cross]:
    """Crosses with the count of distinct value tuples (of the first ``limit`` crosses).

    ``extras`` gives a field set's ``(source, effect)`` where the screen measured it.
    """
    col = {n: i for i, n in enumerate(encoder.fields)}
    sizes = np.asarray(encoder.vocab_sizes, np.int64)
    out = []
    for rank, (fields, strength, active) in enumerate(ranked):
        distinct = 0
        if rank < limit:
            key = np.zeros(len(ids), np.int64)
            for f in fields:
                key = key * sizes[col[f]] + ids[:, col[f]]
            distinct = int(np.unique(key).size)
        source, effect = (extras or {}).get(frozenset(fields), ("fives", None))
        out.append(
            Cross(
                fields=fields,
                strength=strength,
                active=active,
                distinct=distinct,
                source=source,
                effect=effect,
            )
        )
    return out
