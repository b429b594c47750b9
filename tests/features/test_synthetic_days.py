"""Tests of the synthetic daily windows: churn, drift, the written layout and days.json."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from features.schema import load_schema
from features.synthetic_config import SyntheticConfig
from features.synthetic_days import DayModel, day_models, write_days
from features.synthetic_days_config import (
    ITEM,
    USER,
    DaysConfig,
    churn_count,
    day_name,
    days_arrow_schema,
    days_schema,
)
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[2]
BASE = SyntheticConfig(
    rows=2_000,
    seed=7,
    num_numeric=3,
    num_categorical=8,
    vocab_sizes=(20, 20, 20, 20, 20, 20, 30, 40),
    n_single=2,
    n_pairs=1,
    n_triples=1,
    n_numeric_effects=1,
)
CHURNING = DaysConfig(
    base=BASE, days=4, items=120, users=200, item_churn=0.15, user_churn=0.1, drift=0.2
)


def _folder_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _day_values(root: Path, day: int, field: str) -> set[str]:
    folder = root / day_name(day)
    return {
        v
        for split in ("train", "test")
        for part in sorted((folder / split).glob("part-*.parquet"))
        for v in pq.read_table(part, columns=[field]).column(field).to_pylist()
    }


def _crosses(model: DayModel) -> list:
    return [*model.click.singles, *model.click.pairs, *model.click.triples]


@pytest.fixture(scope="module")
def churning(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("days")
    return out, write_days(CHURNING, out)


# ---------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"days": 0}, r"days must be an integer >= 1, got 0"),
        ({"days": 2.5}, r"days must be an integer >= 1, got 2.5"),
        ({"items": 0}, r"items must be an integer >= 1, got 0"),
        ({"users": True}, r"users must be an integer >= 1, got True"),
        ({"item_churn": 1.5}, r"item_churn must be a finite number in \[0.0, 1.0\], got 1.5"),
        ({"user_churn": -0.1}, r"user_churn must be .* got -0.1"),
        ({"drift": -1.0}, r"drift must be a finite number in \[0.0, inf\), got -1.0"),
        ({"drift": float("nan")}, r"drift must be .* got nan"),
        ({"item_scale": "big"}, r"item_scale must be .* got 'big'"),
        ({"test_fraction": 1.0}, r"test_fraction must be a finite number in \[0.0, 1.0\)"),
        ({"base": 3}, r"base must be a SyntheticConfig, got int"),
        ({"base": dataclasses.replace(BASE, sequences=True)}, r"expected sequences = false"),
    ],
)
def test_bad_settings_raise_a_clear_value_error(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        DaysConfig(**{"base": BASE, **kwargs})


def test_churn_count_rounds_half_up() -> None:
    assert [churn_count(s, 10) for s in (0.0, 0.04, 0.05, 0.15, 1.0)] == [0, 0, 1, 2, 10]
    assert (CHURNING.item_births, CHURNING.user_births) == (18, 20)


def test_days_schema_adds_item_and_user_to_the_base_fields() -> None:
    schema = days_schema(CHURNING)
    names = [f.name for f in schema.fields]
    assert names[-2:] == [ITEM, USER] and names[0] == "label" and len(names) == 1 + 3 + 8 + 2
    assert list(schema.source.columns) == names
    assert days_arrow_schema(CHURNING).names == names
    assert not days_arrow_schema(CHURNING).field(ITEM).nullable


# ---------------------------------------------------------------------------------------------
# Churn
# ---------------------------------------------------------------------------------------------


def test_each_day_retires_and_births_exactly_the_configured_counts() -> None:
    models = list(day_models(CHURNING))
    seen: set[int] = set(models[0].items.active.tolist())
    assert models[0].items.born.tolist() == list(range(120)) and models[0].items.retired.size == 0
    for prev, day in itertools.pairwise(models):
        for pop_prev, pop, births in (
            (prev.items, day.items, 18),
            (prev.users, day.users, 20),
        ):
            assert len(pop.born) == len(pop.retired) == births
            assert len(pop.active) == len(np.unique(pop.active)) == len(pop_prev.active)
            assert set(pop.retired) <= set(pop_prev.active) and not set(pop.retired) & set(
                pop.active
            )
            assert set(pop.active) == (set(pop_prev.active) - set(pop.retired)) | set(pop.born)
            assert pop.born.tolist() == list(range(len(pop_prev.effects), len(pop.effects)))
        assert not seen & set(day.items.born.tolist())  # a born id is new
        seen |= set(day.items.active.tolist())


def test_days_json_reports_the_churn_and_rows(churning) -> None:
    out, report = churning
    assert json.loads((out / "days.json").read_text()) == report
    assert [w["name"] for w in report["windows"]] == ["day-000", "day-001", "day-002", "day-003"]
    first, *later = report["windows"]
    assert first["items"] == {"born": 120, "retired": 0, "active": 120}
    assert first["users"] == {"born": 200, "retired": 0, "active": 200}
    for w in later:
        assert w["items"] == {"born": 18, "retired": 18, "active": 120}
        assert w["users"] == {"born": 20, "retired": 20, "active": 200}
    for w in report["windows"]:
        assert w["rows"] == 2_000 == w["split_rows"]["train"] + w["split_rows"]["test"]
        assert 0.5 < w["oracle_auc"] < 1.0
    assert all(0.5 < w["next_day_frozen_auc"] < 1.0 for w in report["windows"][:-1])
    assert report["windows"][-1]["next_day_frozen_auc"] is None


def test_a_retired_item_appears_in_no_later_day_and_a_born_one_in_no_earlier_day(churning):
    out, _ = churning
    models = list(day_models(CHURNING))
    for field, pop_of, prefix in ((ITEM, "items", "i"), (USER, "users", "u")):
        values = [_day_values(out, d, field) for d in range(CHURNING.days)]
        for d, model in enumerate(models):
            pop = getattr(model, pop_of)
            assert values[d] <= {f"{prefix}{i:07d}" for i in pop.active}
            retired = {f"{prefix}{i:07d}" for i in pop.retired}
            born = {f"{prefix}{i:07d}" for i in pop.born}
            assert all(not retired & values[later] for later in range(d, CHURNING.days))
            assert all(not born & values[earlier] for earlier in range(d))
            assert born & values[d] or d == 0  # some newborn values are drawn at once


# ---------------------------------------------------------------------------------------------
# Drift
# ---------------------------------------------------------------------------------------------


def test_drift_steps_every_planted_table_by_drift_in_standard_deviation() -> None:
    """The step of a table is ``drift`` times a unit-variance pure interaction: its variance
    under the product of the marginals is exactly drift^2 and its mean along any axis is 0."""
    d0, d1 = list(day_models(dataclasses.replace(CHURNING, days=2)))[:2]
    probs = [np.diff(cdf, prepend=0.0) for cdf in d0.click.cdfs]
    crosses = list(zip(_crosses(d0), _crosses(d1), strict=True))
    assert [len(a.fields) for a, _ in crosses] == [1, 1, 2, 3]
    for a, b in crosses:
        step = (b.table - a.table)[tuple(slice(0, -1) for _ in a.fields)]
        assert np.all((b.table - a.table)[..., -1] == 0)  # the missing slot stays 0
        var = step * step
        for axis, f in reversed(list(enumerate(a.fields))):
            var = var @ probs[f]
            assert np.allclose(np.tensordot(step, probs[f], axes=([axis], [0])), 0.0)
        assert float(var) == pytest.approx(0.2**2, rel=1e-9)
    (_, w0), (_, w1) = d0.click.numeric[0], d1.click.numeric[0]
    assert w1 != w0 and abs(w1 - w0) < 5 * 0.2 * BASE.effect_scale


def test_without_drift_and_churn_every_day_is_drawn_from_one_model(tmp_path) -> None:
    still = dataclasses.replace(CHURNING, days=3, item_churn=0.0, user_churn=0.0, drift=0.0)
    models = list(day_models(still))
    for m in models[1:]:
        assert m.click.intercept == models[0].click.intercept
        assert all(
            np.array_equal(a.table, b.table)
            for a, b in zip(_crosses(m), _crosses(models[0]), strict=True)
        )
        assert np.array_equal(m.items.active, models[0].items.active)
        assert np.array_equal(m.users.effects, models[0].users.effects)
    windows = write_days(still, tmp_path)["windows"]
    for w, nxt in itertools.pairwise(windows):
        assert nxt["items"]["born"] == nxt["users"]["retired"] == 0
        assert w["next_day_frozen_auc"] == nxt["oracle_auc"]


def test_drift_and_churn_cost_a_frozen_model_auc(tmp_path) -> None:
    """With strong drift and churn the previous day's true model ranks a day's rows worse
    than the day's own model (on the same rows)."""
    moving = dataclasses.replace(
        CHURNING,
        base=dataclasses.replace(BASE, rows=6_000),
        days=2,
        drift=1.0,
        item_churn=0.5,
        user_churn=0.5,
        item_scale=1.0,
        user_scale=1.0,
    )
    first, second = write_days(moving, tmp_path)["windows"]
    assert first["next_day_frozen_auc"] < second["oracle_auc"] - 0.02


