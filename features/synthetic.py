"""The embedded default dataset: a synthetic Criteo-layout click log with planted effects.

StitchRec's default data (``stitchrec demo`` trains on it) and the ground truth that later work
(cross search, pair statistics, embedding studies) is checked against. The layout is Criteo's:
a 0/1 ``label``, numeric counts ``I1..I{num_numeric}`` and hashed categoricals
``C1..C{num_categorical}`` whose values look like Criteo's 8-hex-digit tokens.

Features. Every cell is missing with probability ``m = missing_rate``. A categorical field ``f``
with vocabulary ``V_f`` draws the frequency rank ``r`` of its value Zipf-like::

    p_f(r) = (r + 1)^-s / sum_{j<V_f} (j + 1)^-s,        r = 0 .. V_f - 1,  s = zipf_exponent

(inverse-CDF sampling) and writes the token ``tok_f[r]``, a seeded random 32-bit number in hex,
unique over all (field, value) pairs, so the rank cannot be read from the token. A numeric field
``k`` is a Criteo-like non-negative count ``I_k = floor(exp(mu_k + sigma_k * eps))``,
``eps ~ N(0, 1)``, with per-field ``mu_k ~ U(-0.5, 5)``, ``sigma_k ~ U(0.6, 1.8)`` drawn from the
seed, stored as float32.

Click model. With ``v_f`` the value rank of field ``f`` and ``z_k`` the standardized
``log1p(I_k)``::

    logit = b + sum_{single f}        s_f   * w_f[v_f]
              + sum_{pairs (a,b)}     s_ab  * G_ab[v_a, v_b]
              + sum_{triples (a,b,c)} s_abc * G_abc[v_a, v_b, v_c]
              + sum_{numeric k}       w_k   * z_k,          z_k = (log1p(I_k) - mean_k) / std_k
    label ~ Bernoulli(sigmoid(logit))

* ``w_f`` holds one N(0, 1) weight per value, centered and scaled to mean 0, variance 1 under
  ``p_f``: ``s_f`` is the standard deviation of the term over the rows where ``f`` is present.
* ``G`` is a table of seeded random +-1 signs over the value tuples of the cross, projected onto
  its pure top-order interaction (the ``p``-weighted mean along every axis is subtracted in turn,
  the weighted ANOVA projection) and scaled to variance 1 under the product of the marginals.
  Its mean over any one field's values is exactly zero for every setting of the other fields, so a
  planted cross is a PURE interaction: it adds no main effect to its fields (and a planted triple
  adds no pair effect to its sub-pairs); only the crossed feature explains it.
* ``mean_k``, ``std_k`` are the population moments of ``log1p(I_k)`` (a 36k-point quadrature
  over ``eps``), reported in the ground truth: they define ``z_k``.
* A missing value contributes 0 to every term that involves it.
* ``s_* = effect_scale * U(0.75, 1.25)``; ``w_k = +-effect_scale * U(0.75, 1.25)``.
* ``b`` is found by bisection so that the mean click probability of a 2^17-row calibration
  sample equals ``target_ctr``.

The effect fields are chosen by the seed over disjoint field sets, so the ground truth is
unambiguous: triples among fields with ``2 <= V <= 100`` (``TRIPLE_MAX_VOCAB``), pairs among the
remaining fields with ``2 <= V <= 1000`` (``PAIR_MAX_VOCAB``), single effects among the other
fields with ``V >= 2``. Small vocabularies keep the head value tuples frequent, so every planted
effect is learnable from about a million rows.

Determinism. The model (tokens, effect tables, intercept) depends on the config and seed only,
never on ``rows`` or the batch size. Rows are generated in fixed chunks of ``CHUNK_ROWS`` rows,
chunk ``i`` from its own ``SeedSequence(seed, spawn_key=(1, i))`` stream, and re-cut to the
requested ``batch_rows``: the same config gives identical columns whatever ``batch_rows`` is,
and the rows of a shorter run are the first rows of a longer one with the same seed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sklearn.metrics import roc_auc_score

from features.readers import ShardWriter, rebatch
from features.schema import FeatureKind, FeatureSpec, Schema, SourceSpec

CHUNK_ROWS = 65_536
CALIBRATION_ROWS = 131_072
TRIPLE_MAX_VOCAB = 100
PAIR_MAX_VOCAB = 1_000
MAX_VOCAB = 100_000_000
SCHEMA_NAME = "synthetic"

# Criteo's (Kaggle) cardinalities, the large ones capped at 100k to keep memory modest
# (about 0.7M values in all).
DEFAULT_VOCAB_SIZES: tuple[int, ...] = (
    1_000, 500, 100_000, 50_000, 300, 24, 10_000, 600, 3, 50_000, 5_000, 100_000, 3_000,
    27, 10_000, 100_000, 10, 5_000, 2_000, 4, 100_000, 18, 15, 50_000, 100, 20_000,
)  # fmt: skip

_PRIVATE_PROB = "__prob"
_PRIVATE_SPLIT = "__split"
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Size, layout and planted effects of the synthetic click log (see the module docstring).

    Attributes:
      rows: number of rows.
      num_numeric: numeric fields I1..I{num_numeric}.
      num_categorical: categorical fields C1..C{num_categorical}.
      vocab_sizes: vocabulary size per categorical field; an int means the same for all. Always
        a tuple after construction.
      zipf_exponent: ``s`` in ``p(rank r) ~ (r + 1)^-s`` within a field.
      zipf_exponents: per-field exponents overriding ``zipf_exponent`` (None: all the same), e.g.
        a flatter field with millions of distinct values for embedding benchmarks.
      missing_rate: share of empty cells in every numeric and categorical field.
      n_single: planted main effects (categorical fields).
      n_pairs: planted order-2 pure interactions.
      n_triples: planted order-3 pure interactions.
      n_numeric_effects: numeric fields with a linear effect of their standardized log1p.
      effect_scale: typical standard deviation of one planted term on the logit.
      target_ctr: mean click probability.
      seed: the seed of everything (model and rows).
    """

    rows: int = 1_000_000
    num_numeric: int = 13
    num_categorical: int = 26
    vocab_sizes: int | tuple[int, ...] = DEFAULT_VOCAB_SIZES
    zipf_exponent: float = 1.1
    zipf_exponents: tuple[float, ...] | None = None
    missing_rate: float = 0.02
    n_single: int = 4
    n_pairs: int = 3
    n_triples: int = 2
    n_numeric_effects: int = 2
    effect_scale: float = 0.5
    target_ctr: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rows", "num_numeric", "num_categorical", "seed"):
            self._check_int(name, 1 if name == "rows" else 0)
        for name in ("n_single", "n_pairs", "n_triples", "n_numeric_effects"):
            self._check_int(name, 0)
        if self.num_numeric + self.num_categorical < 1:
            raise ValueError(
                f"num_numeric + num_categorical must be >= 1 (a schema needs a model input), got "
                f"num_numeric={self.num_numeric}, num_categorical={self.num_categorical}"
            )
        object.__setattr__(self, "vocab_sizes", self._normalized_vocab())
        self._check_real("zipf_exponent", self.zipf_exponent, lo=0.0, lo_open=True)
        if self.zipf_exponents is not None:
            exps = tuple(self.zipf_exponents)
            if len(exps) != self.num_categorical or not all(_is_real(e) and e > 0 for e in exps):
                raise ValueError(
                    f"zipf_exponents must be None or {self.num_categorical} numbers > 0, got "
                    f"{self.zipf_exponents!r}"
                )
            object.__setattr__(self, "zipf_exponents", tuple(float(e) for e in exps))
        self._check_real("missing_rate", self.missing_rate, lo=0.0, hi=1.0)
        self._check_real("effect_scale", self.effect_scale, lo=0.0)
        self._check_real("target_ctr", self.target_ctr, lo=0.0, hi=1.0, lo_open=True)
        if self.n_numeric_effects > self.num_numeric:
            raise ValueError(
                f"n_numeric_effects must be <= num_numeric={self.num_numeric}, got "
                f"{self.n_numeric_effects}"
            )
        self._check_field_budget()

    def _check_int(self, name: str, lo: int) -> None:
        value = getattr(self, name)
        if not _is_int(value) or value < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
        object.__setattr__(self, name, int(value))

    def _check_real(
        self, name: str, value: Any, *, lo: float, hi: float | None = None, lo_open: bool = False
    ) -> None:
        bad = not _is_real(value) or value < lo or (lo_open and value == lo)
        bad = bad or (hi is not None and value >= hi)
        if bad:
            left = "(" if lo_open else "["
            right = f"{hi})" if hi is not None else "inf)"
            raise ValueError(
                f"{name} must be a finite number in {left}{lo}, {right}, got {value!r}"
            )
        object.__setattr__(self, name, float(value))

    def _normalized_vocab(self) -> tuple[int, ...]:
        v = self.vocab_sizes
        sizes = (v,) * self.num_categorical if _is_int(v) else v
        if isinstance(sizes, str | bytes) or not hasattr(sizes, "__len__"):
            raise ValueError(
                f"vocab_sizes must be an int or a sequence of {self.num_categorical} ints, "
                f"got {v!r}"
            )
        sizes = tuple(sizes)
        if len(sizes) != self.num_categorical:
            raise ValueError(
                f"vocab_sizes must have num_categorical={self.num_categorical} entries, got "
                f"{len(sizes)}"
            )
        for i, s in enumerate(sizes):
            if not _is_int(s) or not 1 <= s <= MAX_VOCAB:
                raise ValueError(
                    f"vocab_sizes[{i}] (field C{i + 1}) must be an integer in [1, {MAX_VOCAB}], "
                    f"got {s!r}"
                )
        return tuple(int(s) for s in sizes)

    def _check_field_budget(self) -> None:
        """Planted effects use disjoint fields: triples need V<=100, pairs V<=1000, all V>=2."""
        v = self.vocab_sizes
        n_tri = sum(2 <= s <= TRIPLE_MAX_VOCAB for s in v)
        n_pair = sum(2 <= s <= PAIR_MAX_VOCAB for s in v)
        n_any = sum(s >= 2 for s in v)
        need_tri = 3 * self.n_triples
        need_pair = need_tri + 2 * self.n_pairs
        need_any = need_pair + self.n_single
        if need_tri > n_tri:
            raise ValueError(
                f"vocab_sizes: n_triples={self.n_triples} needs {need_tri} categorical fields "
                f"with a vocabulary in [2, {TRIPLE_MAX_VOCAB}], found {n_tri}; lower n_triples "
                f"or add small fields"
            )
        if need_pair > n_pair:
            raise ValueError(
                f"vocab_sizes: n_pairs={self.n_pairs} with n_triples={self.n_triples} needs "
                f"{need_pair} disjoint categorical fields with a vocabulary in "
                f"[2, {PAIR_MAX_VOCAB}], found {n_pair}; lower n_pairs or add small fields"
            )
        if need_any > n_any:
            raise ValueError(
                f"vocab_sizes: n_single={self.n_single}, n_pairs={self.n_pairs}, "
                f"n_triples={self.n_triples} need {need_any} disjoint categorical fields with a "
                f"vocabulary >= 2, found {n_any} (num_categorical={self.num_categorical})"
            )

    @property
    def numeric_names(self) -> list[str]:
        return [f"I{i + 1}" for i in range(self.num_numeric)]

    @property
    def categorical_names(self) -> list[str]:
        return [f"C{i + 1}" for i in range(self.num_categorical)]


# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------


def field_exponents(config: SyntheticConfig) -> tuple[float, ...]:
    """The Zipf exponent of each categorical field."""
    return config.zipf_exponents or (config.zipf_exponent,) * config.num_categorical


def synthetic_schema(config: SyntheticConfig) -> Schema:
    """Criteo layout read from parquet: label, I* numeric (log1p), C* categorical strings."""
    fields = [FeatureSpec(name="label", kind=FeatureKind.LABEL)]
    fields += [
        FeatureSpec(name=n, kind=FeatureKind.NUMERIC, transform="log1p")
        for n in config.numeric_names
    ]
    fields += [
        FeatureSpec(name=n, kind=FeatureKind.CATEGORICAL, min_count=2)
        for n in config.categorical_names
    ]
    source = SourceSpec(format="parquet", columns=tuple(f.name for f in fields))
    return Schema(name=SCHEMA_NAME, fields=tuple(fields), source=source)


def arrow_schema(config: SyntheticConfig) -> pa.Schema:
    """label float32 (not null), I* float32 (nullable), C* string (nullable)."""
    return pa.schema(
        [pa.field("label", pa.float32(), nullable=False)]
        + [pa.field(n, pa.float32()) for n in config.numeric_names]
        + [pa.field(n, pa.string()) for n in config.categorical_names]
    )


