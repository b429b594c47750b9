"""The FIVES graph network as a Keras layer: field ids [batch, F] -> logits [batch]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from features.crosses.fives_graph import adjacency, propagate


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


def predict_probabilities(
    net: FivesNetwork, ids: np.ndarray, batch_size: int = 16384
) -> np.ndarray:
    out = [
        tf.sigmoid(net(ids[i : i + batch_size], training=False)).numpy()
        for i in range(0, len(ids), batch_size)
    ]
    return np.concatenate(out) if out else np.zeros(0, np.float32)
