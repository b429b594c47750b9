"""The embedding tables of a model's fields: method, options and size per field from a
``ModelConfig`` (``embedding_tables``), and which method a field ends up with
(``planned_method``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from embeddings.collection import EMBEDDING_METHODS
from embeddings.protocols import RatioSized
from embeddings.table_config import TableConfig
from ranking.config import ModelConfig


def _sized_options(
    config: ModelConfig, method: str, num_rows: int, dim: int
) -> dict[str, Any] | None:
    """The layer options of ``method`` for one field, or None to keep the field full."""
    explicit = {k: v for k, v in config.embedding_options.get(method, {}).items() if k != "codes"}
    if method == "full":
        return explicit
    if num_rows < config.compress_min_rows:
        return None  # a small field: a full table costs little and loses nothing
    cls = EMBEDDING_METHODS[method]
    if not isinstance(cls, RatioSized):
        return explicit
    if config.embedding_compression > 1:
        # explicit options that change the size (split, fusion, operation, ...) size it too
        given = {k: v for k, v in explicit.items() if k in cls.ratio_options}
        sized = cls.options_for_ratio(num_rows, dim, config.embedding_compression, **given)
        return {**sized, **explicit}
    if any(name not in explicit for name in cls.size_options):
        return None  # nothing to size it by (no compression, no explicit size): full table
    return explicit


def planned_method(
    config: ModelConfig, name: str, num_rows: int, dim: int, categorical: bool
) -> str:
    """The method a field's table ends up with: numeric buckets and fields a sized method
    cannot size (too small, no compression, no explicit size) use ``full``."""
    method = config.method_of(name) if categorical else "full"
    return method if _sized_options(config, method, num_rows, dim) is not None else "full"


def embedding_tables(
    config: ModelConfig,
    preprocessor: tf.keras.layers.Layer,
    dim_of: Any,
    combiners: dict[str, str],
    wide: bool = False,
) -> list[TableConfig]:
    """One table config per embedded field: method, options and size (see ``ModelConfig``).

    ``wide``: the dimension-1 weights of the linear term, where a learned length is moot, so
    ``amtl`` fields get full weight tables there.
    """
    categorical = set(preprocessor.categorical_fields)
    tables = []
    for name, rows in preprocessor.embedded_fields.items():
        dim = dim_of(name)
        method = planned_method(config, name, rows, dim, name in categorical)
        if wide and method == "amtl":
            method = "full"
        options = _sized_options(config, method, rows, dim)
        tables.append(
            TableConfig(
                name=name,
                num_rows=rows,
                dim=dim,
                combiner=combiners.get(name, "mean"),
                method=method,
                l2=config.l2,
                options=options,
            )
        )
    return tables
