"""``stitchrec train`` with ``[preranking]``: FSCD's three stages, selection.json, costs, budgets,
the two-tower run and the cascade export of two runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from features.schema import SchemaError
from pipelines.cli import main
from pipelines.config import ConfigError, load_config
from pipelines.export import export_run
from pipelines.preranking import (
    build_fscd,
    build_on_sample,
    check_costs,
    fit,
    select_stage,
)
from pipelines.train import RunPaths, prepare_data, prepare_stats, train
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
budget_value = 3
fscd_epochs = 3
finetune_epochs = 1
"""


def test_cli_train_runs_the_three_stages_and_writes_selection(tmp_path, capsys):
    data = write_grouped(tmp_path / "data", rows=4000)
    cfg = _config(tmp_path, data, "fscd", FSCD)
    assert main(["train", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "fscd stage 1" in out and "fscd stage 2" in out and "fscd stage 3" in out
    run = tmp_path / "fscd"
    sel = json.loads((run / "selection.json").read_text())
    assert sel["budget"] == {"kind": "fields", "value": 3.0}
    assert len(sel["kept"]) == 3 and len(sel["dropped"]) == 2
    fields = sel["fields"]
    assert [f["rank"] for f in fields] == [1, 2, 3, 4, 5]
    probs = [f["keep_prob"] for f in fields]
    assert probs == sorted(probs, reverse=True)
    assert [f["name"] for f in fields if f["kept"]] == sel["kept"]
    for f in fields:
        assert {"complexity", "alpha", "cost", "embedding_dim", "cardinality", "reason"} <= set(f)
        assert f["complexity"] == pytest.approx(
            f["cost"] + 0.01 * f["embedding_dim"] + 1e-7 * f["cardinality"]
        )
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


def _stage1_keep(tmp_path: Path, name: str, schema_text: str) -> dict:
    """Stages 1 and 2 only (stage 3 does not change the ranking of fields)."""
    data = write_grouped(tmp_path / name, text=schema_text, rows=4000)
    pre = FSCD.replace("budget_value = 3", "budget_value = 4")
    cfg = load_config(_config(tmp_path, data, name, pre))
    quiet = lambda _: None  # noqa: E731
    paths = RunPaths(Path(cfg.output_dir))
    schema, train_files, _ = prepare_data(cfg, paths, quiet)
    stats = prepare_stats(schema, train_files, paths, quiet)
    tf.keras.utils.set_random_seed(0)
    stage1 = build_fscd(cfg, schema, stats)
    build_on_sample(stage1, schema, train_files)
    fit(stage1, schema, train_files, cfg, cfg.preranking.fscd_epochs, quiet, "stage 1")
    return select_stage(stage1, schema, cfg, train_files)


def test_raising_a_fields_cost_makes_fscd_drop_it_first(tmp_path):
    base = _stage1_keep(tmp_path, "base", GROUPED_SCHEMA)
    assert "user" in base["kept"]  # the strongest signal of the tiny log
    costly = GROUPED_SCHEMA.replace(
        'name = "user"\nkind = "categorical"\ngroup = "user"\ncost = 1.0',
        'name = "user"\nkind = "categorical"\ngroup = "user"\ncost = 100.0',
    )
    assert costly != GROUPED_SCHEMA
    sel = _stage1_keep(tmp_path, "costly", costly)
    assert sel["fields"][-1]["name"] == "user"  # ranked last
    assert sel["dropped"] == ["user"]  # and the one field a budget of 4 drops
    user = next(f for f in sel["fields"] if f["name"] == "user")
    assert user["complexity"] > 100


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


def test_a_budget_that_keeps_no_field_is_a_clear_error(tmp_path):
    data = write_grouped(tmp_path / "data", rows=600)
    pre = FSCD.replace('budget = "fields"', 'budget = "flops"').replace(
        "budget_value = 3", "budget_value = 10"
    )
    cfg = load_config(_config(tmp_path, data, "tiny_budget", pre))
    with pytest.raises(ValueError, match=r"flops budget 10 keeps no field: the top field"):
        train(cfg, log=lambda _: None)


@pytest.mark.parametrize(
    "section, match",
    [
        ('[preranking]\nbudget = "bytes"', r"\[preranking\]: budget 'bytes' is not one of"),
        ("[preranking]\ncolour = 1", r"\[preranking\]: unknown keys \['colour'\]"),
        ("[preranking]\ntemperature = -1", r"\[preranking\]: temperature must be > 0"),
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
