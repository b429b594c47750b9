"""The planner on hand-made graphs: chains, cycles, argument limits, stitching, gathers."""

from __future__ import annotations

import tensorflow as tf

from compiler_opt import ir, planner


def _graph(fn, *specs):
    return ir.from_concrete_function(
        tf.function(fn, input_signature=list(specs)).get_concrete_function()
    )


def _names(g, op):
    return [n.name for n in g.nodes.values() if n.op == op]


X16 = tf.TensorSpec([None, 16], tf.float32)


def test_elementwise_chain_becomes_one_loop_group(hand):
    g = _graph(lambda x: tf.sigmoid(tf.exp(x) * 3.0 + 1.0) - x, X16)
    p = planner.plan(g, hand, batch=64)
    (group,) = p.groups
    assert group.kind == "loop"
    assert sorted(g[n].op for n in group.nodes) == ["AddV2", "Exp", "Mul", "Sigmoid", "Sub"]
    assert (group.before.launches, group.after.launches) == (5, 1)
    # x read once (64 * 16 floats), the result written once
    assert (group.after.bytes_read, group.after.bytes_written) == (4096, 4096)
    assert p.fused.launches == 1 and p.unfused.launches == 5
    assert p.fused.time_s < p.unfused.time_s


def test_merge_through_a_matmul_would_make_a_cycle(hand):
    w = tf.Variable(tf.ones([16, 16]))

    def diamond(x):
        a = tf.exp(x)
        return a + tf.matmul(a, w)  # Exp -> AddV2 directly and through the MatMul

    g = _graph(diamond, X16)
    p = planner.plan(g, hand, batch=64)
    (exp,), (add,) = _names(g, "Exp"), _names(g, "AddV2")
    assert p.group_of.get(exp) is None or p.group_of.get(exp) != p.group_of.get(add)
    assert p.rejected.get("cycle", 0) >= 1
    assert p.fused.launches == 3  # Exp, MatMul, AddV2 stay three kernels


def test_max_arguments_is_respected(hand):
    specs = [tf.TensorSpec([None, 4], tf.float32)] * 8

    def products(*xs):
        return xs[0] * xs[1] + xs[2] * xs[3] + xs[4] * xs[5] + xs[6] * xs[7]

    g = _graph(products, *specs)
    wide = planner.plan(g, hand, batch=32, max_args=64)
    assert len(wide.groups) == 1 and wide.groups[0].after.arguments == 9  # 8 inputs + 1 output
    narrow = planner.plan(g, hand, batch=32, max_args=4)
    assert narrow.rejected.get("max_args", 0) >= 1
    assert len(narrow.groups) >= 2
    assert all(grp.after.arguments <= 4 for grp in narrow.groups)
    assert narrow.fused.launches > wide.fused.launches


def test_layer_norm_is_stitched_into_one_group(hand):
    gamma = tf.constant([1.5] * 16)

    def layer_norm(x):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        d = x - mean
        var = tf.reduce_mean(d * d, axis=-1, keepdims=True)
        return d * tf.math.rsqrt(var + 1e-6) * gamma + 0.5

    g = _graph(layer_norm, X16)
    p = planner.plan(g, hand, batch=128)
    (group,) = p.groups
    assert group.kind == "stitch"
    assert sorted(g[n].op for n in group.nodes).count("Mean") == 2
    assert group.after.launches == 1 and p.fused.launches == 1
    assert group.after.bytes == 2 * 128 * 16 * 4  # x in, y out
    # without stitching, a reduction may not feed ops in its own group
    split = planner.plan(g, hand, batch=128, stitch=False)
    assert split.fused.launches > 1 and split.rejected.get("reduction", 0) >= 1


def test_batch_axis_reduction_is_only_a_group_output(hand):
    def batch_center(x):
        mean = tf.reduce_mean(x * x, axis=0)  # statistics over the batch
        return x - mean

    g = _graph(batch_center, X16)
    p = planner.plan(g, hand, batch=128)
    (mean,), (sub,), (mul,) = _names(g, "Mean"), _names(g, "Sub"), _names(g, "Mul")
    assert planner.reduction_kind(g[mean]) == "column"
    assert p.group_of[mean] != p.group_of.get(sub)
    assert p.groups[p.group_of[mean]].kind == "input"  # x * x fused into its reduction
    assert p.group_of[mul] == p.group_of[mean]
    assert p.rejected.get("reduction", 0) >= 1


def test_sibling_gathers_are_grouped_horizontally(hand):
    t1, t2 = tf.Variable(tf.zeros([50, 4])), tf.Variable(tf.zeros([60, 4]))
    ids = tf.TensorSpec([None], tf.int32)
    g = _graph(lambda a, b: (tf.gather(t1, a), tf.gather(t2, b)), ids, ids)
    p = planner.plan(g, hand, batch=256)
    (group,) = p.groups
    assert group.kind == "horizontal-gather" and len(group.nodes) == 2
    assert (group.before.launches, group.after.launches) == (2, 1)
    assert planner.plan(g, hand, batch=256, horizontal=False).groups == []


def test_gather_mask_pool_concat_is_one_group(hand):
    t1, t2 = tf.Variable(tf.zeros([50, 4])), tf.Variable(tf.zeros([60, 4]))
    ids = tf.TensorSpec([None, 3], tf.int32)
    mask = tf.TensorSpec([None, 3, 1], tf.float32)

    def pooled(a, b, ma, mb):
        pa = tf.reduce_sum(tf.gather(t1, a) * ma, axis=1)
        pb = tf.reduce_sum(tf.gather(t2, b) * mb, axis=1)
        return tf.concat([pa, pb], axis=1)

    g = _graph(pooled, ids, ids, mask, mask)
    p = planner.plan(g, hand, batch=256)
    (group,) = p.groups
    assert group.kind == "concat"
    ops = sorted(g[n].op for n in group.nodes)
    assert ops == ["ConcatV2", "Mul", "Mul", "ResourceGather", "ResourceGather", "Sum", "Sum"]
    # only the [256, 8] result is written; the [256, 3, 4] gathers never leave the kernel
    assert group.after.bytes_written == 256 * 8 * 4
    text = p.to_text()
    assert "concat" in text and "kernel launches" in text and "7 -> 1" in text
