"""Shared plumbing of the embedding layers: argument checks, pooling, the L2 penalty, ratios.

Every layer of embeddings/ follows one calling convention (see embeddings/full.py):

* ids int ``[batch]`` -> ``[batch, dim]`` (any dense shape ``S`` gives ``S + [dim]``);
* ids int ragged ``[batch, None]`` -> ``[batch, dim]``, pooled by ``combiner`` (``mean`` or
  ``sum``; a row without values gives zeros, never NaN).

A layer turns the flat ids (:func:`flat_ids`) into one vector per id, then hands those vectors
to :func:`pool_and_regularize`, which restores the input's shape or pools the ragged rows and
adds the L2 penalty ``l2 * sum(square(components)) / n`` (``n`` = number of ids looked up, the
batch size for dense ``[batch]`` ids; ``components`` = every table row read, e.g. both the
quotient and the remainder rows of QR), as ``FullEmbedding`` does for ``[batch]`` and ragged
ids (for a dense ``[batch, k]`` input ``n`` counts all ``batch * k`` ids). The ragged mean is
``sum / max(row_length, 1)``, so an empty row gives zeros without a NaN to mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

COMBINERS = ("mean", "sum")
#: default of ``options_for_ratio``'s ``tolerance``: the largest accepted factor between the
#: requested and the achieved compression ratio before it raises "not reachable".
RATIO_TOLERANCE = 1.5


def check_common_args(num_rows: Any, dim: Any, combiner: Any, l2: Any) -> None:
    """Raises ValueError naming the argument when the shared arguments are invalid."""
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows must be an integer >= 1, got {num_rows!r}")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of {COMBINERS}, got {combiner!r}")
    if not isinstance(l2, int | float) or isinstance(l2, bool) or not l2 >= 0:
        raise ValueError(f"l2 must be a number >= 0, got {l2!r}")


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """Returns ``value`` if it is an int in ``[low, high]``; raises ValueError naming it otherwise."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def flat_ids(ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
    """The ids as one int64 vector: the flat values of a ragged tensor, a dense one flattened."""
    if isinstance(ids, tf.RaggedTensor):
        values = ids.flat_values
    elif ids.shape.rank == 1:
        values = ids
    else:
        values = tf.reshape(ids, [-1])
    return tf.cast(values, tf.int64)


def pool_and_regularize(
    layer: tf.keras.layers.Layer,
    ids: tf.Tensor | tf.RaggedTensor,
    vectors: tf.Tensor,
    components: Sequence[tf.Tensor] | None = None,
) -> tf.Tensor:
    """Shapes (or pools) the per-id ``vectors`` like ``ids`` and adds the layer's L2 loss.

    Args:
      layer: the calling layer; its ``combiner`` (``mean``/``sum``) and ``l2`` are used, and the
        penalty goes to its ``add_loss``.
      ids: the layer's input, dense or ragged ``[batch, None]``.
      vectors: ``[n, dim]``, one vector per entry of :func:`flat_ids` ``(ids)``.
      components: the table rows read to build ``vectors`` (each ``[n, ...]``), on which L2 is
        taken; default ``[vectors]`` (a plain lookup).

    Returns:
      ``ids.shape + [dim]`` for dense ids; ``[batch, dim]`` for ragged ids, the mean or sum of
      each row's vectors (zeros for an empty row).
    """
    if isinstance(ids, tf.RaggedTensor):
        rows = ids.with_flat_values(vectors)
        out = tf.reduce_sum(rows, axis=1)
        if layer.combiner == "mean":
            lengths = tf.cast(tf.maximum(ids.row_lengths(), 1), out.dtype)
            out = out / lengths[:, None]
    elif ids.shape.rank == 1:
        out = vectors
    else:
        shape = tf.concat([tf.shape(ids, out_type=tf.int32), tf.shape(vectors)[-1:]], axis=0)
        out = tf.reshape(vectors, shape)
    if layer.l2 > 0:
        parts = [vectors] if components is None else list(components)
        n = tf.cast(tf.maximum(tf.shape(vectors)[0], 1), vectors.dtype)
        total = tf.add_n([tf.reduce_sum(tf.square(p)) for p in parts])
        layer.add_loss(layer.l2 * total / n)
    return out


def check_ratio(ratio: Any, tolerance: Any) -> None:
    """Validates the ``ratio`` and ``tolerance`` arguments of an ``options_for_ratio``."""
    if not isinstance(ratio, int | float) or isinstance(ratio, bool) or not ratio > 0:
        raise ValueError(f"ratio must be a number > 0, got {ratio!r}")
    if not isinstance(tolerance, int | float) or isinstance(tolerance, bool) or not tolerance >= 1:
        raise ValueError(f"tolerance must be a number >= 1, got {tolerance!r}")


def ratio_or_raise(
    method: str,
    num_rows: int,
    dim: int,
    ratio: float,
    serve_bytes: int,
    reachable: str,
    tolerance: float,
) -> None:
    """Raises ValueError when ``serve_bytes`` misses ``num_rows*dim*4/ratio`` by > ``tolerance``x.

    ``reachable`` describes the ratios the method can reach for this ``num_rows`` (for the
    message).
    """
    achieved = num_rows * dim * 4 / serve_bytes
    if max(achieved / ratio, ratio / achieved) > tolerance:
        raise ValueError(
            f"{method}: compression ratio {ratio:g} is not reachable for num_rows={num_rows}, "
            f"dim={dim}; the closest is {achieved:.3g}x ({reachable})"
        )


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def bits_for(num_rows: int) -> int:
    """Bits needed to write every id in ``[0, num_rows)`` (at least 1)."""
    return max(1, (num_rows - 1).bit_length())


def log_distance(a: float, b: float) -> float:
    return abs(math.log(a / b))
