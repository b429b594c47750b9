"""FSCD math (complexity, relaxed Bernoulli, selection by budget), its layer and weight transfer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from features.dataset import iter_batches, list_parquet
from features.preprocessing import build_preprocessor
from ranking.config import ModelConfig
from ranking.fscd import (
    FieldSelection,
    FSCDRankingModel,
    add_field_selection,
    amortized_complexity,
    complexity_alpha,
    field_complexity,
    input_slices,
    model_flops,
    prior_keep_probability,
    relaxed_bernoulli,
    select_fields,
    transfer_weights,
)
from ranking.models import build_model
from tests.ranking.prerank_data import grouped_stats, write_grouped


def test_complexity_prior_and_alpha_by_hand():
    c = field_complexity([1.0, 3.0], [16, 8], [1000, 10], g1=1.0, g2=0.01, g3=1e-3)
    np.testing.assert_allclose(c, [1.0 + 0.16 + 1.0, 3.0 + 0.08 + 0.01])
    prior = prior_keep_probability(c)
    np.testing.assert_allclose(prior, 1 - 1 / (1 + np.exp(-c)))
    # alpha = log((1 - prior) / prior) = c, also where the prior underflows
    np.testing.assert_allclose(complexity_alpha(c), np.log((1 - prior) / prior))
    np.testing.assert_allclose(complexity_alpha(np.array([800.0])), [800.0])
    with pytest.raises(ValueError, match="one value per field"):
        field_complexity([1.0], [1, 2], [3])


def test_relaxed_bernoulli_keeps_with_probability_theta():
    theta = 0.3
    logit = tf.constant([math.log(theta / (1 - theta))])
    # u = 0.5: z = sigmoid(logit / t)
    z = relaxed_bernoulli(logit, tf.constant([[0.5]]), 0.1)
    np.testing.assert_allclose(z.numpy(), [[1 / (1 + math.exp(-logit.numpy()[0] / 0.1))]], 1e-6)
    # z > 1/2 exactly when u > 1 - theta: a uniform grid of u keeps a share theta
    u = tf.constant(((np.arange(10_000) + 0.5) / 10_000)[:, None], tf.float32)
    z = relaxed_bernoulli(logit, u, 0.1).numpy()
    assert abs((z > 0.5).mean() - theta) < 1e-3
    assert ((z < 0.05) | (z > 0.95)).mean() > 0.8  # t = 0.1: nearly binary


def test_model_flops_by_hand():
    # dnn, D=4 -> [3] -> head: 2*4*3 + 2*3 + 2*3 + 1
    assert model_flops("dnn", 4, [3]) == 2 * 4 * 3 + 2 * 3 + 2 * 3 + 1
    # dcn_v2 full rank adds per layer 2*D*D + 4*D
    assert model_flops("dcn_v2", 4, [3], cross_layers=2) == 2 * (32 + 16) + 37
    assert model_flops("dcn_v2", 4, [3], 1, cross_rank=2) == 4 * 4 * 2 + 16 + 37
    with pytest.raises(ValueError, match="dnn and dcn_v2"):
        model_flops("fm", 4, [3])
    # request columns (D_r = 3 of 4) of the first layer are charged once per K = 10 candidates
    share = 1 + 3 / 10
    assert model_flops("dnn", 4, [3], request_width=3, candidates_per_request=10) == (
        pytest.approx(2 * share * 3 + 2 * 3 + 2 * 3 + 1)
    )
    assert model_flops(
        "dcn_v2", 4, [3], cross_layers=2, request_width=3, candidates_per_request=10
    ) == pytest.approx(2 * share * 4 + 16 + 32 + 16 + 37)
    assert model_flops(
        "dcn_v2", 4, [3], 1, cross_rank=2, request_width=3, candidates_per_request=10
    ) == pytest.approx(2 * share * 2 + 2 * 2 * 4 + 16 + 37)
    with pytest.raises(ValueError, match="request_width"):
        model_flops("dnn", 4, [3], request_width=5)


def test_select_fields_by_count_and_usage():
    names = ["a", "b", "c", "d"]
    prob = [0.2, 0.9, 0.5, 0.7]
    kept, decisions = select_fields(names, prob, "fields", 2)
    assert kept == ["b", "d"]
    assert [d["name"] for d in decisions] == ["b", "d", "c", "a"]
    assert [d["kept"] for d in decisions] == [True, True, False, False]
    assert "fields 3 > budget 2" in decisions[2]["reason"]
    cost = {"a": 1.0, "b": 5.0, "c": 1.0, "d": 4.0}
    kept, _ = select_fields(names, prob, "flops", 9.5, lambda k: sum(cost[n] for n in k))
    assert kept == ["b", "d"]  # + c would need 10 > 9.5; the prefix stops there
    kept, _ = select_fields(names, prob, "latency", 100, lambda k: sum(cost[n] for n in k))
    assert kept == ["b", "d", "c", "a"]


def test_budget_that_keeps_no_field_is_a_clear_error():
    with pytest.raises(ValueError, match=r"flops budget 3 keeps no field: the top field 'b'"):
        select_fields(["a", "b"], [0.1, 0.9], "flops", 3, lambda k: 10.0 * len(k))
    with pytest.raises(ValueError, match="not one of"):
        select_fields(["a"], [0.5], "bytes", 3)
    with pytest.raises(ValueError, match="needs a usage function"):
        select_fields(["a"], [0.5], "latency", 3)


def test_request_fields_are_kept_outside_the_budget():
    names = ["u", "a", "b", "ctx", "c"]
    prob = [0.1, 0.9, 0.5, 0.05, 0.7]  # request-side u, ctx rank last by keep probability
    kept, decisions = select_fields(names, prob, "fields", 1, request=["u", "ctx"])
    assert kept == ["a", "u", "ctx"]  # the top item field, then the request fields (rank order)
    by = {d["name"]: d for d in decisions}
    assert [d["name"] for d in decisions] == ["a", "c", "b", "u", "ctx"]
    assert by["u"]["side"] == by["ctx"]["side"] == "request"
    assert by["u"]["kept"] and by["ctx"]["kept"] and by["u"]["usage"] == 0.0
    assert "request-side: computed once per request" in by["u"]["reason"]
    assert by["a"]["usage"] == 1.0 and by["c"]["usage"] == 2.0  # item fields only
    assert not by["c"]["kept"] and "fields 2 > budget 1" in by["c"]["reason"]
    # usage functions see every kept field and decide what request fields cost: here
    # latency 3 per item field, request fields free (computed once per request)
    lat = {"u": 50.0, "ctx": 50.0, "a": 3.0, "b": 3.0, "c": 3.0}

    def per_candidate(k: list[str]) -> float:
        return sum(lat[n] for n in k if n not in ("u", "ctx"))

    kept, decisions = select_fields(names, prob, "latency", 6, per_candidate, request=["u", "ctx"])
    assert kept == ["a", "c", "u", "ctx"] and [d["usage"] for d in decisions][:2] == [3.0, 6.0]
    # the same fields, every one charged per candidate: u and ctx compete and lose
    kept, _ = select_fields(names, prob, "latency", 6, lambda k: sum(lat[n] for n in k))
    assert kept == ["a", "c"]


def test_request_fields_errors():
    with pytest.raises(
        ValueError,
        match=r"flops budget 3 keeps no per-candidate field: the top one 'b' \(keep probability "
        r"0\.900\) with the request-side fields \['u'\] \(always kept\) needs 20",
    ):
        select_fields(["u", "a", "b"], [1.0, 0.1, 0.9], "flops", 3, lambda k: 10.0 * len(k), ["u"])
    with pytest.raises(ValueError, match=r"every field \['u', 'v'\] is request-side"):
        select_fields(["u", "v"], [0.5, 0.5], "fields", 1, request=["u", "v"])
    with pytest.raises(ValueError, match=r"request fields \['x'\] are not among the fields"):
        select_fields(["u", "v"], [0.5, 0.5], "fields", 1, request=["x"])


def test_amortized_complexity_by_hand():
    c = amortized_complexity([2.0, 1.5, 0.5], [True, False, True], 500)
    np.testing.assert_allclose(c, [2.0 / 500, 1.5, 0.5 / 500])
    np.testing.assert_allclose(complexity_alpha(c), c, rtol=1e-9)  # alpha_j = charged c_j
    with pytest.raises(ValueError, match="candidates_per_request must be >= 1, got 0"):
        amortized_complexity([1.0], [True], 0)
    with pytest.raises(ValueError, match="one flag per field"):
        amortized_complexity([1.0, 2.0], [True], 10)


def test_field_selection_layer_gates_and_penalty():
    layer = FieldSelection(["a", "b"], [2.0, 0.5], temperature=0.1, reg_weight=0.1, init_keep=0.8)
    x = [tf.ones([3, 2]), 2 * tf.ones([3, 1])]
    out = layer(x, training=False)
    np.testing.assert_allclose(out[0].numpy(), 0.8 * np.ones([3, 2]), rtol=1e-6)
    np.testing.assert_allclose(out[1].numpy(), 1.6 * np.ones([3, 1]), rtol=1e-6)
    assert not layer.losses
    out = layer(x, training=True)
    # one gate per row and field, shared by the field's columns
    g = out[0].numpy()
    np.testing.assert_allclose(g[:, 0], g[:, 1])
    assert ((g >= 0) & (g <= 1)).all()
    np.testing.assert_allclose(float(layer.losses[0]), 0.1 * (2.0 * 0.8 + 0.5 * 0.8), rtol=1e-6)
    clone = FieldSelection.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"field_names": []}, "at least one field"),
        ({"field_names": ["a", "a"], "alpha": [1, 1]}, "duplicates"),
        ({"alpha": [1.0]}, "2 fields but 1 alpha"),
        ({"alpha": [1.0, -1.0]}, "alpha values must be >= 0"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"init_keep": 1.0}, "init_keep"),
    ],
)
def test_field_selection_validates(kwargs, message):
    args = {"field_names": ["a", "b"], "alpha": [1.0, 1.0], **kwargs}
    with pytest.raises(ValueError, match=message):
        FieldSelection(**args)


def _tiny_models(tmp_path: Path, model_type: str = "dcn_v2"):
    paths = write_grouped(tmp_path / "data", rows=600)
    schema, stats = grouped_stats(paths)
    cfg = ModelConfig(type=model_type, embedding_dim=4, mlp=(8,), cross_layers=2)
    base = build_model(cfg, build_preprocessor(schema, stats), "label")
    alpha = {n: 1.0 for n in ["user", "item", "tags", "age", "price"]}
    stage1 = add_field_selection(base, alpha)
    batch = next(iter_batches(schema, list_parquet(paths["train"]), batch_size=16, shuffle=False))
    feats = {k: tf.constant(v) for k, v in batch.items()}
    stage1(feats)
    return paths, schema, stats, cfg, stage1, feats


def test_fscd_model_round_trips_config_and_saved_model(tmp_path):
    _, _, _, _, stage1, feats = _tiny_models(tmp_path)
    assert stage1.selection.field_names == ["user", "item", "tags", "age", "price"]
    clone = tf.keras.layers.deserialize(tf.keras.layers.serialize(stage1))
    assert isinstance(clone, FSCDRankingModel)
    clone(feats)
    clone.set_weights(stage1.get_weights())
    np.testing.assert_allclose(clone(feats).numpy(), stage1(feats).numpy(), rtol=1e-5)

    class Module(tf.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        @tf.function
        def f(self, features):
            return self.model(features, training=False)

    module = Module(stage1)
    expected = module.f(feats).numpy()
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.f(feats).numpy(), expected, rtol=1e-5)


def test_transfer_weights_restricts_the_input_axis(tmp_path):
    _, schema, stats, cfg, stage1, feats = _tiny_models(tmp_path)
    kept = ["item", "price"]
    sub = schema.select(kept)
    target = build_model(cfg, build_preprocessor(sub, stats), "label")
    target({k: v for k, v in feats.items() if k in kept})
    counts = transfer_weights(stage1, target)
    assert counts["sliced"] > 0
    src = input_slices(stage1)  # user 0:4, item 4:8, tags 8:12, age 12:16, price 16:17
    assert src["item"] == (4, 8) and src["price"] == (16, 17)
    index = [4, 5, 6, 7, 16]
    s_cross = stage1.interaction.get_weights()[0]  # first cross layer kernel [17, 17]
    t_cross = target.interaction.get_weights()[0]  # [5, 5]
    np.testing.assert_allclose(t_cross, s_cross[np.ix_(index, index)])
    s_tower = stage1.tower.get_weights()[0]  # [17, 8]
    np.testing.assert_allclose(target.tower.get_weights()[0], s_tower[index])
    np.testing.assert_allclose(
        target.embedding.layers_by_field["item"].get_weights()[0],
        stage1.embedding.layers_by_field["item"].get_weights()[0],
    )
    assert float(target.bias) == pytest.approx(float(stage1.bias))
