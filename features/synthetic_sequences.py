"""Behaviour sequences and a conversion label for the synthetic click log (opt-in).

``SyntheticConfig(sequences=True)`` adds four fields and a planted history x target term to the
click logit; ``SyntheticConfig(conversion=True)`` adds a second label ``buy`` defined on the
clicked rows. Both are off by default, and then the data is exactly the Criteo-layout log of
``features.synthetic``.

Items and clusters. ``K = num_clusters`` latent interest clusters hold ``S = items_per_cluster``
items each (``V = K * S`` items); a seeded permutation assigns the items to clusters, and within a
cluster the item of rank ``r`` is drawn with the Zipf probability ``(r + 1)^-s / sum_j (j + 1)^-s``
(``s = zipf_exponent``). An item's token is a seeded 8-hex-digit number prefixed ``i``; a cluster's
token is ``k<cluster>``.

Rows. Each row (an impression of one user) draws its user's interest cluster ``c_u`` uniformly
from the K clusters and a history length ``L``: 0 with probability ``hist_empty_rate``, else
uniform on ``1 .. hist_max_len``. History position ``j`` (``j = 0`` the newest) draws its
cluster ``c_j = c_u`` with probability ``f = interest_focus``, else uniformly from all K, and then
an item of that cluster. The target item's cluster ``c_t`` is ``c_u`` with probability
``rho = target_interest``, else uniform, and then an item of that cluster. Columns::

    item        the target item's token                         categorical
    item_cat    k<c_t>                                          categorical
    hist_items  the L history items' tokens, newest first, "|"  sequence (shares item's table)
    hist_cats   k<c_j> of each history item, aligned            sequence (shares item_cat's
                                                                table, aligned_with hist_items)

History x target term, added to the click logit of ``features.synthetic``::

    H = hist_strength * sum_{j < L} hist_decay^j * ([c_t == c_j] - kappa)
    kappa = a * (f + (1 - f) / K) + (1 - a) * (1 - f) / K,       a = rho + (1 - rho) / K

``kappa = P(c_j = c_t | c_t)`` is the same for every target cluster, so ``E[H | item] = 0``,
``E[H | item_cat] = 0`` and ``E[H | L] = 0``: the term adds no main effect to the target item,
its category or the history length; only the match between the target and the recent history
explains it. The click intercept is calibrated with ``H`` included.

Conversion. With ``conversion=True`` a clicked row converts (``buy = 1``) with probability::

    pCVR = sigmoid(b_buy + sum_{numeric k in B} w_k * z_k + s_g * w_g[v_g])
    buy  = label * Bernoulli(pCVR)                      (0 wherever label = 0)

``B`` holds up to two numeric fields without a click effect and ``g`` is one categorical field in
no click effect (a noise field of the click model), so the conversion depends on other fields
than the click; ``z_k`` is standardized as in the click model, ``w_g`` is a centered,
unit-variance table under the field's value distribution, ``w_k = +-conversion_scale *
U(0.75, 1.25)``, ``s_g = conversion_scale * U(0.75, 1.25)``, and ``b_buy`` is found by bisection
so that the mean pCVR of the calibration sample equals ``target_cvr``. The true click-and-buy
probability (pCTCVR, ESMM's full-impression target) is ``pCTR * pCVR``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.synthetic_config import CONVERSION_LABEL, HISTORY_FIELDS, SyntheticConfig

SEPARATOR = "|"


@dataclasses.dataclass(frozen=True)
class HistoryModel:
    """Items, clusters and the term ``H`` (module docstring); a function of the config only."""

    item_of: np.ndarray  # [K, S] item index of the rank-r item of each cluster
    cluster_of: np.ndarray  # [V] cluster of each item
    rank_cdf: np.ndarray  # [S] Zipf CDF over the ranks inside a cluster
    item_tokens: pa.StringArray  # [V]
    cluster_tokens: pa.StringArray  # [K]
    kappa: float


@dataclasses.dataclass(frozen=True)
class ConversionModel:
    """The pCVR logit's fields and weights (module docstring)."""

    numeric: tuple[tuple[int, float], ...]  # (numeric field index, weight)
    field: int  # categorical field index
    scale: float
    table: np.ndarray  # unit-variance, centered; padded so index -1 (missing) reads 0
    intercept: float = 0.0


@dataclasses.dataclass
class HistoryDraw:
    """``n`` rows of targets and histories (a ragged history: ``lengths`` and flat arrays)."""

    target: np.ndarray  # [n] item index
    target_cluster: np.ndarray  # [n]
    lengths: np.ndarray  # [n]
    hist_items: np.ndarray  # [sum(lengths)], row-major, newest first within a row
    hist_clusters: np.ndarray  # [sum(lengths)]
    term: np.ndarray  # [n] H

    def head(self, n: int) -> HistoryDraw:
        """The first ``n`` rows."""
        end = int(self.lengths[:n].sum())
        return HistoryDraw(
            self.target[:n],
            self.target_cluster[:n],
            self.lengths[:n],
            self.hist_items[:end],
            self.hist_clusters[:end],
            self.term[:n],
        )


def kappa(num_clusters: int, focus: float, target_interest: float) -> float:
    """``P(c_j = c_t | c_t)``, the centering constant of ``H``."""
    k = num_clusters
    a = target_interest + (1.0 - target_interest) / k
    return a * (focus + (1.0 - focus) / k) + (1.0 - a) * (1.0 - focus) / k


def _prefixed_tokens(prefix: str, values: np.ndarray) -> pa.StringArray:
    return pa.array([f"{prefix}{int(v):08x}" for v in values], type=pa.string())


