import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.dataset import make_dataset
from features.preprocessing import build_preprocessor
from features.schema import load_schema
from features.stats import compute_stats
from ranking import metrics
from ranking.models import ModelConfig, RankingModel, build_model


@pytest.fixture()
def setup(tiny_data):
    schema = load_schema(tiny_data["schema"])
    stats = compute_stats(schema, pq.read_table(tiny_data["train"]).to_batches())
    return schema, stats, tiny_data


def _train(model, schema, data, epochs=3):
    tf.keras.utils.set_random_seed(0)
    model.compile(optimizer=tf.keras.optimizers.Adam(0.02))
    ds = make_dataset(schema, data["train"], batch_size=256, shuffle=True)
    model.fit(ds, epochs=epochs, verbose=0)
    test = next(iter(make_dataset(schema, data["test"], batch_size=10_000)))
    return test, model.score(test).numpy()


@pytest.mark.parametrize("kind", ["lr", "fm", "dnn", "dcn_v2"])
def test_every_model_learns_the_planted_signal(setup, kind):
    schema, stats, data = setup
    model = build_model(
        ModelConfig(type=kind, embedding_dim=4, mlp=(16,), cross_layers=1),
        build_preprocessor(schema, stats),
        "label",
    )
    test, scores = _train(model, schema, data)
    # the signal (user < 10, item 3, tag c) gives AUC ~0.70; random is 0.5
    assert metrics.auc(test["label"], scores) > 0.64
    assert np.all((scores > 0) & (scores < 1))


def test_config_and_saved_model_round_trip(setup, tmp_path):
    schema, stats, data = setup
    model = build_model(
        ModelConfig(type="dcn_v2", embedding_dim=4, mlp=(8,), cross_layers=2, cross_rank=2),
        build_preprocessor(schema, stats),
        "label",
        initial_bias=-0.3,
    )
    test, scores = _train(model, schema, data, epochs=1)
    clone = RankingModel.from_config(model.get_config())
    clone(test)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone.score(test).numpy(), scores, rtol=1e-6, atol=1e-7)

    inputs = {k: v for k, v in test.items() if k != "label"}
    spec = {k: tf.TensorSpec([None], v.dtype, name=k) for k, v in inputs.items()}
    serve = tf.function(lambda f: {"score": model.score(f)}, input_signature=[spec])
    module = tf.Module()
    module.model = model
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": serve})
    loaded = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    np.testing.assert_allclose(loaded(**inputs)["score"].numpy(), scores, rtol=1e-6, atol=1e-7)


def test_unknown_embedding_method_field(setup):
    schema, stats, _ = setup
    with pytest.raises(ValueError, match="not categorical embedded fields"):
        build_model(
            ModelConfig(embedding_methods={"price": "full"}),
            build_preprocessor(schema, stats),
            "label",
        )


def test_wide_weight_penalty_is_in_the_model_losses(setup):
    schema, stats, data = setup
    with pytest.raises(ValueError, match="l2_wide must be >= 0"):
        ModelConfig(type="lr", l2_wide=-1.0)
    model = build_model(
        ModelConfig(type="lr", l2_wide=0.01, l1_wide=0.002),
        build_preprocessor(schema, stats),
        "label",
        initial_bias=0.7,
    )
    batch = next(iter(make_dataset(schema, data["train"], batch_size=64)))
    model(batch)
    rng = np.random.default_rng(0)
    for w in model.wide.trainable_weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    model(batch)
    wide = np.concatenate([w.numpy().ravel() for w in model.wide.trainable_weights])
    assert len(model.wide.trainable_weights) >= 2  # field tables and the numeric weights
    expected = 0.01 * np.sum(wide**2) + 0.002 * np.sum(np.abs(wide))
    assert len(model.losses) == 1  # the bias is not penalized, nothing else adds one
    np.testing.assert_allclose(model.losses[0].numpy(), expected, rtol=1e-5)
    clone = RankingModel.from_config(model.get_config())
    assert (clone.wide.l2, clone.wide.l1) == (0.01, 0.002)
    plain = build_model(ModelConfig(type="lr"), build_preprocessor(schema, stats), "label")
    plain(batch)
    assert not plain.losses


def test_full_tables_take_their_embedding_options(setup):
    schema, stats, data = setup
    config = ModelConfig(
        type="dnn", embedding_dim=4, mlp=(8,), embedding_options={"full": {"initializer": "ones"}}
    )
    model = build_model(config, build_preprocessor(schema, stats), "label")
    model(next(iter(make_dataset(schema, data["test"], batch_size=8))))
    tables = [w for w in model.embedding.weights if "table" in w.name]
    assert tables and all(np.all(w.numpy() == 1.0) for w in tables)


def test_embedding_option_names_are_the_layers_arguments():
    import inspect

    from embeddings.base import EmbeddingLayer
    from embeddings.collection import EMBEDDING_METHODS
    from ranking.config import EMBEDDING_OPTION_NAMES

    set_by_the_model = {"self", "num_rows", "dim", "combiner", "l2", "counts", "kwargs"}
    base = set(inspect.signature(EmbeddingLayer.__init__).parameters) - set_by_the_model
    for method, cls in EMBEDDING_METHODS.items():
        own = set(inspect.signature(cls.__init__).parameters) - set_by_the_model
        extra = {"codes"} if method == "bh" else set()
        assert set(EMBEDDING_OPTION_NAMES[method]) == own | base | extra, method


def test_deep_models_take_a_wide_term(setup):
    schema, stats, data = setup
    preprocessor = build_preprocessor(schema, stats)
    config = ModelConfig(type="dcn_v2", embedding_dim=4, mlp=(8,), cross_layers=1, wide=True)
    model = build_model(config, preprocessor, "label")
    test, scores = _train(model, schema, data, epochs=1)
    assert model.wide is not None and model.interaction is not None
    assert build_model(ModelConfig(type="dcn_v2"), preprocessor, "label").wide is None
    # the logit is the deep part plus the wide term
    ids, dense = model.preprocessor(test)
    deep = model.with_blocks(wide=None)(test, training=False)
    np.testing.assert_allclose(
        model(test, training=False), deep + model.wide(ids, dense), rtol=1e-5, atol=1e-6
    )
    assert float(tf.reduce_max(tf.abs(model.wide(ids, dense)))) > 0
    clone = RankingModel.from_config(model.get_config())
    clone(test)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone.score(test).numpy(), scores, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "options",
    [{"type": "lr"}, {"type": "fm"}, {"type": "dnn", "tasks": [{"name": "c", "label": "c"}]}],
)
def test_wide_is_refused_where_it_means_nothing(options):
    with pytest.raises(ValueError, match="wide = true adds a wide term"):
        ModelConfig(wide=True, **options)
