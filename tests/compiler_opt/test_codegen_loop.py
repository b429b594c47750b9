"""Generated loop ops: the spec's checks, the op against NumPy, a planned serving graph with its
elementwise groups generated (outputs equal), the matmul epilogue rule, and freezing a graph
that reads tables through the embedding kernel's handles."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt import gemm, graph_io, ir, planner, realize, registry, toolchain
from compiler_opt.embedding_op import layer as emb_layer
from compiler_opt.loop_op import cpu as loop_cpu
from compiler_opt.loop_op import groups as loop_groups
from compiler_opt.loop_op.spec import LoopSpec
from tests.compiler_opt.conftest import SHARED_KERNELS, need_compiler


def _op(spec: LoopSpec):
    name = loop_groups.load(spec)
    return registry.op_function(name)


def test_spec_rejects_what_it_cannot_generate():
    with pytest.raises(ValueError, match="width must be >= 1"):
        LoopSpec(0, ("full",), (("Relu", (0,)),), (0,))
    with pytest.raises(ValueError, match="at least one 'full'"):
        LoopSpec(4, ("row",), (("Relu", (0,)),), (0,))
    with pytest.raises(ValueError, match="op 'Erf' is not one of"):
        LoopSpec(4, ("full",), (("Erf", (0,)),), (0,))
    with pytest.raises(ValueError, match="Mul takes 2 operands"):
        LoopSpec(4, ("full",), (("Mul", (0,)),), (0,))
    with pytest.raises(ValueError, match=r"operands \(0, 1\) out of range"):
        LoopSpec(4, ("full",), (("Mul", (0, 1)),), (0,))
    with pytest.raises(ValueError, match="outputs"):
        LoopSpec(4, ("full",), (("Relu", (0,)),), (1,))
    with pytest.raises(ValueError, match=r"matmul \(1, 3, False\): needs a 'full' input"):
        LoopSpec(4, ("full", "row"), (("Mul", (0, 1)),), (0,), (4,), matmul=(1, 3, False))


def test_generated_op_computes_the_program_with_row_and_scalar_broadcasts():
    need_compiler()
    # v3 = x0 * x1 (full * row); v4 = v3 + x2 (scalar); v5 = relu(v4); outputs v3 and v5
    spec = LoopSpec(
        3,
        ("full", "row", "scalar"),
        (("Mul", (0, 1)), ("AddV2", (3, 2)), ("Relu", (4,))),
        (0, 2),
    )
    x = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
    w = np.array([2.0, 1.0, -1.0], np.float32)
    c = np.array(-1.5, np.float32)
    prod, out = _op(spec)([x, w, c], M=2)
    np.testing.assert_array_equal(prod.numpy(), [[2.0, -2.0, -3.0], [1.0, 4.0, 1.0]])
    np.testing.assert_array_equal(out.numpy(), [[0.5, 0.0, 0.0], [0.0, 2.5, 0.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input 1 \(row\) has 2 elements"):
        _op(spec)([x, w[:2], c], M=2)


def _model_fn():
    """An MLP layer and a cross layer: ``h = relu(W1 x + b1)``, ``y = x * (W2 h + b2) + x``,
    with ``W2 h`` a result too."""
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.normal(size=(6, 6)).astype(np.float32))
    b1 = tf.constant(rng.normal(size=6).astype(np.float32))
    w2 = tf.Variable(rng.normal(size=(6, 6)).astype(np.float32))
    b2 = tf.Variable(rng.normal(size=6).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
    def f(x):
        h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w1), b1))
        m = tf.matmul(h, w2)
        y = x * tf.nn.bias_add(m, b2) + x
        return {"y": tf.sigmoid(y) * 2.0 - 1.0, "m": m}

    return f, (w2, b2)


def test_planner_leaves_matmul_epilogues_to_the_matmul(hand):
    f, _ = _model_fn()
    frozen = realize.freeze(f.get_concrete_function())
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    epilogues = planner.runtime_epilogues(graph)
    ops = sorted(graph[n].op for n in epilogues)
    # relu(bias_add(matmul)) of the first layer; the second matmul has two readers (W2 h is a
    # result and feeds the bias): the remapper cannot fold its BiasAdd, which then may be fused
    assert ops == ["BiasAdd", "Relu"]
    p = planner.plan(graph, hand, 64)
    grouped = {n for g in p.groups for n in g.nodes}
    assert not grouped & set(epilogues)
    assert p.summary()["matmul_epilogues"] == 2
    p_all = planner.plan(graph, hand, 64, epilogues=False)
    assert p_all.summary()["matmul_epilogues"] == 0


def test_generated_loops_equal_the_frozen_graph(hand):
    need_compiler()
    f, _ = _model_fn()
    r = realize.generated_loops(f.get_concrete_function(), hand, 64)
    assert r.loops >= 1
    kinds = {n.op for n in r.tagged.node}
    assert any(op.startswith("StitchrecLoop") for op in kinds)
    # relu(bias_add(matmul)): the epilogue the plan left to the matmul is folded into it
    fused_mm = [n for n in r.tagged.node if n.op == "_FusedMatMul"]
    assert [list(n.attr["fused_ops"].list.s) for n in fused_mm] == [[b"BiasAdd", b"Relu"]]
    assert "Relu" not in kinds
    for rows in (1, 7, 300):  # shape-generic: any batch size, no padding
        x = np.random.default_rng(rows).normal(size=(rows, 6)).astype(np.float32)
        want = r.unfused(x)
        got = r.fused(x)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)


def test_a_group_with_an_op_without_generated_form_is_left_and_said_why(hand):
    need_compiler()

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def f(x):
        return tf.math.erf(x * 2.0) + x

    r = realize.generated_loops(f.get_concrete_function(), hand, 64)
    assert r.loops == 0
    assert any("Erf has no generated form" in why for why in r.left.values())
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(r.fused(x)[0].numpy(), r.unfused(x)[0].numpy())


def test_freeze_keeps_the_handles_a_generated_embedding_kernel_reads():
    need_compiler()
    from embeddings.collection import EmbeddingCollection

    coll = EmbeddingCollection(
        [{"name": "a", "num_rows": 5, "dim": 2}, {"name": "b", "num_rows": 3, "dim": 2}]
    )
    ids = {"a": tf.constant([0, 4, 2], tf.int64), "b": tf.constant([1, 1, 2], tf.int64)}
    coll(ids)
    block, kernel = emb_layer.fused_block(coll, ids, dense_dim=0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)])
    def f(a, b):
        return emb_layer.fused_concat(block, kernel, {"a": a, "b": b}, None) * 2.0

    concrete = f.get_concrete_function()
    assert len(realize.handles_kept(concrete)) == 2  # both tables, read by the kernel
    frozen = realize.freeze(concrete)
    assert len(frozen.bound) == 2
    fn = graph_io.load_graph_def(frozen.graph_def, frozen.inputs, frozen.outputs, frozen.bound)
    got = fn(ids["a"], ids["b"])[0].numpy()
    want = 2.0 * tf.concat(list(coll(ids).fields().values()), axis=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    coll.layers_by_field["a"].table.assign_add(tf.ones([5, 2]))  # read live, not frozen
    np.testing.assert_allclose(fn(ids["a"], ids["b"])[0].numpy()[:, :2], want[:, :2] + 2.0)


def test_a_head_column_squeeze_is_generated_and_keeps_the_result_shape(hand):
    need_compiler()
    rng = np.random.default_rng(1)
    w = tf.constant(rng.normal(size=(5, 1)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32)])
    def f(x):  # a head: logits [rows, 1] -> [rows], plus a bias, then the probability
        return tf.sigmoid(tf.matmul(x, w)[:, 0] + 0.25)

    r = realize.generated_loops(f.get_concrete_function(), hand, 64)
    assert r.loops == 1, r.left
    for rows in (1, 9):
        x = rng.normal(size=(rows, 5)).astype(np.float32)
        got, want = r.fused(x)[0], r.unfused(x)[0]
        assert got.shape == (rows,)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32)])
    def g(x):  # x[:, 1] of a wider matrix is not a squeeze: left, and said why
        return tf.sigmoid(x[:, 1] + 0.25)

    r = realize.generated_loops(g.get_concrete_function(), hand, 64)
    assert r.loops == 0
    assert any("StridedSlice other than x[:, 0]" in why for why in r.left.values())


def test_a_loop_op_takes_the_matmul_that_feeds_it(hand):
    """A cross layer ``x * (x W + b) + x`` and a head ``sigmoid(y w)[:, 0] + c``: each loop op
    takes its matmul (and bias): 2 ops where there were 4."""
    need_compiler()
    rng = np.random.default_rng(2)
    w = tf.constant(rng.normal(size=(6, 6)).astype(np.float32))
    b = tf.constant(rng.normal(size=6).astype(np.float32))
    wh = tf.constant(rng.normal(size=(6, 1)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32)])
    def f(x):
        y = x * tf.nn.bias_add(tf.matmul(x, w), b) + x
        return tf.sigmoid(tf.matmul(y, wh)[:, 0] + 0.5)

    r = realize.generated_loops(f.get_concrete_function(), hand, 64)
    assert (r.loops, r.matmuls) == (2, 2), r.left
    ops = [n.op for n in r.tagged.node]
    assert not {"MatMul", "_FusedMatMul", "BiasAdd"} & set(ops)
    assert sum(op.startswith("StitchrecLoop") for op in ops) == 2
    for rows in (1, 7, 300):
        x = rng.normal(size=(rows, 6)).astype(np.float32)
        got, want = r.fused(x)[0].numpy(), r.unfused(x)[0].numpy()
        assert got.shape == (rows,)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    off = realize.generated_loops(f.get_concrete_function(), hand, 64, matmuls=False)
    assert off.matmuls == 0 and "_FusedMatMul" in {n.op for n in off.tagged.node}


def test_matmul_ops_link_one_gemm_library_and_load_from_wherever_their_folder_lies(tmp_path):
    """Two ops with a matmul call the GEMM's library, built once; their sources instantiate no
    Eigen product; copied to another folder (the first one gone), the libraries still load."""
    need_compiler()
    specs = (
        LoopSpec(4, ("full", "full"), (("Mul", (0, 1)),), (0,), (4,), matmul=(1, 3, False)),
        LoopSpec(4, ("full", "full"), (("AddV2", (0, 1)),), (0,), (4,), matmul=(1, 5, True)),
    )
    libs = [toolchain.compile_kernel(loop_cpu.generate(s), SHARED_KERNELS) for s in specs]
    shared = toolchain.compile_kernel(gemm.SOURCE, SHARED_KERNELS)
    assert not shared.compiled  # the first op built it
    readelf = shutil.which("readelf")  # binutils, beside g++
    if readelf is not None:  # named by its file name however it was first built
        dynamic = subprocess.run([readelf, "-d", str(shared.path)], capture_output=True, text=True)
        assert f"Library soname: [{shared.path.name}]" in dynamic.stdout
    for lib in libs:
        source = (SHARED_KERNELS / f"{lib.key}.cc").read_text()
        assert gemm.SYMBOL in source and "Eigen" not in source
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for lib in (*libs, shared):
        shutil.copy(lib.path, moved / lib.path.name)
    framework = next(Path(tf.sysconfig.get_lib()).glob("libtensorflow_framework.so*"))
    load = (
        "import ctypes, sys\n"
        "ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)\n"
        "for path in sys.argv[2:]:\n"
        "    ctypes.CDLL(path)\n"
    )
    args = [sys.executable, "-c", load, str(framework), *(str(moved / x.path.name) for x in libs)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (moved / shared.path.name).unlink()  # without the GEMM's library beside them: not found
    r = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0 and shared.path.name in r.stderr