def history_model(
    config: SyntheticConfig, rng: np.random.Generator, rank_probs: np.ndarray
) -> HistoryModel:
    """Seeded assignment of items to clusters and item tokens; ``rank_probs`` [S] sums to 1."""
    k, s = config.num_clusters, config.items_per_cluster
    item_of = rng.permutation(k * s).reshape(k, s)
    cluster_of = np.empty(k * s, dtype=np.int64)
    cluster_of[item_of] = np.arange(k)[:, None]
    tokens = rng.choice(2**32, size=k * s, replace=False)
    return HistoryModel(
        item_of=item_of,
        cluster_of=cluster_of,
        rank_cdf=np.cumsum(rank_probs),
        item_tokens=_prefixed_tokens("i", tokens),
        cluster_tokens=pa.array([f"k{c}" for c in range(k)], type=pa.string()),
        kappa=kappa(k, config.interest_focus, config.target_interest),
    )


def _items(model: HistoryModel, rng: np.random.Generator, clusters: np.ndarray) -> np.ndarray:
    ranks = np.searchsorted(model.rank_cdf, rng.random(len(clusters)), side="right")
    np.minimum(ranks, len(model.rank_cdf) - 1, out=ranks)
    return model.item_of[clusters, ranks]


def draw_history(
    config: SyntheticConfig, model: HistoryModel, rng: np.random.Generator, n: int
) -> HistoryDraw:
    """All history draws of ``n`` rows, in a fixed order from ``rng``."""
    k = config.num_clusters
    interest = rng.integers(0, k, size=n)
    lengths = rng.integers(1, config.hist_max_len + 1, size=n)
    lengths[rng.random(n) < config.hist_empty_rate] = 0
    focused = rng.random(n) < config.target_interest
    target_cluster = np.where(focused, interest, rng.integers(0, k, size=n))
    target = _items(model, rng, target_cluster)
    total = int(lengths.sum())
    rows = np.repeat(np.arange(n), lengths)
    focused = rng.random(total) < config.interest_focus
    hist_clusters = np.where(focused, interest[rows], rng.integers(0, k, size=total))
    hist_items = _items(model, rng, hist_clusters)
    starts = np.cumsum(lengths) - lengths
    position = np.arange(total) - starts[rows]
    match = (hist_clusters == target_cluster[rows]).astype(np.float64)
    contrib = config.hist_decay**position * (match - model.kappa)
    term = config.hist_strength * np.bincount(rows, weights=contrib, minlength=n)
    return HistoryDraw(target, target_cluster, lengths, hist_items, hist_clusters, term)


def _joined(tokens: pa.StringArray, values: np.ndarray, lengths: np.ndarray) -> pa.Array:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    flat = pc.take(tokens, pa.array(values, type=pa.int64()))
    lists = pa.ListArray.from_arrays(pa.array(offsets), flat)
    return pc.binary_join(lists, SEPARATOR)


def history_columns(model: HistoryModel, draw: HistoryDraw) -> dict[str, pa.Array]:
    """The four string columns of ``HISTORY_FIELDS``; an empty history is an empty string."""
    return {
        "item": pc.take(model.item_tokens, pa.array(draw.target, type=pa.int64())),
        "item_cat": pc.take(model.cluster_tokens, pa.array(draw.target_cluster, type=pa.int64())),
        "hist_items": _joined(model.item_tokens, draw.hist_items, draw.lengths),
        "hist_cats": _joined(model.cluster_tokens, draw.hist_clusters, draw.lengths),
    }


def conversion_offset(
    model: ConversionModel,
    ranks: list[np.ndarray],
    counts: list[np.ndarray],
    num_mean: np.ndarray,
    num_std: np.ndarray,
) -> np.ndarray:
    """The pCVR logit minus ``b_buy``; missing values contribute 0."""
    out = model.scale * model.table[ranks[model.field]]
    for k, w in model.numeric:
        z = (np.log1p(counts[k].astype(np.float64)) - num_mean[k]) / num_std[k]
        out = out + w * np.nan_to_num(z, nan=0.0)
    return out


def history_truth(config: SyntheticConfig, model: HistoryModel) -> dict[str, Any]:
    """JSON-able description of the history term."""
    return {
        "fields": list(HISTORY_FIELDS),
        "num_clusters": config.num_clusters,
        "items_per_cluster": config.items_per_cluster,
        "hist_max_len": config.hist_max_len,
        "hist_empty_rate": config.hist_empty_rate,
        "interest_focus": config.interest_focus,
        "target_interest": config.target_interest,
        "decay": config.hist_decay,
        "strength": config.hist_strength,
        "kappa": model.kappa,
        "formula": (
            "click logit += strength * sum_{j<L} decay^j * ([cluster(item) == cluster("
            "hist_items[j])] - kappa); j = 0 is the newest history item; E[term | item] = 0"
        ),
    }


def conversion_truth(
    model: ConversionModel, categorical: list[str], numeric: list[str]
) -> dict[str, Any]:
    """JSON-able description of the conversion model."""
    return {
        "label": CONVERSION_LABEL,
        "defined_on": "label",
        "intercept": model.intercept,
        "single": {"field": categorical[model.field], "scale": model.scale},
        "numeric": [{"field": numeric[k], "weight": w} for k, w in model.numeric],
        "formula": (
            "pCVR = sigmoid(intercept + single.scale*w_g[v_g] + sum_numeric weight*z_k); "
            "buy = label * Bernoulli(pCVR); pCTCVR = pCTR * pCVR"
        ),
    }
