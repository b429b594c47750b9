"""Synthetic daily windows: the click log of ``features.synthetic`` over ``N`` days, with churning
items and users and slowly drifting weights, for continuous training.

Day ``d`` draws its rows exactly as ``features.synthetic`` does (same fields, missing cells,
value distributions, planted single, pair, triple and numeric terms), with that day's click
model, and adds two categorical fields::

    logit_d = b_d + sum_{single f} s_f * w_f^d[v_f] + sum_{pairs} s_ab * G_ab^d[v_a, v_b]
                  + sum_{triples} s_abc * G_abc^d[v_a, v_b, v_c] + sum_{numeric k} w_k^d * z_k
                  + e_item[item] + e_user[user]
    label ~ Bernoulli(sigmoid(logit_d))

Items and users. Day 0 has ``n_I = items`` active items with ids ``0 .. n_I - 1`` and effects
``e_item ~ N(0, item_scale^2)``. The active items fill ``n_I`` popularity slots; a row's item
is the one in slot ``r``, drawn with the Zipf probability ``(r + 1)^-s / sum_j (j + 1)^-s``
(``s = zipf_exponent``). Each later day retires ``k = round(item_churn * n_I)`` items chosen
uniformly from the active ones and gives their slots to ``k`` newborn items (the next ids, fresh
effects from the same ``N(0, item_scale^2)``): a retired item never comes back, a newborn one
may land in a head slot. An item's value is ``i`` and its id in 7 digits (``i0000042``). Users
churn likewise (``users``, ``user_churn``, ``user_scale``; values ``u0000042``).

Drift. Day 0's weights are ``features.synthetic``'s. From one day to the next every planted
table takes a step of a seeded random walk, ``G^{d+1} = G^d + delta * N^d`` with ``N^d`` fresh
Gaussian noise projected like ``G`` (pure interaction, unit variance under the marginals;
``delta = drift``), so a term's standard deviation moves by about ``delta`` times its scale a
day and a planted cross stays a pure interaction; a numeric weight steps
``w_k^{d+1} = w_k^d + delta * effect_scale * eps``. ``drift = 0`` with no churn draws every day
from one model. The intercept ``b_d`` is calibrated each day (bisection on a seeded sample of
``DAY_CALIBRATION_ROWS`` rows of the day's model) to the mean click probability
``target_ctr``.

Output (``write_days``): ``OUTPUT/day-000/ .. day-{N-1}/``, each laid out like
``features.synthetic.write_dataset`` (``schema.toml``, ``train/`` and ``test/`` Parquet shards,
``ground_truth.json``), every day with the same schema, and ``OUTPUT/days.json`` with per day
the rows, the born, retired and active items and users, ``oracle_auc`` (the day's test rows
scored by the day's true model) and ``next_day_frozen_auc`` (day ``d + 1``'s test rows scored
by day ``d``'s true model, unknown items and users at effect 0: what a day of drift and churn
costs a frozen perfect model; null on the last day).

Determinism. Everything follows from ``base.seed``: day ``d``'s churn, newborn effects and
drift from their own streams, its rows in chunks of ``CHUNK_ROWS`` (chunk ``i`` from
``SeedSequence(seed, spawn_key=(4, d, i))``); the same config writes the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.synthetic import PROB_COLUMN, draw_batch, oracle_auc, write_splits
from features.synthetic_config import CHUNK_ROWS, LABEL
from features.synthetic_days_config import (
    DAY_CALIBRATION_ROWS,
    ITEM,
    USER,
    DaysConfig,
    day_name,
    days_arrow_schema,
    days_schema,
)
from features.synthetic_model import (
    ClickModel,
    Draw,
    calibrate_intercept,
    click_model,
    draw_chunk,
    ground_truth,
    logit_offset,
    pure_interaction,
    seeded_rng,
    sigmoid,
    zipf_probabilities,
)

FROZEN_COLUMN = "__frozen"  # private: a row's click probability under the previous day's model


@dataclasses.dataclass(frozen=True, eq=False)
class Population:
    """The active values of a churning field (items or users) on one day.

    ``active[r]`` is the id in popularity slot ``r``; ``effects[i]`` the logit effect of id
    ``i`` for every id born so far; ``born`` / ``retired`` the ids born and retired this day.
    """

    prefix: str
    active: np.ndarray  # int64 [n]
    effects: np.ndarray  # float64 [ids born so far]
    born: np.ndarray  # int64
    retired: np.ndarray  # int64

    def effect_of(self, ids: np.ndarray) -> np.ndarray:
        """The effect of each id; 0 for an id born after this day (unknown to its model)."""
        known = ids < len(self.effects)
        return np.where(known, self.effects[np.where(known, ids, 0)], 0.0)

    @functools.cached_property
    def tokens(self) -> pa.StringArray:
        """The value of every id born so far: prefix and the id in 7 digits."""
        return pa.array([f"{self.prefix}{i:07d}" for i in range(len(self.effects))], pa.string())


def first_population(prefix: str, size: int, scale: float, rng: np.random.Generator) -> Population:
    """Day 0: ids ``0 .. size - 1`` in slot order, effects ``scale * N(0, 1)``."""
    ids = np.arange(size, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    return Population(prefix, ids, scale * rng.standard_normal(size), ids, empty)


def next_population(
    pop: Population, births: int, scale: float, rng: np.random.Generator
) -> Population:
    """Retires ``births`` active ids (uniform, without replacement) and gives their slots to as
    many new ids (the next ones) with effects ``scale * N(0, 1)``."""
    slots = np.sort(rng.choice(len(pop.active), size=births, replace=False))
    born = np.arange(len(pop.effects), len(pop.effects) + births, dtype=np.int64)
    active = pop.active.copy()
    retired = active[slots]
    active[slots] = born
    effects = np.concatenate([pop.effects, scale * rng.standard_normal(births)])
    return Population(pop.prefix, active, effects, born, np.sort(retired))


@dataclasses.dataclass(frozen=True, eq=False)
class DayModel:
    """The true click model of day ``day``: the drifted planted terms (and the day's
    intercept) in ``click``, and the day's items and users."""

    day: int
    click: ClickModel
    items: Population
    users: Population


