"""One embedding layer per field, behind one call: ``{field: ids} -> Embedded`` holding
``{field: [batch, dim]}`` (``embeddings.forms``: the ``fields`` form, ``output_form``).

``EmbeddingCollection(tables)`` takes one ``TableConfig`` per field (embeddings/table_config.py;
its stored dict form is accepted too, as ``from_config`` passes it); ``method`` picks the layer
class from ``EMBEDDING_METHODS`` and ``options`` are that method's own arguments, so a training
config chooses the method per field. ``counts`` (``{field: training count per id}``, id 0 the
OOV row) feeds the layers that learn from frequencies (AMTL); it is data, not config: a
collection rebuilt from its config gets the counts back from a checkpoint.

``serving_form()`` returns the collection a SavedModel should hold: each layer that has a more
compact inference form (AMTL rows truncated to their learned lengths) is replaced by it.
``select(names)`` returns a collection over some of the fields, sharing their layers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from embeddings.amtl import AMTLEmbedding
from embeddings.base import EmbeddingLayer
from embeddings.binary_hash import BinaryHashEmbedding
from embeddings.forms import Embedded, Form
from embeddings.full import FullEmbedding
from embeddings.hashing import HashingEmbedding
from embeddings.protocols import HasServingForm, LearnsFromCounts
from embeddings.qr import QREmbedding
from embeddings.table_config import TableConfig

EMBEDDING_METHODS: dict[str, type[EmbeddingLayer]] = {
    "full": FullEmbedding,
    "hashing": HashingEmbedding,
    "qr": QREmbedding,
    "bh": BinaryHashEmbedding,
    "amtl": AMTLEmbedding,
}


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class EmbeddingCollection(tf.keras.layers.Layer):
    """Per-field embedding layers; the call returns ``Embedded`` in the ``fields`` form, the
    vectors in the order of ``tables``.

    Args:
      tables: one ``TableConfig`` (or its dict form) per field.
      counts: ``{field: count per id}`` for the methods that learn from counts.
      layers: ``{field: layer}`` to hold instead of building them from ``tables``.
    """

    #: the form of the ``Embedded`` the call returns
    output_form: Form = Form.FIELDS

    def __init__(
        self,
        tables: Sequence[TableConfig | Mapping[str, Any]],
        counts: dict[str, Sequence[int]] | None = None,
        layers: dict[str, tf.keras.layers.Layer] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if not tables:
            raise ValueError("tables must hold at least one field")
        self.tables = [TableConfig.of(t) for t in tables]
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"tables has duplicate field names: {names}")
        self.layers_by_field: dict[str, tf.keras.layers.Layer] = {}
        for i, t in enumerate(self.tables):
            if t.method not in EMBEDDING_METHODS:
                raise ValueError(
                    f"field {t.name!r}: embedding method {t.method!r} is not one of "
                    f"{sorted(EMBEDDING_METHODS)}"
                )
            if layers is not None:
                self.layers_by_field[t.name] = layers[t.name]
                continue
            self.layers_by_field[t.name] = _build_layer(t, i, counts)

    @property
    def field_names(self) -> list[str]:
        return [t.name for t in self.tables]

    @property
    def dims(self) -> list[int]:
        return [t.dim for t in self.tables]

    def call(self, ids: dict[str, tf.Tensor]) -> Embedded:
        missing = [n for n in self.field_names if n not in ids]
        if missing:
            raise KeyError(f"ids lack fields {missing}; got {sorted(ids)}")
        return Embedded(
            vectors={name: layer(ids[name]) for name, layer in self.layers_by_field.items()}
        )

    def select(self, names: list[str]) -> EmbeddingCollection:
        """A collection over the fields ``names`` (in table order), sharing their layers; its
        call returns the ``fields`` form."""
        unknown = [n for n in names if n not in self.layers_by_field]
        if unknown or not names:
            raise ValueError(
                f"names must be some of the fields {self.field_names}, got {list(names)}"
            )
        tables = [t for t in self.tables if t.name in names]
        layers = {t.name: self.layers_by_field[t.name] for t in tables}
        return EmbeddingCollection(tables, layers=layers, name=f"{self.name}_selected")

    def serving_form(self) -> EmbeddingCollection:
        """The same fields with each layer's compact inference form where it has one."""
        layers = {
            name: layer.serving_form() if isinstance(layer, HasServingForm) else layer
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
        return {**super().get_config(), "tables": [t.to_dict() for t in self.tables]}


def _build_layer(
    table: TableConfig, index: int, counts: dict[str, Sequence[int]] | None
) -> tf.keras.layers.Layer:
    """The layer of ``table`` (named ``emb_{index:03d}``), its counts passed when it takes them."""
    cls = EMBEDDING_METHODS[table.method]
    options = dict(table.options)
    if issubclass(cls, LearnsFromCounts) and counts is not None and table.name in counts:
        options["counts"] = counts[table.name]
    try:
        return cls(
            num_rows=table.num_rows,
            dim=table.dim,
            combiner=table.combiner,
            l2=table.l2,
            name=f"emb_{index:03d}",
            **options,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"field {table.name!r}, embedding method {table.method!r}: {e}") from None
