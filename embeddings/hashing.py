"""The hashing trick: ids share ``buckets`` rows through a fixed pseudo-random hash.

``HashingEmbedding(num_rows, dim, buckets=B)`` holds a table ``W`` of shape ``[B, dim]`` and
looks up ``e(i) = W[bucket(i)]`` (Weinberger et al., "Feature Hashing for Large Scale Multitask
Learning", ICML 2009), with

* ``bucket(i) = 0`` for id 0 (the OOV/missing id the preprocessor emits) and for every negative
  id (the OOV path), so the OOV row is never shared with a real value;
* ``bucket(i) = 1 + (splitmix64(i + (seed + 1) * 0x9E3779B97F4A7C15) >> 1) mod (B - 1)`` for
  ``i > 0`` (``B == 1``: everything shares row 0).

The hash is an integer mixer (the splitmix64 finalizer, wrapping uint64 arithmetic on
``tf.bitwise``), not ``i mod B``: ids are frequency ranks, and a plain modulo would spread the
frequent ids evenly over the buckets, a frequency-aware hash the hashing trick does not have.
It is pure integer arithmetic, so CPU, GPU and any saved graph agree bit for bit.

Ids ``>= num_rows`` are hashed like the others when ``open_vocabulary`` (default): the hashing
trick has no vocabulary bound, so a fingerprint of an unseen value gets its own pseudo-random
bucket. With ``open_vocabulary=False`` they take the OOV path (bucket 0), like ``FullEmbedding``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import tensorflow as tf

from embeddings import common
from embeddings.base import EmbeddingLayer

#: splitmix64 constants (also written into the generated C++ of compiler_opt.embedding_op)
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
U64 = (1 << 64) - 1


def splitmix64(x: tf.Tensor, seed: int = 0) -> tf.Tensor:
    """The splitmix64 output of ``x + (seed + 1) * golden`` (int64 in, uint64 out, wrapping)."""
    z = tf.bitcast(tf.cast(x, tf.int64), tf.uint64)
    z = z + tf.constant(((seed + 1) * GOLDEN) & U64, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(30, tf.uint64)))
    z = z * tf.constant(MIX1, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(27, tf.uint64)))
    z = z * tf.constant(MIX2, tf.uint64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, tf.uint64)))


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class HashingEmbedding(EmbeddingLayer):
    """Hashing-trick embedding: ``e(i) = W[bucket(i)]``, ``W`` of shape ``[buckets, dim]``.

    ids int ``[batch]`` -> ``[batch, dim]``; ragged ``[batch, None]`` -> ``[batch, dim]`` pooled
    by ``combiner``. See the module docstring for ``bucket``.

    Args:
      num_rows: vocabulary rows of the field (id 0 = OOV); the size the ratio is measured on.
      dim: embedding dimension.
      combiner: pooling of ragged ids: ``mean`` or ``sum``.
      l2: L2 penalty on the rows looked up in a batch (``l2 * sum(rows**2) / n_ids``).
      buckets: rows of the table (>= 1); bucket 0 is the OOV row.
      seed: hash seed (0 <= seed < 2**63); different seeds give independent hashes.
      open_vocabulary: hash ids ``>= num_rows`` (True) or send them to the OOV bucket (False).
      initializer: initializer of the table.
    """

    #: the option that sets the table size, and the others ``options_for_ratio`` takes
    size_options: ClassVar[tuple[str, ...]] = ("buckets",)
    ratio_options: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        num_rows: int,
        dim: int,
        *,
        buckets: int,
        seed: int = 0,
        open_vocabulary: bool = True,
        **kwargs: Any,
    ):
        super().__init__(num_rows, dim, **kwargs)
        common.check_int("buckets", buckets, 1)
        common.check_int("seed", seed, 0, (1 << 63) - 1)
        if not isinstance(open_vocabulary, bool):
            raise ValueError(f"open_vocabulary must be a bool, got {open_vocabulary!r}")
        self.buckets = buckets
        self.seed = seed
        self.open_vocabulary = open_vocabulary

    @property
    def table_shape(self) -> tuple[int, int]:
        return (self.buckets, self.dim)

    def bucket(self, ids: tf.Tensor) -> tf.Tensor:
        """The bucket in ``[0, buckets)`` of each id (int64, same shape as ``ids``)."""
        ids = tf.cast(ids, tf.int64)
        if self.buckets == 1:
            return tf.zeros_like(ids)
        oov = ids <= 0
        if not self.open_vocabulary:
            oov = tf.logical_or(oov, ids >= self.num_rows)
        h = tf.bitwise.right_shift(splitmix64(ids, self.seed), tf.constant(1, tf.uint64))
        b = 1 + tf.math.floormod(tf.bitcast(h, tf.int64), self.buckets - 1)
        return tf.where(oov, tf.zeros_like(b), b)

    def row_index(self, ids: tf.Tensor) -> tf.Tensor:
        return self.bucket(ids)

    @staticmethod
    def options_for_ratio(
        num_rows: int, dim: int, ratio: float, *, tolerance: float = common.RATIO_TOLERANCE
    ) -> dict[str, Any]:
        """``{"buckets": round(num_rows / ratio)}`` (at least 1).

        Any ratio up to ``num_rows`` (one bucket) is reachable; beyond it by more than
        ``tolerance``x raises ValueError.
        """
        common.check_common_args(num_rows, dim, "mean", 0.0)
        common.check_ratio(ratio, tolerance)
        buckets = max(1, round(num_rows / ratio))
        common.ratio_or_raise(
            "HashingEmbedding",
            num_rows,
            dim,
            ratio,
            buckets * dim * 4,
            f"one bucket at the most gives {num_rows}x",
            tolerance,
        )
        return {"buckets": buckets}

    def options_config(self) -> dict[str, Any]:
        return {"buckets": self.buckets, "seed": self.seed, "open_vocabulary": self.open_vocabulary}
