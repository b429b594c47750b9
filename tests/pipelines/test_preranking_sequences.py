"""``stitchrec train`` with ``[preranking]`` on a schema with a user history, and the cascade of
that pre-ranker with a DIN ranking run: the history is one request value of ``rank_request``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from features.dataset import iter_batches, list_parquet
from pipelines.config import load_config
from pipelines.preranking import export_cascade_runs
from pipelines.run.model import load_trained_model
from pipelines.train import train
from tests.ranking.sequence_prerank_data import ITEMS, REQUEST, write_sequence_data
from tests.testdata import write_run_config

FSCD = """
[preranking]
method = "fscd"
budget = "fields"
budget_value = 2
fscd_epochs = 1
finetune_epochs = 1
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("prerank_seq")
    data = write_sequence_data(root / "data", rows=600)
    train_section = {"batch_size": 128, "epochs": 1, "learning_rate": 0.01, "seed": 0}

    def run(name: str, extra: str, **model) -> Path:
        section = {"embedding_dim": 4, "mlp": [8], "type": "dnn", **model}
        path = write_run_config(
            root / f"{name}.toml", data, root / name, section, train_section, extra=extra
        )
        train(load_config(path), log=lambda _: None)
        return root / name

    return root, data, run("fscd", FSCD), run("rank", "", sequence_pooling="din")


def test_fscd_selects_among_the_other_fields(runs):
    _, _, fscd, _ = runs
    sel = json.loads((fscd / "selection.json").read_text())
    names = [f["name"] for f in sel["fields"]]
    assert sorted(names) == ["C1", "C2", "C3", "I1", "item", "item_cat"]
    assert sorted(sel["request_fields"]["fields"]) == ["C1", "I1"]


def test_cascade_of_runs_ranks_with_the_history_as_the_ranking_run(runs):
    root, data, fscd, rank_run = runs
    out = export_cascade_runs(fscd, rank_run, root / "cascade", keep=3)
    meta = json.loads((out / "assets.extra" / "stitchrec.json").read_text())
    assert {"hist_items", "hist_cats"} <= set(meta["request_inputs"])
    rank, schema, _ = load_trained_model(rank_run)
    batch = next(iter_batches(schema, list_parquet(data["test"]), batch_size=8, shuffle=False))
    request = {k: tf.constant(batch[k][1:2]) for k in REQUEST}
    cands = {k: tf.constant(batch[k]) for k in ITEMS}
    got = tf.saved_model.load(str(out)).signatures["rank_request"](**request, **cands)
    tiled = {**{k: tf.repeat(v, 8) for k, v in request.items()}, **cands}
    want = tf.sigmoid(rank(tiled)).numpy()
    kept = got["kept"].numpy()
    assert kept.sum() == 3
    np.testing.assert_allclose(got["score"].numpy()[kept], want[kept], rtol=0, atol=1e-6)
