"""Reading ranked crosses off a trained FIVES network (by adjacency paths or by contribution)
and counting the distinct value tuples of each cross."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from features.crosses.artifact import Cross
from features.crosses.fives_encoding import FieldEncoder
from features.crosses.fives_graph import adjacency, binarize
from features.crosses.fives_network import FivesNetwork

# ---------------------------------------------------------------------------------------------
# Reading crosses off the adjacencies
# ---------------------------------------------------------------------------------------------


def extract_crosses(
    adj: Sequence[np.ndarray], fields: Sequence[str], beam: int = 8
) -> list[tuple[tuple[str, ...], float, bool]]:
    """Ranked ``(fields, strength, active)`` of every cross the adjacencies ``adj`` hold.

    Order k+1 crosses are the paths root i -> l_1 (layer 1) -> ... with one neighbour per layer
    among the ``beam`` strongest of each layer (all of them when F <= beam + 1): strength
    ``prod_k A^(k)[i, l_k]``, the best path per field set. Sorted by strength, then order.
    """
    f = len(fields)
    best: dict[frozenset[int], tuple[float, tuple[int, ...], bool]] = {}
    for i in range(f):
        tops = [
            [j for j in np.argsort(-a[i], kind="stable")[: max(beam, 1)] if j != i] for a in adj
        ]
        for depth in range(1, len(adj) + 1):
            for path in itertools.product(*tops[:depth]):
                members = (i, *path)
                if len(set(members)) != len(members):
                    continue
                s = float(np.prod([adj[k][i, j] for k, j in enumerate(path)]))
                active = all(adj[k][i, j] >= 0.5 for k, j in enumerate(path))
                key = frozenset(members)
                if key not in best or s > best[key][0]:
                    best[key] = (s, members, active)
    ranked = sorted(best.values(), key=lambda t: (-t[0], -len(t[1]), t[1]))
    return [(tuple(fields[m] for m in sorted(members)), s, act) for s, members, act in ranked]


def contributions(
    net: FivesNetwork, ids: np.ndarray, fields: Sequence[str], chunk: int = 128
) -> list[tuple[tuple[str, ...], float, bool]]:
    """Ranked ``(fields, strength, active)`` of pairs and triples by what they add to the logit.

    Needs a linear readout (``mlp = ()``) and ``max_order <= 3``. The logit is then a sum of
    product terms, each a function of the values of one field set::

        logit = b + sum_i w0_i . e_i
                  + sum_{i,l} w1_i . (e_i * a1_il W1_l e_l)                         pairs {i, l}
                  + sum_{i,l,j} w2_i . (e_i * a1_il W1_l e_l * a2_ij W2_j e_j)    {i, l, j}

    with ``a`` the network's adjacency divided by the node's active degree (as in ``propagate``).
    Each term is measured on centered embeddings ``e_i - mean(e_i)`` (the mean over ``ids``):
    with independent fields that is its pure interaction part (the ANOVA projection: its mean
    over any one field's values is zero), so a cross's main effects and, for a triple, its pair
    effects do not count towards it. A cross's contribution is the sum of its terms over every path that gives its field set
    (a pair from nodes i and l; a triple from its 6 orderings; a layer-2 term with l = j belongs
    to the pair {i, l}); its raw strength is that contribution's standard deviation over ``ids``
    (logit units), and ``strength`` divides by the largest one, so the top cross has 1.
    ``active``: every edge of some path is on after binarization.

    Shapes: ``ids`` int32 [rows, F]; per chunk the layer-2 terms are [chunk, F, F, F].
    """
    if net.mlp_sizes or net.max_order > 3:
        raise ValueError(
            f"contributions need a linear readout (mlp = ()) and max_order <= 3, got mlp "
            f"{net.mlp_sizes} and max_order {net.max_order}"
        )
    f, d, layers = net.num_fields, net.embedding_dim, net.max_order - 1
    adj = adjacency(tf.convert_to_tensor(net.h), net.tau, net.heredity)
    hard = [np.asarray(a.numpy() >= 0.5) for a in adj]
    norm = []
    for a in adj:
        active = tf.reduce_sum(tf.round(binarize(a)), axis=1)
        norm.append(a / tf.maximum(active, 1.0)[:, None])
    kernel = tf.reshape(net.out.kernel[:, 0], (layers + 1, f, d))
    s1 = np.zeros((f, f))
    q1 = np.zeros((f, f))
    s2 = np.zeros((f, f, f))
    q2 = np.zeros((f, f, f))
    rows = 0
    mean = _mean_embeddings(net, ids, chunk)
    for start in range(0, len(ids), chunk):
        x = tf.cast(ids[start : start + chunk], tf.int32)
        e = tf.gather(net.table, x + net.offsets) - mean  # [b, F, d], centered
        we1 = tf.einsum("bfd,fde->bfe", e, net.w[0])
        # t1[b, i, l] = a1_il * w1_i . (e_i * W1_l e_l)
        t1 = tf.einsum("il,bid,bld->bil", norm[0], e * kernel[1][None], we1)
        pair = t1 + tf.transpose(t1, (0, 2, 1))
        if layers == 2:
            we2 = tf.einsum("bfd,fde->bfe", e, net.w[1])
            # t2[b, i, l, j] = a1_il a2_ij w2_i . (e_i * W1_l e_l * W2_j e_j)
            t2 = tf.einsum(
                "il,ij,bid,bld,bjd->bilj", norm[0], norm[1], e * kernel[2][None], we1, we2
            )
            diag = tf.linalg.diag_part(t2)  # [b, i, l]: l = j, the pair {i, l}
            pair += diag + tf.transpose(diag, (0, 2, 1))
            t2 = t2 - tf.linalg.diag(diag)
            sym = tf.add_n([tf.transpose(t2, (0, *p)) for p in itertools.permutations((1, 2, 3))])
            s2 += tf.reduce_sum(sym, 0).numpy()
            q2 += tf.reduce_sum(tf.square(sym), 0).numpy()
        s1 += tf.reduce_sum(pair, 0).numpy()
        q1 += tf.reduce_sum(tf.square(pair), 0).numpy()
        rows += int(x.shape[0])
    n = max(rows, 1)
    std1 = np.sqrt(np.maximum(q1 / n - (s1 / n) ** 2, 0.0))
    std2 = np.sqrt(np.maximum(q2 / n - (s2 / n) ** 2, 0.0))
    return _ranked(std1, std2 if layers == 2 else None, hard, fields)


def _mean_embeddings(net: FivesNetwork, ids: np.ndarray, chunk: int) -> tf.Tensor:
    """[F, d]: each field's mean embedding over the rows of ``ids``."""
    total = np.zeros((net.num_fields, net.embedding_dim))
    for start in range(0, len(ids), chunk):
        x = tf.cast(ids[start : start + chunk], tf.int32)
        total += tf.reduce_sum(tf.gather(net.table, x + net.offsets), 0).numpy()
    return tf.constant(total / max(len(ids), 1), net.table.dtype)


def _ranked(
    std1: np.ndarray, std2: np.ndarray | None, hard: list[np.ndarray], fields: Sequence[str]
) -> list[tuple[tuple[str, ...], float, bool]]:
    """Pairs (``std1`` [F, F]) and triples (``std2`` [F, F, F], when the network has them)
    ranked by raw strength, divided by the largest; ``active`` from the binarized adjacency
    ``hard``."""
    f = std1.shape[0]
    out: list[tuple[float, tuple[int, ...], bool]] = []
    for i, k in itertools.combinations(range(f), 2):
        act = bool(hard[0][i, k] or hard[0][k, i])
        out.append((float(std1[i, k]), (i, k), act))
    if std2 is not None:
        for i, k, j in itertools.combinations(range(f), 3):
            act = any(
                hard[0][a, b] and hard[1][a, c] for a, b, c in itertools.permutations((i, k, j))
            )
            out.append((float(std2[i, k, j]), (i, k, j), act))
    top = max((s for s, _, _ in out), default=0.0) or 1.0
    ranked = sorted(out, key=lambda t: (-t[0], -len(t[1]), t[1]))
    return [(tuple(fields[m] for m in members), s / top, act) for s, members, act in ranked]


def with_distinct(
    ranked: list[tuple[tuple[str, ...], float, bool]],
    encoder: FieldEncoder,
    ids: np.ndarray,
    limit: int = 200,
    extras: dict[frozenset[str], tuple[str, float | None]] | None = None,
) -> list[Cross]:
    """Crosses with the count of distinct value tuples (of the first ``limit`` crosses).

    ``extras`` gives a field set's ``(source, effect)`` where the screen measured it.
    """
    col = {n: i for i, n in enumerate(encoder.fields)}
    sizes = np.asarray(encoder.vocab_sizes, np.int64)
    out = []
    for rank, (fields, strength, active) in enumerate(ranked):
        distinct = 0
        if rank < limit:
            key = np.zeros(len(ids), np.int64)
            for f in fields:
                key = key * sizes[col[f]] + ids[:, col[f]]
            distinct = int(np.unique(key).size)
        source, effect = (extras or {}).get(frozenset(fields), ("fives", None))
        out.append(
            Cross(
                fields=fields,
                strength=strength,
                active=active,
                distinct=distinct,
                source=source,
                effect=effect,
            )
        )
    return out
