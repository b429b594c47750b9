"""Pair-statistics layers: PCF-GNN from cached node vectors and the explicit table, checked by
hand; config and SavedModel round trips; the dense-block hook of the ranking models."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest
import tensorflow as tf

from ranking.config import ModelConfig
from ranking.models import RankingModel, build_model
from ranking.pair_stats import PairStatsGNN, PairStatsTable, pair_keys
from tests.keras_tracking import tracked_leaves

PRIOR = 0.25


def _artifact(dim: int = 3) -> SimpleNamespace:
    """A hand-made artifact: user {a, b}, item {1, 2, 3}, tag {x, y}; head = one linear layer."""
    rng = np.random.default_rng(0)
    vocab = {"user": ["a", "b"], "item": ["1", "2", "3"], "tag": ["x", "y"]}
    n = sum(len(v) + 1 for v in vocab.values())
    return SimpleNamespace(
        fields=["user", "item", "tag"],
        vocab=vocab,
        multi={"tag": "|"},
        pairs=[("user", "item"), ("user", "tag")],
        nodes=rng.normal(size=(n, dim)).astype(np.float32),
        relations=rng.normal(size=(2, 2)).astype(np.float32),
        head=[
            (rng.normal(size=(3 * dim + 2, 4)).astype(np.float32), np.zeros(4, np.float32)),
            (rng.normal(size=(4, 1)).astype(np.float32), np.full(1, -0.5, np.float32)),
        ],
        prior=PRIOR,
        offsets={"user": 0, "item": 3, "tag": 7},
    )


def _expected(art: SimpleNamespace, r: int, gu: int, gv: int) -> float:
    hu, hv = art.nodes[gu].astype(np.float64), art.nodes[gv].astype(np.float64)
    x = np.concatenate([hu, hv, hu * hv, art.relations[r]])
    x = np.maximum(x @ art.head[0][0] + art.head[0][1], 0) @ art.head[1][0] + art.head[1][1]
    return float(1 / (1 + np.exp(-x[0])))


FEATURES = {
    "user": tf.constant(["a", "b", "zz", "", "a"]),
    "item": tf.constant([2, 3, 1, 1, -1], tf.int64),
    "tag": tf.constant(["x|y", "y", "x", "x", ""]),
}


def test_gnn_layer_by_hand() -> None:
    art = _artifact()
    layer = PairStatsGNN.from_artifact(art, output="ctr")
    out = layer(FEATURES).numpy()
    assert out.shape == (5, 2) and layer.output_dim == 2
    # global node ids: user a=1, b=2, OOV=0; item "1"=4 "2"=5 "3"=6; tag x=8, y=9
    assert out[0, 0] == pytest.approx(_expected(art, 0, 1, 5), rel=1e-5)
    assert out[1, 0] == pytest.approx(_expected(art, 0, 2, 6), rel=1e-5)
    assert out[2, 0] == pytest.approx(_expected(art, 0, 0, 4), rel=1e-5)  # unseen user: OOV node
    assert out[3, 0] == pytest.approx(PRIOR) and out[4, 0] == pytest.approx(PRIOR)  # missing side
    mean = (_expected(art, 1, 1, 8) + _expected(art, 1, 1, 9)) / 2  # multi-valued: mean
    assert out[0, 1] == pytest.approx(mean, rel=1e-5)
    assert out[4, 1] == pytest.approx(PRIOR)  # empty tag cell
    logits = PairStatsGNN.from_artifact(art)(FEATURES).numpy()
    np.testing.assert_allclose(logits, np.log(out / (1 - out)), rtol=1e-4)
    # a pair given in the other order uses the same relation
    swapped = PairStatsGNN.from_artifact(art, pairs=[("tag", "user")], output="ctr")
    np.testing.assert_allclose(swapped(FEATURES).numpy()[:, 0], out[:, 1], rtol=1e-6)
    with pytest.raises(ValueError, match="not in the artifact"):
        PairStatsGNN.from_artifact(art, pairs=[("item", "tag")])


def test_gnn_vocabularies_are_not_tracked_by_keras() -> None:
    """Keras walked every tracked node value on each ``trainable_variables`` call."""
    art = _artifact()
    layer = PairStatsGNN.from_artifact(art)
    layer(FEATURES)
    words = {v for vals in art.vocab.values() for v in vals}
    assert not words & {x for x in tracked_leaves(layer) if isinstance(x, str)}
    assert layer.get_config()["vocabularies"] == {f: art.vocab[f] for f in layer.fields}


def _table(output: str = "ctr") -> PairStatsTable:
    return PairStatsTable.from_pairs(
        [("user", "item"), ("user", "tag")],
        [
            (["a", "b"], ["2", "1"], np.array([0.9, 0.1])),
            (["a", "a", "b"], ["x", "y", "y"], np.array([0.6, 0.2, 0.7])),
        ],
        prior=PRIOR,
        separators={"tag": "|"},
        output=output,
    )


def test_table_layer_by_hand() -> None:
    layer = _table()
    out = layer(FEATURES).numpy()
    np.testing.assert_allclose(out[:, 0], [0.9, PRIOR, PRIOR, PRIOR, PRIOR], rtol=1e-6)
    np.testing.assert_allclose(out[:, 1], [0.4, 0.7, PRIOR, PRIOR, PRIOR], rtol=1e-6)
    assert layer.memory_bytes() == {"parameters": 60, "vocabulary": 0, "total": 60}
    keys = pair_keys(0, ["a"], ["2"])
    assert keys.dtype == np.int64 and keys[0] in layer.keys.numpy()
    assert pair_keys(1, ["a"], ["2"])[0] != keys[0]  # the relation is part of the key
    empty = PairStatsTable.from_pairs([("user", "item")], [([], [], np.zeros(0))], PRIOR)
    np.testing.assert_allclose(empty(FEATURES).numpy()[:, 0], np.log(PRIOR / (1 - PRIOR)))


def test_validation() -> None:
    art = _artifact()
    with pytest.raises(ValueError, match="at most one side may be multi-valued"):
        PairStatsTable([("tag", "genre")], 0, PRIOR, {"tag": "|", "genre": "|"})
    with pytest.raises(ValueError, match="output 'prob'"):
        PairStatsTable([("user", "item")], 0, PRIOR, output="prob")
    with pytest.raises(ValueError, match="prior must be a click rate"):
        PairStatsTable([("user", "item")], 0, 1.5)
    with pytest.raises(ValueError, match="two different field names"):
        PairStatsTable([("user", "user")], 0, PRIOR)
    with pytest.raises(ValueError, match="must be finite, in"):
        PairStatsTable.from_pairs([("user", "item")], [(["a"], ["1"], np.array([np.nan]))], PRIOR)
    with pytest.raises(ValueError, match="duplicate pair"):
        PairStatsTable.from_pairs(
            [("user", "item")], [(["a", "a"], ["1", "1"], np.array([0.1, 0.2]))], PRIOR
        )
    with pytest.raises(ValueError, match="'item' of the pairs has no node vocabulary"):
        PairStatsGNN([("user", "item")], {"user": ["a"]}, 3, 2, [1], PRIOR)
    with pytest.raises(ValueError, match="head_units must be positive and end with 1"):
        PairStatsGNN([("user", "item")], art.vocab, 3, 2, [4], PRIOR)
    layer = PairStatsGNN.from_artifact(art)
    with pytest.raises(ValueError, match="node table shape"):
        layer.set_pretrained(art.nodes[:3], art.relations, art.head)


class _Module(tf.Module):
    def __init__(self, layer: tf.keras.layers.Layer):
        super().__init__()
        self.layer = layer

    @tf.function(
        input_signature=[
            {
                "user": tf.TensorSpec([None], tf.string),
                "item": tf.TensorSpec([None], tf.int64),
                "tag": tf.TensorSpec([None], tf.string),
            }
        ]
    )
    def f(self, features):
        return self.layer(features)


@pytest.mark.parametrize("kind", ["gnn", "table"])
def test_config_and_saved_model_round_trip(kind: str, tmp_path: Path) -> None:
    layer = PairStatsGNN.from_artifact(_artifact()) if kind == "gnn" else _table("logit")
    before = layer(FEATURES).numpy()
    clone = type(layer).from_config(layer.get_config())
    clone(FEATURES)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(FEATURES).numpy(), before, rtol=1e-6)
    assert clone.get_config() == layer.get_config()
    tf.saved_model.save(_Module(layer), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.f(FEATURES).numpy(), before, rtol=1e-6)


class _Pre(tf.keras.layers.Layer):
    """A minimal preprocessor: user -> id (a=1, b=2, else 0), no dense features."""

    embedded_fields: ClassVar[dict[str, int]] = {"user": 3}
    categorical_fields: ClassVar[list[str]] = ["user"]
    dense_fields: ClassVar[list[str]] = []

    def call(self, features):
        x = features["user"]
        ids = tf.where(tf.equal(x, "a"), 1, tf.where(tf.equal(x, "b"), 2, 0))
        return {"user": tf.cast(ids, tf.int64)}, None


@pytest.mark.parametrize("model_type", ["lr", "dnn", "dcn_v2"])
def test_models_take_dense_blocks(model_type: str) -> None:
    tf.keras.utils.register_keras_serializable(package="test_pair_stats")(_Pre)
    block = _table("logit")
    cfg = ModelConfig(type=model_type, embedding_dim=2, mlp=(4,))
    model = build_model(cfg, _Pre(), "label", dense_blocks=[block])
    logits = model(FEATURES).numpy()
    assert logits.shape == (5,)
    # the block feeds the model: other statistics, other logits
    if model_type == "lr":
        model.wide._dense.kernel.assign(np.ones((2, 1), np.float32))
        logits = model(FEATURES).numpy()
    block.values.assign(block.values.numpy() * 0.5)
    assert np.abs(model(FEATURES).numpy() - logits).max() > 1e-4
    config = model.get_config()
    assert len(config["dense_blocks"]) == 1
    clone = RankingModel.from_config(config)
    clone(FEATURES)
    assert type(clone.dense_blocks[0]) is PairStatsTable
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(FEATURES).numpy(), model(FEATURES).numpy(), rtol=1e-5)
