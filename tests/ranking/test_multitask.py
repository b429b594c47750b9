import itertools
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.dataset import make_dataset
from features.preprocessing import build_preprocessor
from features.schema import load_schema
from features.stats import compute_stats
from pipelines.run.model import load_trained_model, save_model, warm_start
from pipelines.run.step import make_train_step
from ranking.blocks import MLP, ConcatInteraction, CrossInteraction, FMInteraction
from ranking.config import ModelConfig, TaskConfig
from ranking.models import build_model
from ranking.multitask import MultiTaskModel, ctcvr_logit, initial_biases
from ranking.multitask_heads import (
    EXPERT_FACTORIES,
    PLE,
    MMoE,
    TaskTowers,
    expert_factory,
    register_expert_layer,
)
from tests.testdata import write_tiny_dataset

TASKS = (TaskConfig("click", "label"), TaskConfig("buy", "buy", weight=0.5, defined_on="click"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Schema, stats and four batches of 250 rows with a planted conversion label ``buy``:
    a click on an item below 10 converts."""
    data = write_tiny_dataset(tmp_path_factory.mktemp("tiny"), rows=1200, train_rows=1000)
    schema = load_schema(data["schema"])
    stats = compute_stats(schema, pq.read_table(data["train"]).to_batches())
    batches = []
    for b in itertools.islice(make_dataset(schema, data["train"], batch_size=250), 4):
        b = dict(b)
        b["buy"] = tf.constant(b["label"].numpy() * (b["item"].numpy() < 10), tf.float32)
        batches.append(b)
    return schema, stats, batches


def _model(tiny, kind, type_="dnn", **options):
    schema, stats, batches = tiny
    tf.keras.utils.set_random_seed(0)
    config = ModelConfig(
        type=type_,
        embedding_dim=4,
        cross_layers=1,
        expert_mlp=(8,),
        tower_mlp=(4,),
        num_experts=2,
        tasks=TASKS,
        multitask=kind,
        **options,
    )
    model = build_model(config, build_preprocessor(schema, stats), "label")
    model(batches[0])
    return model


def _optimizer(model, rate=0.05):
    opt = tf.keras.optimizers.Adam(rate)
    opt.build(model.trainable_variables)
    return opt


@pytest.mark.parametrize(
    "kind,type_,options",
    [
        ("shared_bottom", "dnn", {}),
        ("mmoe", "dcn_v2", {}),
        ("ple", "fm", {"ple_levels": 2}),
        ("esmm", "dnn", {}),
    ],
)
def test_each_head_trains_with_the_step(tiny, kind, type_, options):
    model = _model(tiny, kind, type_, **options)
    assert isinstance(model, MultiTaskModel) and model.task_names == ["click", "buy"]
    batches = tiny[2]
    auc = tf.keras.metrics.AUC()
    step = make_train_step(model, _optimizer(model), auc_metric=auc)
    losses = [float(step(b)) for _ in range(5) for b in batches]
    assert np.mean(losses[-4:]) < 0.85 * np.mean(losses[:4])
    logits = model(batches[0]).numpy()
    assert logits.shape == (250, 2) and np.all(np.isfinite(logits))
    assert 0.5 < auc.result().numpy() <= 1.0  # the primary task's AUC


def test_ctcvr_logit_is_the_logit_of_the_product():
    grid = np.array([-12.0, -3.0, -0.5, 0.0, 0.7, 4.0, 15.0])
    a, b = (x.ravel() for x in np.meshgrid(grid, grid))
    p = 1 / (1 + np.exp(-a)) / (1 + np.exp(-b))
    got = ctcvr_logit(tf.constant(a, tf.float32), tf.constant(b, tf.float32)).numpy()
    np.testing.assert_allclose(got, np.log(p / (1 - p)), rtol=1e-6, atol=1e-6)
    # extremes, by hand: p = (1 - e^-200)^2 -> 200 - ln 2; p = e^-400 -> -400; p ~ e^-200
    extreme_a = tf.constant([200.0, -200.0, 200.0, -200.0, 1e4])
    extreme_b = tf.constant([200.0, -200.0, -200.0, 200.0, 1e4])
    with tf.GradientTape() as tape:
        tape.watch(extreme_a)
        out = ctcvr_logit(extreme_a, extreme_b)
    want = [200 - math.log(2), -400.0, -200.0, -200.0, 1e4 - math.log(2)]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    assert np.all(np.isfinite(tape.gradient(out, extreme_a).numpy()))


def _bce(y, x):
    return max(x, 0) - x * y + math.log1p(math.exp(-abs(x)))


def test_defined_on_counts_the_child_loss_on_parent_rows_only(tiny):
    labels = tf.constant([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    logits = tf.constant([[0.5, 2.0], [-1.0, 0.3], [0.2, 5.0], [1.0, -3.0]])
    rows = labels.numpy().tolist(), logits.numpy().tolist()
    click = np.mean([_bce(y[0], x[0]) for y, x in zip(*rows, strict=True)])
    buy_on_clicks = np.mean([_bce(1, 2.0), _bce(0, 0.3)])
    buy_all_rows = np.mean([_bce(y[1], x[1]) for y, x in zip(*rows, strict=True)])
    shared = _model(tiny, "shared_bottom")
    assert float(shared.task_loss(labels, logits)) == pytest.approx(
        click + 0.5 * buy_on_clicks, rel=1e-6
    )
    esmm = _model(tiny, "esmm")  # pCTCVR: every row
    assert float(esmm.task_loss(labels, logits)) == pytest.approx(
        click + 0.5 * buy_all_rows, rel=1e-6
    )
    no_clicks = tf.constant([[0.0, 0.0], [0.0, 0.0]])
    assert float(shared.task_loss(no_clicks, logits[:2])) == pytest.approx(
        np.mean([_bce(0, 0.5), _bce(0, -1.0)]), rel=1e-6
    )


def test_esmm_conditional_logits_and_the_ctcvr_column(tiny):
    model = _model(tiny, "esmm")
    features = tiny[2][0]
    cvr = model.conditional_logits(features)
    towers = model.tower_logits(features, training=False)
    out = model(features, training=False)
    np.testing.assert_allclose(cvr.numpy(), towers[:, 1].numpy())
    np.testing.assert_allclose(out[:, 0].numpy(), towers[:, 0].numpy())
    np.testing.assert_allclose(out[:, 1].numpy(), ctcvr_logit(towers[:, 0], cvr).numpy())
    with pytest.raises(ValueError, match="conditional_logits is ESMM's pCVR"):
        _model(tiny, "mmoe").conditional_logits(features)


def test_mmoe_gates_sum_to_one_and_ple_has_two_levels():
    z = tf.random.stateless_normal([5, 6], seed=[1, 2])
    mmoe = MMoE(num_tasks=3, num_experts=4, expert_units=[8])
    assert mmoe(z).shape == (5, 3, 8)
    gates = mmoe.gate_weights(z).numpy()
    assert gates.shape == (5, 3, 4)
    np.testing.assert_allclose(gates.sum(axis=-1), 1.0, rtol=1e-6)
    ple = PLE(num_tasks=2, task_experts=2, shared_experts=1, levels=2, expert_units=[8, 4])
    assert ple(z).shape == (5, 2, 4)
    # level 0: a shared gate over all 2 * 2 + 1 experts; task gates over own 2 + 1 shared,
    # level 1 reads level 0's 4-wide outputs
    assert [g.kernel.shape.as_list() for g in ple._shared_gates] == [[6, 5]]
    assert [g.kernel.shape.as_list() for g in ple._task_gates] == [[6, 3], [6, 3], [4, 3], [4, 3]]
    assert len(ple._task_experts) == 8 and len(ple._shared) == 2


def test_expert_layer_hook():
    with pytest.raises(ValueError, match="expert_layer 'nope' has no layer"):
        expert_factory("nope")
    made = []

    def deep(units, dropout=0.0, name=None, depth=1):
        made.append(depth)
        return MLP(list(units) * depth, dropout=dropout, name=name)

    register_expert_layer("deep_test", deep)
    try:
        head = MMoE(2, 2, [4], expert_layer="deep_test", expert_options={"depth": 2})
        assert head(tf.ones([3, 5])).shape == (3, 2, 4) and made == [2, 2]
        assert MMoE.from_config(head.get_config()).expert_options == {"depth": 2}
    finally:
        EXPERT_FACTORIES.pop("deep_test")
    with pytest.raises(ValueError, match="expert_layer 'mlp' takes no options"):
        MMoE(2, 2, [4], expert_options={"depth": 2})


@pytest.mark.parametrize("kind", ["shared_bottom", "mmoe", "ple", "esmm"])
def test_config_and_saved_model_round_trip(tiny, kind, tmp_path):
    model = _model(tiny, kind, "dcn_v2" if kind == "ple" else "dnn")
    features = tiny[2][0]
    want = model(features).numpy()
    clone = MultiTaskModel.from_config(model.get_config())
    clone(features)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(features).numpy(), want, rtol=1e-6, atol=1e-6)
    assert clone.tasks == TASKS and clone.kind == kind

    inputs = {k: v for k, v in features.items() if k not in ("label", "buy")}
    spec = {k: tf.TensorSpec([None], v.dtype, name=k) for k, v in inputs.items()}
    serve = tf.function(lambda f: {"logits": model(f, training=False)}, input_signature=[spec])
    module = tf.Module()
    module.model = model
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": serve})
    loaded = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    np.testing.assert_allclose(loaded(**inputs)["logits"].numpy(), want, rtol=1e-6, atol=1e-6)


def test_task_towers_round_trip_and_initial_biases():
    biases = initial_biases(TASKS, {"label": 0.2, "buy": 0.05})
    assert biases == pytest.approx([math.log(0.2 / 0.8), math.log(0.25 / 0.75)])
    towers = TaskTowers(2, [3], initial_biases=biases)
    x = tf.zeros([2, 2, 5])
    np.testing.assert_allclose(towers(x).numpy(), [biases, biases], rtol=1e-6)
    assert TaskTowers.from_config(towers.get_config()).initial_biases == biases
    with pytest.raises(ValueError, match="initial_biases: expected 2 values"):
        TaskTowers(2, initial_biases=[0.0])


def test_build_model_picks_the_interaction_of_the_type(tiny):
    schema, stats, _ = tiny
    pre = build_preprocessor(schema, stats)
    for type_, cls in (("dnn", ConcatInteraction), ("dcn_v2", CrossInteraction)):
        model = build_model(ModelConfig(type=type_, tasks=TASKS), pre, "label")
        assert isinstance(model.interaction, cls)
    fm = build_model(ModelConfig(type="fm", tasks=TASKS, multitask="mmoe"), pre, "label")
    assert isinstance(fm.interaction, FMInteraction) and isinstance(fm.head, MMoE)


def test_single_task_models_have_the_uniform_api(tiny):
    schema, stats, batches = tiny
    model = build_model(
        ModelConfig(type="dnn", mlp=(4,)), build_preprocessor(schema, stats), "label"
    )
    assert model.task_names == ["label"]
    assert model.labels_of(batches[0]) is batches[0]["label"]
    x = tf.constant([1.0, 2.0])
    assert model.primary(x) is x
    np.testing.assert_array_equal(model.primary(tf.constant([[1.0, 9.0], [2.0, 9.0]])), [1, 2])


def test_the_mirrored_step_matches_the_one_process_step(tiny):
    batches = tiny[2]
    model = _model(tiny, "mmoe")
    start = model.get_weights()
    one = [float(s) for s in map(make_train_step(model, _optimizer(model, 0.01)), batches[:2])]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = _model(tiny, "mmoe")
        mirrored.set_weights(start)
        step = make_train_step(mirrored, _optimizer(mirrored, 0.01), strategy)
    rows = tf.constant(250, tf.int64)  # one replica: its rows are the global batch
    got = [float(step((b, rows))) for b in batches[:2]]
    np.testing.assert_allclose(got, one, rtol=1e-5)


def test_a_saved_run_model_restores_and_warm_starts(tiny, tmp_path):
    model = _model(tiny, "mmoe")
    features = tiny[2][0]
    model.set_weights([w + 0.1 for w in model.get_weights()])  # away from the initial ones
    want = model(features).numpy()
    save_model(model, tiny[0], tmp_path / "run")
    restored, _, _ = load_trained_model(tmp_path / "run")  # model.json + checkpoint
    np.testing.assert_allclose(restored(features).numpy(), want, rtol=1e-6, atol=1e-6)
    fresh = _model(tiny, "mmoe")
    warm_start(fresh, str(tmp_path / "run"), lambda _: None)
    np.testing.assert_allclose(fresh(features).numpy(), want, rtol=1e-6, atol=1e-6)
    single = build_model(ModelConfig(type="dnn", mlp=(4,)), fresh.preprocessor, "label")
    single(features)
    with pytest.raises(ValueError, match="one model is multi-task"):
        warm_start(single, str(tmp_path / "run"), lambda _: None)