# ---------------------------------------------------------------------------------------------
# The model: tokens, value distributions and planted effects (a function of the config only)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Cross:
    fields: tuple[int, ...]  # categorical field indices
    scale: float
    table: np.ndarray  # unit-variance pure interaction, padded: index -1 (missing) reads 0


@dataclasses.dataclass(frozen=True)
class _Model:
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


def _rng(seed: int, *key: int) -> np.random.Generator:
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
    values = _rng(config.seed, 0, 0).choice(2**32, size=total, replace=False)
    ends = np.cumsum(config.vocab_sizes)
    return tuple(
        _hex_tokens(values[e - v : e]) for e, v in zip(ends, config.vocab_sizes, strict=True)
    )


def _pure_interaction(signs: np.ndarray, probs: list[np.ndarray]) -> np.ndarray:
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
    rng = _rng(config.seed, 0, 1)
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
    rng = _rng(config.seed, 0, key)
    scales = _effect_scales(rng, len(groups), config.effect_scale)
    out = []
    for fields, scale in zip(groups, scales, strict=True):
        shape = tuple(config.vocab_sizes[f] for f in fields)
        if len(fields) == 1:
            raw = rng.standard_normal(shape)
        else:
            raw = rng.integers(0, 2, size=shape, dtype=np.int8) * 2 - 1
        table = _pure_interaction(raw, [probs[f] for f in fields])
        out.append(_Cross(fields=fields, scale=float(scale), table=table))
    return tuple(out)


