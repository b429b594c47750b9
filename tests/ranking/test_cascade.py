"""The pre-ranking -> ranking cascade: request features once, top-M hand-off, SavedModel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from features.dataset import iter_batches, list_parquet
from features.preprocessing import build_preprocessor
from pipelines.preranking import field_groups
from ranking.cascade import DROPPED_SCORE, CascadeModule, RequestScorer, export_cascade
from ranking.config import ModelConfig
from ranking.models import build_model
from tests.ranking.prerank_data import grouped_stats, write_grouped
from tests.ranking.test_two_tower import _model as two_tower

REQUEST = ("user", "age")
ITEMS = ("item", "tags", "price")


@pytest.fixture()
def setup(tmp_path):
    paths = write_grouped(tmp_path / "data", rows=800)
    schema, stats = grouped_stats(paths)
    tf.keras.utils.set_random_seed(0)
    rank = build_model(
        ModelConfig(type="dcn_v2", embedding_dim=4, mlp=(8,), cross_layers=1),
        build_preprocessor(schema, stats),
        "label",
    )
    prerank = two_tower(schema, stats, tower_dim=4)
    batch = next(iter_batches(schema, list_parquet(paths["test"]), batch_size=12, shuffle=False))
    feats = {k: tf.constant(v) for k, v in batch.items() if k != "label"}
    rank(feats)
    prerank(feats)
    request = {k: feats[k][3:4] for k in REQUEST}
    cands = {k: feats[k] for k in ITEMS}
    return field_groups(schema), stats, rank, prerank, request, cands


def _tiled(request, cands):
    n = int(next(iter(cands.values())).shape[0])
    return {**{k: tf.repeat(v, n) for k, v in request.items()}, **cands}


def test_request_scorer_equals_the_model_on_tiled_rows(setup):
    groups, _, rank, prerank, request, cands = setup
    for model in (rank, prerank):
        scorer = RequestScorer(model, groups)
        assert scorer.request_names == ["user", "age"]
        got = scorer(request, cands).numpy()
        np.testing.assert_allclose(got, model(_tiled(request, cands)).numpy(), rtol=1e-5, atol=1e-6)


def test_cascade_keeps_the_prerank_top_m_and_ranks_them(setup):
    groups, _, rank, prerank, request, cands = setup
    module = CascadeModule(prerank, rank, groups, keep=5)
    out = module.rank_request({**request, **cands})
    flat_pre = tf.sigmoid(prerank(_tiled(request, cands))).numpy()
    flat_rank = tf.sigmoid(rank(_tiled(request, cands))).numpy()
    np.testing.assert_allclose(out["prerank_score"].numpy(), flat_pre, rtol=1e-5, atol=1e-6)
    kept = out["kept"].numpy()
    assert kept.dtype == bool and kept.sum() == 5
    assert set(np.flatnonzero(kept)) == set(np.argsort(-flat_pre)[:5])
    score = out["score"].numpy()
    np.testing.assert_allclose(score[kept], flat_rank[kept], rtol=1e-5, atol=1e-6)
    assert (score[~kept] == DROPPED_SCORE).all()
    # fewer candidates than M: all are kept and ranked
    small = module.rank_request({**request, **{k: v[:3] for k, v in cands.items()}})
    assert small["kept"].numpy().all()


def test_cascade_saved_model_signatures(setup, tmp_path):
    groups, _, rank, prerank, request, cands = setup
    out = export_cascade(prerank, rank, groups, tmp_path / "cascade", keep=4)
    meta = json.loads((out / "assets.extra" / "stitchrec.json").read_text())
    assert meta["request_inputs"] == ["user", "age"] and meta["keep"] == 4
    assert meta["dropped_score"] == DROPPED_SCORE
    loaded = tf.saved_model.load(str(out))
    sig = loaded.signatures["rank_request"]
    specs = sig.structured_input_signature[1]
    assert specs["user"].shape == [1] and specs["item"].shape.as_list() == [None]
    got = sig(**request, **cands)
    want = CascadeModule(prerank, rank, groups, keep=4).rank_request({**request, **cands})
    for key in ("score", "prerank_score", "kept"):
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-6)
    flat = loaded.signatures["serving_default"](**_tiled(request, cands))["score"].numpy()
    np.testing.assert_allclose(flat, tf.sigmoid(rank(_tiled(request, cands))).numpy(), rtol=1e-5)
    # an empty candidate list fails inside the SavedModel with a clear message
    empty = {k: v[:0] for k, v in cands.items()}
    with pytest.raises(tf.errors.InvalidArgumentError, match="candidate list is empty"):
        sig(**request, **empty)


def test_bad_requests_are_clear_errors(setup):
    groups, _, rank, prerank, request, cands = setup
    module = CascadeModule(prerank, rank, groups, keep=4)
    req = {k: v.numpy() for k, v in request.items()}
    with pytest.raises(ValueError, match="candidate list is empty"):
        module.rank_candidates(req, {k: v.numpy()[:0] for k, v in cands.items()})
    with pytest.raises(KeyError, match="lacks fields"):
        module.rank_candidates({"user": req["user"]}, {k: v.numpy() for k, v in cands.items()})
    with pytest.raises(ValueError, match="differ in length"):
        module.rank_candidates(req, {**{k: v.numpy() for k, v in cands.items()}, "item": [1]})
    with pytest.raises(ValueError, match="needs one value"):
        module.rank_candidates(
            {**req, "user": ["u1", "u2"]}, {k: v.numpy() for k, v in cands.items()}
        )
    got = module.rank_candidates(req, {k: v.numpy() for k, v in cands.items()})
    assert got["kept"].sum() == 4
    with pytest.raises(ValueError, match="no `group`"):
        CascadeModule(prerank, rank, {**groups, "tags": None}, keep=4)
    with pytest.raises(ValueError, match="keep must be >= 1"):
        CascadeModule(prerank, rank, groups, keep=0)


@pytest.mark.parametrize("model_type", ["dcn_v2", "fm", "lr"])
def test_request_side_dense_and_multi_valued_fields(tmp_path, model_type):
    """A dense (price) and a multi-valued (tags) request-side field are computed on the one row
    and repeated; the wide term of fm/lr gets the repeated ragged ids."""
    schema, stats = grouped_stats(write_grouped(tmp_path / "data", rows=800))
    moved = schema.replace_field("price", group="context").replace_field("tags", group="user")
    model = build_model(
        ModelConfig(type=model_type, embedding_dim=4, mlp=(8,), cross_layers=1),
        build_preprocessor(moved, stats),
        "label",
    )
    request = {"user": ["u2"], "age": [41.0], "price": [12.5], "tags": ["c|a"]}
    cands = {"item": [1, 3, 5, 7, 3]}
    tiled = {k: tf.constant(np.repeat(v, 5)) for k, v in request.items()}
    tiled["item"] = tf.constant(cands["item"], tf.int64)
    want = model(tiled).numpy()
    scorer = RequestScorer(model, field_groups(moved))
    assert scorer.request_names == ["user", "tags", "price", "age"]
    got = scorer(
        {k: tf.constant(v) for k, v in request.items()},
        {"item": tf.constant(cands["item"], tf.int64)},
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "model_cfg",
    [
        {"type": "dnn", "mlp": (8, 4)},
        {"type": "dcn_v2", "mlp": (8,), "cross_layers": 2},
        {"type": "dcn_v2", "mlp": (8,), "cross_layers": 2, "cross_rank": 3},
    ],
    ids=["dnn", "dcn_v2", "dcn_v2_low_rank"],
)
def test_first_layer_split_is_exact(tmp_path, model_cfg):
    """W [x_r; x_i] = W_r x_r + W_i x_i: the request part of the first layer computed once per
    request gives the plain model's logits (request and item columns interleave here: user,
    item, tags, age embedded, then the dense price)."""
    schema, stats = grouped_stats(write_grouped(tmp_path / "data", rows=800))
    tf.keras.utils.set_random_seed(1)
    model = build_model(
        ModelConfig(embedding_dim=4, **model_cfg), build_preprocessor(schema, stats), "label"
    )
    paths = list_parquet(tmp_path / "data" / "test")
    batch = next(iter_batches(schema, paths, batch_size=40, shuffle=False))
    feats = {k: tf.constant(v) for k, v in batch.items() if k != "label"}
    model(feats)
    # non-zero biases, so a bias added twice or dropped would show
    for w in model.weights:
        if "bias" in w.name and w.shape.rank == 1:
            w.assign(tf.random.normal(w.shape, stddev=0.5))
    request = {k: feats[k][7:8] for k in REQUEST}
    cands = {k: feats[k] for k in ITEMS}
    groups = field_groups(schema)
    split = RequestScorer(model, groups)
    plain = RequestScorer(model, groups, split_first_layer=False)
    assert split._first_layer() is not None and plain._first_layer() is None
    rows_r, rows_i = split._column_rows()
    assert sorted([*rows_r, *rows_i]) == list(range(4 * 4 + 1))
    want = model(_tiled(request, cands)).numpy()
    np.testing.assert_allclose(split(request, cands).numpy(), want, atol=1e-5)
    np.testing.assert_allclose(plain(request, cands).numpy(), want, atol=1e-5)
    assert np.std(want) > 1e-3  # the candidates are told apart


def test_a_model_with_a_tower_residual_scores_requests_and_round_trips(setup, tmp_path):
    """``RankingModel(residual=two-tower)`` over two item fields: logits are its own plus the
    towers' (over every field); the request scorer, a config round trip and the cascade agree."""
    groups, stats, rank, _, request, cands = setup
    schema, _ = grouped_stats(write_grouped(tmp_path / "d2", rows=300))
    sub = schema.select(["user", "age", "item", "price"])
    tf.keras.utils.set_random_seed(1)
    towers = two_tower(schema, stats, tower_dim=4)
    model = build_model(
        ModelConfig(type="dcn_v2", embedding_dim=4, mlp=(8,), cross_layers=1),
        build_preprocessor(sub, stats),
        "label",
    )
    model.residual = towers
    feats = _tiled(request, cands)
    own = model.logits_from(*model.preprocessor(feats))
    np.testing.assert_allclose(
        model(feats).numpy(), (own + towers(feats)).numpy(), rtol=1e-5, atol=1e-6
    )
    scorer = RequestScorer(model, groups)
    assert sorted(scorer.item_names) == ["item", "price", "tags"]
    assert sorted(scorer.own_items) == ["item", "price"]
    np.testing.assert_allclose(
        scorer(request, cands).numpy(), model(feats).numpy(), rtol=1e-5, atol=1e-6
    )
    config = tf.keras.layers.serialize(model)
    again = tf.keras.layers.deserialize(json.loads(json.dumps(config)))
    again(feats)
    # by checkpoint, as a trained run is restored (the residual is set after construction
    # here and in the pipeline, inside the constructor on load: weight order differs)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=again).restore(path).assert_existing_objects_matched()
    assert again.residual is not None
    np.testing.assert_allclose(again(feats).numpy(), model(feats).numpy(), rtol=1e-6)
    module = CascadeModule(model, rank, groups, keep=4)
    out = module.rank_request({**request, **cands})
    np.testing.assert_allclose(
        out["prerank_score"].numpy(), tf.sigmoid(model(feats)).numpy(), rtol=1e-5
    )


