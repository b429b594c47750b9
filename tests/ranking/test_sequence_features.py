"""Behaviour sequences inside ranking models: the groups of a schema's sequences, the
``SequencePooling`` layer (by hand, config and SavedModel round-trips), ``extend`` on the three
``Embedded`` forms, and RankingModels with sequences built by ``build_model``: they train, their
round-trips give the same scores, and only a model that pools reads the history."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from embeddings.forms import Embedded
from features.preprocessing import build_preprocessor
from features.readers import read_batches
from features.schema import load_schema
from features.stats import compute_stats
from ranking.config import ModelConfig
from ranking.models import RankingModel, build_model
from ranking.sequence_features import SequencePooling, extend, history_inputs, sequence_groups
from tests.features.test_sequences import SCHEMA

# the shared sequence `hist` (item's table), `hist_cat` aligned with it (its own table) and
# `query`, an unshared sequence of its own
SCHEMA3 = (
    SCHEMA
    + """
[[fields]]
name = "query"
kind = "sequence"
max_len = 2
"""
)
HEADER = "click,buy,item,hist,hist_cat,query"
ROWS = [
    "1,1,i1,i2|i1,c2|c1,q1|q2|q3",
    "1,0,i2,i1|i2|i3|i1|i2,c1|c2|c3|c1|c2,q2",
    "0,,i3,,,",
    "0,0,i1,i3,c3,q1|q1",
]
FEATURES = {
    "item": ["i1", "i2", "i3", "zz", "i2", "i1"],
    "hist": ["i2|i1", "i1|i2|i3|i1|i2", "", "i3|zz", "i3", "i2|i2"],
    "hist_cat": ["c2|c1", "c1|c2|c3|c1|c2", "", "c3|c9", "c3", "c2|c2"],
    "query": ["q1|q2", "q2", "", "q3|q1|q2", "q1", ""],
}
LABELS = {"click": [1.0, 1.0, 0.0, 0.0, 1.0, 0.0], "buy": [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]}


def _constants(values: dict[str, list]) -> dict[str, tf.Tensor]:
    return {k: tf.constant(v) for k, v in values.items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("seqf")
    (root / "seq.toml").write_text(SCHEMA3)
    (root / "d.csv").write_text("\n".join([HEADER, *ROWS]) + "\n")
    schema = load_schema(root / "seq.toml")
    return schema, compute_stats(schema, read_batches(schema, root / "d.csv"))


def test_sequence_groups_by_hand(setup) -> None:
    pre = build_preprocessor(*setup)
    assert pre.sequence_fields["query"] == {
        "table": "query",
        "max_len": 2,
        "aligned_with": None,
        "num_rows": 4,  # q1, q2, q3 and the OOV row
    }
    groups = sequence_groups(pre.sequence_fields, {"item": 4, "hist_cat": 3, "query": 2}, ["item"])
    assert groups == [
        {
            "name": "hist",
            "members": ["hist", "hist_cat"],
            "tables": ["item", "hist_cat"],
            "dims": [4, 3],
            "max_len": 3,
            "targets": ["item", None],  # hist_cat's table is no model input
        },
        {
            "name": "query",
            "members": ["query"],
            "tables": ["query"],
            "dims": [2],
            "max_len": 2,
            "targets": [None],
        },
    ]


GROUPS = [
    {
        "name": "hist",
        "members": ["hist", "hist_cat"],
        "tables": ["item", "hist_cat"],
        "dims": [3, 2],
        "max_len": 3,
        "targets": ["item", None],
    },
    {
        "name": "query",
        "members": ["query"],
        "tables": ["query"],
        "dims": [2],
        "max_len": 2,
        "targets": [None],
    },
]


def _pooling_inputs() -> tuple[dict, dict, dict]:
    rng = np.random.default_rng(0)
    histories = {
        "hist": tf.constant(rng.normal(size=(2, 3, 3)), tf.float32),
        "hist_cat": tf.constant(rng.normal(size=(2, 3, 2)), tf.float32),
        "query": tf.constant(rng.normal(size=(2, 2, 2)), tf.float32),
    }
    masks = {
        "hist": tf.constant([[True, True, False], [False, False, False]]),
        "query": tf.constant([[True, False], [True, True]]),
    }
    targets = {"hist": tf.constant(rng.normal(size=(2, 3)), tf.float32)}
    return histories, masks, targets


def test_mean_pooling_by_hand() -> None:
    histories, masks, targets = _pooling_inputs()
    out = SequencePooling(GROUPS, "mean")(histories, masks, targets)
    assert list(out) == ["hist", "hist_cat", "query"]
    h = {k: v.numpy() for k, v in histories.items()}
    np.testing.assert_allclose(out["hist"][0], h["hist"][0, :2].mean(0), rtol=1e-6)
    np.testing.assert_allclose(out["hist_cat"][0], h["hist_cat"][0, :2].mean(0), rtol=1e-6)
    np.testing.assert_allclose(out["hist"][1], np.zeros(3))  # an empty history
    np.testing.assert_allclose(out["query"][0], h["query"][0, 0], rtol=1e-6)
    np.testing.assert_allclose(out["query"][1], h["query"][1].mean(0), rtol=1e-6)


def test_pooling_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="pooling must be one of"):
        SequencePooling(GROUPS, "max")
    with pytest.raises(ValueError, match="at least one sequence group"):
        SequencePooling([], "din")


@pytest.mark.parametrize("pooling", ["din", "bst"])
def test_pooling_config_and_saved_model_round_trip(pooling: str, tmp_path: Path) -> None:
    histories, masks, targets = _pooling_inputs()
    options = {"hidden": [4]} if pooling == "din" else {"num_heads": 1}
    layer = SequencePooling(GROUPS, pooling, options)
    want = {k: v.numpy() for k, v in layer(histories, masks, targets).items()}
    clone = SequencePooling.from_config(layer.get_config())
    assert clone.groups == GROUPS and clone.options == options
    clone(histories, masks, targets)
    clone.set_weights(layer.get_weights())
    for k, v in clone(histories, masks, targets).items():
        np.testing.assert_allclose(v.numpy(), want[k], rtol=1e-6, atol=1e-6)

    spec = (
        {k: tf.TensorSpec([None, *v.shape[1:]], tf.float32) for k, v in histories.items()},
        {k: tf.TensorSpec([None, v.shape[1]], tf.bool) for k, v in masks.items()},
        {"hist": tf.TensorSpec([None, 3], tf.float32)},
    )
    module = tf.Module()
    module.layer = layer
    module.serve = tf.function(lambda h, m, t: layer(h, m, t), input_signature=spec)
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))  # held: its variables live with it
    out = loaded.serve(histories, masks, targets)
    for k, v in out.items():
        np.testing.assert_allclose(v.numpy(), want[k], rtol=1e-6, atol=1e-6)


EXTRA = {"h": tf.constant([[1.0, 2.0], [3.0, 4.0]]), "q": tf.constant([[5.0, 6.0], [7.0, 8.0]])}


def test_extend_the_three_forms() -> None:
    a, b = tf.constant([[0.1, 0.2], [0.3, 0.4]]), tf.constant([[0.5, 0.6], [0.7, 0.8]])
    # per-field vectors: the extra fields after the embedded ones
    fields = extend(Embedded(vectors={"a": a, "b": b}), EXTRA)
    assert list(fields.fields()) == ["a", "b", "h", "q"]
    np.testing.assert_array_equal(fields.fields()["q"].numpy(), EXTRA["q"].numpy())
    want = np.concatenate([a, b, EXTRA["h"], EXTRA["q"]], axis=1)
    # a concat block [batch, D] gets the vectors side by side after it
    concat = extend(Embedded(block=tf.concat([a, b], axis=1)), EXTRA)
    assert concat.block.shape == (2, 8)
    np.testing.assert_array_equal(concat.block.numpy(), want)
    # a stacked block [batch, F, d] gets them stacked after its fields
    stacked = extend(Embedded(block=tf.stack([a, b], axis=1)), EXTRA)
    assert stacked.block.shape == (2, 4, 2)
    np.testing.assert_array_equal(stacked.block.numpy()[:, 2], EXTRA["h"].numpy())
    np.testing.assert_array_equal(stacked.block.numpy()[:, 3], EXTRA["q"].numpy())
    np.testing.assert_array_equal(stacked.concat().numpy(), want)
    # nothing to add: the same object
    same = Embedded(block=a)
    assert extend(same, {}) is same


def _model(setup, type_: str, pooling: str) -> RankingModel:
    tf.keras.utils.set_random_seed(0)
    options = {"din": {"hidden": [4]}, "bst": {"num_heads": 1}}.get(pooling, {})
    config = ModelConfig(
        type=type_,
        embedding_dim=4,
        mlp=(8,),
        cross_layers=1,
        sequence_pooling=pooling,
        sequence_options=options,
    )
    model = build_model(config, build_preprocessor(*setup), "click")
    model(_constants(FEATURES))
    return model


@pytest.mark.parametrize(("type_", "pooling"), [("dnn", "din"), ("dcn_v2", "mean"), ("fm", "bst")])
def test_models_with_sequences_train_and_round_trip(setup, type_, pooling, tmp_path) -> None:
    model = _model(setup, type_, pooling)
    assert model.sequences.output_fields == ["hist", "hist_cat", "query"]
    batch = _constants({**FEATURES, **LABELS})
    opt = tf.keras.optimizers.Adam(0.01)
    losses = []
    for _ in range(4):  # eager steps: no trace to build for four steps
        with tf.GradientTape() as tape:
            loss = model.compute_loss(batch, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        losses.append(float(loss))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]

    features = _constants(FEATURES)
    want = model(features, training=False).numpy()
    clone = type(model).from_config(model.get_config())
    clone(features)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(features, training=False).numpy(), want, atol=1e-6)

    spec = {k: tf.TensorSpec([None], tf.string, name=k) for k in FEATURES}
    module = tf.Module()
    # the signature's variables and vocabulary tables, without tracing every Keras layer
    module.weights, module.preprocessor = list(model.variables), model.preprocessor
    serve = tf.function(lambda f: {"logit": model(f, training=False)}, input_signature=[spec])
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": serve})
    loaded = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    np.testing.assert_allclose(loaded(**features)["logit"].numpy(), want, atol=1e-6)


@pytest.mark.parametrize(("pooling", "reads"), [("none", False), ("din", True), ("mean", True)])
def test_only_a_pooling_model_reads_the_history(setup, pooling, reads) -> None:
    model = _model(setup, "dnn", pooling)
    features = _constants(FEATURES)
    other = {
        **FEATURES,
        "hist": ["i3|i3|i3", "i3", "i1|i2", "i1", "i1|i2|i3", "i3"],
        "query": ["q3", "q1|q1", "q2", "", "q3|q3", "q1"],
    }
    assert (model.sequences is None) == (pooling == "none")
    a = model(features, training=False).numpy()
    b = model(_constants(other), training=False).numpy()
    assert not np.allclose(a, b, atol=1e-6) if reads else np.array_equal(a, b)
    # the candidate's own fields still count either way
    c = model(_constants({**FEATURES, "item": ["i3", "i1", "i2", "i2", "i1", "i3"]})).numpy()
    assert not np.allclose(a, c, atol=1e-6)


def test_history_inputs_mask_positions_every_member_has() -> None:
    """A served request whose side sequence is shorter than its main sequence is pooled over
    the positions both have (the reader refuses such rows in training data)."""
    table = tf.keras.layers.Embedding(5, 2, embeddings_initializer="ones")
    side = tf.keras.layers.Embedding(4, 2, embeddings_initializer="zeros")
    groups = [dict(GROUPS[0], dims=[2, 2])]  # hist (item's table) and hist_cat, max_len 3
    ids = {
        "item": tf.constant([1, 2], tf.int64),
        "hist": tf.ragged.constant([[1, 2, 3], [4]], tf.int64),
        "hist_cat": tf.ragged.constant([[1], [2, 3]], tf.int64),
    }
    histories, masks, targets = history_inputs(ids, groups, {"item": table, "hist_cat": side})
    assert masks["hist"].numpy().tolist() == [[True, False, False], [True, False, False]]
    assert histories["hist"].shape == (2, 3, 2) and histories["hist_cat"].shape == (2, 3, 2)
    assert sorted(targets) == ["hist"] and targets["hist"].shape == (2, 2)