def _marginals(click: ClickModel) -> list[np.ndarray]:
    return [np.diff(cdf, prepend=0.0) for cdf in click.cdfs]


def drift_click(config: DaysConfig, click: ClickModel, rng: np.random.Generator) -> ClickModel:
    """One step of the random walk (module docstring): every planted table plus ``drift`` times
    a pure, unit-variance noise table, every numeric weight plus ``drift * effect_scale * eps``."""
    if config.drift == 0.0:
        return click
    probs = _marginals(click)

    def step(cross: Any) -> Any:
        shape = tuple(len(probs[f]) for f in cross.fields)
        noise = pure_interaction(rng.standard_normal(shape), [probs[f] for f in cross.fields])
        return dataclasses.replace(cross, table=cross.table + config.drift * noise)

    singles, pairs, triples = (
        tuple(step(c) for c in group) for group in (click.singles, click.pairs, click.triples)
    )
    eps = rng.standard_normal(len(click.numeric))
    numeric = tuple(
        (k, w + config.drift * config.base.effect_scale * float(e))
        for (k, w), e in zip(click.numeric, eps, strict=True)
    )
    return dataclasses.replace(
        click, singles=singles, pairs=pairs, triples=triples, numeric=numeric
    )


def _slots(rng: np.random.Generator, cdf: np.ndarray, n: int) -> np.ndarray:
    """Zipf popularity slots by inverse-CDF sampling."""
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(cdf) - 1)


def draw_day(
    config: DaysConfig, model: DayModel, rng: np.random.Generator, n: int
) -> tuple[Draw, np.ndarray, np.ndarray]:
    """``n`` rows of day ``model.day``: ``features.synthetic``'s draw, then each row's item and
    user ids; the draw's ``offset`` includes their effects."""
    draw = draw_chunk(config.base, model.click, rng, n)
    cdfs = _slot_cdfs(config)
    items = model.items.active[_slots(rng, cdfs[0], n)]
    users = model.users.active[_slots(rng, cdfs[1], n)]
    draw.offset = draw.offset + model.items.effect_of(items) + model.users.effect_of(users)
    return draw, items, users


@functools.lru_cache(maxsize=4)
def _slot_cdfs(config: DaysConfig) -> tuple[np.ndarray, np.ndarray]:
    s = config.base.zipf_exponent
    return tuple(np.cumsum(zipf_probabilities(n, s)) for n in (config.items, config.users))


def _calibrated(config: DaysConfig, model: DayModel) -> DayModel:
    """The day's model with its intercept calibrated to ``target_ctr`` (the same seeded sample
    stream every day, so one model gives one intercept)."""
    rng = seeded_rng(config.base.seed, 3)
    draw, _, _ = draw_day(config, model, rng, DAY_CALIBRATION_ROWS)
    b = calibrate_intercept(draw.offset, config.base.target_ctr)
    return dataclasses.replace(model, click=dataclasses.replace(model.click, intercept=b))


def day_models(config: DaysConfig) -> Iterator[DayModel]:
    """The true model of day 0, 1, .., ``days - 1`` (module docstring), one at a time."""
    seed = config.base.seed
    click = click_model(config.base)
    items = first_population("i", config.items, config.item_scale, seeded_rng(seed, 5, 0, 0))
    users = first_population("u", config.users, config.user_scale, seeded_rng(seed, 5, 0, 1))
    for day in range(config.days):
        if day > 0:
            click = drift_click(config, click, seeded_rng(seed, 6, day))
            born = config.item_births, config.user_births
            items = next_population(items, born[0], config.item_scale, seeded_rng(seed, 5, day, 0))
            users = next_population(users, born[1], config.user_scale, seeded_rng(seed, 5, day, 1))
        yield _calibrated(config, DayModel(day, click, items, users))


