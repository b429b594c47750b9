"""Pair statistics as extra dense model inputs, computed inside the model from RAW features.

Two layers with one interface, ``layer(features) -> [batch, n_pairs]`` float32, where
``features`` is the raw batch ``{field: [batch]}`` (strings or int64; multi-valued fields are
``separator``-joined strings) and column ``r`` is the statistic of pair ``r = (a, b)``:

* ``PairStatsGNN``: PCF-GNN (SIGIR'21, arXiv 2105.07752). Each value is mapped to its node
  (``StringLookup`` over the pre-training vocabulary; unknown values to the field's OOV node) and
  the statistic is predicted from the cached node vectors by the pre-trained edge head::

      p_uv = sigmoid(MLP([h_u ; h_v ; h_u * h_v ; R_r]))

  so every pair, also one never seen in the logs, gets a value. Serving holds
  ``O((N_a + N_b) * d)`` floats (plus the vocabularies) instead of one entry per seen pair.
* ``PairStatsTable``: the explicit statistics table, the baseline: the smoothed training CTR of
  every seen pair, keyed by a 63-bit fingerprint of ``"r\\x1fa\\x1fb"`` (sorted keys, binary
  search), and the prior for unseen pairs. It holds 12 bytes (int64 key + float32 value) per
  seen pair.

A multi-valued side yields the mean of the statistic over the cell's values. A missing side
(``""`` or int64 ``-1``; an empty multi-valued cell) yields the prior: there is no pair.
``output = "logit"`` returns ``logit(p)`` (well-scaled for linear terms and MLPs), ``"ctr"``
returns ``p``. All weights are frozen (pre-trained); they live in the layer as non-trainable
variables, so training checkpoints and the exported SavedModel hold them, and the model rebuilds
from ``get_config`` (shapes and vocabularies) before the checkpoint restores the values. This
module imports no ``features`` code: ``from_artifact`` and ``from_pairs`` take plain arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

OUTPUTS = ("logit", "ctr")
KEY_SEPARATOR = "\x1f"
_CLIP = 1e-4


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_." else "_" for c in name)


def _check_common(
    pairs: Sequence[Sequence[str]], separators: dict[str, str], prior: float, output: str
) -> list[list[str]]:
    if not pairs:
        raise ValueError("pair statistics need at least one field pair")
    out = []
    for p in pairs:
        if isinstance(p, str) or len(p) != 2 or p[0] == p[1]:
            raise ValueError(f"field pair {p!r}: expected two different field names")
        if p[0] in separators and p[1] in separators:
            raise ValueError(f"field pair {list(p)}: at most one side may be multi-valued")
        out.append([str(p[0]), str(p[1])])
    if output not in OUTPUTS:
        raise ValueError(f"output {output!r} is not one of {list(OUTPUTS)}")
    if not (0.0 < prior < 1.0):
        raise ValueError(f"prior must be a click rate in (0, 1), got {prior!r}")
    return out


def _as_strings(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(string values, missing mask): ``""`` and int ``-1`` are missing."""
    if x.dtype == tf.string:
        return x, tf.equal(x, "")
    missing = tf.equal(x, tf.cast(-1, x.dtype))
    return tf.strings.as_string(x), missing


def _logit(p: tf.Tensor) -> tf.Tensor:
    p = tf.clip_by_value(p, _CLIP, 1.0 - _CLIP)
    return tf.math.log(p) - tf.math.log1p(-p)


