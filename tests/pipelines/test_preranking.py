"""``stitchrec train`` with ``[preranking]``: FSCD's three stages, selection.json, costs, budgets,
the two-tower run and the cascade export of two runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from features.schema import SchemaError
from features.stats import DatasetStats
from pipelines.cli import main
from pipelines.config import ConfigError, load_config
from pipelines.export import export_run
from pipelines.preranking import (
    build_fscd,
    check_costs,
    penalty_weight,
    select_stage,
)
from pipelines.run.data import prepare_data, prepare_stats
from pipelines.run.model import build_on_sample
from pipelines.run.paths import RunPaths
from pipelines.run.scoring import evaluate_model, make_scorer
from pipelines.run.stage_fit import fit
from pipelines.train import train
from ranking.config import PrerankConfig
from tests.ranking.prerank_data import GROUPED_SCHEMA, write_grouped
from tests.testdata import write_run_config


def _config(tmp_path: Path, data: dict[str, Path], name: str, preranking: str, **model) -> Path:
    model_section = {"embedding_dim": 4, "mlp": [16], "type": "dnn", **model}
    train = {"batch_size": 128, "epochs": 1, "learning_rate": 0.01, "seed": 0}
    return write_run_config(
        tmp_path / f"{name}.toml", data, tmp_path / name, model_section, train, extra=preranking
    )


FSCD = """
[preranking]
method = "fscd"
budget = "fields"
budget_value = 2
fscd_epochs = 3
finetune_epochs = 1
"""
# GROUPED_SCHEMA: user and age are request-side (group user / context), item, tags and price
# per-candidate (group item)
REQUEST = {"user", "age"}


def test_cli_train_runs_the_three_stages_and_writes_selection(tmp_path, capsys):
    data = write_grouped(tmp_path / "data", rows=4000)
    cfg = _config(tmp_path, data, "fscd", FSCD)
    assert main(["train", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "fscd stage 1" in out and "fscd stage 2" in out and "fscd stage 3" in out
    assert "initialized from stage 1" in out  # finetune_init = "stage1", the default
    run = tmp_path / "fscd"
    sel = json.loads((run / "selection.json").read_text())
    assert sel["budget"] == {"kind": "fields", "value": 2.0}
    # the default request_fields = "free": user and age are kept outside the budget of 2
    assert sel["request_fields"] == {
        "mode": "free",
        "candidates_per_request": 500,
        "fields": ["user", "age"],
    }
    assert set(sel["kept"]) >= REQUEST
    assert len(sel["kept"]) == 4 and len(sel["dropped"]) == 1
    fields = sel["fields"]
    assert [f["rank"] for f in fields] == [1, 2, 3, 4, 5]
    probs = [f["keep_prob"] for f in fields]
    assert probs == sorted(probs, reverse=True)
    assert [f["name"] for f in fields if f["kept"]] == sel["kept"]
    for f in fields:
        assert {"complexity", "alpha", "cost", "embedding_dim", "cardinality", "reason"} <= set(f)
        c = f["cost"] + 0.01 * f["embedding_dim"] + 1e-7 * f["cardinality"]
        assert f["complexity"] == pytest.approx(c)
        # request-side complexity is amortized over the request's candidates: c_j / 500
        request = f["name"] in REQUEST
        assert f["side"] == ("request" if request else "candidate")
        assert f["charged_complexity"] == pytest.approx(c / 500 if request else c)
        assert f["alpha"] == pytest.approx(f["charged_complexity"], rel=1e-6)
        if request:
            assert f["kept"] and "request-side: computed once per request" in f["reason"]
    # the budget counts per-candidate fields only: usage 1, 2 for the kept item fields
    assert sorted(f["usage"] for f in fields if f["side"] == "candidate" and f["kept"]) == [1, 2]
    # the strongest signal of the tiny log (users u0..u9 click more) ranks first; the
    # pre-ranking model reads only the kept fields and exports as a normal run
    assert fields[0]["name"] == "user"
    report = json.loads((run / "train_report.json").read_text())
    assert report["test"]["auc"] > 0.6
    assert report["selection"]["kept"] == sel["kept"]
    assert (run / "fscd_stage1" / "model.json").exists()
    exported = export_run(run, tmp_path / "export")
    meta = json.loads((exported / "assets.extra" / "stitchrec.json").read_text())
    assert sorted(meta["inputs"]) == sorted(sel["kept"])


def _quiet(_: str) -> None:
    pass


def _built_fscd(cfg) -> tuple:
    """``(schema, train_files, test_files, model)``: the run's data prepared and an FSCD model
    built on a sample (seed 0), as ``stitchrec train`` does before stage 1."""
    paths = RunPaths(Path(cfg.output_dir))
    schema, train_files, _, test_files = prepare_data(cfg, paths, _quiet)
    stats = prepare_stats(schema, train_files, paths, _quiet)
    tf.keras.utils.set_random_seed(0)
    model = build_fscd(cfg, schema, stats)
    build_on_sample(model, schema, train_files)
    return schema, train_files, test_files, model


def _stage1_keep(
    tmp_path: Path, name: str, schema_text: str, budget_value: int, mode: str = "free"
) -> dict:
    """Stages 1 and 2 only (stage 3 does not change the ranking of fields)."""
    data = write_grouped(tmp_path / name, text=schema_text, rows=4000)
    pre = FSCD.replace("budget_value = 2", f"budget_value = {budget_value}")
    pre += f'request_fields = "{mode}"\n'
    cfg = load_config(_config(tmp_path, data, name, pre))
    schema, train_files, _, stage1 = _built_fscd(cfg)
    fit(stage1, schema, train_files, cfg, cfg.preranking.fscd_epochs, _quiet, "stage 1")
    return select_stage(stage1, schema, cfg, train_files)


def _with_cost(name: str, cost: float) -> str:
    text = re.sub(
        rf'(name = "{name}"\n(?:[^\[]*?\n)?cost = )1\.0', rf"\g<1>{cost}", GROUPED_SCHEMA, count=1
    )
    assert text != GROUPED_SCHEMA
    return text


def test_raising_an_item_fields_cost_makes_fscd_drop_it_first(tmp_path):
    base = _stage1_keep(tmp_path, "base", GROUPED_SCHEMA, budget_value=2)
    item_side = [f["name"] for f in base["fields"] if f["side"] == "candidate"]
    assert sorted(item_side) == ["item", "price", "tags"]
    top = item_side[0]  # the per-candidate field stage 1 ranks first at equal costs
    assert top in base["kept"]
    sel = _stage1_keep(tmp_path, "costly", _with_cost(top, 100.0), budget_value=2)
    assert sel["fields"][-1]["name"] == top  # ranked last
    assert sel["dropped"] == [top]  # and the one field a budget of 2 item fields drops
    costly = sel["fields"][-1]
    assert costly["complexity"] > 100 and costly["charged_complexity"] == costly["complexity"]


def test_penalty_weight_is_one_over_n_unless_set():
    """The paper's 1/N by default: at 0.01 (the old default) MovieLens' genres gate closed in
    stage 1 before its embedding learned anything (docs/preranking.md)."""
    stats = DatasetStats(rows=2000, positives=500.0, fields={})
    assert penalty_weight(PrerankConfig(), stats) == pytest.approx(1 / 2000)
    assert penalty_weight(PrerankConfig(reg_weight=0.01), stats) == 0.01
    with pytest.raises(ValueError, match="training rows"):
        penalty_weight(PrerankConfig(), DatasetStats(rows=0, positives=0.0, fields={}))


def test_fit_stops_early_and_restores_the_best_epoch(tmp_path):
    data = write_grouped(tmp_path / "data", rows=1500)
    cfg = load_config(_config(tmp_path, data, "es", FSCD))
    schema, train_files, test_files, model = _built_fscd(cfg)
    # a learning rate this high overfits the tiny log within a few epochs
    out = fit(
        model, schema, train_files, cfg, 6, _quiet, "es",
        valid_files=test_files, patience=1, learning_rate=0.02,
    )  # fmt: skip
    aucs = out["valid_auc"]
    assert 1 <= len(aucs) <= 6 and out["best_epoch"] >= 1
    # it stopped early: fewer epochs than the 6 allowed, `patience` (1) after the best one
    assert len(aucs) == out["epochs"] < 6
    assert out["epochs"] - out["best_epoch"] == 1
    best = max(aucs)
    assert aucs[out["best_epoch"] - 1] == best
    assert aucs[-1] < best  # stopped: the last epoch did not beat the best
    restored = evaluate_model(make_scorer(model, schema), schema, test_files)["auc"]
    assert restored == pytest.approx(best, abs=1e-6)
    with pytest.raises(ValueError, match="patience"):
        fit(model, schema, train_files, cfg, 1, _quiet, "es", valid_files=test_files, patience=0)


def test_request_fields_stay_whatever_they_cost_unless_budgeted(tmp_path):
    costly = _with_cost("user", 100.0)
    # free: user is computed once per request; 100 / 500 candidates = 0.2 per candidate, and
    # it is kept outside a budget of one item field
    free = _stage1_keep(tmp_path, "free", costly, budget_value=1)
    user = next(f for f in free["fields"] if f["name"] == "user")
    assert user["charged_complexity"] == pytest.approx(user["complexity"] / 500)
    assert user["kept"] and user["side"] == "request"
    kept_items = [f["name"] for f in free["fields"] if f["side"] == "candidate" and f["kept"]]
    assert len(kept_items) == 1 and set(free["kept"]) == {"user", "age", *kept_items}
    # budgeted (the paper's row-level cost): user is charged 100 per candidate and is the one
    # field a budget of 4 (of 5) drops
    budgeted = _stage1_keep(tmp_path, "budgeted", costly, budget_value=4, mode="budgeted")
    assert budgeted["request_fields"]["fields"] == []
    assert budgeted["fields"][-1]["name"] == "user"
    assert budgeted["dropped"] == ["user"]


def test_missing_costs_are_a_clear_error(tmp_path, capsys):
    text = GROUPED_SCHEMA.replace(
        'separator = "|"\ngroup = "item"\ncost = 1.0', 'separator = "|"\ngroup = "item"'
    )
    data = write_grouped(tmp_path / "data", text=text, rows=200)
    with pytest.raises(SchemaError, match=r"fields \['tags'\] have none"):
        check_costs(str(data["schema"]))
    cfg = _config(tmp_path, data, "nocost", FSCD)
    assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "schema.toml" in err and "'tags'" in err and "cost" in err


@pytest.mark.parametrize(
    "mode, match",
    [
        (
            "free",
            r"flops budget 10 keeps no per-candidate field: the top one '\w+' \(keep "
            r"probability [0-9.]+\) with the request-side fields \['(user|age)', '(user|age)'\] \(always "
            r"kept\) needs \d+",
        ),
        ("budgeted", r"flops budget 10 keeps no field: the top field '\w+'"),
    ],
)
def test_a_budget_that_keeps_no_field_is_a_clear_error(tmp_path, mode, match):
    data = write_grouped(tmp_path / "data", rows=600)
    pre = FSCD.replace('budget = "fields"', 'budget = "flops"').replace(
        "budget_value = 2", "budget_value = 10"
    )
    cfg = load_config(_config(tmp_path, data, "tiny_budget", pre + f'request_fields = "{mode}"'))
    with pytest.raises(ValueError, match=match):
        train(cfg, log=lambda _: None)


@pytest.mark.parametrize(
    "section, match",
    [
        ('[preranking]\nbudget = "bytes"', r"\[preranking\]: budget 'bytes' is not one of"),
        ("[preranking]\ncolour = 1", r"\[preranking\]: unknown keys \['colour'\]"),
        ("[preranking]\ntemperature = -1", r"\[preranking\]: temperature must be > 0"),
        (
            '[preranking]\nrequest_fields = "once"',
            r"\[preranking\]: request_fields 'once' is not one of \['free', 'budgeted'\]",
        ),
        (
            "[preranking]\ncandidates_per_request = 0",
            r"\[preranking\]: candidates_per_request must be >= 1, got 0",
        ),
        (
            '[preranking]\nmodel = "fm"',
            r"\[preranking\]: model 'fm' is not one of \['dnn', 'dcn_v2'\]",
        ),
        (
            '[preranking]\nfinetune_init = "warm"',
            r"\[preranking\]: finetune_init 'warm' is not one of \['stage1', 'scratch'\]",
        ),
    ],
)
def test_preranking_config_errors_name_file_and_section(tmp_path, section, match):
    data = write_grouped(tmp_path / "data", rows=100)
    path = _config(tmp_path, data, "bad", section)
    with pytest.raises(ConfigError, match=match) as e:
        load_config(path)
    assert "bad.toml" in str(e.value)


def test_fscd_needs_an_interaction_model(tmp_path):
    data = write_grouped(tmp_path / "data", rows=100)
    cfg = load_config(_config(tmp_path, data, "fm", FSCD, type="fm"))
    with pytest.raises(ConfigError, match="needs \\[model\\] type dnn or dcn_v2"):
        train(cfg, log=lambda _: None)


def test_two_tower_run_and_cascade_export(tmp_path, capsys):
    data = write_grouped(tmp_path / "data", rows=3000)
    path = _config(tmp_path, data, "tt", '[preranking]\nmethod = "two_tower"\ntower_dim = 4')
    tt = load_config(path, ["train.epochs=3"])
    report = train(tt, log=lambda _: None)
    assert report["model"] == "two_tower" and report["test"]["auc"] > 0.55
    rank = load_config(_config(tmp_path, data, "rank", ""))
    train(rank, log=lambda _: None)
    # a pre-ranking run never overwrites a ranking run's checkpoints
    into_rank = load_config(path, [f"output_dir={rank.output_dir}"])
    with pytest.raises(ConfigError, match="holds a ranking run"):
        train(into_rank, log=lambda _: None)
    out = tmp_path / "cascade"
    argv = ["export", "--run", tt.output_dir, "--cascade-rank", rank.output_dir, "--keep", "2"]
    assert main([*argv, "--output", str(out)]) == 0
    assert f"exported {out}" in capsys.readouterr().out
    loaded = tf.saved_model.load(str(out))
    got = loaded.signatures["rank_request"](
        user=tf.constant(["u1"]),
        age=tf.constant([30.0]),
        item=tf.constant([3, 4, 5, 6], tf.int64),
        tags=tf.constant(["a|b", "c", "", "d"]),
        price=tf.constant([1.0, 5.0, 20.0, 2.0]),
    )
    kept = got["kept"].numpy()
    assert kept.sum() == 2
    assert set(np.flatnonzero(kept)) == set(np.argsort(-got["prerank_score"].numpy())[:2])
    assert (got["score"].numpy()[~kept] == -1.0).all()
    assert ((got["score"].numpy()[kept] > 0) & (got["score"].numpy()[kept] < 1)).all()


def test_finetune_from_scratch_starts_stage_three_fresh(tmp_path, capsys):
    data = write_grouped(tmp_path / "data", rows=1500)
    section = FSCD.replace("fscd_epochs = 3", 'fscd_epochs = 1\nfinetune_init = "scratch"')
    assert main(["train", "--config", str(_config(tmp_path, data, "scratch", section))]) == 0
    out = capsys.readouterr().out
    assert "fresh initialization" in out and "initialized from stage 1" not in out
    report = json.loads((tmp_path / "scratch" / "train_report.json").read_text())
    assert 0.5 < report["test"]["auc"] <= 1.0


def test_fscd_with_a_tower_residual_trains_exports_and_cascades(tmp_path, capsys):
    """``tower_residual = true``: stage 1 and the pre-ranker add towers over every field; the
    selection still keeps 2 item fields, the pre-ranker reads every field (the towers') and
    exports, alone and as the cascade's pre-ranking."""
    data = write_grouped(tmp_path / "data", rows=2000)
    section = FSCD.replace(
        "fscd_epochs = 3", 'fscd_epochs = 1\ntower_residual = true\ntower_dim = 4\nmodel = "dnn"'
    )
    # the ranking model is a dcn_v2; the pre-ranker its own type, a dnn
    cfg = load_config(_config(tmp_path, data, "res", section, type="dcn_v2"))
    assert cfg.preranking.tower_residual and cfg.model.type == "dcn_v2"
    report = train(cfg, log=lambda _: None)
    assert report["interaction"] == "ConcatInteraction"
    run = Path(cfg.output_dir)
    sel = json.loads((run / "selection.json").read_text())
    assert len(sel["kept"]) == 4 and set(sel["kept"]) >= REQUEST
    assert report["test"]["auc"] > 0.55
    exported = export_run(run, tmp_path / "export")
    meta = json.loads((exported / "assets.extra" / "stitchrec.json").read_text())
    assert sorted(meta["inputs"]) == ["age", "item", "price", "tags", "user"]  # the towers' too
    rank = load_config(_config(tmp_path, data, "rank", ""))
    train(rank, log=lambda _: None)
    out = tmp_path / "cascade"
    argv = ["export", "--run", str(run), "--cascade-rank", rank.output_dir, "--keep", "2"]
    assert main([*argv, "--output", str(out)]) == 0
    got = tf.saved_model.load(str(out)).signatures["rank_request"](
        user=tf.constant(["u1"]),
        age=tf.constant([30.0]),
        item=tf.constant([3, 4, 5], tf.int64),
        tags=tf.constant(["a|b", "c", ""]),
        price=tf.constant([1.0, 5.0, 20.0]),
    )
    assert got["kept"].numpy().sum() == 2
    with pytest.raises(ValueError, match="tower_residual must be true or false"):
        PrerankConfig(tower_residual="yes")
