"""Optional capabilities of embedding layers and methods, as runtime-checkable protocols.

* :class:`HasServingForm`: a layer (or collection) with a more compact inference form of the
  same outputs (``AMTLEmbedding``, ``EmbeddingCollection``); an export holds that form.
* :class:`WarmStartable`: a layer that starts from another layer's trained ``[num_rows, dim]``
  table (``AMTLEmbedding`` behind a ``FullEmbedding``).
* :class:`LearnsFromCounts`: a layer that takes per-id training counts (``counts``, data rather
  than config; ``AMTLEmbedding``). Checked on the class: ``issubclass(cls, LearnsFromCounts)``.
* :class:`RatioSized`: a method whose size is chosen for a compression ratio (``hashing``,
  ``qr``, ``bh``). Checked on the class: ``isinstance(cls, RatioSized)`` (it has data members).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import tensorflow as tf


@runtime_checkable
class HasServingForm(Protocol):
    """``serving_form()``: the layer serving should hold, with the same outputs."""

    def serving_form(self) -> tf.keras.layers.Layer: ...


@runtime_checkable
class WarmStartable(Protocol):
    """``warm_start_from(table_values)``: copies a trained ``[num_rows, dim]`` table in."""

    def warm_start_from(self, table_values: np.ndarray | tf.Tensor) -> None: ...


@runtime_checkable
class LearnsFromCounts(Protocol):
    """Takes ``counts`` (training count per id, id 0 the OOV row) as a constructor argument
    and through ``set_counts``."""

    def set_counts(self, counts: Sequence[float] | np.ndarray) -> None: ...


@runtime_checkable
class RatioSized(Protocol):
    """A method sized for a compression ratio.

    Attributes:
      size_options: the constructor options without which the layer has no size (e.g.
        ``("buckets",)``); a field given none of them and no ratio keeps a full table.
      ratio_options: the other options ``options_for_ratio`` takes (e.g. ``("operation",)``):
        explicit values of them shape the sizing.
    """

    size_options: ClassVar[tuple[str, ...]]
    ratio_options: ClassVar[tuple[str, ...]]

    @staticmethod
    def options_for_ratio(
        num_rows: int, dim: int, ratio: float, *, tolerance: float = ..., **fixed: Any
    ) -> dict[str, Any]:
        """The constructor options whose serving bytes are ``num_rows * dim * 4 / ratio``
        (within ``tolerance``x, else ValueError), ``fixed`` (of ``ratio_options``) kept."""
        ...
