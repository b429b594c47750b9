"""Cascades and pre-rankers on a schema with a user history (group user, shared item table)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from features.dataset import iter_batches, iter_record_batches, list_parquet
from features.preprocessing import build_preprocessor
from features.schema import load_schema
from features.stats import compute_stats
from pipelines.config import load_config
from pipelines.export import export_cascade_saved_model
from pipelines.preranking import build_fscd, build_run_two_tower, field_groups
from ranking.cascade import CascadeModule, RequestScorer
from ranking.config import ModelConfig, TaskConfig
from ranking.fscd import selection_fields
from ranking.models import build_model
from ranking.multitask import build_multitask_model
from tests.ranking.sequence_prerank_data import ITEMS, REQUEST, write_sequence_data
from tests.testdata import write_run_config


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq")
    paths = write_sequence_data(root / "data", rows=400)
    schema = load_schema(paths["schema"])
    files = list_parquet(paths["train"])
    stats = compute_stats(schema, iter_record_batches(schema, files))
    batch = next(iter_batches(schema, files, batch_size=10, shuffle=False))
    feats = {k: tf.constant(v) for k, v in batch.items() if k != "label"}
    request = {k: feats[k][2:3] for k in REQUEST}
    cands = {k: feats[k] for k in ITEMS}
    cfg_path = write_run_config(
        root / "tt.toml",
        paths,
        root / "run",
        {"type": "dnn", "embedding_dim": 4, "mlp": [8]},
        {"batch_size": 64, "epochs": 1},
        extra='[preranking]\nmethod = "fscd"\ntower_dim = 4',
    )
    return paths, schema, stats, request, cands, load_config(cfg_path)


def _tiled(request, cands):
    n = int(next(iter(cands.values())).shape[0])
    return {**{k: tf.repeat(v, n) for k, v in request.items()}, **cands}


def _rank(schema, stats, kind="dnn", pooling="din"):
    tf.keras.utils.set_random_seed(0)
    config = ModelConfig(
        type=kind, embedding_dim=4, mlp=(8,), cross_layers=1, sequence_pooling=pooling
    )
    return build_model(config, build_preprocessor(schema, stats), "label")


@pytest.mark.parametrize(("kind", "pooling"), [("dnn", "din"), ("dcn_v2", "din"), ("dnn", "mean")])
def test_request_scorer_tiles_the_history_once_and_equals_the_model(data, kind, pooling):
    _, schema, stats, request, cands, _ = data
    rank = _rank(schema, stats, kind, pooling)
    want = rank(_tiled(request, cands)).numpy()
    for split in (True, False):
        scorer = RequestScorer(rank, field_groups(schema), split_first_layer=split)
        assert scorer.request_sequences == ["hist_items", "hist_cats"]
        got = scorer(request, cands).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_shorter_side_sequence_is_pooled_as_the_model_pools_it(data):
    _, schema, stats, request, cands, _ = data
    rank = _rank(schema, stats)
    short = {**request, "hist_items": tf.constant(["i1|i2|i3"]), "hist_cats": tf.constant(["k1"])}
    want = rank(_tiled(short, cands)).numpy()
    got = RequestScorer(rank, field_groups(schema))(short, cands).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_the_history_of_another_user_changes_the_scores(data):
    _, schema, stats, request, cands, _ = data
    rank = _rank(schema, stats)
    rank(_tiled(request, cands))
    scorer = RequestScorer(rank, field_groups(schema))
    other = {**request, "hist_items": tf.constant([""]), "hist_cats": tf.constant([""])}
    assert np.abs(scorer(request, cands).numpy() - scorer(other, cands).numpy()).max() > 1e-6


def test_pre_rankers_read_no_sequence_and_the_cascade_ranks_with_the_history(data, tmp_path):
    _, schema, stats, request, cands, cfg = data
    two_tower = build_run_two_tower(cfg, schema, stats)
    # the user tower reads the request fields only (not the shared tables' item fields)
    assert two_tower.user_tower.input_names == ["I1", "C1"]
    assert two_tower.item_tower.input_names == ["C2", "C3", "item", "item_cat"]
    fscd = build_fscd(cfg, schema, stats)
    assert fscd.preprocessor.sequence_fields == {}
    assert sorted(selection_fields(fscd)) == ["C1", "C2", "C3", "I1", "item", "item_cat"]
    rank = _rank(schema, stats)
    tiled = _tiled(request, cands)
    two_tower(tiled)
    want = tf.sigmoid(rank(tiled)).numpy()
    module = CascadeModule(two_tower, rank, field_groups(schema), keep=4)
    spec = module.rank_request.input_signature[0]
    assert spec["hist_items"].shape == [1] and spec["item"].shape.as_list() == [None]
    out = module.rank_request({**request, **cands})
    kept = out["kept"].numpy()
    assert kept.sum() == 4
    np.testing.assert_allclose(out["score"].numpy()[kept], want[kept], rtol=0, atol=1e-6)
    saved = export_cascade_saved_model(
        two_tower, rank, field_groups(schema), tmp_path / "cascade", keep=4
    )
    meta = json.loads((saved / "assets.extra" / "stitchrec.json").read_text())
    assert set(meta["request_inputs"]) == set(REQUEST)
    loaded = tf.saved_model.load(str(saved)).signatures["rank_request"](**request, **cands)
    np.testing.assert_allclose(loaded["score"].numpy(), out["score"].numpy(), atol=1e-6)


def test_a_multi_task_ranking_model_is_refused_by_name(data):
    _, schema, stats, *_ = data
    tasks = (TaskConfig("click", "label"), TaskConfig("again", "label"))
    config = ModelConfig(type="dnn", embedding_dim=4, mlp=(8,), tasks=tasks, tower_mlp=(4,))
    model = build_multitask_model(config, build_preprocessor(schema, stats))
    with pytest.raises(ValueError, match="cannot score requests with a MultiTaskModel"):
        RequestScorer(model, field_groups(schema))
