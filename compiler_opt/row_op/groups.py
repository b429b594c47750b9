"""Row programs from the IR: a planned group read out as a ``RowSpec`` (:func:`row_spec`),
the expressible pieces of a group (:func:`expressible_parts`); their registry entry and loading."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import compiler_opt.registry as registry
from compiler_opt.graph_io import canonical_ref
from compiler_opt.ir import Graph, split_ref
from compiler_opt.row_op import cpu as row_cpu
from compiler_opt.row_op import cuda as row_cuda
from compiler_opt.row_op.spec import REDUCTIONS, VIEWS, RowSpec, RowValue
from compiler_opt.xy_op import OPS, LoopGroup


def _sources(spec: RowSpec, cuda: bool) -> tuple[str, str | None]:
    return row_cpu.generate(spec, cuda=cuda), row_cuda.row_source(spec) if cuda else None


def _always(spec: RowSpec) -> None:
    """Every row program has a CUDA form."""
    return None


#: the registry's entry for row programs
ROW = registry.OpKind("row", _sources, _always)


def load(spec: RowSpec) -> str:
    """Compiles (or finds in the cache) and loads row program ``spec``; returns its name."""
    return registry.load(spec, ROW).name


def library_path(spec: RowSpec) -> str:
    """The path of the library :func:`load` loads for ``spec`` (compiled when absent)."""
    return str(registry.compile_op(spec, ROW)[0].path)


def _data_inputs(node: Any) -> list[str]:
    """The node's data operands (a reduction's axes, a reshape's shape are not data)."""
    if node.op in REDUCTIONS or node.op in ("Reshape", "ExpandDims"):
        return node.inputs[:1]
    return list(node.inputs)


def row_spec(
    graph: Graph, nodes: Sequence[str], outputs: Sequence[str] = ()
) -> tuple[LoopGroup | None, str]:
    """The group of ``nodes`` (a planned group, topological order) as a ``LoopGroup`` whose
    spec is a ``RowSpec``, or ``(None, reason)``. ``outputs``: the graph's result tensors."""
    if not nodes:
        return None, "empty group"
    members = list(nodes)
    inside = set(members)
    # views between members (free ops: not in the plan's node list) join the program
    for n in list(members):
        for ref in _data_inputs(graph[n]):
            chain, p = [], graph[split_ref(ref)[0]]
            while p.op in VIEWS and p.name not in inside and p.inputs:
                chain.append(p.name)
                p = graph[split_ref(p.inputs[0])[0]]
            if chain and p.name in inside:  # _topological orders the members below
                for c in chain:
                    if c not in inside:
                        inside.add(c)
                        members.append(c)
    order = _topological(graph, members)
    value_of: dict[str, int] = {}  # input ref -> input index
    inputs: list[tuple[bool, tuple[int, ...]]] = []
    input_refs: list[str] = []
    body: list[tuple[str, list[tuple[str, int]], tuple[int, ...], tuple[int, ...]]] = []
    for n in order:
        node = graph[n]
        if not (
            node.op in OPS or node.op in REDUCTIONS or node.op in VIEWS or node.op == "Softmax"
        ):
            return None, f"{n}: op {node.op} has no row form"
        if len(node.outputs) != 1 or node.outputs[0].dtype != "float32":
            return None, f"{n}: not one float32 output"
        s = node.outputs[0].shape
        if s is None or len(s) < 1 or s[0] is not None or any(d is None for d in s[1:]):
            return None, f"{n}: output shape {s} is not [rows (unknown), static...]"
        rank = len(s)
        axes: tuple[int, ...] = ()
        if node.op in REDUCTIONS:
            graph_axes = node.attrs.get("axes")
            if graph_axes is None or 0 in graph_axes:
                return None, f"{n}: {node.op} over axes {graph_axes}: not constant non-batch axes"
            axes = tuple(a - 1 for a in graph_axes)
        if node.op == "Softmax":
            axes = (rank - 2,)
        operands: list[tuple[str, int]] = []
        for ref in _data_inputs(node):
            if split_ref(ref)[0] in inside:
                operands.append(("body", order.index(split_ref(ref)[0])))
                continue
            ref = canonical_ref(ref)
            info = graph.tensor(ref)
            shape = info.shape
            if info.dtype != "float32" or shape is None or any(d is None for d in shape[1:]):
                return None, f"{n}: input {ref} is {info.dtype} of shape {shape}"
            if shape and shape[0] is None:
                entry = (True, tuple(int(d) for d in shape[1:]))
            elif len(shape) >= rank:  # a constant with a leading 1 in the batch's place
                if len(shape) > rank or shape[0] != 1:
                    return None, f"{n}: input {ref} of shape {shape} has a batch dim of its own"
                entry = (False, tuple(int(d) for d in shape[1:]))
            else:
                entry = (False, tuple(int(d) for d in shape))
            if ref not in value_of:
                value_of[ref] = len(input_refs)
                input_refs.append(ref)
                inputs.append(entry)
            operands.append(("in", value_of[ref]))
        body.append((node.op, operands, tuple(int(d) for d in s[1:]), axes))
    n_in = len(inputs)
    values = tuple(
        RowValue(op, tuple(k if src == "in" else n_in + k for src, k in ops), shape, axes)
        for op, ops, shape, axes in body
    )
    results = {canonical_ref(r) for r in outputs}
    out_values = [
        i
        for i, n in enumerate(order)
        if any(c not in inside for c in graph.consumers(n)) or f"{n}:0" in results
    ]
    try:
        spec = RowSpec(tuple(inputs), values, tuple(out_values))
    except ValueError as e:
        return None, str(e)
    controls = sorted({c for n in order for c in graph[n].control_inputs if c not in inside})
    group = LoopGroup(spec, order, input_refs, [f"{order[i]}:0" for i in out_values], controls, ROW)
    return group, ""


