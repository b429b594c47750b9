"""The XLA-cluster realization: tagged groups, outputs equal to the unfused graph."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from compiler_opt import realize
from compiler_opt.executed import executed_kernels


def test_planned_groups_run_as_xla_clusters_with_equal_outputs(hand):
    rng = np.random.default_rng(0)
    t1 = tf.Variable(rng.normal(size=(50, 8)).astype(np.float32))
    t2 = tf.Variable(rng.normal(size=(60, 8)).astype(np.float32))
    w = tf.Variable(rng.normal(size=(17, 4)).astype(np.float32))

    @tf.function
    def model(a, b, mask, dense):
        pa = tf.reduce_sum(tf.gather(t1, a) * mask, axis=1)
        pb = tf.reduce_mean(tf.gather(t2, b), axis=1)
        x = tf.concat([pa, pb, tf.math.log1p(dense)], axis=1)
        return tf.nn.relu(tf.matmul(x, w)) * 2.0 + 1.0

    specs = (
        tf.TensorSpec([None, 3], tf.int32),
        tf.TensorSpec([None, 2], tf.int32),
        tf.TensorSpec([None, 3, 1], tf.float32),
        tf.TensorSpec([None, 1], tf.float32),
    )
    r = realize.xla_clusters(model.get_concrete_function(*specs), hand, batch=64)
    assert r.clusters == len(r.plan.groups) >= 2
    kinds = {g.kind for g in r.plan.groups}
    assert "concat" in kinds and "loop" in kinds
    scopes = {
        n.name: n.attr["_XlaScope"].s.decode() for n in r.tagged.node if "_XlaCompile" in n.attr
    }
    for g in r.plan.groups:  # every node of a group carries the group's scope
        assert {scopes[m] for m in g.nodes} == {f"stitch_{g.id}"}
    args = (
        tf.constant(rng.integers(0, 50, (64, 3)), tf.int32),
        tf.constant(rng.integers(0, 60, (64, 2)), tf.int32),
        tf.constant(rng.random((64, 3, 1)), tf.float32),
        tf.constant(rng.random((64, 1)), tf.float32),
    )
    expected = model(*args).numpy()
    (fused,) = r.fused(*args)
    (unfused,) = r.unfused(*args)
    np.testing.assert_allclose(unfused.numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(fused.numpy(), expected, atol=1e-5)
    # each group ran as one XLA cluster (_XlaCompile + _XlaRun + _XlaMerge); only the matmul
    # (not memory-bound) still runs as a TensorFlow op
    ran = executed_kernels(r.fused, *args)["top_tf_ops"]
    assert ran.pop("_XlaRun") == r.clusters
    others = {op for op in ran if op not in ("_XlaCompile", "_XlaMerge")}
    assert others and all("MatMul" in op for op in others), ran
    assert executed_kernels(r.unfused, *args)["tf_ops"] >= 10