def _model_without_intercept(config: SyntheticConfig) -> _Model:
    probs = [
        zipf_probabilities(size, exponent)
        for size, exponent in zip(config.vocab_sizes, field_exponents(config), strict=True)
    ]
    singles, pairs, triples = _choose_fields(config)
    rng = _rng(config.seed, 0, 2)
    mu = rng.uniform(-0.5, 5.0, size=config.num_numeric)
    sigma = rng.uniform(0.6, 1.8, size=config.num_numeric)
    moments = np.array(
        [_log1p_count_moments(m, s) for m, s in zip(mu, sigma, strict=True)]
    ).reshape(-1, 2)
    num_fields = rng.permutation(config.num_numeric)[: config.n_numeric_effects]
    num_w = _effect_scales(rng, len(num_fields), config.effect_scale)
    num_w *= rng.choice([-1.0, 1.0], size=len(num_fields))
    return _Model(
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
    )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _calibrate_intercept(offsets: np.ndarray, target: float) -> float:
    """Bisection for ``b`` with ``mean(sigmoid(b + offsets)) = target``."""
    lo, hi = -40.0, 40.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if _sigmoid(mid + offsets).mean() < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=8)
def _cached_model(config: SyntheticConfig) -> _Model:
    model = _model_without_intercept(config)
    draw = _draw_chunk(config, model, _rng(config.seed, 2), CALIBRATION_ROWS)
    b = _calibrate_intercept(draw.offset, config.target_ctr)
    return dataclasses.replace(model, intercept=b)


def _model(config: SyntheticConfig) -> _Model:
    """The model does not depend on ``rows``: one cache entry serves every size."""
    return _cached_model(dataclasses.replace(config, rows=1))


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Draw:
    ranks: list[np.ndarray]  # per categorical field, int32, -1 = missing
    counts: list[np.ndarray]  # per numeric field, float32, NaN = missing
    offset: np.ndarray  # logit minus the intercept
    split_u: np.ndarray
    label_u: np.ndarray


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


def _logit_offset(model: _Model, ranks: list[np.ndarray], counts: list[np.ndarray]) -> np.ndarray:
    """Sum of the planted terms (module docstring); missing values contribute 0."""
    n = len(ranks[0]) if ranks else len(counts[0])
    out = np.zeros(n, dtype=np.float64)
    for cross in (*model.singles, *model.pairs, *model.triples):
        out += cross.scale * cross.table[tuple(ranks[f] for f in cross.fields)]
    for k, w in model.numeric:
        z = (np.log1p(counts[k].astype(np.float64)) - model.num_mean[k]) / model.num_std[k]
        out += w * np.nan_to_num(z, nan=0.0)
    return out


