"""The FIVES graph math as plain functions: soft adjacency per layer (Eq. 7-8), the
straight-through binarization and the propagation of node states (Eq. 2).

Shapes: ``h`` [L, F, F] adjacency logits; embeddings ``e`` [batch, F, d]; ``w`` [L, F, d, d].
"""

from __future__ import annotations

import tensorflow as tf

# ---------------------------------------------------------------------------------------------
# The math: adjacency (Eq. 7-8) and propagation (Eq. 2), as plain functions
# ---------------------------------------------------------------------------------------------


def rescale(a: tf.Tensor, tau: tf.Tensor | float) -> tf.Tensor:
    """Eq. 8: ``sigma(logit(a) / tau)``; a in (0, 1)."""
    a = tf.clip_by_value(a, 1e-6, 1.0 - 1e-6)
    return tf.sigmoid((tf.math.log(a) - tf.math.log1p(-a)) / tau)


def binarize(a: tf.Tensor) -> tf.Tensor:
    """``phi(a) = [a >= 0.5]`` forward, identity gradient (straight-through)."""
    hard = tf.cast(a >= 0.5, a.dtype)
    return a + tf.stop_gradient(hard - a)


def adjacency(h: tf.Tensor, tau: tf.Tensor | float, heredity: bool = True) -> list[tf.Tensor]:
    """Eq. 7: soft adjacency per layer from the logits ``h`` [L, F, F]; diagonal masked.

    ``heredity=False`` drops Eq. 7's dependence on the layer below: every layer is
    ``sigma(H^(k) / tau)`` (each layer-k edge has its own logit).
    """
    num_fields = tf.shape(h)[1]
    off_diag = 1.0 - tf.eye(num_fields, dtype=h.dtype)
    out = [tf.sigmoid(h[0] / tau) * off_diag]
    for k in range(1, h.shape[0]):
        if not heredity:
            out.append(tf.sigmoid(h[k] / tau) * off_diag)
            continue
        prev = binarize(out[-1])
        degree = tf.reduce_sum(tf.stop_gradient(tf.round(prev)), axis=1, keepdims=True)
        mean = tf.matmul(prev, tf.sigmoid(h[k])) / tf.maximum(degree, 1.0)
        out.append(rescale(mean, tau) * off_diag * tf.cast(degree > 0, h.dtype))
    return out


def propagate(e: tf.Tensor, adj: list[tf.Tensor], w: tf.Tensor) -> list[tf.Tensor]:
    """Eq. 2: node states ``[n^(0), .., n^(L)]``, each [batch, F, d], from embeddings ``e``."""
    states = [e]
    for k, a in enumerate(adj):
        we = tf.einsum("bfd,fde->bfe", e, w[k])
        active = tf.reduce_sum(tf.stop_gradient(tf.round(binarize(a))), axis=1)
        p = tf.einsum("ij,bjd->bid", a, we) / tf.maximum(active, 1.0)[None, :, None]
        states.append(p * states[-1])
    return states
