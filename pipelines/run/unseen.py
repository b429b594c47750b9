"""``[train] unseen_row``: what the OOV row of an embedding table holds when no training row
reaches it.

Row 0 of a ``full`` table is where a value outside the vocabulary lands: missing, under
``min_count``, or never seen. When no training row lands there (every value of the training
rows has its own row), no step updates row 0, and a value first seen after training (a new
user, a new item) reads the row's random initialization: noise in the interactions of every
such row. On logs whose test period brings new users it costs AUC (MovieLens split by time: 90%
of the test ratings are by users the training period never saw; docs/training.md).

``unseen_row = "mean"`` (the default) sets that row to the count-weighted mean of the field's
vocabulary rows, ``W[0] = sum_i c_i W[i] / sum_i c_i`` over the rows ``i >= 1`` with their
training counts ``c_i`` (the statistics' vocabulary counts): an unseen value reads the average
seen value's vector. ``"initial"`` leaves the row as initialized. Tables whose row 0 has
training rows (rare or missing values) keep what training made of it either way.

The loop sets the row whenever the weights come to rest: before each checkpoint is written and
before each validation evaluation (in the weight average too), so every checkpoint, the best
one, the export and the ensemble's snapshots hold it. No training step reads the row, so the
steps, losses and every other weight are the same under either setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from embeddings.full import FullEmbedding
from pipelines.config_train import UNSEEN_ROWS


def weighted_mean_row(table: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """``[dim]``: ``sum_i counts[i] * table[i + 1] / sum_i counts[i]``.

    Shapes: ``table`` ``[rows, dim]``; ``counts`` ``[rows - 1]`` (the counts of rows 1..),
    not all zero."""
    counts = tf.cast(counts, table.dtype)
    return tf.tensordot(counts, table[1:], axes=1) / tf.reduce_sum(counts)


@dataclasses.dataclass
class UnseenRows:
    """The ``full`` tables whose OOV row no training row reaches, with their vocabulary counts.

    ``fill()`` sets each one's row 0 to ``weighted_mean_row`` of the table as it is."""

    tables: dict[str, tuple[tf.Variable, tf.Tensor]]

    @classmethod
    def of(cls, model: tf.keras.Model, counts: Mapping[str, Sequence[int]], how: str) -> UnseenRows:
        """The tables of ``model`` to fill under ``unseen_row = how``; ``counts``: per field,
        the training count of every row (row 0: OOV and missing cells). Models without a
        per-field ``EmbeddingCollection`` (``lr``; tables fused for training) have none."""
        if how not in UNSEEN_ROWS:
            raise ValueError(f"unseen_row must be one of {list(UNSEEN_ROWS)}, got {how!r}")
        collection = getattr(model, "embedding", None)
        if how == "initial" or not isinstance(collection, EmbeddingCollection):
            return cls({})
        tables: dict[str, tuple[tf.Variable, tf.Tensor]] = {}
        for name, layer in collection.layers_by_field.items():
            c = counts.get(name)
            if not isinstance(layer, FullEmbedding) or c is None or c[0] or not any(c[1:]):
                continue
            if len(c) == layer.table.shape[0]:  # one count a row
                tables[name] = (layer.table, tf.constant(list(c[1:]), tf.float64))
        return cls(tables)

    @property
    def fields(self) -> list[str]:
        return list(self.tables)

    def fill(self) -> None:
        for table, counts in self.tables.values():
            mean = weighted_mean_row(tf.convert_to_tensor(table), counts)
            table.scatter_update(tf.IndexedSlices(mean[None], tf.constant([0], tf.int64)))

    def describe(self) -> dict[str, Any]:
        """The report's entry: the fields whose OOV row holds their mean."""
        return {"mean_fields": self.fields}