def test_cascade_with_generated_lookups_serves_the_same_scores(setup, tmp_path):
    """``kernels=True``: the candidates' lookups of the (fused) ranking model as one generated
    op; the export ships its source, the server's ``ModelVersion`` loads it with the SavedModel,
    and the scores are the plain cascade's."""
    from tests.compiler_opt.conftest import need_compiler

    need_compiler()
    from pipelines.export import export_cascade_saved_model
    from serving.model_version import ModelVersion

    groups, _, rank, prerank, request, cands = setup
    plain = CascadeModule(prerank, rank, groups, keep=4).rank_request({**request, **cands})
    out = export_cascade_saved_model(
        prerank, rank, groups, tmp_path / "cascade", keep=4, kernels=True
    )
    manifest = json.loads((out / "assets" / "compiler_opt_kernels" / "manifest.json").read_text())
    assert len(manifest["kernels"]) == 1  # the ranking model's; the two-tower has none
    version = ModelVersion("cascade", 1, out, ["/device:CPU:0"], fusion=False).load()
    assert version.kernels == [manifest["kernels"][0]["forward"]]
    graph = version.instances[0].signatures["rank_request"].graph.as_graph_def()
    ops = {n.op for f in graph.library.function for n in f.node_def}
    assert version.kernels[0] in ops  # the op, not the per-field lookups, scores candidates
    got = version.instances[0].signatures["rank_request"](**request, **cands)
    for key in ("score", "prerank_score", "kept"):
        np.testing.assert_allclose(got[key].numpy(), plain[key].numpy(), rtol=1e-5, atol=1e-6)
