"""Loop ops from the IR: a planned group read out as a ``LoopSpec`` (:func:`loop_spec`), the
matmul feeding it taken in (:func:`attach_matmuls`); their registry entry and loading."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tensorflow.core.framework import graph_pb2

import compiler_opt.registry as registry
from compiler_opt.graph_io import canonical_ref
from compiler_opt.ir import Graph, split_ref
from compiler_opt.loop_op import cpu as loop_cpu
from compiler_opt.loop_op import cuda as loop_cuda
from compiler_opt.loop_op.spec import LoopSpec
from compiler_opt.xy_op import OPS, LoopGroup


def _sources(spec: LoopSpec, cuda: bool) -> tuple[str, str | None]:
    return loop_cpu.generate(spec, cuda=cuda), loop_cuda.loop_source(spec) if cuda else None


#: the registry's entry for loop ops
LOOP = registry.OpKind("loop", _sources, loop_cuda.loop_unsupported)


def load(spec: LoopSpec) -> str:
    """Compiles (or finds in the cache) and loads loop op ``spec``; returns its name."""
    return registry.load(spec, LOOP).name


def library_path(spec: LoopSpec) -> str:
    """The path of the library :func:`load` loads for ``spec`` (compiled when absent)."""
    return str(registry.compile_op(spec, LOOP)[0].path)


def _compatible(a: Sequence[int | None], b: Sequence[int | None]) -> bool:
    """Same rank, and every dimension equal or unknown in one of them."""
    return len(a) == len(b) and all(
        x is None or y is None or x == y for x, y in zip(a, b, strict=True)
    )


def _column_squeeze(graph: Graph, node: Any) -> bool:
    """``node`` is a ``StridedSlice`` taking ``[rows, 1] -> [rows]`` with constant begin, end
    and strides (a head's ``logits[:, 0]``). With as many elements out as in (checked when the
    op runs: its input is a ``full`` one), it can only be every row's one value: the identity."""
    x, out = graph.tensor(node.inputs[0]).shape, node.outputs[0].shape
    consts = all(graph[split_ref(r)[0]].op == "Const" for r in node.inputs[1:])
    return (
        consts and x is not None and out is not None and len(x) == 2 and x[1] == 1 and len(out) == 1
    )


def loop_spec(
    graph: Graph, nodes: Sequence[str], outputs: Sequence[str] = ()
) -> tuple[LoopGroup | None, str]:
    """The ``LoopGroup`` of ``nodes`` (a planned group, topological order) in ``graph``, or
    ``(None, reason)`` when the group is not an elementwise float32 program over one
    ``[rows, width]`` shape. ``outputs``: the graph's result tensors (read outside the group)."""
    if not nodes:
        return None, "empty group"
    inside = set(nodes)
    shape: tuple[int | None, ...] = ()
    for i, n in enumerate(nodes):
        node = graph[n]
        if node.op == "StridedSlice":
            if not _column_squeeze(graph, node):
                return None, f"{n}: StridedSlice other than x[:, 0] of a [rows, 1] column"
        elif node.op not in OPS:
            return None, f"{n}: op {node.op} has no generated form"
        if len(node.outputs) != 1 or node.outputs[0].dtype != "float32":
            return None, f"{n}: not one float32 output"
        s = node.outputs[0].shape
        if s is None or len(s) < 1 or any(d is None for d in s[1:]):
            return None, f"{n}: output shape {s} is not [rows, static...]"
        if i == 0:
            shape = tuple(s)
        elif tuple(s) != shape:
            return None, f"{n}: output shape {s} differs from the group's {shape}"
    width = 1
    for d in shape[1:]:
        width *= int(d)
    value_of: dict[str, int] = {}
    kinds: list[str] = []
    input_refs: list[str] = []
    body_ops: list[tuple[str, list[tuple[str, int]]]] = []  # operand: ("in"|"body", index)
    for n in nodes:
        node = graph[n]
        operands: list[tuple[str, int]] = []
        squeeze = node.op == "StridedSlice"  # x[:, 0] of [rows, 1]: the identity on the data
        for ref in node.inputs[:1] if squeeze else node.inputs:
            if split_ref(ref)[0] in inside:
                operands.append(("body", nodes.index(split_ref(ref)[0])))
                continue
            ref = canonical_ref(ref)
            info = graph.tensor(ref)
            s = info.shape
            if info.dtype != "float32" or s is None:
                return None, f"{n}: input {ref} is {info.dtype} of shape {s}"
            if _compatible(s[:1] if squeeze else s, shape):  # unknown dims: checked at run
                kind = "full"
            elif len(s) == 1 and s[0] == width and len(shape) == 2:
                kind = "row"
            elif all(d == 1 for d in s):
                kind = "scalar"
            else:
                return None, f"{n}: input {ref} of shape {s} does not broadcast as full/row/scalar"
            if ref not in value_of:
                value_of[ref] = len(input_refs)
                input_refs.append(ref)
                kinds.append(kind)
            operands.append(("in", value_of[ref]))
        body_ops.append(("Identity" if squeeze else node.op, operands))
    if "full" not in kinds:
        return None, "no input of the result's shape"
    n_in = len(input_refs)
    body = tuple(
        (op, tuple(k if src == "in" else n_in + k for src, k in ops)) for op, ops in body_ops
    )
    results = {canonical_ref(r) for r in outputs}
    out_values = []
    for i, n in enumerate(nodes):
        readers = [c for c in graph.consumers(n) if c not in inside]
        if readers or f"{n}:0" in results:
            out_values.append(i)
    controls = sorted({c for n in nodes for c in graph[n].control_inputs if c not in inside})
    spec = LoopSpec(width, tuple(kinds), body, tuple(out_values), tuple(int(d) for d in shape[1:]))
    return (
        LoopGroup(
            spec, list(nodes), input_refs, [f"{nodes[i]}:0" for i in out_values], controls, LOOP
        ),
        "",
    )