def expressible(graph: Graph, name: str) -> bool:
    """Whether node ``name`` can be a value of a row program on its own terms (its op, one
    float32 output ``[rows (unknown), static...]``; its operands are checked by :func:`row_spec`)."""
    node = graph[name]
    if not (node.op in OPS or node.op in REDUCTIONS or node.op == "Softmax"):
        return False
    if len(node.outputs) != 1 or node.outputs[0].dtype != "float32":
        return False
    s = node.outputs[0].shape
    return s is not None and len(s) >= 1 and s[0] is None and all(d is not None for d in s[1:])


def _view_source(graph: Graph, ref: str) -> str:
    """The node behind ``ref``, seen through views (``VIEWS``)."""
    p = graph[split_ref(ref)[0]]
    while p.op in VIEWS and p.inputs:
        p = graph[split_ref(p.inputs[0])[0]]
    return p.name


def _reaches(graph: Graph, start: set[str], targets: set[str]) -> bool:
    """Whether a path of data or control edges leads from a node of ``start`` to ``targets``."""
    seen, stack = set(start), list(start)
    while stack:
        for c in graph.consumers(stack.pop()):
            if c in targets:
                return True
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return False


def expressible_parts(
    graph: Graph, nodes: Sequence[str], outputs: Sequence[str] = (), min_size: int = 2
) -> list[LoopGroup]:
    """The row programs inside a planned group that cannot be generated whole (a ``concat``
    group with its gathers, a group with a cast): its expressible nodes split into connected
    pieces (through views too), each of at least ``min_size`` nodes, holding a reduction or
    softmax, that :func:`row_spec` accepts and that leaves the graph acyclic once it is one
    node (no path leaves the piece and comes back into it)."""
    ok = [n for n in nodes if expressible(graph, n)]
    members = set(ok)
    parent = {n: n for n in ok}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in ok:
        for ref in graph[n].inputs:
            src = _view_source(graph, ref)
            if src in members:
                parent[find(n)] = find(src)
    pieces: dict[str, list[str]] = {}
    for n in ok:  # ``nodes`` is in topological order, and so is each piece
        pieces.setdefault(find(n), []).append(n)
    out = []
    for piece in pieces.values():
        if len(piece) < min_size:
            continue
        if not any(graph[n].op in REDUCTIONS or graph[n].op == "Softmax" for n in piece):
            continue  # elementwise only: the loop ops' domain (planned as loop groups)
        inside = set(piece)
        exits = {c for n in piece for c in graph.consumers(n) if c not in inside}
        if _reaches(graph, exits, inside):
            continue
        group, _ = row_spec(graph, piece, outputs)
        if group is not None:
            out.append(group)
    return out


def _topological(graph: Graph, members: list[str]) -> list[str]:
    """``members`` in an order where every member follows the members it reads."""
    inside, done, out = set(members), set(), []

    def visit(n: str) -> None:
        if n in done:
            return
        done.add(n)
        for ref in graph[n].inputs:
            p = split_ref(ref)[0]
            if p in inside:
                visit(p)
        out.append(n)

    for n in members:
        visit(n)
    return out
