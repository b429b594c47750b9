"""The floor estimator: the FMA loop, the units of a plan by hand, measuring, the peak cache."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt import cost, floor, graph_io, ir, planner, realize
from tests.compiler_opt.conftest import need_compiler, share_kernels


def _fma_reference(iters: int, lanes: int) -> float:
    """The FMA loop's result by hand: 12 float32 chains ``acc = fma(acc, m, a)`` from
    ``m * (c + 1)`` (a float32 product is exact in float64, so one rounding to float32 after
    the float64 sum is the fused multiply-add), summed in float64 over chains and lanes."""
    m, a = np.float32(0.999999), np.float32(1e-7)
    acc = np.array([m * np.float32(c + 1) for c in range(12)], dtype=np.float32)
    for _ in range(iters):
        acc = (acc.astype(np.float64) * float(m) + float(a)).astype(np.float32)
    return float(acc.astype(np.float64).sum()) * lanes


def test_the_fma_loop_does_the_arithmetic_it_counts(tmp_path, monkeypatch):
    need_compiler()
    monkeypatch.setenv("STITCHREC_CACHE", str(share_kernels(tmp_path / "cache")))
    lib = floor._fma_library()
    for bits in (256, 512):
        got = getattr(lib, f"stitchrec_fma_{bits}")(1000)
        assert got == pytest.approx(_fma_reference(1000, bits // 32), rel=1e-12)
    peak = floor.measure_fma_peak(threads=1, seconds=0.02, repeats=1)
    assert peak.threads == 1 and peak.vector_bits in (256, 512)
    assert peak.flops == max(peak.measured.values()) > 1e8


def test_the_peak_is_cached_and_a_broken_file_is_measured_again(tmp_path, monkeypatch):
    need_compiler()
    monkeypatch.setenv("STITCHREC_CACHE", str(share_kernels(tmp_path / "cache")))
    path = floor.peak_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = floor.Peak(cost.device_key("/CPU:0"), 123.0, 2, 256, {"fma256_flops": 123.0})
    path.write_text(json.dumps(dataclasses.asdict(kept)))
    assert floor.load_or_measure_peak() == kept  # read, not measured
    path.write_text("{not json")
    measured = floor.load_or_measure_peak()
    assert measured.flops > 1e8 and json.loads(path.read_text())["flops"] == measured.flops
    assert not path.with_suffix(".tmp").exists()


def _dense_relu(batch: int) -> tuple[floor.Floor, planner.Plan, object]:
    """``relu(x @ W + b) * 2`` with W 8x4, frozen and planned at ``batch``."""
    w = tf.Variable(tf.ones([8, 4]))
    b = tf.Variable(tf.zeros([4]))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def f(x):
        return tf.nn.relu(tf.matmul(x, w) + b) * 2.0

    frozen = realize.freeze(f.get_concrete_function())
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    return graph, frozen, f


def test_units_by_hand(hand):
    graph, _, _ = _dense_relu(16)
    plan = planner.plan(graph, hand, 16)
    fl = floor.units(plan, peak_flops=1e9)
    (mm,) = [u for u in fl.units if u.kind == "matmul"]
    (loop,) = [u for u in fl.units if u.kind == "loop"]
    assert mm.label == "MatMul MatMul" and loop.label == "group 0"
    # 2 * 16 rows * 8 in * 4 out; x (16 * 8 floats) and W (8 * 4) read, [16, 4] written
    assert mm.flops == 2 * 16 * 8 * 4
    assert mm.bytes == (16 * 8 + 8 * 4 + 16 * 4) * 4
    assert mm.floor_s == pytest.approx(max(1024 / 1e9, 896 / 1e9))
    # + b, relu, * 2 in one group: [16, 4] read and written (b and 2.0 inlined constants)
    assert (loop.flops, loop.bytes) == (0, 2 * 16 * 4 * 4)
    assert loop.floor_s == pytest.approx(512 / 1e9)
    assert fl.flops == mm.flops  # elementwise arithmetic is not counted
    assert fl.floor_s == pytest.approx(sum(u.floor_s for u in fl.units))
    # every kernel of the graph is in exactly one unit
    kernels = [
        n for n, node in graph.nodes.items() if cost.CostModel(graph, hand, 16).is_kernel(node)
    ]
    held = [n for u in fl.units for n in u.nodes]
    assert sorted(held) == sorted(kernels)


def test_measure_charges_op_time_to_units(hand):
    graph, frozen, f = _dense_relu(4096)
    plan = planner.plan(graph, hand, 4096)
    fl = floor.units(plan, peak_flops=1e9)
    fn = graph_io.load_graph_def(frozen.graph_def, frozen.inputs, frozen.outputs, frozen.bound)
    x = tf.random.uniform([4096, 8])
    np.testing.assert_allclose(fn(x)[0].numpy(), f(x).numpy(), rtol=1e-6)
    measured = floor.measure(fl, fn, [x], calls=3)
    assert measured.wall_s > 0 and measured.unattributed_s is not None
    assert all(u.measured_s is not None for u in measured.units)
    (mm,) = [u for u in measured.units if u.kind == "matmul"]
    assert mm.measured_s > 0  # the matmul's event, found by its node's name
    text = measured.to_text()
    assert "floor at batch 4096" in text and "x floor" in text and "per call (median)" in text
    assert measured.to_dict()["flops"] == 2 * 4096 * 8 * 4


def test_a_training_step_counts_its_weights_matmuls_through_their_handles(hand):
    """A training step frozen with its variables kept reads the weights through handles with
    no static shape: the matmul's sizes come from the variable (not the batch squared)."""
    w = tf.Variable(tf.ones([8, 4]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    x = tf.random.uniform([16, 8])
    fl = floor.of_function(
        step.get_concrete_function(x), [x], hand, 1e9, 16, keep_variables=True, calls=1
    )
    # the forward x @ W and the weight's gradient x^T @ dy: 2 * 16 * 8 * 4 each
    assert fl.flops == 2 * (2 * 16 * 8 * 4)
    assert fl.wall_s > 0 and w.numpy()[0, 0] < 1.0  # the step ran and updated W