def attach_matmuls(
    graph: Graph,
    graph_def: graph_pb2.GraphDef,
    groups: Sequence[LoopGroup],
    outputs: Sequence[str] = (),
) -> tuple[list[LoopGroup], int]:
    """``groups`` with the matmul that feeds each one (if any) moved inside its op: the first
    ``full`` input that is ``MatMul(A, W)`` or ``BiasAdd(MatMul(A, W), b)``, with ``W`` a
    constant ``[k, width]`` (no transposes) and ``b`` a constant ``[width]``, whose result only
    the group reads, becomes ``LoopSpec.matmul``: the op contracts ``A W`` into its output
    buffer (Eigen's GEMM, one block of rows per task on TensorFlow's CPU thread pool) and runs
    the elementwise program over each block while its rows are in the cache, so a DCN-v2 cross layer ``x0 * (x W + b) + x`` or a
    head ``sigmoid(h w + b)`` is one op instead of two. Returns the groups and how many
    took a matmul."""
    defs = {n.name: n for n in graph_def.node}
    results = {canonical_ref(r) for r in outputs}

    def only_read_by(name: str, readers: set[str]) -> bool:
        cons = graph.consumers(name)
        return bool(cons) and set(cons) <= readers and f"{name}:0" not in results

    def const_shape(ref: str) -> tuple[int | None, ...] | None:
        """The static shape of ``ref`` when it is a constant (through ``Identity`` nodes: a
        frozen variable read), else None."""
        node = graph[split_ref(ref)[0]]
        while node.op == "Identity" and node.inputs:
            node = graph[split_ref(node.inputs[0])[0]]
        shape = graph.tensor(ref).shape
        return tuple(shape) if node.op == "Const" and shape is not None else None

    out, attached = [], 0
    for g in groups:
        spec = g.spec
        if g.kind is not LOOP or spec.matmul is not None:
            out.append(g)
            continue
        if spec.dims is None or len(spec.dims) > 1:
            out.append(g)
            continue
        inside = set(g.nodes)
        found = None
        for slot, (kind, ref) in enumerate(zip(spec.inputs, g.input_refs, strict=True)):
            if kind != "full" or split_ref(ref)[1] != 0:
                continue
            node, taken, bias = graph[split_ref(ref)[0]], [], None
            if node.op == "BiasAdd":
                if const_shape(node.inputs[1]) != (spec.width,):
                    continue
                if not only_read_by(node.name, inside):
                    continue
                bias, taken = canonical_ref(node.inputs[1]), [node.name]
                node = graph[split_ref(node.inputs[0])[0]]
            nd = defs.get(node.name)
            if node.op != "MatMul" or nd is None or split_ref(node.inputs[0])[0] in inside:
                continue
            if nd.attr["transpose_a"].b or nd.attr["transpose_b"].b:
                continue
            if not only_read_by(node.name, set(taken) or inside):
                continue
            w = const_shape(node.inputs[1])
            a = graph.tensor(node.inputs[0]).shape
            if w is None or len(w) != 2 or w[1] != spec.width or w[0] is None:
                continue
            if a is None or len(a) != 2 or a[1] != w[0]:
                continue
            found = (slot, node, taken, bias, int(w[0]))
            break
        if found is None:
            out.append(g)
            continue
        slot, node, taken, bias, k = found
        refs = list(g.input_refs)
        refs[slot] = canonical_ref(node.inputs[0])
        refs.append(canonical_ref(node.inputs[1]))
        if bias is not None:
            refs.append(bias)
        controls = sorted(
            set(g.control_inputs)
            | {c for n in [node.name, *taken] for c in graph[n].control_inputs}
        )
        new_spec = dataclasses.replace(spec, matmul=(slot, k, bias is not None))
        out.append(
            LoopGroup(new_spec, [node.name, *taken, *g.nodes], refs, g.output_refs, controls, LOOP)
        )
        attached += 1
    return out, attached