def test_each_day_is_calibrated_to_the_target_ctr(churning) -> None:
    _, report = churning
    for w in report["windows"]:
        assert abs(w["ctr"]["train"] - BASE.target_ctr) < 0.04, w["name"]


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def test_every_day_is_a_generate_window_with_the_shared_schema(churning) -> None:
    out, report = churning
    schema = days_schema(CHURNING)
    for d in range(CHURNING.days):
        folder = out / day_name(d)
        assert sorted(p.name for p in folder.iterdir()) == [
            "ground_truth.json",
            "schema.toml",
            "test",
            "train",
        ]
        assert load_schema(folder / "schema.toml") == schema
        table = pq.read_table(folder / "train" / "part-00000.parquet")
        assert table.schema.names == days_arrow_schema(CHURNING).names
        truth = json.loads((folder / "ground_truth.json").read_text())
        assert truth["day"]["day"] == d and truth["day"]["item"]["active"] == 120
        assert truth["observed"]["oracle_auc"] == report["windows"][d]["oracle_auc"]
        assert "e_item[item]" in truth["formula"]


def test_the_same_seed_writes_the_same_bytes(churning, tmp_path) -> None:
    out, _ = churning
    write_days(CHURNING, tmp_path / "again")
    assert _folder_bytes(tmp_path / "again") == _folder_bytes(out)
    other = dataclasses.replace(CHURNING, base=dataclasses.replace(BASE, seed=8), days=1)
    write_days(other, tmp_path / "other")
    again = _folder_bytes(tmp_path / "again")
    assert (
        _folder_bytes(tmp_path / "other")["day-000/train/part-00000.parquet"]
        != again["day-000/train/part-00000.parquet"]
    )


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def test_cli_bad_churn_is_one_error_line_and_exit_2(tmp_path) -> None:
    cmd = [sys.executable, "-m", "pipelines.cli", "generate", "--output", str(tmp_path / "o")]
    proc = subprocess.run(
        [*cmd, "--days", "2", "--item-churn", "1.5"], capture_output=True, text=True, cwd=ROOT
    )
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2, proc.stderr
    assert errors == [
        "error: stitchrec generate: argument --item-churn: expected a number in [0, 1], got "
        "'1.5' (see stitchrec generate --help)"
    ]
    assert not (tmp_path / "o").exists()


