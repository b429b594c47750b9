"""compiler_opt.row_op: generated ops for groups with reductions (row programs).

Each program is read out of a frozen ``tf.function`` (every node it can express), replaces
those nodes in the GraphDef, and must give the function's own outputs: the FM term, a
LayerNorm, a softmax, every reduction with and without kept dims, constants broadcast against
the row. Then: the reasons for what it cannot express, the acyclicity rule for pieces of a
group, the FM model's serving signature as the server realizes it, and the CUDA form's device
code (run on the host) where nvcc exists.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from compiler_opt import graph_io, ir, realize, registry, toolchain, xy_op
from compiler_opt.loop_op import cpu as loop_cpu
from compiler_opt.loop_op import groups as loop_groups
from compiler_opt.loop_op import spec as loop_def
from compiler_opt.row_op import cpu as row_cpu
from compiler_opt.row_op import cuda as row_cuda
from compiler_opt.row_op import groups as row_groups
from compiler_opt.row_op import spec as row_def
from compiler_opt.row_op.spec import RowSpec, RowValue
from tests.compiler_opt.conftest import HAND, need_compiler, share_kernels, tiny_dcn_v2

GAMMA = np.linspace(0.5, 1.5, 8).astype(np.float32)


def fm(v):  # v [B, F, d]: DeepFM's pairwise term
    sum_sq = tf.square(tf.reduce_sum(v, axis=1))
    sq_sum = tf.reduce_sum(tf.square(v), axis=1)
    return 0.5 * tf.reduce_sum(sum_sq - sq_sum, axis=1, keepdims=True)


def layer_norm(x):  # x [B, 8]
    m = tf.reduce_mean(x, axis=-1, keepdims=True)
    c = x - m
    var = tf.reduce_mean(tf.square(c), axis=-1, keepdims=True)
    return c * tf.math.rsqrt(var + 1e-5) * tf.constant(GAMMA) + 0.25


def softmax(x):  # x [B, 3, 5]
    return tf.nn.softmax(x * 2.0 + tf.constant(np.arange(5, dtype=np.float32)), axis=-1)


def reductions(x):  # x [B, 3, 4]: every reduction, kept dims or not, and their mix
    a = tf.reduce_max(x, axis=2)  # [B, 3]
    b = tf.reduce_min(x, axis=[1, 2], keepdims=True)  # [B, 1, 1]
    c = tf.reduce_prod(x * 0.5 + 1.0, axis=1)  # [B, 4]
    d = tf.reduce_sum(x * tf.constant([[1.0], [2.0], [3.0]]), axis=1, keepdims=True)  # [B, 1, 4]
    return a, b, c, tf.reduce_mean(d - b, axis=2)


CASES = {
    "fm": (fm, [None, 3, 4]),
    "layer_norm": (layer_norm, [None, 8]),
    "softmax": (softmax, [None, 3, 5]),
    "reductions": (reductions, [None, 3, 4]),
}


def _frozen(fn, shape):
    return realize.freeze(tf.function(fn).get_concrete_function(tf.TensorSpec(shape, tf.float32)))


def _topo(graph, names=None):
    order = ir.topological_order(graph.nodes)
    return order if names is None else [n for n in order if n in set(names)]


def _whole_program(frozen):
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    nodes = [n for n in _topo(graph) if row_groups.expressible(graph, n)]
    return graph, row_groups.row_spec(graph, nodes, frozen.outputs)


def _run(graph_def, frozen, outputs, x):
    out = graph_io.load_graph_def(graph_def, frozen.inputs, outputs)(tf.constant(x))
    return [o.numpy() for o in out]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_program_equals_the_ops_it_replaces(case):
    need_compiler()
    fn, shape = CASES[case]
    frozen = _frozen(fn, shape)
    _, (group, reason) = _whole_program(frozen)
    assert group is not None, reason
    assert isinstance(group.spec, RowSpec)
    graph_def, outputs = xy_op.rewrite(frozen.graph_def, [group], frozen.outputs)
    kept = [n.op for n in graph_def.node if n.op not in ("Placeholder", "Const", "Identity")]
    assert kept == [group.spec.op_name]  # one op in place of the whole computation
    rng = np.random.default_rng(0)
    for batch in (1, 5, 64):
        x = rng.normal(size=(batch, *shape[1:])).astype(np.float32)
        want = _run(frozen.graph_def, frozen, frozen.outputs, x)
        got = _run(graph_def, frozen, outputs, x)
        for w, g in zip(want, got, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_hand_checked_fm_term():
    """v = [[1, 2], [3, 4]] (F=2, d=2): sum_f = [4, 6]; (16 - 10) + (36 - 20) = 22; 0.5 * 22.
    The rows are padded with zeros to the ``fm`` case's [3, 4] (zeros add nothing to either
    sum): the same program, compiled once for both tests."""
    need_compiler()
    frozen = _frozen(fm, CASES["fm"][1])
    _, (group, _) = _whole_program(frozen)
    graph_def, outputs = xy_op.rewrite(frozen.graph_def, [group], frozen.outputs)
    x = np.zeros((2, 3, 4), np.float32)
    x[:, :2, :2] = [[[1, 2], [3, 4]], [[0, 0], [0, 1]]]
    np.testing.assert_array_equal(_run(graph_def, frozen, outputs, x)[0], [[11.0], [0.0]])


def test_what_a_program_cannot_express_is_named():
    def batch_sum(x):
        return tf.reduce_sum(x * 2.0, axis=0, keepdims=True) + x

    frozen = _frozen(batch_sum, [None, 4])
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    nodes = [n.name for n in graph.nodes.values() if n.op in ("Mul", "Sum", "AddV2")]
    group, reason = row_groups.row_spec(graph, _topo(graph, nodes), frozen.outputs)
    assert group is None and "is not [rows (unknown), static...]" in reason  # [1, 4]: no rows

    def cast(x):
        return tf.cast(tf.reduce_sum(x, axis=1), tf.int32)

    frozen = _frozen(cast, [None, 4])
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    nodes = [n.name for n in graph.nodes.values() if n.op in ("Sum", "Cast")]
    group, reason = row_groups.row_spec(graph, _topo(graph, nodes), frozen.outputs)
    assert group is None and "Cast has no row form" in reason


def test_a_piece_that_would_close_a_cycle_is_left():
    """``a = sum(x)``; ``y = a * f(a)`` with ``f`` a cast round trip (not expressible): as one
    node, {Sum, Mul} would feed the casts and read them back."""

    def through_cast(x):
        a = tf.reduce_sum(x, axis=1, keepdims=True)
        back = tf.cast(tf.cast(a, tf.int32), tf.float32)
        return a * back

    def direct(x):
        a = tf.reduce_sum(x, axis=1, keepdims=True)
        return a * a

    for fn, pieces in ((through_cast, 0), (direct, 1)):
        frozen = _frozen(fn, [None, 4])
        graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
        nodes = _topo(graph)
        assert len(row_groups.expressible_parts(graph, nodes, frozen.outputs)) == pieces


def test_spec_validation():
    with pytest.raises(ValueError, match="needs a batched input"):
        RowSpec(((False, (4,)),), (RowValue("Neg", (0,), (4,)),), (0,))
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(4,\)"):
        RowSpec(((True, (4,)),), (RowValue("Neg", (0,), (3,)),), (0,))
    with pytest.raises(ValueError, match="MAX_ROW_FLOATS"):
        RowSpec(((True, (100, 200)),), (RowValue("Neg", (0,), (100, 200)),), (0,))
    assert row_def.broadcast((3, 1), (4,)) == (3, 4)
    assert row_def.broadcast((3,), (4,)) is None


def test_the_fm_model_serves_its_pairwise_term_as_one_op(tmp_path):
    """The FM model's serving signature as the server realizes it (``generated``): the FM
    term becomes one row program (a group of its own, or a piece of the lookups' concat
    group, as the plan has it); same scores."""
    need_compiler()
    from features.dataset import make_dataset
    from pipelines.export import export_saved_model

    model, schema, files = tiny_dcn_v2(tmp_path, model_type="fm")
    path = export_saved_model(model, schema, tmp_path / "saved_model")
    loaded = tf.saved_model.load(str(path))
    fn = loaded.signatures["serving_default"]
    realized = realize.generated_loops(fn, HAND, 256)
    assert realized.rows == 1, realized.left
    raw = next(iter(make_dataset(schema, files, batch_size=33)))
    features = {k: v for k, v in raw.items() if k in fn.structured_input_signature[1]}
    want = fn(**features)
    got = realized.fused(*[features[k] for k in sorted(features)])
    got = dict(zip(sorted(want), got, strict=True)) if not isinstance(got, dict) else got
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k].numpy(), rtol=1e-5, atol=1e-6)

    # as the server runs it: with and without the row program, the faster kept at warm-up
    from compiler_opt.fused_signature import FusedSignature, FusionSpec

    fused = FusedSignature(fn, FusionSpec(realization="generated", plan_batch=64), HAND)
    assert {"epilogues_to_matmul", "no_row_programs"} <= set(fused._candidates)
    fused.warmup({k: v.numpy() for k, v in features.items()})
    d = fused.describe()
    assert d["choice"] in d["timings_ms"] and d["row_programs"] == (
        0 if d["choice"] == "no_row_programs" else 1
    )
    served = fused(features)
    for k in want:
        np.testing.assert_allclose(served[k].numpy(), want[k].numpy(), rtol=1e-5, atol=1e-6)


def test_the_cuda_form_runs_the_same_program(tmp_path):
    need_compiler()
    if toolchain.nvcc() is None:
        if os.environ.get("STITCHREC_REQUIRE_NVCC"):
            pytest.fail("STITCHREC_REQUIRE_NVCC is set but nvcc was not found")
        pytest.skip("no nvcc")
    frozen = _frozen(reductions, [None, 3, 6])  # a spec no other test loads without CUDA
    _, (group, _) = _whole_program(frozen)
    spec = group.spec
    old = {k: os.environ.get(k) for k in ("STITCHREC_CUDA", "STITCHREC_CACHE")}
    os.environ.update({"STITCHREC_CUDA": "1", "STITCHREC_CACHE": str(share_kernels(tmp_path))})
    try:
        name = row_groups.load(spec)
        assert registry.has_gpu_kernel(name)
        x = np.random.default_rng(1).normal(size=(9, 3, 6)).astype(np.float32)
        nodes = {n.name: n for n in frozen.graph_def.node}
        inputs = []
        for ref in group.input_refs:  # the argument, or a constant of the graph
            node = nodes[ref.split(":")[0]]
            while node.op == "Identity":
                node = nodes[node.input[0].split(":")[0]]
            is_arg = node.op == "Placeholder"
            inputs.append(x if is_arg else tf.make_ndarray(node.attr["value"].tensor))
        want = registry.op_function(name)([tf.constant(v) for v in inputs], M=len(spec.outputs))
        got = row_cuda.run_row_on_host(row_groups.library_path(spec), spec, inputs, 9)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    for w, g in zip(want, got, strict=True):
        assert not np.isnan(g).any()
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-7)


def test_precompile_builds_a_graphs_libraries_side_by_side(tmp_path, monkeypatch):
    """``registry.precompile`` (called by ``xy_op.rewrite``) compiles the missing libraries of a
    loop op and a row program concurrently; loading them afterwards compiles nothing. They are
    compiled as users compile them (no ``$STITCHREC_CXX_PCH``): with the tests' precompiled
    header, the same source gives the same library, byte for byte."""
    need_compiler()
    pch = os.environ.get(toolchain.PCH_ENV)
    monkeypatch.delenv(toolchain.PCH_ENV, raising=False)
    monkeypatch.setenv("STITCHREC_CACHE", str(tmp_path))
    loop = loop_def.LoopSpec(width=6, inputs=("full",), body=(("Neg", (0,)),), outputs=(0,))
    row = RowSpec(((True, (2, 6)),), (RowValue("Sum", (0,), (6,), (0,)),), (0,))
    registry.precompile([(loop, loop_groups.LOOP), (row, row_groups.ROW)])
    plain = toolchain.compile_kernel(loop_cpu.generate(loop))
    assert not plain.compiled
    assert not toolchain.compile_kernel(row_cpu.generate(row)).compiled
    if pch:  # compiled again where it was (its path is in the library: ``__FILE__``)
        users = plain.path.read_bytes()
        plain.path.unlink()
        monkeypatch.setenv(toolchain.PCH_ENV, pch)
        with_pch = toolchain.compile_kernel(loop_cpu.generate(loop))
        assert with_pch.compiled and with_pch.path == plain.path
        assert with_pch.path.read_bytes() == users
    bad = RowSpec(((True, (3,)),), (RowValue("Sum", (0,), (), (0,)),), (0,))
    monkeypatch.setattr(row_cpu, "generate", lambda spec, cuda=False: "not C++")
    with pytest.raises(toolchain.CompilerUnavailable, match="failed"):  # beside a cached one
        registry.precompile([(bad, row_groups.ROW), (loop, loop_groups.LOOP)])
