"""Quotient-remainder compositional embedding (Shi et al., "Compositional Embeddings Using
Complementary Partitions for Memory-Efficient Recommendation Systems", KDD 2020).

``QREmbedding(num_rows, dim, collisions=m)`` holds two tables,

* quotient ``Q`` of shape ``[ceil(num_rows / m), d']``, indexed by ``i // m``;
* remainder ``R`` of shape ``[m, d']``, indexed by ``i mod m``;

and composes ``e(i)`` from the two rows by ``operation``:

* ``mult`` (default): ``e(i) = Q[i // m] * R[i mod m]`` (element-wise), ``d' = dim``;
* ``add``: ``e(i) = Q[i // m] + R[i mod m]``, ``d' = dim``;
* ``concat``: ``e(i) = [Q[i // m], R[i mod m]]``, ``d' = dim / 2`` (``dim`` must be even).

The two partitions are complementary: each id in ``[0, num_rows)`` gets its own ``(q, r)`` pair,
so no two ids share both rows. Ids outside ``[0, num_rows)`` take the OOV path: they become id 0
(pair ``(0, 0)``) before the split, so no gather goes out of bounds.

Parameters: ``(ceil(num_rows / m) + m) * d'`` floats, smallest near ``m = sqrt(num_rows)``: QR
compresses at most ~``sqrt(num_rows) / 2`` times (``sqrt(num_rows)`` with ``concat``).

Initialization (our choice; the paper does not fix it): both tables use ``initializer``, except
that with ``mult`` the remainder table defaults to ``RandomNormal(mean=1, stddev=0.05)``, so the
product starts at the scale of a plain embedding and the quotient rows get full-size gradients
(two small random factors would give ~0.05**2 embeddings and vanishing gradients).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import tensorflow as tf

from embeddings import common
from embeddings.base import EmbeddingLayer
from embeddings.full import oov_safe

OPERATIONS = ("mult", "add", "concat")


def _component_dim(dim: int, operation: str) -> int:
    return dim // 2 if operation == "concat" else dim


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class QREmbedding(EmbeddingLayer):
    """Quotient-remainder embedding; see the module docstring for the formula.

    ids int ``[batch]`` -> ``[batch, dim]``; ragged ``[batch, None]`` -> ``[batch, dim]`` pooled
    by ``combiner``.

    Args:
      num_rows: vocabulary rows of the field (id 0 = OOV).
      dim: embedding dimension (even for ``concat``).
      combiner: pooling of ragged ids: ``mean`` or ``sum``.
      l2: L2 penalty on the quotient and remainder rows looked up
        (``l2 * (sum(Q[q]**2) + sum(R[r]**2)) / n_ids``).
      collisions: ``m`` >= 1, rows of the remainder table (ids sharing a quotient row).
      operation: ``mult``, ``add`` or ``concat``.
      initializer: initializer of the quotient table (and of the remainder table but for
        ``mult``).
      remainder_initializer: initializer of the remainder table; None: ``initializer``, or
        ``RandomNormal(1, 0.05)`` for ``mult``.
    """

    #: the option that sets the table size, and the others ``options_for_ratio`` takes
    size_options: ClassVar[tuple[str, ...]] = ("collisions",)
    ratio_options: ClassVar[tuple[str, ...]] = ("operation",)

    def __init__(
        self,
        num_rows: int,
        dim: int,
        *,
        collisions: int,
        operation: str = "mult",
        remainder_initializer: str | dict | None = None,
        **kwargs: Any,
    ):
        super().__init__(num_rows, dim, **kwargs)
        common.check_int("collisions", collisions, 1)
        common.check_choice("operation", operation, OPERATIONS)
        if operation == "concat" and dim % 2:
            raise ValueError(f"dim must be even with operation 'concat', got {dim!r}")
        self.collisions = collisions
        self.operation = operation
        if remainder_initializer is not None:
            self.remainder_initializer = tf.keras.initializers.get(remainder_initializer)
        elif operation == "mult":
            self.remainder_initializer = tf.keras.initializers.RandomNormal(1.0, 0.05)
        else:  # a second instance: one unseeded instance called twice repeats its values
            init = self.initializer
            self.remainder_initializer = init.__class__.from_config(init.get_config())
        self._remainder_initializer_arg = remainder_initializer

    @property
    def quotient_rows(self) -> int:
        return common.ceil_div(self.num_rows, self.collisions)

    @property
    def component_dim(self) -> int:
        return _component_dim(self.dim, self.operation)

    def create_weights(self) -> None:
        self.quotient = self.add_weight(
            name="quotient",
            shape=(self.quotient_rows, self.component_dim),
            initializer=self.initializer,
            trainable=True,
        )
        self.remainder = self.add_weight(
            name="remainder",
            shape=(self.collisions, self.component_dim),
            initializer=self.remainder_initializer,
            trainable=True,
        )

    def indices(self, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(i // m, i mod m)`` after the OOV mapping (int64, shapes of ``ids``)."""
        ids = oov_safe(ids, self.num_rows)
        return ids // self.collisions, tf.math.floormod(ids, self.collisions)

    def call(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        q, r = self.indices(common.flat_ids(ids))
        qv = tf.nn.embedding_lookup(self.quotient, q)
        rv = tf.nn.embedding_lookup(self.remainder, r)
        if self.operation == "mult":
            vectors = qv * rv
        elif self.operation == "add":
            vectors = qv + rv
        else:
            vectors = tf.concat([qv, rv], axis=-1)
        return common.pool_and_regularize(self, ids, vectors, components=[qv, rv])

    def memory_bytes(self) -> dict[str, int]:
        """float32 bytes of both tables: ``(ceil(num_rows / m) + m) * d' * 4``."""
        n = (self.quotient_rows + self.collisions) * self.component_dim * 4
        return {"train": n, "serve": n}

    @staticmethod
    def options_for_ratio(
        num_rows: int,
        dim: int,
        ratio: float,
        *,
        operation: str = "mult",
        tolerance: float = common.RATIO_TOLERANCE,
    ) -> dict[str, Any]:
        """``{"collisions": m, "operation": operation}`` with ``m <= sqrt(num_rows)`` (the
        smaller table is the remainder one) bringing the bytes closest to
        ``num_rows * dim * 4 / ratio``.

        Reachable: up to ``num_rows / (2 * ceil(sqrt(num_rows)))``, ~``sqrt(num_rows) / 2``
        (twice that with ``concat``); a ratio off by more than ``tolerance``x raises ValueError.
        """
        common.check_common_args(num_rows, dim, "mean", 0.0)
        common.check_choice("operation", operation, OPERATIONS)
        if operation == "concat" and dim % 2:
            raise ValueError(f"dim must be even with operation 'concat', got {dim!r}")
        common.check_ratio(ratio, tolerance)
        cdim = _component_dim(dim, operation)
        target_rows = num_rows * dim / (ratio * cdim)
        root = max(1, math.isqrt(num_rows - 1) + 1)  # ceil(sqrt(num_rows))
        # rows(m) = ceil(V/m) + m falls for m up to ~sqrt(V); m^2 - T m + V = 0 gives the m for T
        disc = target_rows * target_rows - 4 * num_rows
        guess = (target_rows - math.sqrt(disc)) / 2 if disc > 0 else root
        candidates = {1, root}
        for m in (math.floor(guess), math.ceil(guess)):
            candidates.update({min(max(m + k, 1), root) for k in (-1, 0, 1)})

        def rows(m: int) -> int:
            return common.ceil_div(num_rows, m) + m

        best = min(sorted(candidates), key=lambda m: common.log_distance(rows(m), target_rows))
        max_ratio = num_rows * dim / (rows(root) * cdim)
        common.ratio_or_raise(
            f"QREmbedding({operation})",
            num_rows,
            dim,
            ratio,
            rows(best) * cdim * 4,
            f"QR reaches at most {max_ratio:.4g}x, at collisions={root}",
            tolerance,
        )
        return {"collisions": best, "operation": operation}

    def options_config(self) -> dict[str, Any]:
        return {"collisions": self.collisions, "operation": self.operation}

    def get_config(self) -> dict[str, Any]:
        rem = self._remainder_initializer_arg
        return {
            **super().get_config(),
            "remainder_initializer": (
                None if rem is None else tf.keras.initializers.serialize(self.remainder_initializer)
            ),
        }
