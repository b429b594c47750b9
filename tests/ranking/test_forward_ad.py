"""Forward-mode derivatives of ReLU + dropout: the plain ops' outputs and gradients, element for
element; less memory held for the backward pass; the MLP's ``gradient`` option."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from ranking.blocks import MLP
from ranking.forward_ad import dense_relu_dropout
from ranking.multitask_heads import TaskTowers

SEED = tf.constant([3, 11], tf.int64)
ROOT = Path(__file__).resolve().parents[2]


def _plain(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, rate: float) -> tf.Tensor:
    z = tf.nn.bias_add(tf.matmul(x, kernel), bias)
    return tf.nn.experimental.stateless_dropout(tf.nn.relu(z), rate=rate, seed=SEED)


@pytest.mark.parametrize("output_kept", [False, True])
def test_outputs_and_gradients_are_the_plain_ones(output_kept):
    x = tf.Variable(tf.random.stateless_normal([64, 20], seed=[1, 2]))
    kernel = tf.Variable(tf.random.stateless_normal([20, 33], seed=[1, 3]))
    bias = tf.Variable(tf.random.stateless_normal([33], seed=[1, 4]))
    upstream = tf.random.stateless_normal([64, 33], seed=[5, 6])
    for rate in (0.1, 0.5):
        with tf.GradientTape(persistent=True) as tape:
            plain = _plain(x, kernel, bias, rate)
            ours = dense_relu_dropout(x, kernel, bias, rate, SEED, output_kept)
            loss_plain = tf.reduce_sum(plain * upstream)
            loss_ours = tf.reduce_sum(ours * upstream)
        np.testing.assert_array_equal(ours.numpy(), plain.numpy())
        # the derivative by hand: 1 / (1 - rate) where the element passed, else 0
        kept = plain.numpy() != 0
        assert 0 < kept.mean() < 1
        dz = np.where(kept, upstream.numpy() * np.float32(1 / (1 - rate)), 0).astype(np.float32)
        for var, by_hand in (
            (x, dz @ kernel.numpy().T),
            (kernel, x.numpy().T @ dz),
            (bias, dz.sum(axis=0)),
        ):
            g_plain, g_ours = tape.gradient(loss_plain, var), tape.gradient(loss_ours, var)
            np.testing.assert_allclose(g_ours.numpy(), g_plain.numpy(), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(g_ours.numpy(), by_hand, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"rate must be in \(0, 1\), got 0.0"):
        dense_relu_dropout(x, kernel, bias, 0.0, SEED)


def _held_after_forward(forward) -> int:
    """Bytes the allocator holds after ``forward()`` (a tf.function) under a tape: what the
    backward pass will read (TensorFlow keeps those tensors as the function's extra outputs).
    The least of three calls after the tracing one: the process-wide counter also sees what
    another thread allocates meanwhile, which only adds."""
    held = []
    for _ in range(4):
        start = tf.config.experimental.get_memory_info("CPU:0")["current"]
        with tf.GradientTape() as tape:
            loss = forward()
        held.append(tf.config.experimental.get_memory_info("CPU:0")["current"] - start)
        del tape, loss
    return min(held[1:])


def backward_pass_bytes() -> dict[str, int]:
    """Bytes held for the backward pass by three layers of 512 units at batch 8192, the loss a
    sum of the last: ReLU alone, ReLU + dropout as plain ops, and the forward-mode form.

    Reads the CPU allocator's byte counters, which TensorFlow keeps only with its BFC allocator
    on the CPU (``TF_CPU_ALLOCATOR_USE_BFC=true`` before it loads) or once something in the
    process has switched them on; ``test_the_backward_pass_keeps_less`` runs it in a child
    process with the former."""
    x = tf.random.stateless_normal([8192, 64], seed=[0, 1])
    ws = [tf.Variable(tf.random.stateless_normal([64, 512], seed=[0, 2]) * 0.1)]
    ws += [tf.Variable(tf.random.stateless_normal([512, 512], seed=[0, i]) * 0.05) for i in (3, 4)]
    b = tf.zeros([512])

    def forward(layer):
        @tf.function
        def run():
            h = x
            for i, w in enumerate(ws):
                h = layer(h, w, i < len(ws) - 1)
            return tf.reduce_sum(h)

        return run

    def ours(kept_where_next_keeps):
        def layer(h, w, next_keeps):
            kept = kept_where_next_keeps and next_keeps
            return dense_relu_dropout(h, w, b, 0.2, SEED, output_kept=kept)

        return layer

    return {
        "relu_only": _held_after_forward(forward(lambda h, w, _: tf.nn.relu(tf.matmul(h, w)))),
        "plain": _held_after_forward(forward(lambda h, w, _: _plain(h, w, b, 0.2))),
        "booleans": _held_after_forward(forward(ours(False))),
        "ours": _held_after_forward(forward(ours(True))),
    }


def test_the_backward_pass_keeps_less():
    """Plain back-propagation keeps the ReLU's output and the keep mask of each layer and the
    dropout's output of the first two (the next matmul's input); the forward-mode form with a
    boolean per layer those two outputs and three booleans, and reading the first two layers'
    booleans off their outputs (kept by the next layer) those two outputs and one boolean.
    Measured: 7.2 against 3.8 and 3.2 bytes per element (ReLU alone, no dropout: 4.0)."""
    code = (
        "import json; from tests.ranking.test_forward_ad import backward_pass_bytes; "
        "print(json.dumps(backward_pass_bytes()))"
    )
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    held = json.loads(out.stdout.strip().splitlines()[-1])
    elements = 3 * 8192 * 512
    # beyond the outputs ReLU alone keeps: plain ~5 bytes per element, ours ~1
    assert held["relu_only"] >= 4 * elements  # at least each layer's output, as float32
    assert held["plain"] - held["booleans"] >= 2 * elements
    assert held["plain"] >= 1.3 * held["booleans"]
    # two of the three layers' booleans (1 byte per element each) not kept
    assert held["booleans"] - held["ours"] >= 0.5 * elements


def _mlp_step(mlp: MLP, x: tf.Tensor, upstream: tf.Tensor) -> tuple[tf.Tensor, list]:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(mlp(x, training=True) * upstream)
    return loss, tape.gradient(loss, mlp.trainable_variables)


def test_mlp_forward_ad_trains_as_backprop_over_the_same_layers():
    x = tf.random.stateless_normal([128, 20], seed=[2, 3])
    upstream = tf.random.stateless_normal([128, 8], seed=[2, 4])
    plain = MLP([32, 8], dropout=0.3, seed=7)
    plain(x)
    ours = plain.with_gradient("forward_ad")
    assert ours is not plain and ours.gradient == "forward_ad"
    assert [v.ref() for v in ours.weights] == [v.ref() for v in plain.weights]
    assert ours.dropout_calls is plain.dropout_calls and plain.with_gradient("backprop") is plain
    # the same call count keys the same masks: reset it between the two steps
    loss_plain, g_plain = _mlp_step(plain, x, upstream)
    plain.dropout_calls.assign(0)
    loss_ours, g_ours = _mlp_step(ours, x, upstream)
    assert loss_ours.numpy() == pytest.approx(loss_plain.numpy(), rel=1e-6)
    for a, b in zip(g_ours, g_plain, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    # inference: no dropout, the plain layers
    np.testing.assert_array_equal(ours(x).numpy(), plain(x).numpy())


def test_mlp_forward_ad_builds_its_layers_and_round_trips_its_config(tmp_path):
    mlp = MLP([16, 4], dropout=0.2, seed=1, gradient="forward_ad")
    x = tf.ones([8, 5])
    _, grads = _mlp_step(mlp, x, tf.ones([8, 4]))  # the first call is a training call
    assert len(grads) == 4 and all(g is not None for g in grads)
    config = mlp.get_config()
    assert config["gradient"] == "forward_ad"
    again = MLP.from_config(config)
    assert again.gradient == "forward_ad" and again.seed == 1
    assert "gradient" not in MLP([4], dropout=0.1, seed=1).get_config()
    with pytest.raises(ValueError, match=r"gradient must be one of .*'forward_ad'.*got 'fwd'"):
        MLP([4], gradient="fwd")
    # a SavedModel of it serves the plain function
    module = tf.Module()
    module.mlp = mlp
    module.f = tf.function(lambda t: mlp(t), input_signature=[tf.TensorSpec([None, 5])])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_allclose(loaded.f(x).numpy(), mlp(x).numpy(), rtol=1e-6)


def test_task_towers_with_forward_ad_share_their_layers_and_gradients():
    towers = TaskTowers(2, units=[16, 8], dropout=0.25)
    x = tf.random.stateless_normal([32, 2, 12], seed=[4, 5])
    towers(x)
    ours = towers.with_gradient("forward_ad")
    assert [t.gradient for t in ours._towers] == ["forward_ad", "forward_ad"]
    assert [v.ref() for v in ours.weights] == [v.ref() for v in towers.weights]
    grads = []
    for t in (towers, ours):
        for mlp in towers._towers:
            mlp.dropout_calls.assign(5)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(t(x, training=True))
        grads.append(tape.gradient(loss, towers.trainable_variables))
    for a, b in zip(*grads, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
