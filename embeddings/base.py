"""``EmbeddingLayer``: the base of the trainable embedding layers of embeddings/.

It holds what every method shares: the arguments ``num_rows``, ``dim``, ``combiner``, ``l2`` and
``initializer`` (checked in ``__init__``), the weights ``build`` creates (``create_weights``: one
trainable ``table`` of shape ``table_shape`` unless the method creates others), a single-table
lookup in ``call`` (``W[row_index(ids)]``, then the pooling and L2 penalty of
:func:`embeddings.common.pool_and_regularize`), the float32 ``memory_bytes`` of that table, and
a ``get_config`` of the shared arguments plus the method's own (``options_config``).

A method sets its rows in ``row_index`` (the OOV path included) or, when its output is more
than one row read, overrides ``call``; its own arguments are checked in its ``__init__`` after
``super().__init__``, and listed by ``options_config`` in the order its config writes them.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from embeddings.common import check_common_args, flat_ids, pool_and_regularize


class EmbeddingLayer(tf.keras.layers.Layer):
    """Shared arguments, table, lookup and config of an embedding layer.

    ids int ``[batch]`` -> ``[batch, dim]`` (any dense shape ``S`` -> ``S + [dim]``); ragged
    ``[batch, None]`` -> ``[batch, dim]`` pooled by ``combiner`` (embeddings/common.py).

    Args:
      num_rows: vocabulary rows of the field, row 0 being the OOV row.
      dim: embedding dimension.
      combiner: pooling of multi-valued (ragged) ids: ``mean`` or ``sum``.
      l2: L2 penalty on the rows looked up in a batch (added to the layer's losses).
      initializer: initializer of the table.
      **kwargs: arguments of ``tf.keras.layers.Layer`` (``name``, ``dtype``, ...).
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
        self.num_rows = int(num_rows)
        self.dim = int(dim)
        self.combiner = combiner
        self.l2 = float(l2)
        self.initializer = tf.keras.initializers.get(initializer)

    @property
    def table_shape(self) -> tuple[int, int]:
        """Shape of the ``table`` weight: ``(num_rows, dim)`` unless the method sets another."""
        return (self.num_rows, self.dim)

    def add_table(self) -> None:
        """Creates the trainable ``table`` weight of shape ``table_shape``."""
        self.table = self.add_weight(
            name="table", shape=self.table_shape, initializer=self.initializer, trainable=True
        )

    def create_weights(self) -> None:
        """Creates the layer's weights (called by ``build``): the ``table`` unless overridden."""
        self.add_table()

    def build(self, input_shape: Any) -> None:
        self.create_weights()
        super().build(input_shape)

    def row_index(self, ids: tf.Tensor) -> tf.Tensor:
        """The table row of each id (int64 ``[n]`` -> int64 ``[n]``), OOV path included."""
        raise NotImplementedError(f"{type(self).__name__} defines no row_index")

    def call(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        vectors = tf.nn.embedding_lookup(self.table, self.row_index(flat_ids(ids)))
        return pool_and_regularize(self, ids, vectors)

    def memory_bytes(self) -> dict[str, int]:
        """float32 bytes of the ``table``, the same for training and for serving."""
        rows, cols = self.table_shape
        n = rows * cols * 4
        return {"train": n, "serve": n}

    def options_config(self) -> dict[str, Any]:
        """The method's own constructor arguments, as ``get_config`` writes them."""
        return {}

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_rows": self.num_rows,
            "dim": self.dim,
            "combiner": self.combiner,
            "l2": self.l2,
            **self.options_config(),
            "initializer": tf.keras.initializers.serialize(self.initializer),
        }
