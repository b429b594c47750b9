"""The two-tower pre-ranking model: towers by schema group, precomputable item vectors, training,
config and SavedModel round trips."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from features.dataset import iter_batches, list_parquet
from pipelines.config import DataConfig, PipelineConfig
from pipelines.export import export_saved_model
from pipelines.preranking import build_run_two_tower, field_groups
from ranking.config import ModelConfig, PrerankConfig
from ranking.metrics import auc
from ranking.two_tower import TwoTowerModel, tower_fields
from tests.ranking.prerank_data import grouped_stats, write_grouped


@pytest.fixture()
def grouped(tmp_path):
    paths = write_grouped(tmp_path / "data", rows=3000)
    schema, stats = grouped_stats(paths)
    batch = next(iter_batches(schema, list_parquet(paths["test"]), batch_size=600, shuffle=False))
    return paths, schema, stats, {k: tf.constant(v) for k, v in batch.items()}


def _model(schema, stats, **prerank):
    cfg = PipelineConfig(
        output_dir="unused",
        data=DataConfig(schema="unused", train=("unused",)),
        model=ModelConfig(embedding_dim=4),
        preranking=PrerankConfig(
            method="two_tower", **{"tower_dim": 6, "tower_mlp": (8,), **prerank}
        ),
    )
    return build_run_two_tower(cfg, schema, stats)


def test_towers_read_their_groups(grouped):
    _, schema, stats, feats = grouped
    assert tower_fields(field_groups(schema)) == (["user", "age"], ["item", "tags", "price"])
    model = _model(schema, stats)
    assert model.user_tower.input_names == ["user", "age"]
    assert model.item_tower.input_names == ["item", "tags", "price"]
    logits = model(feats)
    assert logits.shape == [600]
    # the logit is the dot product of the two towers' vectors plus the bias
    u, v = model.user_vectors(feats), model.item_vectors(feats)
    assert u.shape == v.shape == [600, 6]
    np.testing.assert_allclose(
        logits.numpy(), (u.numpy() * v.numpy()).sum(1) + float(model.bias), rtol=1e-5, atol=1e-6
    )


def test_precomputed_item_vectors_score_like_the_model(grouped):
    _, schema, stats, feats = grouped
    model = _model(schema, stats)
    model(feats)
    items = {k: feats[k][:7] for k in ("item", "tags", "price")}
    request = {k: feats[k][:1] for k in ("user", "age")}
    vectors = model.item_vectors(items)  # computed once, ahead of requests
    got = model.score_candidates(model.user_vectors(request), vectors)
    tiled = {**{k: tf.repeat(v, 7) for k, v in request.items()}, **items}
    np.testing.assert_allclose(got.numpy(), model(tiled).numpy(), rtol=1e-5, atol=1e-6)


def test_a_field_without_group_is_a_clear_error(grouped):
    _, schema, stats, _ = grouped
    loose = schema.replace_field("tags", group=None)
    with pytest.raises(ValueError, match=r"\['tags'\] have no `group`"):
        tower_fields(field_groups(loose))
    only_items = schema
    for name in ("user", "age"):
        only_items = only_items.replace_field(name, group="item")
    with pytest.raises(ValueError, match="needs user/context fields and item fields"):
        _model(only_items, stats)


def test_trains_to_a_useful_auc(grouped):
    paths, schema, stats, feats = grouped
    tf.keras.utils.set_random_seed(0)
    model = _model(schema, stats)
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01))
    train = next(
        iter_batches(schema, list_parquet(paths["train"]), batch_size=10**6, shuffle=False)
    )
    ds = tf.data.Dataset.from_tensor_slices(train).shuffle(3000, seed=0).batch(128)
    model.fit(ds, epochs=4, verbose=0)
    # the tiny log's signal: users u0..u9 and item 3 click more (both towers must learn)
    assert auc(feats["label"].numpy(), model.score(feats).numpy()) > 0.62


def test_config_and_saved_model_round_trip(grouped, tmp_path):
    _, schema, stats, feats = grouped
    model = _model(schema, stats)
    expected = model.score(feats).numpy()
    clone = tf.keras.layers.deserialize(tf.keras.layers.serialize(model))
    assert isinstance(clone, TwoTowerModel)
    clone(feats)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone.score(feats).numpy(), expected, rtol=1e-5)
    out = export_saved_model(model, schema, tmp_path / "sm")
    loaded = tf.saved_model.load(str(out))
    inputs = {f.name: feats[f.name] for f in schema.model_inputs}
    got = loaded.signatures["serving_default"](**inputs)["score"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_prerank_config_validates():
    with pytest.raises(ValueError, match="budget 'bytes' is not one of"):
        PrerankConfig(budget="bytes")
    with pytest.raises(ValueError, match="whole budget_value"):
        PrerankConfig(budget="fields", budget_value=1.5)
    with pytest.raises(ValueError, match="budget_value must be > 0"):
        PrerankConfig(budget_value=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        PrerankConfig(temperature=0)
    assert dataclasses.replace(PrerankConfig(), mlp=[4]).mlp == (4,)