def _draw_chunk(config: SyntheticConfig, model: _Model, rng: np.random.Generator, n: int) -> _Draw:
    """All random draws of ``n`` rows, in a fixed order from one stream."""
    m = config.missing_rate
    ranks = [_draw_categorical(rng, cdf, m, n) for cdf in model.cdfs]
    counts = [
        _draw_count(rng, mu, s, m, n) for mu, s in zip(model.num_mu, model.num_sigma, strict=True)
    ]
    offset = _logit_offset(model, ranks, counts)
    return _Draw(ranks, counts, offset, rng.random(n), rng.random(n))


def _head(x: np.ndarray | list[np.ndarray], n: int) -> Any:
    return [a[:n] for a in x] if isinstance(x, list) else x[:n]


def _chunk_batch(config: SyntheticConfig, model: _Model, index: int) -> pa.RecordBatch:
    """Chunk ``index`` as a RecordBatch plus the private true-probability and split columns."""
    n = min(CHUNK_ROWS, config.rows - index * CHUNK_ROWS)
    # always a full chunk of draws, so a shorter run is a prefix of a longer one
    d = _draw_chunk(config, model, _rng(config.seed, 1, index), CHUNK_ROWS)
    if n < CHUNK_ROWS:
        d = _Draw(*(_head(getattr(d, f.name), n) for f in dataclasses.fields(d)))
    prob = _sigmoid(model.intercept + d.offset)
    cols: list[pa.Array] = [pa.array((d.label_u < prob).astype(np.float32))]
    for c in d.counts:
        miss = np.isnan(c)
        cols.append(pa.array(np.where(miss, np.float32(0), c), mask=miss, type=pa.float32()))
    for r, tokens in zip(d.ranks, model.tokens, strict=True):
        cols.append(pc.take(tokens, pa.array(r, mask=r < 0, type=pa.int32())))
    cols += [pa.array(prob), pa.array(d.split_u)]
    schema = arrow_schema(config)
    schema = schema.append(pa.field(_PRIVATE_PROB, pa.float64())).append(
        pa.field(_PRIVATE_SPLIT, pa.float64())
    )
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _check_positive(name: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _private_batches(config: SyntheticConfig, batch_rows: int) -> Iterator[pa.RecordBatch]:
    model = _model(config)
    chunks = (_chunk_batch(config, model, i) for i in range(-(-config.rows // CHUNK_ROWS)))
    return rebatch(chunks, batch_rows)


def generate_batches(
    config: SyntheticConfig, batch_rows: int = 262_144
) -> Iterator[pa.RecordBatch]:
    """Streams ``config.rows`` rows as RecordBatches of ``batch_rows`` rows (the last: the rest).

    Columns: ``label`` float32 0/1, ``I*`` float32 (null = missing), ``C*`` string (null =
    missing). The rows do not depend on ``batch_rows``.
    """
    batch_rows = _check_positive("batch_rows", batch_rows)
    names = arrow_schema(config).names
    return (b.select(names) for b in _private_batches(config, batch_rows))


def click_probabilities(config: SyntheticConfig, batch_rows: int = 262_144) -> Iterator[np.ndarray]:
    """The true ``sigmoid(logit)`` of each row (float64), batched like ``generate_batches``."""
    batch_rows = _check_positive("batch_rows", batch_rows)
    return (b.column(_PRIVATE_PROB).to_numpy() for b in _private_batches(config, batch_rows))


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
    model = _model(config)
    cat, num = config.categorical_names, config.numeric_names
    used = {f for c in (*model.singles, *model.pairs, *model.triples) for f in c.fields}
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


# ---------------------------------------------------------------------------------------------
# Writing a dataset
# ---------------------------------------------------------------------------------------------


class _SplitWriter:
    """Parquet shards of one split (``features.readers.ShardWriter``) and its row and click
    counts; an empty split still gets one empty, readable shard."""

    def __init__(self, directory: Path, schema: pa.Schema, rows_per_shard: int) -> None:
        self.directory, self.schema = directory, schema
        self._shards = ShardWriter(directory, rows_per_shard, "part")
        self.paths: list[str] = []
        self.rows = 0
        self.clicks = 0.0

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self.clicks += float(pc.sum(batch.column("label")).as_py() or 0.0)
        self._shards.write(batch)

    def finish(self) -> None:
        paths = self._shards.close()
        if not paths:
            paths = [self.directory / "part-00000.parquet"]
            pq.write_table(self.schema.empty_table(), paths[0])
        self.paths = [str(p) for p in paths]


class _TsvWriter:
    """Criteo TSV: label, I* as integers, C* hex tokens; tab separated, empty = missing."""

    def __init__(self, path: Path, config: SyntheticConfig) -> None:
        import pyarrow.csv as pcsv

        self.path = path
        self.schema = pa.schema(
            [pa.field("label", pa.int8())]
            + [pa.field(n, pa.int64()) for n in config.numeric_names]
            + [pa.field(n, pa.string()) for n in config.categorical_names]
        )
        options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
        self._writer = pcsv.CSVWriter(str(path), self.schema, write_options=options)

    def write(self, batch: pa.RecordBatch) -> None:
        cols = [c.cast(t) for c, t in zip(batch.columns, self.schema.types, strict=True)]
        self._writer.write_batch(pa.RecordBatch.from_arrays(cols, schema=self.schema))

    def close(self) -> None:
        self._writer.close()


def _check_write_args(test_fraction: Any, rows_per_shard: Any) -> tuple[float, int]:
    if not _is_real(test_fraction) or not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be a number in [0, 1), got {test_fraction!r}")
    return float(test_fraction), _check_positive("rows_per_shard", rows_per_shard)


def write_dataset(
    config: SyntheticConfig,
    out_dir: str | Path,
    *,
    test_fraction: float = 0.2,
    rows_per_shard: int = 1_000_000,
    criteo_tsv: bool = False,
) -> dict[str, Any]:
    """Writes the dataset under ``out_dir`` and returns a summary.

    Files: ``train/part-NNNNN.parquet``, ``test/part-NNNNN.parquet`` (a row is a test row when
    its seeded split draw is below ``test_fraction``; stale ``part-*.parquet`` files in those
    folders are removed first), ``schema.toml``, ``ground_truth.json`` (``ground_truth(config)``
    plus an ``observed`` entry), and with ``criteo_tsv`` ``train.tsv`` / ``test.tsv`` holding the
    same rows as the parquet splits in Criteo's TSV layout.

    Summary: rows and CTR per split, ``oracle_auc`` (AUC of the true click probability on the test
    split, the ceiling of any model; None for an empty or one-class split) and the paths.
    """
    test_fraction, rows_per_shard = _check_write_args(test_fraction, rows_per_shard)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schema = arrow_schema(config)
    shards = {s: _SplitWriter(out / s, schema, rows_per_shard) for s in ("train", "test")}
    tsv = {s: _TsvWriter(out / f"{s}.tsv", config) for s in shards} if criteo_tsv else {}
    test_probs: list[np.ndarray] = []
    test_labels: list[np.ndarray] = []
    for batch in _private_batches(config, 262_144):
        is_test = pc.less(batch.column(_PRIVATE_SPLIT), test_fraction)
        for split, mask in (("test", is_test), ("train", pc.invert(is_test))):
            part = batch.filter(mask)
            if split == "test":
                test_probs.append(part.column(_PRIVATE_PROB).to_numpy())
                test_labels.append(part.column("label").to_numpy())
            part = part.select(schema.names)
            shards[split].write(part)
            if split in tsv:
                tsv[split].write(part)
    for shard in shards.values():
        shard.finish()
    for writer in tsv.values():
        writer.close()
    y = np.concatenate(test_labels)
    oracle = float(roc_auc_score(y, np.concatenate(test_probs))) if 0 < y.sum() < y.size else None
    summary = _summary(out, shards, tsv, oracle)
    synthetic_schema(config).save(out / "schema.toml")
    truth = ground_truth(config)
    truth["observed"] = {k: summary[k] for k in ("rows", "ctr", "oracle_auc")}
    (out / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return summary


def _summary(
    out: Path, shards: dict[str, _SplitWriter], tsv: dict[str, _TsvWriter], oracle: float | None
) -> dict[str, Any]:
    paths: dict[str, Any] = {s: w.paths for s, w in shards.items()}
    paths["schema"] = str(out / "schema.toml")
    paths["ground_truth"] = str(out / "ground_truth.json")
    for s, w in tsv.items():
        paths[f"{s}_tsv"] = str(w.path)
    return {
        "rows": {s: w.rows for s, w in shards.items()},
        "ctr": {s: (w.clicks / w.rows if w.rows else None) for s, w in shards.items()},
        "oracle_auc": oracle,
        "paths": paths,
    }
