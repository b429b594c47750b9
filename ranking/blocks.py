"""Model blocks: MLP towers, feature interactions and the wide (linear) term.

Every interaction has one calling convention, ``interaction(embedded, dense) -> [batch, k]``:
``embedded`` is an embedding collection's ``Embedded`` (``embeddings.forms``), ``dense`` a
``[batch, n]`` matrix of numeric features or ``None``. Each interaction declares the form of the
field vectors it takes (``input_form``) and reads ``embedded`` through that form's method; a
collection returning that form hands the vectors over without a conversion.

* ``ConcatInteraction`` (``concat``): ``[e_1, ..., e_F, dense]`` (the DNN's input).
* ``FMInteraction`` (``stacked``): the factorization machine's pairwise term
  ``sum_{i<j} <v_i, v_j> = 1/2 * sum_k ((sum_i v_ik)^2 - sum_i v_ik^2)`` over the field vectors
  and one learned vector per numeric feature scaled by its value (Rendle, ICDM 2010);
  output ``[batch, 1]``.
* ``CrossInteraction`` (``concat``): DCN-v2's cross network on the concatenation ``x_0``:
  ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l`` (Wang et al., WWW 2021), with
  ``tfrs.layers.dcn.Cross`` (low rank when ``projection_dim`` is set); output ``[batch, D]``.
"""

from __future__ import annotations

import random
from typing import Any

import tensorflow as tf
import tensorflow_recommenders as tfrs

from embeddings.forms import Embedded, Form
from ranking.config import MLP_GRADIENTS
from ranking.forward_ad import dense_relu_dropout


