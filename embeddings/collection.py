"""One embedding table per field, behind one call: ``{field: ids} -> {field: [batch, dim]}``.

``EmbeddingCollection(tables)`` takes the per-field specs as plain dicts
``{"name", "num_rows", "dim", "combiner", "method"}``; ``method`` picks the layer class from
``EMBEDDING_METHODS`` (only ``full`` so far; the compressed methods register there), so a training
config can choose the method per field.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from embeddings.full import FullEmbedding

EMBEDDING_METHODS: dict[str, type[tf.keras.layers.Layer]] = {"full": FullEmbedding}


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class EmbeddingCollection(tf.keras.layers.Layer):
    """Per-field embedding layers; outputs keep the order of ``tables``.

    Args:
      tables: one dict per field: ``name``, ``num_rows``, ``dim``, optional ``combiner``
        (``mean``), ``method`` (``full``) and ``l2`` (0).
    """

    def __init__(self, tables: list[dict[str, Any]], **kwargs: Any):
        super().__init__(**kwargs)
        if not tables:
            raise ValueError("tables must hold at least one field")
        names = [t.get("name") for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"tables has duplicate field names: {names}")
        self.tables = [dict(t) for t in tables]
        self.layers_by_field: dict[str, tf.keras.layers.Layer] = {}
        for i, t in enumerate(self.tables):
            method = t.get("method", "full")
            if method not in EMBEDDING_METHODS:
                raise ValueError(
                    f"field {t['name']!r}: embedding method {method!r} is not one of "
                    f"{sorted(EMBEDDING_METHODS)}"
                )
            self.layers_by_field[t["name"]] = EMBEDDING_METHODS[method](
                num_rows=t["num_rows"],
                dim=t["dim"],
                combiner=t.get("combiner", "mean"),
                l2=t.get("l2", 0.0),
                name=f"emb_{i:03d}",
            )

    @property
    def field_names(self) -> list[str]:
        return [t["name"] for t in self.tables]

    @property
    def dims(self) -> list[int]:
        return [t["dim"] for t in self.tables]

    def call(self, ids: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        missing = [n for n in self.field_names if n not in ids]
        if missing:
            raise KeyError(f"ids lack fields {missing}; got {sorted(ids)}")
        return {name: layer(ids[name]) for name, layer in self.layers_by_field.items()}

    def memory_bytes(self) -> dict[str, int]:
        totals = {"train": 0, "serve": 0}
        for layer in self.layers_by_field.values():
            for k, v in layer.memory_bytes().items():
                totals[k] += v
        return totals

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "tables": self.tables}
