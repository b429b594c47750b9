"""The mixture-of-experts layer: routing, capacity drops, prototyping, loss, counters, export."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import math
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from ranking.moe import MoELayer, expert_capacity, route

LN3 = math.log(3.0)


def _layer(x: np.ndarray, gate: np.ndarray | None = None, **options) -> MoELayer:
    """A built layer, its router kernel set to ``gate`` when given."""
    layer = MoELayer(**{"units": (3,), **options})
    layer(tf.constant(x))
    if gate is not None:
        layer.gate.assign(gate)
    return layer


def _reference(layer: MoELayer, x: np.ndarray) -> np.ndarray:
    """Capacity-limited routing written out with loops, in numpy."""
    logits = x @ layer.gate.numpy()
    experts, k, top_k = layer.num_experts, layer.prototypes, layer.top_k
    group = experts // k
    choices = []  # per example: [(expert, gate)] in choice order
    for row in logits:
        if k == 1:
            p = np.exp(row - row.max())
            p /= p.sum()
            best = np.argsort(-p, kind="stable")[:top_k]
            g = p[best] / p[best].sum() if top_k > 1 else p[best]
            choices.append(list(zip(best, g, strict=True)))
        else:
            picks = []
            for j in range(k):
                q = np.exp(
                    row[j * group : (j + 1) * group] - row[j * group : (j + 1) * group].max()
                )
                q /= q.sum()
                picks.append((j * group + int(np.argmax(q)), q.max()))
            choices.append(picks)
    capacity = math.ceil(layer.capacity_factor * len(x) * top_k * k / experts)
    filled = [0] * experts
    combine = np.zeros((len(x), experts))
    for a in range(top_k * k):
        for b in range(len(x)):
            e, g = choices[b][a]
            if filled[e] < capacity:
                combine[b, e] = g
            filled[e] += 1
    out = np.zeros((len(x), layer.units[-1]))
    for e in range(experts):
        y = x
        for kernel, bias in zip(layer.kernels, layer.biases, strict=True):
            y = np.maximum(y @ kernel.numpy()[e] + bias.numpy()[e], 0.0)
        out += combine[:, e : e + 1] * y
    return out


def test_known_gates_choose_the_expected_experts():
    x = np.eye(3, dtype=np.float32)
    gate = np.array([[0, 2, 0], [0, 0, 2], [2, 0, 0]], np.float32)  # row i prefers (i + 1) % 3
    layer = _layer(x, gate, num_experts=3, capacity_factor=1.0)
    routed = layer.routing(tf.constant(x))
    p = np.exp(2) / (np.exp(2) + 2)
    np.testing.assert_allclose(routed["combine"].numpy(), np.roll(np.eye(3), 1, axis=1) * p, 1e-6)
    assert int(routed["capacity"]) == 1


def test_capacity_drops_are_counted_and_give_zero_output():
    x = np.ones((4, 2), np.float32)
    gate = np.array([[LN3, 0.0], [0.0, 0.0]], np.float32)  # every example: p = (0.75, 0.25)
    layer = _layer(x, gate, num_experts=2, capacity_factor=1.0)  # C = ceil(4 / 2) = 2
    out = layer(tf.constant(x), training=True).numpy()
    assert int(layer.routed_total.numpy()) == 4 and int(layer.dropped_total.numpy()) == 2
    assert layer.drop_rate == 0.5
    expert0 = np.maximum(x[0] @ layer.kernels[0].numpy()[0] + layer.biases[0].numpy()[0], 0)
    np.testing.assert_allclose(out[:2], 0.75 * np.stack([expert0, expert0]), rtol=1e-6)
    np.testing.assert_array_equal(out[2:], 0.0)
    layer(tf.constant(x))  # not a training call: the counters stay
    assert int(layer.routed_total.numpy()) == 4


def test_top2_first_choices_fill_buffers_first_and_gates_renormalize():
    # example 0 prefers e0 then e1, example 1 prefers e0 then e2; C = ceil(.75 * 2 * 2 / 3) = 1
    x = np.eye(2, dtype=np.float32)
    gate = np.log(np.array([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]], np.float32))
    layer = _layer(x, gate, num_experts=3, top_k=2, capacity_factor=0.75)
    routed = layer.routing(tf.constant(x))
    assert int(routed["capacity"]) == 1
    expected = [[0.5 / 0.8, 0.3 / 0.8, 0.0], [0.0, 0.0, 0.3 / 0.9]]  # example 1's e0 is dropped
    np.testing.assert_allclose(routed["combine"].numpy(), expected, rtol=1e-5)
    layer(tf.constant(x), training=True)
    assert (int(layer.routed_total.numpy()), int(layer.dropped_total.numpy())) == (4, 1)


def test_prototyping_picks_one_expert_per_group():
    x = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    layer = _layer(x, num_experts=6, prototypes=3, capacity_factor=10.0)
    combine = layer.routing(tf.constant(x))["combine"].numpy()
    chosen = (combine > 0).reshape(6, 3, 2)  # [batch, group, expert in group]
    np.testing.assert_array_equal(chosen.sum(axis=-1), 1)
    logits = (x @ layer.gate.numpy()).reshape(6, 3, 2)
    q = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(combine.reshape(6, 3, 2).sum(-1), q.max(-1), rtol=1e-5)
    assert layer.activated_flops_per_example() == 3 * 6 + 3 * (3 * 3)


@pytest.mark.parametrize(
    "options",
    [
        {"num_experts": 4, "units": (5, 3), "capacity_factor": 0.5},
        {"num_experts": 4, "units": (3,), "top_k": 2, "capacity_factor": 0.6},
        {"num_experts": 6, "units": (4,), "prototypes": 2, "capacity_factor": 0.5},
    ],
    ids=["top1", "top2", "prototypes"],
)
def test_output_equals_capacity_limited_routing(options):
    # each capacity is below an even share of the 9 examples' assignments, so some assignments
    # are dropped whatever the random router (prototypes: C = ceil(0.5 * 9 * 2 / 6) = 2 per
    # expert, 9 assignments per group of 3 experts)
    x = np.random.default_rng(2).normal(size=(9, 4)).astype(np.float32)
    layer = _layer(x, **options)
    out = layer(tf.constant(x), training=True).numpy()
    np.testing.assert_allclose(out, _reference(layer, x), rtol=1e-5, atol=1e-6)
    assert layer.dropped_total.numpy() > 0


def test_load_balance_loss_by_hand():
    x = np.ones((2, 1), np.float32)
    gate = np.array([[LN3, 0.0]], np.float32)  # p = (0.75, 0.25), both routed to expert 0
    layer = _layer(x, gate, num_experts=2, load_balance_weight=0.1)
    layer(tf.constant(x))
    # f = (1, 0), P = (0.75, 0.25): 2 * (1 * 0.75 + 0 * 0.25) = 1.5
    np.testing.assert_allclose(float(layer.losses[0]), 0.1 * 1.5, rtol=1e-6)
    # prototypes: per group n * sum f P, averaged; group 1 routes both to its expert 3
    gate = np.array([[LN3, 0.0, 0.0, LN3]], np.float32)
    layer = _layer(x, gate, num_experts=4, prototypes=2, load_balance_weight=1.0)
    layer(tf.constant(x))
    np.testing.assert_allclose(float(layer.losses[0]), 1.5, rtol=1e-6)
    assert not _layer(x, num_experts=2).losses


def test_gradients_reach_router_and_experts():
    x = tf.constant(np.random.default_rng(3).normal(size=(8, 4)).astype(np.float32))
    layer = MoELayer(4, (3,), top_k=1, load_balance_weight=0.01)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(x, training=True))) + tf.add_n(layer.losses)
    grads = dict(
        zip(
            [w.name for w in layer.trainable_weights],
            tape.gradient(loss, layer.trainable_weights),
            strict=True,
        )
    )
    assert set(grads) == {w.name for w in layer.trainable_weights} and len(grads) == 3
    for name, g in grads.items():
        assert g is not None and np.abs(g.numpy()).sum() > 0, name


def test_counters_sum_under_mirrored_strategy():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        layer = MoELayer(4, (3,), capacity_factor=0.5)  # C = ceil(.5 * 8 / 4) = 1
        layer.build((None, 5))
    x = tf.random.stateless_normal((8, 5), seed=(1, 2))

    @tf.function
    def step(x):
        return strategy.run(lambda x: layer(x, training=True), (x,))

    step(x)
    step(x)
    assert isinstance(layer.routed_total, tf.distribute.DistributedValues)
    assert int(layer.routed_total.numpy()) == 16
    assert int(layer.dropped_total.numpy()) == 16 - 2 * int(
        np.count_nonzero(layer.routing(x)["combine"].numpy())
    )


def test_capacity_and_flops_formulas():
    assert int(expert_capacity(tf.constant(10), 2, 4, 1.25)) == math.ceil(1.25 * 10 * 2 / 4)
    assert int(expert_capacity(tf.constant(8), 1, 4, 1.0)) == 2
    layer = MoELayer(4, (6, 3), top_k=2)
    assert layer.activated_flops_per_example(input_dim=5) == 5 * 4 + 2 * (5 * 6 + 6 * 3)
    with pytest.raises(ValueError, match="input_dim is needed"):
        layer.activated_flops_per_example()


def test_route_is_a_plain_function():
    out = route(tf.constant([[0.0, 1.0], [2.0, 0.0]]), top_k=1, prototypes=1, capacity_factor=1.0)
    np.testing.assert_array_equal(out["kept"].numpy()[:, 0], [[0, 1], [1, 0]])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_experts": 0}, "num_experts must be an int >= 1, got 0"),
        ({"units": ()}, "units must be a non-empty list"),
        ({"top_k": 5}, "top_k must be <= num_experts=4, got 5"),
        ({"prototypes": 2, "top_k": 2}, "top_k must be 1 with prototypes=2, got top_k=2"),
        ({"prototypes": 3}, "num_experts=4 must be divisible by prototypes=3"),
        ({"capacity_factor": 0.0}, "capacity_factor must be > 0, got 0.0"),
        ({"load_balance_weight": -1.0}, "load_balance_weight must be >= 0"),
        ({"activation": "nope"}, "activation must be a Keras activation name, got 'nope'"),
    ],
)
def test_argument_errors(options, message):
    with pytest.raises(ValueError, match=message):
        MoELayer(**{"num_experts": 4, "units": (3,), **options})


class _Module(tf.Module):
    def __init__(self, layer: MoELayer):
        super().__init__()
        self.layer = layer

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def f(self, x):
        return self.layer(x)


@pytest.mark.parametrize(
    "options",
    [
        {"num_experts": 4, "units": [5, 3], "top_k": 2, "capacity_factor": 0.8},
        {"num_experts": 4, "units": [3], "prototypes": 2, "load_balance_weight": 0.01},
    ],
)
def test_config_and_saved_model_round_trip(options, tmp_path: Path):
    x = tf.constant(np.random.default_rng(4).normal(size=(6, 4)).astype(np.float32))
    layer = MoELayer(**options, activation="tanh")
    before = layer(x).numpy()
    clone = MoELayer.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(x).numpy(), before, rtol=1e-6)
    tf.saved_model.save(_Module(layer), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.f(x).numpy(), before, rtol=1e-6)
    np.testing.assert_allclose(loaded.f(x[:3]).numpy(), layer(x[:3]).numpy(), rtol=1e-6)


def test_inference_keeps_every_assignment_so_a_row_scores_alike_in_any_batch():
    x = np.ones((4, 2), np.float32)
    x[0] = [2.0, -1.0]
    gate = np.array([[LN3, 0.0], [0.0, 0.0]], np.float32)  # every example prefers expert 0
    # C = 2 in training; tanh: an expert's output is not zero by chance (a ReLU expert's 3 units
    # were all zero at x = [1, 1] for about 1 in 8 random initialisations)
    layer = _layer(x, gate, num_experts=2, capacity_factor=1.0, activation="tanh")
    batch = layer(tf.constant(x)).numpy()
    alone = np.concatenate([layer(tf.constant(x[i : i + 1])).numpy() for i in range(4)])
    np.testing.assert_allclose(batch, alone, rtol=1e-6)
    assert np.abs(batch[2:]).sum() > 0  # rows past the training capacity are not dropped
    trained = layer(tf.constant(x), training=True).numpy()
    assert np.abs(trained[2:]).sum() == 0  # the same rows in a training call: dropped