class _Untracked:
    """Holds a variable out of Keras's weight tracking."""

    def __init__(self, variable: tf.Variable | None) -> None:
        self.variable = variable


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class MLP(tf.keras.layers.Layer):
    """Dense layers with ReLU and optional dropout: ``[batch, k] -> [batch, units[-1]]``.

    ``gradient``: ``"backprop"`` (TensorFlow's gradients) or ``"forward_ad"``: a training call
    with dropout runs each layer as ``ranking.forward_ad.dense_relu_dropout``, which keeps a
    boolean derivative instead of the ReLU's output and the keep mask (5 bytes per element kept
    for the backward pass instead of 9); outputs and gradients are the same.
    Without dropout both are plain back-propagation (``ReluGrad`` reads the output the next
    layer keeps anyway). :meth:`with_gradient` gives the other form over the same layers.
    """

    def __init__(
        self,
        units: list[int],
        dropout: float = 0.0,
        seed: int | None = None,
        gradient: str = "backprop",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        units = [int(u) for u in units]
        if not units or any(u < 1 for u in units):
            raise ValueError(f"units must be a non-empty list of positive sizes, got {units}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if gradient not in MLP_GRADIENTS:
            raise ValueError(f"gradient must be one of {MLP_GRADIENTS}, got {gradient!r}")
        self.units = units
        self.dropout = float(dropout)
        self.gradient = gradient
        self._dense = [
            tf.keras.layers.Dense(u, activation="relu", name=f"dense_{i}")
            for i, u in enumerate(units)
        ]
        # Dropout masks are stateless draws keyed by (seed + layer, training call). The call
        # counter is no model weight (exports and parameter counts leave it out); a training
        # loop checkpoints ``dropout_calls`` so a restored run draws the uninterrupted run's
        # masks. ``seed`` None: drawn from Python's ``random`` (``set_random_seed`` seeds it).
        self.seed = None
        self._counter = _Untracked(None)
        if dropout:
            self.seed = int(seed) if seed is not None else random.randrange(1 << 30)
            self._counter = _Untracked(
                tf.Variable(
                    0,
                    dtype=tf.int64,
                    trainable=False,
                    name="dropout_calls",
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                )
            )

    @property
    def dropout_calls(self) -> tf.Variable | None:
        """The count of training calls that keys the dropout masks (None without dropout)."""
        return self._counter.variable

    @property
    def dense_layers(self) -> list[tf.keras.layers.Dense]:
        """The Dense layers, input side first."""
        return list(self._dense)

    def with_gradient(self, gradient: str) -> MLP:
        """An MLP computing the same function with ``gradient``, over this one's Dense layers
        and dropout counter (shared variables: a checkpoint of one restores into the other)."""
        if gradient == self.gradient:
            return self
        other = MLP(self.units, self.dropout, self.seed, gradient, name=self.name)
        other._dense, other._counter = self._dense, self._counter
        other.built = self.built
        return other

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        calls, counter = None, self._counter.variable
        if counter is not None and training:
            counter.assign_add(1)
            calls = tf.identity(counter)
        for i, layer in enumerate(self._dense):
            seed = None
            if calls is not None:
                seed = tf.stack([tf.constant(self.seed + i, tf.int64), calls])
            if seed is not None and self.gradient == "forward_ad":
                if not layer.built:
                    layer(x)  # builds the layer; the unused result is pruned from the graph
                # a next layer keeps this one's output as its input
                kept = i < len(self._dense) - 1
                x = dense_relu_dropout(x, layer.kernel, layer.bias, self.dropout, seed, kept)
                continue
            x = layer(x)
            if seed is not None:
                x = tf.nn.experimental.stateless_dropout(x, rate=self.dropout, seed=seed)
        return x

    def get_config(self) -> dict[str, Any]:
        config = {**super().get_config(), "units": self.units, "dropout": self.dropout}
        if self.gradient != "backprop":
            config["gradient"] = self.gradient
        return {**config, "seed": self.seed} if self.dropout else config


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class ConcatInteraction(tf.keras.layers.Layer):
    """``[e_1, ..., e_F, dense]`` concatenated: ``[batch, sum(d_f) + n]``."""

    input_form: Form = Form.CONCAT

    def call(self, embedded: Embedded, dense: tf.Tensor | None = None) -> tf.Tensor:
        return embedded.concat(dense)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FMInteraction(tf.keras.layers.Layer):
    """FM pairwise term over equal-dimension field vectors: ``[batch, 1]``.

    Args:
      num_dense: numeric features; each gets a learned ``dim`` vector scaled by its value.
      dim: the field vectors' dimension.
    """

    input_form: Form = Form.STACKED

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

    def call(self, embedded: Embedded, dense: tf.Tensor | None = None) -> tf.Tensor:
        """``embedded``: field vectors of dimension ``dim``, read stacked ``[batch, F, dim]``."""
        scaled = None
        if dense is not None and self.num_dense:
            # [batch, n, 1] * [n, dim] -> n more field vectors
            scaled = dense[:, :, None] * self.dense_vectors[None]
        v = embedded.stacked(scaled)  # [batch, F (+ n), dim]
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

    input_form: Form = Form.CONCAT

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

    @property
    def cross_layers(self) -> list[tfrs.layers.dcn.Cross]:
        """The cross layers, input side first."""
        return list(self._cross)

    def call(self, embedded: Embedded, dense: tf.Tensor | None = None) -> tf.Tensor:
        x0 = embedded.concat(dense)
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

    #: the form of its weights it reads best: one block, summed (any form gives the same sum)
    input_form: Form = Form.CONCAT

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
            terms += self.field_weights(ids).field_sums()
        if self._dense is not None and dense is not None:
            terms.append(self._dense(dense)[:, 0])
        if self.l2 > 0 or self.l1 > 0:
            self.add_loss(self.penalty())
        return tf.add_n(terms)

    def with_weights(self, weights: tf.keras.layers.Layer) -> LinearTerm:
        """A new term over ``weights`` (a collection of the same fields, e.g. one that computes
        them in one op), sharing this term's numeric-feature weights."""
        if self.field_weights is None or list(weights.field_names) != list(
            self.field_weights.field_names
        ):
            raise ValueError(
                f"weights must hold the fields {self.field_weights and self.field_weights.field_names}"
                f", got {list(weights.field_names)}"
            )
        term = LinearTerm(weights, self.num_dense, l2=self.l2, l1=self.l1, name=self.name)
        term._dense = self._dense
        return term

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
