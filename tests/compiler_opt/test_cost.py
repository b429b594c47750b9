"""The cost model by hand, and the per-device calibration file."""

from __future__ import annotations

import dataclasses
import json

import pytest
import tensorflow as tf

from compiler_opt import cost, ir


def _graph(fn, *specs):
    return ir.from_concrete_function(
        tf.function(fn, input_signature=list(specs)).get_concrete_function()
    )


def _by_op(g, op):
    (node,) = [n for n in g.nodes.values() if n.op == op]
    return node.name


def test_elementwise_bytes_alone_and_fused(hand):
    g = _graph(lambda x: tf.nn.relu(x * 2.0), tf.TensorSpec([None, 8], tf.float32))
    m = cost.CostModel(g, hand, batch=4)
    mul, relu = _by_op(g, "Mul"), _by_op(g, "Relu")
    # Mul reads x (4 * 8 floats = 128 B; the scalar 2.0 is inlined) and writes 128 B
    alone = m.node_cost(mul)
    assert (alone.launches, alone.bytes_read, alone.bytes_written) == (1, 128, 128)
    assert alone.time_s == pytest.approx(1e-6 + 256 / 1e9)
    assert m.unfused().launches == 2 and m.unfused().bytes == 512
    # fused: x read once, the result written once; the intermediate never leaves the kernel
    fused = m.group_cost([mul, relu])
    assert (fused.launches, fused.bytes_read, fused.bytes_written) == (1, 128, 128)
    assert fused.arguments == 2
    assert fused.time_s == pytest.approx(1e-6 + 256 / 1e9)


def test_gather_reads_rows_not_the_table(hand):
    table = tf.Variable(tf.zeros([100, 4]))
    g = _graph(lambda ids: tf.gather(table, ids), tf.TensorSpec([None], tf.int32))
    m = cost.CostModel(g, hand, batch=10)
    c = m.node_cost(_by_op(g, "ResourceGather"))
    # ids 10 * 4 B + 10 rows * 4 floats * 4 B read; 160 B written; 10 rows
    assert (c.bytes_read, c.bytes_written, c.gather_rows) == (40 + 160, 160, 10)
    # a table larger than the cache pays the calibrated latency on every row
    assert c.time_s == pytest.approx(1e-6 + 360 / 1e9 + 10 * 1e-8)
    # a table of 1,600 B in a 3,200 B cache pays half of it
    half = dataclasses.replace(hand, cache_bytes=3200)
    c = cost.CostModel(g, half, batch=10).node_cost(_by_op(g, "ResourceGather"))
    assert c.time_s == pytest.approx(1e-6 + 360 / 1e9 + 10 * 1e-8 * 0.5)


def test_matmul_flops_and_weight_bytes(hand):
    w = tf.Variable(tf.zeros([8, 3]))
    g = _graph(lambda x: tf.matmul(x, w), tf.TensorSpec([None, 8], tf.float32))
    c = cost.CostModel(g, hand, batch=5).node_cost(_by_op(g, "MatMul"))
    assert c.flops == 2 * 5 * 3 * 8
    assert (c.bytes_read, c.bytes_written) == (5 * 8 * 4 + 8 * 3 * 4, 5 * 3 * 4)
    assert c.time_s == pytest.approx(1e-6 + 316 / 1e9 + 240 / 1e9)
    with pytest.raises(ValueError, match="batch must be >= 1, got 0"):
        cost.CostModel(g, cost.Coefficients("x", 1, 1, 1, 1), batch=0)


def test_matmul_flops_read_the_contracted_dimension_from_either_operand(hand):
    """A row input of unknown width (a concat of unknown parts, as a SavedModel's inlined
    functions have): the contracted dimension is the weight's, transposed or not."""
    w = tf.Variable(tf.zeros([8, 3]))
    wt = tf.Variable(tf.zeros([3, 8]))
    spec = tf.TensorSpec([None, None], tf.float32)
    for fn in (lambda x: tf.matmul(x, w), lambda x: tf.matmul(x, wt, transpose_b=True)):
        g = _graph(fn, spec)
        node = _by_op(g, "MatMul")
        assert cost.CostModel(g, hand, batch=5).node_cost(node).flops == 2 * 5 * 3 * 8


def test_calibration_written_reloaded_and_redone(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHREC_CACHE", str(tmp_path / "cache"))
    assert cost.cache_dir() == tmp_path / "cache" / "compiler_opt"
    c = cost.load_or_calibrate(quick=True)
    path = cost.calibration_path()
    assert path.parent == cost.cache_dir() and path.name == cost.device_key() + ".json"
    assert path.exists() and c.device == cost.device_key()
    assert c.launch_s > 0 and c.bandwidth > 1e8 and c.gather_row_s > 0 and c.matmul_flops > 1e7
    assert c.cache_bytes >= 2**16
    assert cost.load(path) == c
    assert cost.load_or_calibrate() == c  # cached: not measured again
    again = cost.load_or_calibrate(recalibrate=True, quick=True)
    assert again.measured != c.measured and cost.load(path) == again
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not a compiler_opt calibration file"):
        cost.load(path)
    fixed = cost.load_or_calibrate(quick=True)  # a broken file is measured again
    assert json.loads(path.read_text())["launch_s"] == fixed.launch_s
