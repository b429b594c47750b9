"""The full embedding table, the baseline every compressed method is measured against.

``FullEmbedding(num_rows, dim)`` holds one trainable row per id. Calling convention shared by
every layer of embeddings/:

* ids int ``[batch]`` -> ``[batch, dim]``;
* ids int ragged ``[batch, None]`` (multi-valued fields) -> ``[batch, dim]``, pooled by
  ``combiner`` (``mean`` or ``sum``; a row without values gives zeros).

Ids outside ``[0, num_rows)`` (negative, too large) take the OOV path: they read row 0, the row
the preprocessor reserves for OOV and missing values, so no gather ever goes out of bounds (on GPU
TensorFlow would silently return zeros there).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from embeddings.common import check_common_args, flat_ids, pool_and_regularize


def oov_safe(ids: tf.Tensor, num_rows: int) -> tf.Tensor:
    """Maps ids outside ``[0, num_rows)`` to 0 (the OOV row)."""
    ids = tf.cast(ids, tf.int64)
    inside = tf.logical_and(ids >= 0, ids < num_rows)
    return tf.where(inside, ids, tf.zeros_like(ids))


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FullEmbedding(tf.keras.layers.Layer):
    """One ``dim``-vector per id: ``e(i) = W[i]``, W of shape ``[num_rows, dim]``.

    Args:
      num_rows: rows of the table, row 0 being the OOV row.
      dim: embedding dimension.
      combiner: pooling of multi-valued (ragged) ids: ``mean`` or ``sum``.
      l2: L2 penalty on the rows looked up in a batch (added to the layer's losses).
      initializer: initializer of the table.
    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        combiner: str = "mean",
        l2: float = 0.0,
        initializer: str | dict = "truncated_normal",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        check_common_args(num_rows, dim, combiner, l2)
        self.num_rows = num_rows
        self.dim = dim
        self.combiner = combiner
        self.l2 = float(l2)
        self.initializer = tf.keras.initializers.get(initializer)

    def build(self, input_shape: Any) -> None:
        self.table = self.add_weight(
            name="table",
            shape=(self.num_rows, self.dim),
            initializer=self.initializer,
            trainable=True,
        )
        super().build(input_shape)

    def call(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        vectors = tf.nn.embedding_lookup(self.table, oov_safe(flat_ids(ids), self.num_rows))
        return pool_and_regularize(self, ids, vectors)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of parameters training holds and serving must hold (float32 table)."""
        n = self.num_rows * self.dim * 4
        return {"train": n, "serve": n}

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_rows": self.num_rows,
            "dim": self.dim,
            "combiner": self.combiner,
            "l2": self.l2,
            "initializer": tf.keras.initializers.serialize(self.initializer),
        }
