"""Model blocks: MLP towers, feature interactions and the wide (linear) term.

Every interaction has one calling convention, ``interaction(embeddings, dense) -> [batch, k]``:
``embeddings`` is a list of ``[batch, d_f]`` field vectors, ``dense`` a ``[batch, n]`` matrix of
numeric features or ``None``.

* ``ConcatInteraction``: ``[e_1, ..., e_F, dense]`` (the DNN's input).
* ``FMInteraction``: the factorization machine's pairwise term
  ``sum_{i<j} <v_i, v_j> = 1/2 * sum_k ((sum_i v_ik)^2 - sum_i v_ik^2)`` over the field vectors
  and one learned vector per numeric feature scaled by its value (Rendle, ICDM 2010);
  output ``[batch, 1]``.
* ``CrossInteraction``: DCN-v2's cross network on the concatenation ``x_0``:
  ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l`` (Wang et al., WWW 2021), with
  ``tfrs.layers.dcn.Cross`` (low rank when ``projection_dim`` is set); output ``[batch, D]``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_recommenders as tfrs


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class MLP(tf.keras.layers.Layer):
    """Dense layers with ReLU and optional dropout: ``[batch, k] -> [batch, units[-1]]``."""

    def __init__(self, units: list[int], dropout: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        units = [int(u) for u in units]
        if not units or any(u < 1 for u in units):
            raise ValueError(f"units must be a non-empty list of positive sizes, got {units}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.units = units
        self.dropout = float(dropout)
        self._dense = [
            tf.keras.layers.Dense(u, activation="relu", name=f"dense_{i}")
            for i, u in enumerate(units)
        ]
        self._drop = [tf.keras.layers.Dropout(dropout) for _ in units] if dropout else []

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        for i, layer in enumerate(self._dense):
            x = layer(x)
            if self._drop:
                x = self._drop[i](x, training=training)
        return x

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units, "dropout": self.dropout}


def _concat(embeddings: list[tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor:
    parts = list(embeddings) + ([dense] if dense is not None else [])
    if not parts:
        raise ValueError("an interaction needs at least one field embedding or dense feature")
    return tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class ConcatInteraction(tf.keras.layers.Layer):
    """``[e_1, ..., e_F, dense]`` concatenated: ``[batch, sum(d_f) + n]``."""

    def call(self, embeddings: list[tf.Tensor], dense: tf.Tensor | None = None) -> tf.Tensor:
        return _concat(embeddings, dense)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FMInteraction(tf.keras.layers.Layer):
    """FM pairwise term over equal-dimension field vectors: ``[batch, 1]``.

    Args:
      num_dense: numeric features; each gets a learned ``dim`` vector scaled by its value.
      dim: the field vectors' dimension.
    """

    def __init__(self, num_dense: int, dim: int, **kwargs: Any):
        super().__init__(**kwargs)
        if num_dense < 0 or dim < 1:
            raise ValueError(f"need num_dense >= 0 and dim >= 1, got {num_dense}, {dim}")
        self.num_dense = int(num_dense)
        self.dim = int(dim)

    def build(self, input_shape: Any) -> None:
        if self.num_dense:
            self.dense_vectors = self.add_weight(
                name="dense_vectors",
                shape=(self.num_dense, self.dim),
                initializer="truncated_normal",
            )
        super().build(input_shape)

    def call(self, embeddings: list[tf.Tensor], dense: tf.Tensor | None = None) -> tf.Tensor:
        """``embeddings``: field vectors ``[batch, dim]``, or blocks of them already stacked
        ``[batch, k, dim]`` (a fused embedding op's output, ``compiler_opt.codegen``)."""
        vectors = list(embeddings)
        scaled = None
        if dense is not None and self.num_dense:
            # [batch, n, 1] * [n, dim] -> n more field vectors
            scaled = dense[:, :, None] * self.dense_vectors[None]
        dims = {v.shape[-1] for v in vectors} | ({self.dim} if scaled is not None else set())
        if len(dims) != 1:
            raise ValueError(f"FM needs field vectors of one dimension, got {sorted(dims)}")
        if all(x.shape.rank == 2 for x in vectors):  # field vectors: stacked
            if scaled is not None:
                vectors.extend(tf.unstack(scaled, axis=1))
            v = tf.stack(vectors, axis=1)  # [batch, F, dim]
        else:  # with blocks: joined along the fields
            blocks = [x if x.shape.rank == 3 else x[:, None, :] for x in vectors]
            v = tf.concat(blocks + ([scaled] if scaled is not None else []), axis=1)
        square_of_sum = tf.square(tf.reduce_sum(v, axis=1))
        sum_of_square = tf.reduce_sum(tf.square(v), axis=1)
        return 0.5 * tf.reduce_sum(square_of_sum - sum_of_square, axis=1, keepdims=True)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_dense": self.num_dense, "dim": self.dim}


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class CrossInteraction(tf.keras.layers.Layer):
    """DCN-v2 cross network of ``num_layers`` ``tfrs.layers.dcn.Cross`` layers.

    Args:
      num_layers: cross layers (each adds one order of interaction).
      projection_dim: low-rank size of W (None: full rank).
    """

    def __init__(self, num_layers: int = 3, projection_dim: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if projection_dim is not None and projection_dim < 1:
            raise ValueError(f"projection_dim must be None or >= 1, got {projection_dim}")
        self.num_layers = int(num_layers)
        self.projection_dim = projection_dim
        self._cross = [
            tfrs.layers.dcn.Cross(
                projection_dim=projection_dim,
                kernel_initializer="glorot_uniform",
                name=f"cross_{i}",
            )
            for i in range(self.num_layers)
        ]

    def call(self, embeddings: list[tf.Tensor], dense: tf.Tensor | None = None) -> tf.Tensor:
        x0 = _concat(embeddings, dense)
        x = x0
        for layer in self._cross:
            x = layer(x0, x)
        return x

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_layers": self.num_layers,
            "projection_dim": self.projection_dim,
        }


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class LinearTerm(tf.keras.layers.Layer):
    """The wide term ``sum_f w_f(id_f) + <w_dense, dense>``: ``[batch]``.

    ``w_f`` is a one-dimensional embedding per field (any embeddings/ method: a full table is
    logistic regression on one-hot ids; a hashed or binary-code table compresses it too).
    Logistic regression on ids and numeric features is this term plus a bias.

    Args:
      weights: an ``EmbeddingCollection`` of dimension-1 tables, one per embedded field (or
        None when there are none).
      num_dense: numeric features.
      l2: at every call, ``l2 * sum(w**2)`` over all the term's weights (every row of every
        field table and the numeric weights) is added to the layer's losses.
      l1: likewise ``l1 * sum(|w|)``.
    """

    def __init__(
        self,
        weights: tf.keras.layers.Layer | None,
        num_dense: int,
        l2: float = 0.0,
        l1: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if not (l2 >= 0 and l1 >= 0):
            raise ValueError(f"l2 and l1 must be >= 0, got l2={l2!r}, l1={l1!r}")
        self.l2 = float(l2)
        self.l1 = float(l1)
        if weights is not None and any(d != 1 for d in weights.dims):
            raise ValueError(f"the wide term's tables must have dimension 1, got {weights.dims}")
        if weights is None and num_dense < 1:
            raise ValueError("a wide term needs embedded fields or numeric features")
        self.field_weights = weights
        self.num_dense = int(num_dense)
        self._dense = (
            tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="w_dense")
            if self.num_dense
            else None
        )

    def call(self, ids: dict[str, tf.Tensor], dense: tf.Tensor | None = None) -> tf.Tensor:
        terms = []
        if self.field_weights is not None:
            # one [batch, 1] per field, or one [batch, F] from a fused embedding op
            terms += [tf.reduce_sum(w, axis=1) for w in self.field_weights(ids).values()]
        if self._dense is not None and dense is not None:
            terms.append(self._dense(dense)[:, 0])
        if self.l2 > 0 or self.l1 > 0:
            self.add_loss(self.penalty())
        return tf.add_n(terms)

    def penalty(self) -> tf.Tensor:
        """``l2 * sum(w**2) + l1 * sum(|w|)`` over the term's trainable weights."""
        weights = [tf.reshape(w, [-1]) for w in self.trainable_weights]
        if not weights:
            return tf.constant(0.0)
        flat = tf.concat(weights, axis=0)
        return self.l2 * tf.reduce_sum(tf.square(flat)) + self.l1 * tf.reduce_sum(tf.abs(flat))

    def get_config(self) -> dict[str, Any]:
        ser = tf.keras.layers.serialize
        return {
            **super().get_config(),
            "weights": ser(self.field_weights) if self.field_weights is not None else None,
            "num_dense": self.num_dense,
            "l2": self.l2,
            "l1": self.l1,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LinearTerm:
        config = dict(config)
        if config.get("weights") is not None:
            config["weights"] = tf.keras.layers.deserialize(config["weights"])
        return cls(**config)
