"""Tests of the synthetic data's behaviour sequences and conversion label."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow as pa
import pytest

from features import synthetic_model
from features.schema import FeatureKind, load_schema
from features.synthetic import generate_batches, write_dataset
from features.synthetic_config import HISTORY_FIELDS, SyntheticConfig, arrow_schema
from features.synthetic_model import ground_truth
from features.synthetic_sequences import draw_history, kappa

CONFIG = SyntheticConfig(rows=20_000, seed=3, sequences=True, conversion=True)


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return pa.Table.from_batches(list(generate_batches(CONFIG)))


def _cells(table: pa.Table, name: str) -> list[list[str]]:
    return [s.split("|") if s else [] for s in table.column(name).to_pylist()]


def test_off_by_default_and_the_other_columns_do_not_change(table: pa.Table) -> None:
    plain = SyntheticConfig(rows=20_000, seed=3)
    assert not set(HISTORY_FIELDS) & set(arrow_schema(plain).names)
    assert "buy" not in arrow_schema(plain).names
    base = pa.Table.from_batches(list(generate_batches(plain)))
    for name in plain.numeric_names + plain.categorical_names:
        assert table.column(name).equals(base.column(name)), name


def test_kappa_by_hand() -> None:
    # a = 0.3 + 0.7 / 10 = 0.37; 0.37 * (0.7 + 0.03) + 0.63 * 0.03 = 0.289
    assert kappa(10, 0.7, 0.3) == pytest.approx(0.289)
    # uniform targets and histories: a match is 1 / K
    assert kappa(4, 0.0, 0.0) == pytest.approx(0.25)


def test_history_columns_are_aligned_and_consistent(table: pa.Table) -> None:
    items, cats = _cells(table, "hist_items"), _cells(table, "hist_cats")
    lengths = np.array([len(h) for h in items])
    assert [len(c) for c in cats] == lengths.tolist()
    assert lengths.max() == CONFIG.hist_max_len
    assert abs((lengths == 0).mean() - CONFIG.hist_empty_rate) < 0.01
    cluster_of: dict[str, str] = {}
    pairs = [
        (i, c) for hi, hc in zip(items, cats, strict=True) for i, c in zip(hi, hc, strict=True)
    ]
    targets = table.column("item").to_pylist(), table.column("item_cat").to_pylist()
    pairs += list(zip(*targets, strict=True))
    for item, cat in pairs:
        assert cluster_of.setdefault(item, cat) == cat  # one cluster per item everywhere
    assert len(set(cluster_of.values())) == CONFIG.num_clusters
    assert len(cluster_of) <= CONFIG.num_clusters * CONFIG.items_per_cluster


def test_clicks_are_likelier_when_the_recent_history_shares_the_target_cluster(
    table: pa.Table,
) -> None:
    click = table.column("label").to_numpy()
    target = np.array(table.column("item_cat").to_pylist())
    cats = _cells(table, "hist_cats")
    newest = np.array([c[0] if c else "" for c in cats])
    match = newest == target
    assert match.mean() > 0.15
    assert click[match].mean() > click[~match].mean() + 0.1
    # the decay: a match in position 0 counts more than a match only in position 9
    old = np.array(
        [len(c) > 9 and c[9] == t and c[0] != t for c, t in zip(cats, target, strict=True)]
    )
    assert click[match].mean() > click[old].mean()


def test_the_history_term_adds_no_main_effect() -> None:
    model = synthetic_model.click_model(CONFIG).history
    n = 200_000
    draw = draw_history(CONFIG, model, np.random.default_rng(0), n)
    rows = np.repeat(np.arange(n), draw.lengths)
    match = draw.hist_clusters == draw.target_cluster[rows]
    assert match.mean() == pytest.approx(model.kappa, abs=0.005)
    for c in range(CONFIG.num_clusters):  # E[H | item_cat] = 0
        assert abs(draw.term[draw.target_cluster == c].mean()) < 0.05
    for length in (0, 1, 10, 20):  # E[H | L] = 0
        assert abs(draw.term[draw.lengths == length].mean()) < 0.05
    assert draw.term.std() > 0.3


def test_buy_is_zero_without_a_click_and_uses_other_fields(table: pa.Table) -> None:
    click, buy = table.column("label").to_numpy(), table.column("buy").to_numpy()
    assert set(np.unique(buy)) == {0.0, 1.0}
    assert not np.any((click == 0) & (buy == 1))
    assert buy[click == 1].mean() == pytest.approx(CONFIG.target_cvr, abs=0.03)
    truth = ground_truth(CONFIG)
    click_fields = {f for group in ("pairs", "triples") for c in truth[group] for f in c["fields"]}
    click_fields |= {c["field"] for c in truth["single"]} | {c["field"] for c in truth["numeric"]}
    conversion = truth["conversion"]
    buy_fields = {conversion["single"]["field"]} | {c["field"] for c in conversion["numeric"]}
    assert len(buy_fields) == 3 and not buy_fields & click_fields
    assert conversion["defined_on"] == "label"


def test_a_shorter_run_is_a_prefix_of_a_longer_one() -> None:
    short_config = dataclasses.replace(CONFIG, rows=500)
    short = pa.Table.from_batches(list(generate_batches(short_config, batch_rows=128)))
    assert short.equals(pa.Table.from_batches(list(generate_batches(CONFIG))).slice(0, 500))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"sequences": 1}, r"sequences must be true or false, got 1"),
        ({"sequences": True, "hist_max_len": 0}, r"hist_max_len must be an integer >= 1, got 0"),
        ({"sequences": True, "hist_decay": -0.5}, r"hist_decay .* got -0.5"),
        ({"conversion": True, "target_cvr": 1.0}, r"target_cvr .* got 1.0"),
        (
            {"conversion": True, "num_categorical": 3, "vocab_sizes": 5, "n_single": 3}
            | {"n_pairs": 0, "n_triples": 0},
            r"conversion needs a categorical field .* in no planted click effect",
        ),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        SyntheticConfig(**kwargs)


def test_written_dataset_has_the_sequence_schema_and_per_task_oracle_aucs(tmp_path) -> None:
    config = SyntheticConfig(rows=6_000, seed=3, sequences=True, conversion=True)
    summary = write_dataset(config, tmp_path)
    schema = load_schema(tmp_path / "schema.toml")
    assert [f.name for f in schema.labels] == ["label", "buy"]
    assert schema.label.name == "label" and schema.field("buy").defined_on == "label"
    hist = schema.field("hist_items")
    assert hist.kind == FeatureKind.SEQUENCE and hist.shares_embedding_with == "item"
    assert hist.max_len == config.hist_max_len
    cats = schema.field("hist_cats")
    assert cats.aligned_with == "hist_items" and cats.shares_embedding_with == "item_cat"
    truth = json.loads((tmp_path / "ground_truth.json").read_text())
    tasks = truth["observed"]["oracle_auc_tasks"]
    assert tasks == summary["oracle_auc_tasks"] and set(tasks) == {"click", "ctcvr", "cvr"}
    assert tasks["click"] == summary["oracle_auc"]
    assert all(0.5 <= v <= 1.0 and math.isfinite(v) for v in tasks.values())
    assert truth["history"]["kappa"] == pytest.approx(0.289)
