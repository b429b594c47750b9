"""The synthetic dataset's settings (``SyntheticConfig``), its constants and its schema
(``synthetic_schema``, ``arrow_schema``); ``features.synthetic`` describes the data.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import pyarrow as pa

from features.schema import FeatureKind, FeatureSpec, Schema, SourceSpec

CHUNK_ROWS = 65_536
CALIBRATION_ROWS = 131_072
TRIPLE_MAX_VOCAB = 100
PAIR_MAX_VOCAB = 1_000
MAX_VOCAB = 100_000_000
SCHEMA_NAME = "synthetic"
LABEL = "label"
CONVERSION_LABEL = "buy"
HISTORY_FIELDS = ("item", "item_cat", "hist_items", "hist_cats")

# Criteo's (Kaggle) cardinalities, the large ones capped at 100k to keep memory modest
# (about 0.7M values in all).
DEFAULT_VOCAB_SIZES: tuple[int, ...] = (
    1_000, 500, 100_000, 50_000, 300, 24, 10_000, 600, 3, 50_000, 5_000, 100_000, 3_000,
    27, 10_000, 100_000, 10, 5_000, 2_000, 4, 100_000, 18, 15, 50_000, 100, 20_000,
)  # fmt: skip


def is_int(v: Any) -> bool:
    """An integer setting (a bool is not one)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    """A finite real setting (a bool is not one)."""
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
      sequences: add the target ``item``, its cluster ``item_cat``, the history sequences
        ``hist_items`` and ``hist_cats`` and the planted history x target click term
        (``features.synthetic_sequences``).
      num_clusters: latent interest clusters ``K`` (sequences only).
      items_per_cluster: items per cluster ``S``; ``K * S`` items in all.
      hist_max_len: the longest history; the schema's ``max_len``.
      hist_empty_rate: share of rows with an empty history.
      interest_focus: ``f``, chance that a history item comes from the user's interest cluster.
      target_interest: ``rho``, chance that the target item comes from it.
      hist_decay: weight ``decay^j`` of history position ``j`` (0 = newest) in the term.
      hist_strength: scale of the history x target term on the click logit.
      conversion: add the label ``buy`` defined on the clicked rows.
      target_cvr: mean conversion probability of a click.
      conversion_scale: typical size of one conversion term on the pCVR logit.
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
    sequences: bool = False
    num_clusters: int = 10
    items_per_cluster: int = 200
    hist_max_len: int = 20
    hist_empty_rate: float = 0.1
    interest_focus: float = 0.7
    target_interest: float = 0.3
    hist_decay: float = 0.8
    hist_strength: float = 0.5
    conversion: bool = False
    target_cvr: float = 0.2
    conversion_scale: float = 1.0

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
            if len(exps) != self.num_categorical or not all(is_real(e) and e > 0 for e in exps):
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
        self._check_sequences()

    def _check_sequences(self) -> None:
        for name in ("sequences", "conversion"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("num_clusters", "items_per_cluster", "hist_max_len"):
            self._check_int(name, 1)
        for name in ("hist_empty_rate", "interest_focus", "target_interest"):
            self._check_real(name, getattr(self, name), lo=0.0, hi=1.0)
        self._check_real("hist_decay", self.hist_decay, lo=0.0)
        self._check_real("hist_strength", self.hist_strength, lo=0.0)
        self._check_real("target_cvr", self.target_cvr, lo=0.0, hi=1.0, lo_open=True)
        self._check_real("conversion_scale", self.conversion_scale, lo=0.0)
        if self.conversion:
            noise = sum(s >= 2 for s in self.vocab_sizes) - (
                3 * self.n_triples + 2 * self.n_pairs + self.n_single
            )
            if noise < 1:
                raise ValueError(
                    "conversion needs a categorical field with a vocabulary >= 2 in no planted "
                    "click effect: lower n_single, n_pairs or n_triples or add a field"
                )

    def _check_int(self, name: str, lo: int) -> None:
        value = getattr(self, name)
        if not is_int(value) or value < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
        object.__setattr__(self, name, int(value))

    def _check_real(
        self, name: str, value: Any, *, lo: float, hi: float | None = None, lo_open: bool = False
    ) -> None:
        bad = not is_real(value) or value < lo or (lo_open and value == lo)
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
        sizes = (v,) * self.num_categorical if is_int(v) else v
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
            if not is_int(s) or not 1 <= s <= MAX_VOCAB:
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
    """Criteo layout read from parquet: label, I* numeric (log1p), C* categorical strings; with
    ``conversion`` the label ``buy`` defined on ``label``, with ``sequences`` the target ``item``
    and ``item_cat`` (categorical) and the sequences ``hist_items`` (sharing ``item``'s table)
    and ``hist_cats`` (sharing ``item_cat``'s table, aligned with ``hist_items``)."""
    fields = [FeatureSpec(name=LABEL, kind=FeatureKind.LABEL)]
    if config.conversion:
        fields.append(FeatureSpec(name=CONVERSION_LABEL, kind=FeatureKind.LABEL, defined_on=LABEL))
    fields += [
        FeatureSpec(name=n, kind=FeatureKind.NUMERIC, transform="log1p")
        for n in config.numeric_names
    ]
    fields += [
        FeatureSpec(name=n, kind=FeatureKind.CATEGORICAL, min_count=2)
        for n in config.categorical_names
    ]
    if config.sequences:
        fields += _history_specs(config)
    source = SourceSpec(format="parquet", columns=tuple(f.name for f in fields))
    return Schema(name=SCHEMA_NAME, fields=tuple(fields), source=source)


def _history_specs(config: SyntheticConfig) -> list[FeatureSpec]:
    item, item_cat, hist_items, hist_cats = HISTORY_FIELDS
    sequence = FeatureKind("sequence")
    return [
        FeatureSpec(name=item, kind=FeatureKind.CATEGORICAL, group="item"),
        FeatureSpec(name=item_cat, kind=FeatureKind.CATEGORICAL, group="item"),
        FeatureSpec(
            name=hist_items,
            kind=sequence,
            max_len=config.hist_max_len,
            shares_embedding_with=item,
            group="user",
        ),
        FeatureSpec(
            name=hist_cats,
            kind=sequence,
            max_len=config.hist_max_len,
            shares_embedding_with=item_cat,
            aligned_with=hist_items,
            group="user",
        ),
    ]


def arrow_schema(config: SyntheticConfig) -> pa.Schema:
    """label float32 (not null), with ``conversion`` buy float32 (not null), I* float32
    (nullable), C* string (nullable), with ``sequences`` item, item_cat, hist_items, hist_cats
    string (not null; an empty history is an empty string)."""
    labels = [LABEL, CONVERSION_LABEL] if config.conversion else [LABEL]
    history = HISTORY_FIELDS if config.sequences else ()
    return pa.schema(
        [pa.field(n, pa.float32(), nullable=False) for n in labels]
        + [pa.field(n, pa.float32()) for n in config.numeric_names]
        + [pa.field(n, pa.string()) for n in config.categorical_names]
        + [pa.field(n, pa.string(), nullable=False) for n in history]
    )
