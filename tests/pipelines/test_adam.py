"""FusedAdam: the update checked by hand, against Keras's Adam on dense and sparse gradients,
with a schedule, across a checkpoint written by Keras's Adam, and its config round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from pipelines.run.adam import FusedAdam
from pipelines.run.model import make_optimizer


def _adam_by_hand(w, grads, lr=0.1, b1=0.9, b2=0.999, eps=1e-7):
    """The Adam update of module ``pipelines.run.adam`` in float64, step after step."""
    w, m, v = np.array(w, np.float64), np.zeros(len(w)), np.zeros(len(w))
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, np.float64)
        m += (g - m) * (1 - b1)
        v += (g * g - v) * (1 - b2)
        w -= lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    return w


def test_three_steps_by_hand():
    grads = [[0.5, -2.0, 0.0], [0.25, 1.0, -3.0], [-1.0, 0.5, 0.0]]
    var = tf.Variable([1.0, 2.0, 3.0])
    opt = FusedAdam(0.1)
    for g in grads:
        opt.apply_gradients([(tf.constant(g), var)])
    np.testing.assert_allclose(var.numpy(), _adam_by_hand([1, 2, 3], grads), rtol=1e-6)
    assert int(opt.iterations) == 3


def _train(opt, steps=5):
    """A table read through ``tf.gather`` (a sparse gradient, ids repeated) and a dense
    kernel, trained ``steps`` steps; their values."""
    tf.keras.utils.set_random_seed(0)
    table = tf.Variable(tf.random.normal([6, 3]))
    kernel = tf.Variable(tf.random.normal([3, 1]))
    ids = tf.constant([0, 2, 2, 5, 0, 0])
    y = tf.constant([[1.0], [0.0], [1.0], [0.0], [1.0], [1.0]])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = tf.gather(table, ids) @ kernel
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))
        grads = tape.gradient(loss, [table, kernel])
        assert isinstance(grads[0], tf.IndexedSlices)
        opt.apply_gradients(zip(grads, [table, kernel], strict=True))

    for _ in range(steps):
        step()
    return table.numpy(), kernel.numpy()


def test_equals_keras_adam_on_sparse_and_dense_gradients():
    keras = _train(tf.keras.optimizers.Adam(0.05))
    fused = _train(FusedAdam(0.05))
    for a, b in zip(keras, fused, strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)  # of moves up to 0.25
    # rows 1, 3 and 4 are never read: their moments and values stay put in both
    start = _train(FusedAdam(0.05), steps=0)[0]
    np.testing.assert_array_equal(fused[0][[1, 3, 4]], start[[1, 3, 4]])


def test_a_schedule_and_amsgrad_match_keras_adam():
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5)
    pairs = [
        (tf.keras.optimizers.Adam(schedule), FusedAdam(schedule)),
        (tf.keras.optimizers.Adam(0.05, amsgrad=True), FusedAdam(0.05, amsgrad=True)),
    ]
    for keras, fused in pairs:
        for a, b in zip(_train(keras), _train(fused), strict=True):
            np.testing.assert_allclose(b, a, atol=1e-5)  # of moves up to 0.25


def test_continues_from_a_keras_adam_checkpoint(tmp_path: Path):
    def state(opt):
        var = tf.Variable([1.0, -1.0])
        opt.build([var])
        return var, tf.train.Checkpoint(var=var, optimizer=opt)

    var, ckpt = state(tf.keras.optimizers.Adam(0.1))
    ckpt.optimizer.apply_gradients([(tf.constant([0.5, 2.0]), var)])
    path = ckpt.save(str(tmp_path / "ckpt"))
    restored, ckpt2 = state(FusedAdam(0.1))
    ckpt2.restore(path).assert_consumed()
    assert int(ckpt2.optimizer.iterations) == 1
    ckpt2.optimizer.apply_gradients([(tf.constant([1.0, -1.0]), restored)])
    expected = _adam_by_hand([1.0, -1.0], [[0.5, 2.0], [1.0, -1.0]])
    np.testing.assert_allclose(restored.numpy(), expected, rtol=1e-5)


def test_make_optimizer_gives_it_and_its_config_round_trips():
    opt = make_optimizer("adam", 0.003)
    assert isinstance(opt, FusedAdam)
    clone = tf.keras.optimizers.deserialize(tf.keras.optimizers.serialize(opt))
    assert type(clone) is FusedAdam
    assert clone.get_config() == opt.get_config()


def test_one_fused_op_per_variable():
    def op_types(opt):
        var = tf.Variable([1.0, 2.0])
        opt.build([var])
        fn = tf.function(lambda g: opt.apply_gradients([(g, var)]))
        graph = fn.get_concrete_function(tf.TensorSpec([2])).graph
        return [op.type for op in graph.get_operations()]

    fused, keras = op_types(FusedAdam(0.1)), op_types(tf.keras.optimizers.Adam(0.1))
    assert fused.count("ResourceApplyAdam") == 1 and "ResourceApplyAdam" not in keras
    assert len(fused) < len(keras)


def test_the_step_scalars_are_built_once_and_repeated_ids_summed_without_unique(
    tmp_path: Path,
):
    tables = [tf.Variable(tf.ones([4, 2])) for _ in range(3)]
    kernel = tf.Variable(tf.ones([2, 1]))
    opt = FusedAdam(0.1)
    opt.build([*tables, kernel])

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            rows = tf.add_n([tf.gather(t, ids) for t in tables])
            loss = tf.reduce_sum(rows @ kernel)
        opt.apply_gradients(
            zip(tape.gradient(loss, [*tables, kernel]), [*tables, kernel], strict=True)
        )

    ids = tf.constant([1, 1, 3])
    types = [op.type for op in step.get_concrete_function(ids).graph.get_operations()]
    assert types.count("Pow") == 2 and types.count("ResourceApplyAdam") == 4
    assert "Unique" not in types
    step(ids)
    # row 1, read twice, moved by the summed gradient: Adam's first step moves every
    # updated entry by the learning rate, rows 0 and 2 (never read) stay put
    np.testing.assert_allclose(tables[0].numpy()[:, 0], [1.0, 0.9, 1.0, 0.9], rtol=1e-6)
    # the step's scalars are never part of a checkpoint
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))
    assert not [name for name, _ in tf.train.list_variables(path) if "coefficients" in name]
