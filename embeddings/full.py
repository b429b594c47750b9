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

import tensorflow as tf

from embeddings.base import EmbeddingLayer


def oov_safe(ids: tf.Tensor, num_rows: int) -> tf.Tensor:
    """Maps ids outside ``[0, num_rows)`` to 0 (the OOV row)."""
    ids = tf.cast(ids, tf.int64)
    inside = tf.logical_and(ids >= 0, ids < num_rows)
    return tf.where(inside, ids, tf.zeros_like(ids))


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FullEmbedding(EmbeddingLayer):
    """One ``dim``-vector per id: ``e(i) = W[i]``, W of shape ``[num_rows, dim]``.

    Takes the arguments of ``EmbeddingLayer``: ``num_rows`` (row 0 the OOV row), ``dim``,
    ``combiner`` (``mean`` or ``sum``), ``l2`` (penalty on the rows looked up) and
    ``initializer`` (of the table).
    """

    def row_index(self, ids: tf.Tensor) -> tf.Tensor:
        """The id itself, or 0 (the OOV row) outside ``[0, num_rows)``."""
        return oov_safe(ids, self.num_rows)
