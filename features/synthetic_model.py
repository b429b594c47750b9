"""The synthetic click model: tokens, value distributions, planted effects and the calibrated
intercept (a function of the config only), the draw of one chunk of rows, and the ground truth
the model reports (``features.synthetic`` gives the formulas).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import pyarrow as pa

from features.synthetic_config import (
    CALIBRATION_ROWS,
    MAX_VOCAB,
    PAIR_MAX_VOCAB,
    SCHEMA_NAME,
    TRIPLE_MAX_VOCAB,
    SyntheticConfig,
    field_exponents,
)
from features.synthetic_sequences import (
    ConversionModel,
    HistoryDraw,
    HistoryModel,
    conversion_offset,
    conversion_truth,
    draw_history,
    history_model,
    history_truth,
)

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# The model: tokens, value distributions and planted effects (a function of the config only)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Cross:
    fields: tuple[int, ...]  # categorical field indices
    scale: float
    table: np.ndarray  # unit-variance pure interaction, padded: index -1 (missing) reads 0


@dataclasses.dataclass(frozen=True)
class ClickModel:
    cdfs: tuple[np.ndarray, ...]
    tokens: tuple[pa.StringArray, ...]
    num_mu: np.ndarray
    num_sigma: np.ndarray
    num_mean: np.ndarray  # population mean of log1p(I_k)
    num_std: np.ndarray
    singles: tuple[_Cross, ...]
    pairs: tuple[_Cross, ...]
    triples: tuple[_Cross, ...]
    numeric: tuple[tuple[int, float], ...]  # (numeric field index, weight)
    intercept: float
    history: HistoryModel | None = None  # config.sequences
    conversion: ConversionModel | None = None  # config.conversion


def seeded_rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def zipf_probabilities(vocab_size: int, exponent: float) -> np.ndarray:
    """``p(r) = (r + 1)^-s / sum_j (j + 1)^-s`` for ranks ``r = 0 .. vocab_size - 1``."""
    w = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    return w / w.sum()


def _hex_tokens(values: np.ndarray) -> pa.StringArray:
    """uint32 values -> 8 lowercase hex digits each, built as one Arrow string buffer."""
    shifts = np.arange(28, -4, -4, dtype=np.uint32)
    chars = _HEX[(values.astype(np.uint32)[:, None] >> shifts) & 0xF]
    offsets = np.arange(0, 8 * len(values) + 1, 8, dtype=np.int32)
    return pa.StringArray.from_buffers(
        len(values), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars).tobytes())
    )


def _make_tokens(config: SyntheticConfig) -> tuple[pa.StringArray, ...]:
    """Distinct random 32-bit tokens over all (field, rank), so ranks are not readable."""
    total = sum(config.vocab_sizes)
    values = seeded_rng(config.seed, 0, 0).choice(2**32, size=total, replace=False)
    ends = np.cumsum(config.vocab_sizes)
    return tuple(
        _hex_tokens(values[e - v : e]) for e, v in zip(ends, config.vocab_sizes, strict=True)
    )


def pure_interaction(signs: np.ndarray, probs: list[np.ndarray]) -> np.ndarray:
    """Projects a table onto its top-order interaction under the product of ``probs``.

    Subtracts the ``p``-weighted mean along each axis in turn (the projectors commute), then
    scales to unit variance under the product distribution, and pads every axis with a zero
    slot at the end so that index -1 (missing) reads 0.
    """
    g = signs.astype(np.float64)
    for axis, p in enumerate(probs):
        mean = np.tensordot(g, p, axes=([axis], [0]))
        g = g - np.expand_dims(mean, axis)
    var = g * g
    for p in reversed(probs):  # contract the last axis each time
        var = var @ p
    std = math.sqrt(float(var))
    g = g / std if std > 0 else g
    return np.pad(g, [(0, 1)] * g.ndim)


def _choose_fields(config: SyntheticConfig) -> tuple[list[tuple[int, ...]], ...]:
    """Disjoint field groups: triples (V<=100), pairs (V<=1000), singles (V>=2), by the seed."""
    rng = seeded_rng(config.seed, 0, 1)
    v = config.vocab_sizes
    used: set[int] = set()

    def pick(count: int, order: int, max_vocab: int) -> list[tuple[int, ...]]:
        ok = [i for i, s in enumerate(v) if 2 <= s <= max_vocab and i not in used]
        chosen = [ok[i] for i in rng.permutation(len(ok))[: count * order]]
        used.update(chosen)
        return [tuple(sorted(chosen[j : j + order])) for j in range(0, len(chosen), order)]

    triples = pick(config.n_triples, 3, TRIPLE_MAX_VOCAB)
    pairs = pick(config.n_pairs, 2, PAIR_MAX_VOCAB)
    singles = pick(config.n_single, 1, MAX_VOCAB)
    return singles, pairs, triples


def _log1p_count_moments(mu: float, sigma: float) -> tuple[float, float]:
    """Mean and std of ``log1p(floor(exp(mu + sigma * eps)))``, eps ~ N(0, 1), by quadrature."""
    t = np.linspace(-9.0, 9.0, 36_001)
    w = np.exp(-0.5 * t * t)
    w /= w.sum()
    x = np.log1p(np.floor(np.exp(mu + sigma * t)).astype(np.float32).astype(np.float64))
    mean = float(w @ x)
    return mean, math.sqrt(max(float(w @ (x - mean) ** 2), 1e-12))


def _effect_scales(rng: np.random.Generator, n: int, base: float) -> np.ndarray:
    """``base * U(0.75, 1.25)`` per effect."""
    return base * rng.uniform(0.75, 1.25, size=n)


def _build_crosses(
    config: SyntheticConfig, groups: list[tuple[int, ...]], probs: list[np.ndarray], key: int
) -> tuple[_Cross, ...]:
    """Seeded random +-1 (order >= 2) or N(0,1) (order 1) tables made pure and unit-variance."""
    rng = seeded_rng(config.seed, 0, key)
    scales = _effect_scales(rng, len(groups), config.effect_scale)
    out = []
    for fields, scale in zip(groups, scales, strict=True):
        shape = tuple(config.vocab_sizes[f] for f in fields)
        if len(fields) == 1:
            raw = rng.standard_normal(shape)
        else:
            raw = rng.integers(0, 2, size=shape, dtype=np.int8) * 2 - 1
        table = pure_interaction(raw, [probs[f] for f in fields])
        out.append(_Cross(fields=fields, scale=float(scale), table=table))
    return tuple(out)


def _conversion_model(
    config: SyntheticConfig,
    probs: list[np.ndarray],
    used: set[int],
    click_numeric: np.ndarray,
) -> ConversionModel:
    """Up to two numeric fields without a click effect and one categorical noise field."""
    rng = seeded_rng(config.seed, 0, 7)
    free = [k for k in range(config.num_numeric) if k not in set(click_numeric.tolist())]
    numeric = sorted(free[i] for i in rng.permutation(len(free))[:2])
    weights = _effect_scales(rng, len(numeric), config.conversion_scale)
    weights *= rng.choice([-1.0, 1.0], size=len(numeric))
    noise = [i for i, v in enumerate(config.vocab_sizes) if v >= 2 and i not in used]
    small = [i for i in noise if config.vocab_sizes[i] <= PAIR_MAX_VOCAB] or noise
    field = int(small[rng.integers(len(small))])
    table = pure_interaction(rng.standard_normal(config.vocab_sizes[field]), [probs[field]])
    return ConversionModel(
        numeric=tuple((int(k), float(w)) for k, w in zip(numeric, weights, strict=True)),
        field=field,
        scale=float(_effect_scales(rng, 1, config.conversion_scale)[0]),
        table=table,
    )


def _model_without_intercept(config: SyntheticConfig) -> ClickModel:
    probs = [
        zipf_probabilities(size, exponent)
        for size, exponent in zip(config.vocab_sizes, field_exponents(config), strict=True)
    ]
    singles, pairs, triples = _choose_fields(config)
    rng = seeded_rng(config.seed, 0, 2)
    mu = rng.uniform(-0.5, 5.0, size=config.num_numeric)
    sigma = rng.uniform(0.6, 1.8, size=config.num_numeric)
    moments = np.array(
        [_log1p_count_moments(m, s) for m, s in zip(mu, sigma, strict=True)]
    ).reshape(-1, 2)
    num_fields = rng.permutation(config.num_numeric)[: config.n_numeric_effects]
    num_w = _effect_scales(rng, len(num_fields), config.effect_scale)
    num_w *= rng.choice([-1.0, 1.0], size=len(num_fields))
    used = {f for group in (*singles, *pairs, *triples) for f in group}
    history = conversion = None
    if config.sequences:
        ranks = zipf_probabilities(config.items_per_cluster, config.zipf_exponent)
        history = history_model(config, seeded_rng(config.seed, 0, 6), ranks)
    if config.conversion:
        conversion = _conversion_model(config, probs, used, num_fields)
    return ClickModel(
        cdfs=tuple(np.cumsum(p) for p in probs),
        tokens=_make_tokens(config),
        num_mu=mu,
        num_sigma=sigma,
        num_mean=moments[:, 0],
        num_std=moments[:, 1],
        singles=_build_crosses(config, singles, probs, 3),
        pairs=_build_crosses(config, pairs, probs, 4),
        triples=_build_crosses(config, triples, probs, 5),
        numeric=tuple((int(k), float(w)) for k, w in zip(sorted(num_fields), num_w, strict=True)),
        intercept=0.0,
        history=history,
        conversion=conversion,
    )


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def calibrate_intercept(offsets: np.ndarray, target: float) -> float:
    """Bisection for ``b`` with ``mean(sigmoid(b + offsets)) = target``."""
    lo, hi = -40.0, 40.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if sigmoid(mid + offsets).mean() < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=8)
def _cached_model(config: SyntheticConfig) -> ClickModel:
    model = _model_without_intercept(config)
    draw = draw_chunk(config, model, seeded_rng(config.seed, 2), CALIBRATION_ROWS)
    b = calibrate_intercept(draw.offset, config.target_ctr)
    if model.conversion is not None:
        b_buy = calibrate_intercept(draw.buy_offset, config.target_cvr)
        conversion = dataclasses.replace(model.conversion, intercept=b_buy)
        model = dataclasses.replace(model, conversion=conversion)
    return dataclasses.replace(model, intercept=b)


def click_model(config: SyntheticConfig) -> ClickModel:
    """The model does not depend on ``rows``: one cache entry serves every size."""
    return _cached_model(dataclasses.replace(config, rows=1))


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Draw:
    ranks: list[np.ndarray]  # per categorical field, int32, -1 = missing
    counts: list[np.ndarray]  # per numeric field, float32, NaN = missing
    offset: np.ndarray  # logit minus the intercept
    split_u: np.ndarray
    label_u: np.ndarray
    history: HistoryDraw | None = None  # config.sequences
    buy_offset: np.ndarray | None = None  # config.conversion: pCVR logit minus its intercept
    buy_u: np.ndarray | None = None


def _draw_categorical(rng: np.random.Generator, cdf: np.ndarray, m: float, n: int) -> np.ndarray:
    """One uniform per cell: ``u < m`` is missing, else rank = searchsorted(cdf, (u-m)/(1-m))."""
    u = rng.random(n)
    ranks = np.searchsorted(cdf, (u - m) / (1.0 - m), side="right").astype(np.int32)
    np.minimum(ranks, len(cdf) - 1, out=ranks)
    ranks[u < m] = -1
    return ranks


def _draw_count(rng: np.random.Generator, mu: float, sigma: float, m: float, n: int) -> np.ndarray:
    """``floor(exp(mu + sigma * eps))`` as float32, NaN where missing."""
    eps = rng.standard_normal(n)
    miss = rng.random(n) < m
    counts = np.floor(np.exp(mu + sigma * eps)).astype(np.float32)
    counts[miss] = np.nan
    return counts


def logit_offset(
    model: ClickModel, ranks: list[np.ndarray], counts: list[np.ndarray]
) -> np.ndarray:
    """Sum of the planted terms (module docstring); missing values contribute 0."""
    n = len(ranks[0]) if ranks else len(counts[0])
    out = np.zeros(n, dtype=np.float64)
    for cross in (*model.singles, *model.pairs, *model.triples):
        out += cross.scale * cross.table[tuple(ranks[f] for f in cross.fields)]
    for k, w in model.numeric:
        z = (np.log1p(counts[k].astype(np.float64)) - model.num_mean[k]) / model.num_std[k]
        out += w * np.nan_to_num(z, nan=0.0)
    return out


def draw_chunk(
    config: SyntheticConfig, model: ClickModel, rng: np.random.Generator, n: int
) -> Draw:
    """All random draws of ``n`` rows, in a fixed order from one stream (the history and
    conversion draws last, so the other columns do not depend on them)."""
    m = config.missing_rate
    ranks = [_draw_categorical(rng, cdf, m, n) for cdf in model.cdfs]
    counts = [
        _draw_count(rng, mu, s, m, n) for mu, s in zip(model.num_mu, model.num_sigma, strict=True)
    ]
    offset = logit_offset(model, ranks, counts)
    draw = Draw(ranks, counts, offset, rng.random(n), rng.random(n))
    if model.history is not None:
        draw.history = draw_history(config, model.history, rng, n)
        draw.offset = draw.offset + draw.history.term
    if model.conversion is not None:
        draw.buy_offset = conversion_offset(
            model.conversion, ranks, counts, model.num_mean, model.num_std
        )
        draw.buy_u = rng.random(n)
    return draw


# ---------------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------------


def _cross_entries(config: SyntheticConfig, crosses: tuple[_Cross, ...]) -> list[dict[str, Any]]:
    names = config.categorical_names
    return [
        {"fields": [names[f] for f in c.fields], "order": len(c.fields), "scale": c.scale}
        for c in crosses
    ]


def ground_truth(config: SyntheticConfig) -> dict[str, Any]:
    """JSON-able description of the planted effects (see the module docstring for the formula).

    ``scale`` is the standard deviation of a term on the logit where its fields are present;
    ``noise_fields`` are the categorical fields in no planted effect.
    """
    model = click_model(config)
    cat, num = config.categorical_names, config.numeric_names
    used = {f for c in (*model.singles, *model.pairs, *model.triples) for f in c.fields}
    truth = _click_truth(config, model, used)
    if model.history is not None:
        truth["history"] = history_truth(config, model.history)
    if model.conversion is not None:
        truth["conversion"] = conversion_truth(model.conversion, cat, num)
    return truth


def _click_truth(config: SyntheticConfig, model: ClickModel, used: set[int]) -> dict[str, Any]:
    cat, num = config.categorical_names, config.numeric_names
    return {
        "name": SCHEMA_NAME,
        "seed": config.seed,
        "rows": config.rows,
        "intercept": model.intercept,
        "target_ctr": config.target_ctr,
        "effect_scale": config.effect_scale,
        "zipf_exponent": config.zipf_exponent,
        "zipf_exponents": list(field_exponents(config)),
        "missing_rate": config.missing_rate,
        "vocab_sizes": dict(zip(cat, config.vocab_sizes, strict=True)),
        "single": [{"field": cat[c.fields[0]], "scale": c.scale} for c in model.singles],
        "pairs": _cross_entries(config, model.pairs),
        "triples": _cross_entries(config, model.triples),
        "numeric": [
            {
                "field": num[k],
                "weight": w,
                "log1p_mean": float(model.num_mean[k]),
                "log1p_std": float(model.num_std[k]),
            }
            for k, w in model.numeric
        ],
        "numeric_lognormal": {
            n: {"mu": float(m), "sigma": float(s)}
            for n, m, s in zip(num, model.num_mu, model.num_sigma, strict=True)
        },
        "noise_fields": [n for i, n in enumerate(cat) if i not in used],
        "formula": (
            "logit = intercept + sum_single scale*w_f[v_f] + sum_pairs scale*G(v_a,v_b) + "
            "sum_triples scale*G(v_a,v_b,v_c) + sum_numeric weight*(log1p(I_k)-log1p_mean)/"
            "log1p_std; label ~ Bernoulli(sigmoid(logit)); missing values contribute 0"
        ),
    }
