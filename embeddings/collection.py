"""One embedding layer per field, behind one call: ``{field: ids} -> {field: [batch, dim]}``.

``EmbeddingCollection(tables)`` takes the per-field specs as plain dicts
``{"name", "num_rows", "dim", "combiner", "method", "l2", "options"}``; ``method`` picks the layer
class from ``EMBEDDING_METHODS`` and ``options`` are that method's own arguments, so a training
config chooses the method per field. ``counts`` (``{field: training count per id}``, id 0 the
OOV row) feeds the layers that learn from frequencies (AMTL); it is data, not config: a
collection rebuilt from its config gets the counts back from a checkpoint.

``serving_form()`` returns the collection a SavedModel should hold: each layer that has a more
compact inference form (AMTL rows truncated to their learned lengths) is replaced by it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from embeddings.amtl import AMTLEmbedding
from embeddings.binary_hash import BinaryHashEmbedding
from embeddings.full import FullEmbedding
from embeddings.hashing import HashingEmbedding
from embeddings.qr import QREmbedding

EMBEDDING_METHODS: dict[str, type[tf.keras.layers.Layer]] = {
    "full": FullEmbedding,
    "hashing": HashingEmbedding,
    "qr": QREmbedding,
    "bh": BinaryHashEmbedding,
    "amtl": AMTLEmbedding,
}


def takes_counts(cls: type) -> bool:
    return "counts" in inspect.signature(cls.__init__).parameters


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class EmbeddingCollection(tf.keras.layers.Layer):
    """Per-field embedding layers; outputs keep the order of ``tables``.

    Args:
      tables: one dict per field: ``name``, ``num_rows``, ``dim``, optional ``combiner``
        (``mean``), ``method`` (``full``), ``l2`` (0) and ``options`` (method arguments).
      counts: ``{field: count per id}`` for methods that take counts.
    """

    def __init__(
        self,
        tables: list[dict[str, Any]],
        counts: dict[str, Sequence[int]] | None = None,
        layers: dict[str, tf.keras.layers.Layer] | None = None,
        **kwargs: Any,
    ):
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
            if layers is not None:
                self.layers_by_field[t["name"]] = layers[t["name"]]
                continue
            cls = EMBEDDING_METHODS[method]
            options = dict(t.get("options") or {})
            if takes_counts(cls) and counts is not None and t["name"] in counts:
                options["counts"] = counts[t["name"]]
            try:
                self.layers_by_field[t["name"]] = cls(
                    num_rows=t["num_rows"],
                    dim=t["dim"],
                    combiner=t.get("combiner", "mean"),
                    l2=t.get("l2", 0.0),
                    name=f"emb_{i:03d}",
                    **options,
                )
            except (TypeError, ValueError) as e:
                raise ValueError(f"field {t['name']!r}, embedding method {method!r}: {e}") from None

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

    def serving_form(self) -> EmbeddingCollection:
        """The same fields with each layer's compact inference form where it has one."""
        layers = {
            name: layer.serving_form() if hasattr(layer, "serving_form") else layer
            for name, layer in self.layers_by_field.items()
        }
        return EmbeddingCollection(self.tables, layers=layers, name=self.name)

    def memory_bytes_by_field(self) -> dict[str, dict[str, int]]:
        return {name: layer.memory_bytes() for name, layer in self.layers_by_field.items()}

    def memory_bytes(self) -> dict[str, int]:
        totals = {"train": 0, "serve": 0}
        for layer in self.layers_by_field.values():
            for k, v in layer.memory_bytes().items():
                totals[k] += v
        return totals

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "tables": self.tables}
