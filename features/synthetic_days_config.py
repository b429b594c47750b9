"""The settings of the synthetic daily windows (``DaysConfig``) and their schema
(``days_schema``, ``days_arrow_schema``); ``features.synthetic_days`` describes the data."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pyarrow as pa

from features.schema import FeatureKind, FeatureSpec, Schema, SourceSpec
from features.synthetic_config import (
    SyntheticConfig,
    arrow_schema,
    is_int,
    is_real,
    synthetic_schema,
)

ITEM = "item"
USER = "user"
# Rows of the seeded sample each day's intercept is calibrated on.
DAY_CALIBRATION_ROWS = 16_384


def day_name(day: int) -> str:
    """The folder of day ``day`` under the output: ``day-000``, ``day-001``, ..."""
    return f"day-{day:03d}"


@dataclasses.dataclass(frozen=True)
class DaysConfig:
    """Size, churn and drift of the synthetic daily windows (see ``features.synthetic_days``).

    Attributes:
      base: the click log of one day: ``base.rows`` rows per day, ``base.seed`` the seed of
        everything; its fields, planted effects and ``target_ctr`` are day 0's. Without
        ``sequences`` and ``conversion``.
      days: number of daily windows ``N``.
      items: active items per day ``n_I`` (the ``item`` field's active set).
      users: active users per day ``n_U``.
      item_churn: share of the active items retired each day (the same number is born).
      user_churn: share of the active users retired each day (the same number is born).
      drift: step ``delta`` of the daily random walk of the other fields' weights, relative to
        their scale (0: the weights never change).
      item_scale: standard deviation of an item's effect on the click logit.
      user_scale: standard deviation of a user's effect on the click logit.
      test_fraction: share of each day's rows in its ``test/`` split.
    """

    base: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
    days: int = 7
    items: int = 10_000
    users: int = 100_000
    item_churn: float = 0.05
    user_churn: float = 0.02
    drift: float = 0.05
    item_scale: float = 0.5
    user_scale: float = 0.5
    test_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not isinstance(self.base, SyntheticConfig):
            raise ValueError(f"base must be a SyntheticConfig, got {type(self.base).__name__}")
        if self.base.sequences or self.base.conversion:
            raise ValueError(
                "base: daily windows have an item and a user field of their own and one label: "
                "expected sequences = false and conversion = false"
            )
        for name in ("days", "items", "users"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in ("item_churn", "user_churn"):
            self._check_real(name, lo=0.0, hi=1.0, hi_open=False)
        for name in ("drift", "item_scale", "user_scale"):
            self._check_real(name, lo=0.0)
        self._check_real("test_fraction", lo=0.0, hi=1.0, hi_open=True)

    def _check_real(
        self, name: str, *, lo: float, hi: float | None = None, hi_open: bool = False
    ) -> None:
        value: Any = getattr(self, name)
        bad = not is_real(value) or value < lo
        bad = bad or (hi is not None and (value > hi or (hi_open and value == hi)))
        if bad:
            right = "inf)" if hi is None else (f"{hi})" if hi_open else f"{hi}]")
            raise ValueError(f"{name} must be a finite number in [{lo}, {right}, got {value!r}")
        object.__setattr__(self, name, float(value))

    @property
    def item_births(self) -> int:
        """Items born (and retired) each day after the first: ``round(item_churn * items)``."""
        return churn_count(self.item_churn, self.items)

    @property
    def user_births(self) -> int:
        """Users born (and retired) each day after the first: ``round(user_churn * users)``."""
        return churn_count(self.user_churn, self.users)


def churn_count(share: float, size: int) -> int:
    """``share * size`` rounded half up."""
    return math.floor(share * size + 0.5)


def days_schema(config: DaysConfig) -> Schema:
    """The schema of every day: ``synthetic_schema(config.base)`` plus the categorical ``item``
    (group ``item``) and ``user`` (group ``user``) fields."""
    base = synthetic_schema(config.base)
    fields = (
        *base.fields,
        FeatureSpec(name=ITEM, kind=FeatureKind.CATEGORICAL, min_count=2, group="item"),
        FeatureSpec(name=USER, kind=FeatureKind.CATEGORICAL, min_count=2, group="user"),
    )
    source = SourceSpec(format="parquet", columns=tuple(f.name for f in fields))
    return Schema(name=base.name, fields=fields, source=source)


def days_arrow_schema(config: DaysConfig) -> pa.Schema:
    """``arrow_schema(config.base)`` plus ``item`` and ``user`` strings (not null)."""
    schema = arrow_schema(config.base)
    for name in (ITEM, USER):
        schema = schema.append(pa.field(name, pa.string(), nullable=False))
    return schema