class _PairStatsBase(tf.keras.layers.Layer):
    """Shared plumbing: value expansion per pair, mean over multi-valued cells, output scale."""

    def __init__(
        self,
        pairs: Sequence[Sequence[str]],
        separators: dict[str, str] | None,
        prior: float,
        output: str,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.separators = dict(separators or {})
        self.prior = float(prior)
        self.output_scale = output
        self.pairs = _check_common(pairs, self.separators, self.prior, output)

    @property
    def output_dim(self) -> int:
        return len(self.pairs)

    @property
    def input_names(self) -> list[str]:
        return list(dict.fromkeys(f for p in self.pairs for f in p))

    def _pair_values(
        self, features: dict[str, tf.Tensor], a: str, b: str
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """Flat (a strings, b strings, present mask, row of each entry, batch size)."""
        xa, ma = _as_strings(features[a])
        xb, mb = _as_strings(features[b])
        batch = tf.shape(xa, out_type=tf.int64)[0]
        if a in self.separators or b in self.separators:
            multi_is_a = a in self.separators
            x, other, other_missing = (xa, xb, mb) if multi_is_a else (xb, xa, ma)
            sep = self.separators[a if multi_is_a else b]
            values = tf.strings.split(x, sep=sep)
            flat = values.flat_values
            rows = values.value_rowids()
            o = tf.gather(other, rows)
            present = tf.logical_and(
                tf.not_equal(flat, ""), tf.logical_not(tf.gather(other_missing, rows))
            )
            fa, fb = (flat, o) if multi_is_a else (o, flat)
            return fa, fb, present, rows, batch
        rows = tf.range(batch)
        present = tf.logical_not(tf.logical_or(ma, mb))
        return xa, xb, present, rows, batch

    def _combine(
        self, p: tf.Tensor, present: tf.Tensor, rows: tf.Tensor, batch: tf.Tensor
    ) -> tf.Tensor:
        """Mean of ``p`` over each row's present entries; the prior where a row has none."""
        w = tf.cast(present, tf.float32)
        total = tf.math.unsorted_segment_sum(p * w, rows, batch)
        count = tf.math.unsorted_segment_sum(w, rows, batch)
        out = tf.where(count > 0, total / tf.maximum(count, 1.0), self.prior)
        return _logit(out) if self.output_scale == "logit" else out

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "pairs": self.pairs,
            "separators": self.separators,
            "prior": self.prior,
            "output": self.output_scale,
        }


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class PairStatsGNN(_PairStatsBase):
    """PCF-GNN pair statistics from cached node vectors and the edge head (module docstring).

    Args:
      pairs: field pairs ``[[a, b], ...]``; output column ``r`` is pair ``r``.
      vocabularies: ``{field: node values}``; local id ``i + 1`` is value ``i``, 0 the OOV node.
      separators: ``{field: separator}`` of multi-valued fields.
      dim: node vector size; relation_dim: relation vector size.
      head_units: widths of the head's dense layers, the last one 1.
      prior: training click rate (the value of a pair with a missing side).
      output: ``logit`` or ``ctr``.
    """

    def __init__(
        self,
        pairs: Sequence[Sequence[str]],
        vocabularies: dict[str, list[str]],
        dim: int,
        relation_dim: int,
        head_units: Sequence[int],
        prior: float,
        separators: dict[str, str] | None = None,
        output: str = "logit",
        **kwargs: Any,
    ):
        super().__init__(pairs, separators, prior, output, **kwargs)
        self._keep_vocabularies(vocabularies)
        for f in self.input_names:
            if f not in self.vocabularies:
                raise ValueError(f"field {f!r} of the pairs has no node vocabulary")
            if not self.vocabularies[f]:
                raise ValueError(f"field {f!r}: the node vocabulary is empty")
        self.dim = int(dim)
        self.relation_dim = int(relation_dim)
        self.head_units = [int(u) for u in head_units]
        if self.dim < 1 or self.relation_dim < 1:
            raise ValueError(f"dim and relation_dim must be >= 1, got {dim}, {relation_dim}")
        if not self.head_units or self.head_units[-1] != 1 or min(self.head_units) < 1:
            raise ValueError(f"head_units must be positive and end with 1, got {head_units}")
        self.fields = [f for f in self.vocabularies if f in self.input_names]
        self.offsets, n = {}, 0
        for f in self.fields:
            self.offsets[f] = n
            n += len(self.vocabularies[f]) + 1
        self.num_nodes = n
        self._lookups = {
            f: tf.keras.layers.StringLookup(
                vocabulary=tuple(self.vocabularies[f]),  # a tuple: not tracked
                num_oov_indices=1,
                mask_token=None,
                name=f"nodes_{_safe(f)}",
            )
            for f in self.fields
        }

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _keep_vocabularies(self, vocabularies: dict[str, Sequence[Any]]) -> None:
        """``{field: [value, ...]}`` as plain data, outside Keras's tracking of lists and dicts
        (which every ``trainable_variables`` call would walk word by word)."""
        self.vocabularies = {f: [str(v) for v in vals] for f, vals in vocabularies.items()}

    def build(self, input_shape: Any) -> None:
        frozen = {"trainable": False, "initializer": "zeros"}
        self.node_table = self.add_weight(
            name="node_table", shape=(self.num_nodes, self.dim), **frozen
        )
        self.relation_table = self.add_weight(
            name="relation_table", shape=(len(self.pairs), self.relation_dim), **frozen
        )
        sizes = [3 * self.dim + self.relation_dim, *self.head_units]
        self.head_kernels, self.head_biases = [], []
        for i in range(len(self.head_units)):
            self.head_kernels.append(
                self.add_weight(name=f"head_{i}_kernel", shape=(sizes[i], sizes[i + 1]), **frozen)
            )
            self.head_biases.append(
                self.add_weight(name=f"head_{i}_bias", shape=(sizes[i + 1],), **frozen)
            )
        super().build(input_shape)

    def set_pretrained(
        self,
        nodes: np.ndarray,
        relations: np.ndarray,
        head: Sequence[tuple[np.ndarray, np.ndarray]],
    ) -> None:
        """Assigns the pre-trained arrays (``nodes`` rows in ``self.fields`` order)."""
        if not self.built:
            self.build(None)
        if nodes.shape != tuple(self.node_table.shape):
            raise ValueError(f"node table shape {nodes.shape}, expected {self.node_table.shape}")
        self.node_table.assign(nodes)
        self.relation_table.assign(relations)
        for (w, b), kv, bv in zip(head, self.head_kernels, self.head_biases, strict=True):
            kv.assign(w)
            bv.assign(b)

    @classmethod
    def from_artifact(
        cls,
        artifact: Any,
        pairs: Sequence[Sequence[str]] | None = None,
        output: str = "logit",
        name: str = "pcf_gnn_stats",
    ) -> PairStatsGNN:
        """A layer holding a pre-trained artifact (``features.crosses.pcf_artifact.PCFArtifact`` or anything
        with its attributes) for ``pairs`` (default: all its pairs; each must be one of them,
        either order)."""
        known = [tuple(p) for p in artifact.pairs]
        pairs = [tuple(p) for p in (pairs or known)]
        rel_index, oriented = [], []
        for p in pairs:
            if p in known:
                rel_index.append(known.index(p))
                oriented.append(p)
            elif (p[1], p[0]) in known:
                rel_index.append(known.index((p[1], p[0])))
                oriented.append((p[1], p[0]))
            else:
                raise ValueError(f"pair {list(p)} is not in the artifact; it has {known}")
        used = list(dict.fromkeys(f for p in oriented for f in p))
        fields = [f for f in artifact.fields if f in used]
        offsets = artifact.offsets
        nodes = np.concatenate(
            [artifact.nodes[offsets[f] : offsets[f] + len(artifact.vocab[f]) + 1] for f in fields]
        )
        layer = cls(
            pairs=oriented,
            vocabularies={f: artifact.vocab[f] for f in fields},
            dim=int(artifact.nodes.shape[1]),
            relation_dim=int(artifact.relations.shape[1]),
            head_units=[int(w.shape[1]) for w, _ in artifact.head],
            prior=float(artifact.prior),
            separators={f: s for f, s in artifact.multi.items() if f in used},
            output=output,
            name=name,
        )
        layer.set_pretrained(nodes, artifact.relations[rel_index], artifact.head)
        return layer

    def _nodes(self, field: str, values: tf.Tensor) -> tf.Tensor:
        ids = tf.cast(self._lookups[field](values), tf.int64)
        return tf.gather(self.node_table, ids + self.offsets[field])

    def call(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """Raw features -> ``[batch, n_pairs]`` predicted statistics (``output`` scale)."""
        cols = []
        for r, (a, b) in enumerate(self.pairs):
            xa, xb, present, rows, batch = self._pair_values(features, a, b)
            hu, hv = self._nodes(a, xa), self._nodes(b, xb)
            rel = tf.broadcast_to(self.relation_table[r], [tf.shape(hu)[0], self.relation_dim])
            x = tf.concat([hu, hv, hu * hv, rel], axis=1)
            for i, (w, bias) in enumerate(zip(self.head_kernels, self.head_biases, strict=True)):
                x = tf.matmul(x, w) + bias
                if i < len(self.head_kernels) - 1:
                    x = tf.nn.relu(x)
            cols.append(self._combine(tf.sigmoid(x[:, 0]), present, rows, batch))
        return tf.stack(cols, axis=1)

    def memory_bytes(self) -> dict[str, int]:
        """What serving holds: float32 node/relation/head weights; vocabulary string bytes plus
        an 8-byte offset per value."""
        params = 4 * (self.num_nodes * self.dim + len(self.pairs) * self.relation_dim)
        sizes = [3 * self.dim + self.relation_dim, *self.head_units]
        params += 4 * sum(sizes[i] * sizes[i + 1] + sizes[i + 1] for i in range(len(sizes) - 1))
        vocab = sum(len(v.encode()) + 8 for f in self.fields for v in self.vocabularies[f])
        return {"parameters": params, "vocabulary": vocab, "total": params + vocab}

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocabularies": self.vocabularies,
            "dim": self.dim,
            "relation_dim": self.relation_dim,
            "head_units": self.head_units,
        }


def pair_keys(relation: int, a: Sequence[str], b: Sequence[str]) -> np.ndarray:
    """63-bit fingerprints of ``"relation\\x1fa\\x1fb"``, int64 ``[n]`` (the table's keys)."""
    if len(a) == 0:
        return np.zeros([0], np.int64)
    text = tf.strings.join(
        [tf.constant(str(relation)), tf.constant(list(a)), tf.constant(list(b))],
        separator=KEY_SEPARATOR,
    )
    return tf.strings.to_hash_bucket_fast(text, 2**63 - 1).numpy()


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class PairStatsTable(_PairStatsBase):
    """The explicit statistics table (module docstring): seen pair -> smoothed CTR, else prior.

    Args:
      pairs: field pairs ``[[a, b], ...]``.
      num_keys: entries in the table (all pairs together).
      prior: the value of unseen pairs (and of a missing side).
      separators: ``{field: separator}`` of multi-valued fields.
      output: ``logit`` or ``ctr``.
    """

    def __init__(
        self,
        pairs: Sequence[Sequence[str]],
        num_keys: int,
        prior: float,
        separators: dict[str, str] | None = None,
        output: str = "logit",
        **kwargs: Any,
    ):
        super().__init__(pairs, separators, prior, output, **kwargs)
        if not isinstance(num_keys, int) or num_keys < 0:
            raise ValueError(f"num_keys must be an integer >= 0, got {num_keys!r}")
        self.num_keys = num_keys

    def build(self, input_shape: Any) -> None:
        self.keys = self.add_weight(
            name="keys", shape=(self.num_keys,), dtype=tf.int64, trainable=False,
            initializer="zeros",
        )  # fmt: skip
        self.values = self.add_weight(
            name="values", shape=(self.num_keys,), trainable=False, initializer="zeros"
        )
        super().build(input_shape)

    @classmethod
    def from_pairs(
        cls,
        pairs: Sequence[Sequence[str]],
        entries: Sequence[tuple[Sequence[str], Sequence[str], np.ndarray]],
        prior: float,
        separators: dict[str, str] | None = None,
        output: str = "logit",
        name: str = "pair_stats_table",
    ) -> PairStatsTable:
        """A table from ``entries[r] = (a values, b values, statistic)`` of each pair ``r``."""
        if len(entries) != len(pairs):
            raise ValueError(f"{len(entries)} entry lists for {len(pairs)} pairs")
        keys, values = [], []
        for r, (a, b, stat) in enumerate(entries):
            stat = np.asarray(stat, np.float64)
            if not (len(a) == len(b) == len(stat)):
                raise ValueError(f"pair {list(pairs[r])}: values and statistics differ in length")
            if stat.size and not (np.isfinite(stat).all() and stat.min() >= 0 and stat.max() <= 1):
                raise ValueError(f"pair {list(pairs[r])}: statistics must be finite, in [0, 1]")
            keys.append(pair_keys(r, a, b))
            values.append(stat.astype(np.float32))
        k = np.concatenate(keys) if keys else np.zeros([0], np.int64)
        v = np.concatenate(values) if values else np.zeros([0], np.float32)
        order = np.argsort(k, kind="stable")
        k, v = k[order], v[order]
        if k.size > 1 and (np.diff(k) == 0).any():
            raise ValueError("two pairs share a 63-bit key (duplicate pair or fingerprint clash)")
        layer = cls(pairs, int(k.size), prior, separators, output, name=name)
        layer.build(None)
        layer.keys.assign(k)
        layer.values.assign(v)
        return layer

    def call(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """Raw features -> ``[batch, n_pairs]`` table statistics (``output`` scale)."""
        cols = []
        for r, (a, b) in enumerate(self.pairs):
            xa, xb, present, rows, batch = self._pair_values(features, a, b)
            if self.num_keys == 0:
                p = tf.fill(tf.shape(xa), tf.constant(self.prior, tf.float32))
            else:
                text = tf.strings.join([tf.fill(tf.shape(xa), str(r)), xa, xb], KEY_SEPARATOR)
                q = tf.strings.to_hash_bucket_fast(text, 2**63 - 1)
                idx = tf.searchsorted(self.keys, q)
                idx = tf.minimum(idx, self.num_keys - 1)
                found = tf.equal(tf.gather(self.keys, idx), q)
                p = tf.where(found, tf.gather(self.values, idx), self.prior)
            cols.append(self._combine(p, present, rows, batch))
        return tf.stack(cols, axis=1)

    def memory_bytes(self) -> dict[str, int]:
        """What serving holds: an int64 key and a float32 statistic per seen pair."""
        n = 12 * self.num_keys
        return {"parameters": n, "vocabulary": 0, "total": n}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_keys": self.num_keys}