def day_batches(
    config: DaysConfig, model: DayModel, previous: DayModel | None
) -> Iterator[pa.RecordBatch]:
    """Day ``model.day``'s rows in chunks of ``CHUNK_ROWS``: the columns of
    ``days_arrow_schema(config)`` plus the private true probability, split draw and (with a
    ``previous`` day) ``FROZEN_COLUMN``, the probability under the previous day's model."""
    rows, seed = config.base.rows, config.base.seed
    for index in range(-(-rows // CHUNK_ROWS)):
        n = min(CHUNK_ROWS, rows - index * CHUNK_ROWS)
        draw, items, users = draw_day(config, model, seeded_rng(seed, 4, model.day, index), n)
        extra = {
            ITEM: pc.take(model.items.tokens, pa.array(items)),
            USER: pc.take(model.users.tokens, pa.array(users)),
        }
        if previous is not None:
            old = logit_offset(previous.click, draw.ranks, draw.counts)
            old = old + previous.items.effect_of(items) + previous.users.effect_of(users)
            extra[FROZEN_COLUMN] = pa.array(sigmoid(previous.click.intercept + old))
        yield draw_batch(config.base, model.click, draw, extra)


def day_truth(config: DaysConfig, model: DayModel) -> dict[str, Any]:
    """``ground_truth(config.base)`` with the day's intercept and numeric weights, and a ``day``
    entry: the day, its churn and drift settings and its items and users."""
    truth = ground_truth(config.base)
    truth["intercept"] = model.click.intercept
    weights = dict(model.click.numeric)
    names = config.base.numeric_names
    for entry in truth["numeric"]:
        entry["weight"] = weights[names.index(entry["field"])]
    truth["day"] = {
        "day": model.day,
        "drift": config.drift,
        ITEM: _population_truth(model.items, config.item_churn, config.item_scale),
        USER: _population_truth(model.users, config.user_churn, config.user_scale),
    }
    truth["formula"] = (
        truth["formula"].replace("; label", " + e_item[item] + e_user[user]; label", 1)
        + "; the planted tables and numeric weights drift from day to day"
    )
    return truth


def _population_truth(pop: Population, churn: float, scale: float) -> dict[str, Any]:
    return {
        "active": len(pop.active),
        "born": len(pop.born),
        "retired": len(pop.retired),
        "churn": churn,
        "effect_scale": scale,
    }


def write_days(
    config: DaysConfig, out_dir: str | Path, *, rows_per_shard: int = 1_000_000
) -> dict[str, Any]:
    """Writes the daily windows under ``out_dir`` (module docstring) and returns ``days.json``.

    A day folder written again has its stale ``part-*.parquet`` shards removed first (as
    ``write_dataset``); ``days.json`` lists the days of this call.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    schema, arrow = days_schema(config), days_arrow_schema(config)
    windows: list[dict[str, Any]] = []
    previous: DayModel | None = None
    for model in day_models(config):
        folder = out / day_name(model.day)
        keep = [PROB_COLUMN, LABEL] + ([FROZEN_COLUMN] if previous else [])
        summary, test = write_splits(
            folder,
            arrow,
            day_batches(config, model, previous),
            test_fraction=config.test_fraction,
            rows_per_shard=rows_per_shard,
            keep=keep,
        )
        labels = test.column(LABEL).to_numpy()
        summary["oracle_auc"] = oracle_auc(labels, test.column(PROB_COLUMN).to_numpy())
        if previous is not None:
            frozen = oracle_auc(labels, test.column(FROZEN_COLUMN).to_numpy())
            windows[-1]["next_day_frozen_auc"] = frozen
        schema.save(folder / "schema.toml")
        truth = day_truth(config, model)
        truth["observed"] = {k: summary[k] for k in ("rows", "ctr", "oracle_auc")}
        (folder / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
        windows.append(_window_record(model, summary))
        previous = model
    report = _days_report(config, windows)
    (out / "days.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _window_record(model: DayModel, summary: dict[str, Any]) -> dict[str, Any]:
    def counts(pop: Population) -> dict[str, int]:
        return {"born": len(pop.born), "retired": len(pop.retired), "active": len(pop.active)}

    return {
        "day": model.day,
        "name": day_name(model.day),
        "rows": sum(summary["rows"].values()),
        "split_rows": summary["rows"],
        "ctr": summary["ctr"],
        "items": counts(model.items),
        "users": counts(model.users),
        "oracle_auc": summary["oracle_auc"],
        "next_day_frozen_auc": None,
    }


def _days_report(config: DaysConfig, windows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "days": config.days,
        "rows_per_day": config.base.rows,
        "seed": config.base.seed,
        "items": config.items,
        "users": config.users,
        "item_churn": config.item_churn,
        "user_churn": config.user_churn,
        "drift": config.drift,
        "test_fraction": config.test_fraction,
        "windows": windows,
    }