def test_cli_day_options_need_days_and_refuse_other_extras(tmp_path, capsys) -> None:
    out = str(tmp_path / "o")
    assert main(["generate", "--output", out, "--drift", "0.1"]) == 2
    assert capsys.readouterr().err == (
        "error: generate --drift sets up daily windows: give --days N with it\n"
    )
    assert main(["generate", "--output", out, "--days", "2", "--sequences"]) == 2
    assert capsys.readouterr().err.startswith("error: generate --days with --sequences: ")
    with pytest.raises(SystemExit) as e:  # the flag's value, checked by the parser
        main(["generate", "--output", out, "--days", "2", "--rows", "0"])
    assert e.value.code == 2
    assert "argument --rows: expected an integer >= 1, got '0'" in capsys.readouterr().err
    assert not Path(out).exists()


def test_cli_generate_days_writes_the_windows_and_days_json(tmp_path, capsys) -> None:
    out = tmp_path / "o"
    flags = ["--rows", "300", "--items", "40", "--users", "50", "--item-churn", "0.1"]
    assert main(["generate", "--output", str(out), "--days", "2", "--seed", "3", *flags]) == 0
    report = json.loads((out / "days.json").read_text())
    assert (report["days"], report["rows_per_day"], report["seed"]) == (2, 300, 3)
    assert (report["item_churn"], report["user_churn"], report["drift"]) == (0.1, 0.02, 0.05)
    assert report["windows"][1]["items"] == {"born": 4, "retired": 4, "active": 40}
    assert report["windows"][1]["users"] == {"born": 1, "retired": 1, "active": 50}
    assert sorted(p.name for p in out.iterdir()) == ["day-000", "day-001", "days.json"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("day-001: 300 rows, items +4 -4 (40 active), users +1 -1")
