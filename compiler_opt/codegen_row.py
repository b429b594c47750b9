"""Generated ops for the planner's ``input`` and ``stitch`` groups: row programs with reductions.

A planned ``stitch`` group holds a row reduction (over non-batch axes: one result per example)
and its consumers, an ``input`` group ends in one; LayerNorm, softmax and DeepFM's FM term
``0.5 * sum_d((sum_f v)^2 - sum_f v^2)`` are such groups. TensorFlow runs them as one op per
node, each reading and writing whole tensors; FusionStitching runs each group as one kernel
that keeps an example's intermediate values on chip. Here a group becomes one TensorFlow op
(CPU, and GPU through ``codegen_cuda``) that runs the group's program **one example (row) at a
time**, every intermediate value of the row in a small local array (compile-time sizes: at
most ``MAX_ROW_FLOATS`` floats per row), so only the group's inputs and outputs touch memory:

* :func:`row_spec` reads a group out of the IR: inputs (``batched`` ``[rows, *shape]``, or
  constant, broadcast against the row as NumPy does), and per node a value with its row
  shape: an elementwise op of ``codegen_loop.OPS`` (NumPy broadcasting between row shapes),
  a reduction (``Sum``, ``Mean``, ``Max``, ``Min``, ``Prod`` over constant non-batch axes, with
  or without kept dims), ``Softmax`` (last axis), or a view (``Reshape``, ``ExpandDims``,
  ``Squeeze``, ``Identity`` between members of the group, absorbed from outside the plan's
  node list since the planner counts them as free). A group it cannot express gives a reason.
* :func:`generate` writes the op: rows split over TensorFlow's CPU thread pool; per row each
  value is a loop over its (static) shape, operands indexed with broadcast strides, a
  reduction an accumulator array; the outputs copied out at the end of the row.
* ``load`` (``codegen_loop``'s, one registry for both kinds of op) compiles it
  (``codegen.compile_kernel``) and loads it; ``codegen_loop.rewrite`` puts one node of it in
  place of the group's nodes.

The op has no gradient: serving graphs only (as the loop ops).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

from compiler_opt import codegen_cuda
from compiler_opt.codegen_loop import (  # one registry of loaded ops for loop and row ops
    OPS,
    LoopGroup,
    _canon,
    has_gpu_kernel,
    library_path,
    load,
    loaded_op,
    xy_op_head,
    xy_op_tail,
)
from compiler_opt.ir import Graph, split_ref

#: reduction -> (initial accumulator, C++ update of ``acc`` with ``x``)
REDUCTIONS: dict[str, tuple[str, str]] = {
    "Sum": ("0.0f", "acc += x"),
    "Mean": ("0.0f", "acc += x"),
    "Max": ("-INFINITY", "acc = acc > x ? acc : x"),
    "Min": ("INFINITY", "acc = acc < x ? acc : x"),
    "Prod": ("1.0f", "acc *= x"),
}
VIEWS = frozenset({"Reshape", "ExpandDims", "Squeeze", "Identity"})
#: per-row floats of all the values of one program (its locals: 64 KB)
MAX_ROW_FLOATS = 16384


def _size(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """NumPy's broadcast of two static shapes, or None when they do not broadcast."""
    out = []
    for x, y in zip(
        [1] * (len(b) - len(a)) + list(a), [1] * (len(a) - len(b)) + list(b), strict=True
    ):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class RowValue:
    """One value of a row program: ``op`` of ``operands`` (input ``k`` or body value
    ``k - len(inputs)``), its row ``shape``; ``axes`` of a reduction (row axes) or softmax."""

    op: str
    operands: tuple[int, ...]
    shape: tuple[int, ...]
    axes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """A group as a program over one example's values (see the module doc): ``inputs`` are
    ``(batched, row shape)``, ``outputs`` body values, each ``[rows, *shape]``."""

    inputs: tuple[tuple[bool, tuple[int, ...]], ...]
    body: tuple[RowValue, ...]
    outputs: tuple[int, ...]

    def __post_init__(self) -> None:
        if not any(b for b, _ in self.inputs):
            raise ValueError("a row program needs a batched input")
        shapes = [s for _, s in self.inputs]
        for i, v in enumerate(self.body):
            if any(not 0 <= k < len(shapes) for k in v.operands):
                raise ValueError(f"body value {i}: operands {v.operands} out of range")
            ins = [shapes[k] for k in v.operands]
            want = _value_shape(v, ins)
            if want != v.shape:
                raise ValueError(f"body value {i} ({v.op}): shape {v.shape}, expected {want}")
            shapes.append(v.shape)
        if not self.outputs or any(not 0 <= o < len(self.body) for o in self.outputs):
            raise ValueError(f"outputs {self.outputs} must name body values")
        total = sum(_size(v.shape) for v in self.body)
        if total > MAX_ROW_FLOATS:
            raise ValueError(f"{total} floats per row, more than MAX_ROW_FLOATS={MAX_ROW_FLOATS}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def op_name(self) -> str:
        h = hashlib.sha256(self.to_json().encode()).hexdigest()[:12]
        return "StitchrecRow" + "".join(chr(ord("a") + int(c, 16)) for c in h).capitalize()

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)


def _value_shape(v: RowValue, ins: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The row shape ``v`` must have, from its operands' shapes (None: not computable)."""
    if v.op in OPS:
        if len(ins) != OPS[v.op][0]:
            return None
        out: tuple[int, ...] | None = tuple(ins[0])
        for s in ins[1:]:
            out = broadcast(out, s) if out is not None else None
        return out
    if len(ins) != 1:
        return None
    (x,) = ins
    if v.op == "Softmax":
        return tuple(x) if x else None
    if v.op in REDUCTIONS:
        if not v.axes or any(not 0 <= a < len(x) for a in v.axes):
            return None
        kept = tuple(1 if a in v.axes else d for a, d in enumerate(x))
        dropped = tuple(d for a, d in enumerate(x) if a not in v.axes)
        return v.shape if v.shape in (kept, dropped) else None
    if v.op in VIEWS:
        return v.shape if _size(v.shape) == _size(x) else None
    return None


# ---------------------------------------------------------------------------- from the IR


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
            ref = _canon(ref)
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
    results = {_canon(r) for r in outputs}
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
    group = LoopGroup(spec, order, input_refs, [f"{order[i]}:0" for i in out_values], controls)
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


# ------------------------------------------------------------------------------ C++ text


def _strides(shape: Sequence[int]) -> list[int]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return list(reversed(out))


def _linear(shape: Sequence[int], operand: Sequence[int]) -> str:
    """C++ index into ``operand`` (broadcast to ``shape``, NumPy-aligned) at the position of
    the loop variables ``i0, i1, ...`` over ``shape``: affine in them, so the innermost loop
    is contiguous (or constant) and vectorizes."""
    pad = [1] * (len(shape) - len(operand)) + list(operand)
    terms = []
    for a, (d, ost) in enumerate(zip(pad, _strides(pad), strict=True)):
        if d == 1:
            continue
        terms.append(f"i{a} * {ost}" if ost != 1 else f"i{a}")
    return " + ".join(terms) or "0"


def _nested(shape: Sequence[int], inner: Sequence[str]) -> list[str]:
    """C++ loops ``i0, i1, ...`` over ``shape`` around ``inner`` (a block when ``shape`` is
    ``()``: the inner declarations stay local)."""
    if not shape:
        return ["    {", *[f"      {x}" for x in inner], "    }"]
    lines, pad = [], "    "
    for a, d in enumerate(shape):
        lines.append(f"{pad}for (int64_t i{a} = 0; i{a} < {d}; ++i{a}) {{")
        pad += "  "
    lines += [f"{pad}{x}" for x in inner]
    lines += ["    " + "  " * a + "}" for a in reversed(range(len(shape)))]
    return lines


#: OpenMP reduction identifiers of the reductions (``#pragma omp simd``: the compiler may
#: reassociate the accumulation and vectorize it)
_OMP = {"Sum": "+", "Mean": "+", "Max": "max", "Min": "min", "Prod": "*"}


def _value_code(spec: RowSpec, i: int, ops: dict[str, str]) -> list[str]:
    """C++ computing body value ``i`` of one row into ``v<k>`` (``k = len(inputs) + i``)."""
    n_in = len(spec.inputs)
    shapes = [s for _, s in spec.inputs] + [v.shape for v in spec.body]
    v = spec.body[i]
    k, n = n_in + i, _size(v.shape)
    if v.op in VIEWS:
        return [f"    const float* v{k} = v{v.operands[0]};"]
    lines = [f"    float v{k}[{n}];"]
    exp = ops.get("Exp", "RowExp({a})")
    if v.op in OPS:
        args = {
            name: f"v{o}[{_linear(v.shape, shapes[o])}]"
            for name, o in zip("ab", v.operands, strict=False)
        }
        template = exp if v.op == "Exp" else ops.get(v.op, OPS[v.op][1])
        if v.op == "Sigmoid":
            template = "1.0f / (1.0f + " + exp.format(a="-({a})") + ")"
        expr = template.format(a=args["a"], b=args.get("b", ""))
        return lines + _nested(v.shape, [f"v{k}[{_linear(v.shape, v.shape)}] = {expr};"])
    x = shapes[v.operands[0]]
    src = f"v{v.operands[0]}"
    if v.op == "Softmax":
        last = x[-1]
        e = exp.format(a="xs[j] - m")
        lines += [
            f"    for (int64_t p = 0; p < {n // last}; ++p) {{",
            f"      const float* xs = {src} + p * {last};",
            f"      float* ys = v{k} + p * {last};",
            "      float m = xs[0];",
            "      #pragma omp simd reduction(max:m)",
            f"      for (int64_t j = 1; j < {last}; ++j) m = xs[j] > m ? xs[j] : m;",
            "      float s = 0.0f;",
            "      #pragma omp simd reduction(+:s)",
            f"      for (int64_t j = 0; j < {last}; ++j) {{ ys[j] = {e}; s += ys[j]; }}",
            "      const float inv = 1.0f / s;",
            f"      for (int64_t j = 0; j < {last}; ++j) ys[j] *= inv;",
            "    }",
        ]
        return lines
    init, update = REDUCTIONS[v.op]
    suffix = len(x) - len(v.axes)
    if tuple(v.axes) == tuple(range(suffix, len(x))):
        # the reduced axes are the trailing ones: per output element one contiguous run
        run = _size(x[suffix:])
        outer = list(x[:suffix])
        at = _linear(outer, outer)
        inner = [
            f"float acc = {init};",
            f"const float* xs = {src} + ({at}) * {run};",
            f"#pragma omp simd reduction({_OMP[v.op]}:acc)",
            f"for (int64_t j = 0; j < {run}; ++j) {{ const float x = xs[j]; {update}; }}",
            f"v{k}[{at}] = acc;",
        ]
        lines += _nested(outer, inner)
    else:  # an accumulator array, the input walked in order
        kept = tuple(1 if a in v.axes else d for a, d in enumerate(x))
        lines.append(f"    for (int64_t o = 0; o < {n}; ++o) v{k}[o] = {init};")
        body = [
            f"const float x = {src}[{_linear(x, x)}];",
            f"float& acc = v{k}[{_linear(x, kept)}];",
            f"{update};",
        ]
        lines += _nested(x, body)
    if v.op == "Mean":
        lines.append(f"    for (int64_t o = 0; o < {n}; ++o) v{k}[o] /= {float(_size(x) // n)}f;")
    return lines


def row_program(spec: RowSpec, ops: dict[str, str]) -> list[str]:
    """C++ of one row ``r``: inputs ``X<k>`` (batched: offset by the row), outputs ``Y<o>``."""
    lines = []
    for k, (batched, shape) in enumerate(spec.inputs):
        offset = f" + r * {_size(shape)}" if batched else ""
        lines.append(f"    const float* v{k} = X{k}{offset};")
    for i in range(len(spec.body)):
        lines += _value_code(spec, i, ops)
    n_in = len(spec.inputs)
    for o, value in enumerate(spec.outputs):
        n = _size(spec.body[value].shape)
        lines.append(
            f"    for (int64_t f = 0; f < {n}; ++f) Y{o}[r * {n} + f] = v{n_in + value}[f];"
        )
    return lines


# exp for the CPU programs: branch-free, so a loop of it vectorizes (std::exp does not without
# -ffast-math). Cephes' expf: exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln(2) / 2, a
# degree-6 polynomial; within 2 ulp of std::exp on [-87.3, 88.3], clamped outside (no inf)
_ROW_EXP = """\
inline float RowExp(float x) {
  x = std::min(std::max(x, -87.3365f), 88.3762f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}"""


def generate(spec: RowSpec, cuda: bool = False) -> str:
    """C++ source of the op of ``spec``; with ``cuda`` also its GPU kernel (one thread per
    row: ``codegen_cuda.row_source``)."""
    name = spec.op_name
    n_in, n_out = len(spec.inputs), len(spec.outputs)
    cost = 4 * sum(_size(v.shape) for v in spec.body) + 1
    prologue = [
        f"    OP_REQUIRES(ctx, ctx->num_inputs() == {n_in} && ctx->num_outputs() == {n_out},",
        f'        errors::InvalidArgument("{name}: expected {n_in} inputs and {n_out} outputs"));',
        "    int64_t rows = -1;",
    ]
    for k, (batched, shape) in enumerate(spec.inputs):
        n = _size(shape)
        if batched:
            prologue += [
                f"    OP_REQUIRES(ctx, ctx->input({k}).dims() >= 1, errors::InvalidArgument(",
                f'        "{name}: input {k} must have a batch dimension"));',
                f"    if (rows < 0) rows = ctx->input({k}).dim_size(0);",
                f"    OP_REQUIRES(ctx, ctx->input({k}).dim_size(0) == rows && "
                f"ctx->input({k}).NumElements() == rows * {n},",
                f'        errors::InvalidArgument("{name}: input {k} has shape ",',
                f"            ctx->input({k}).shape().DebugString(), "
                f'", expected [", rows, ", {", ".join(map(str, shape))}]"));',
            ]
        else:
            prologue += [
                f"    OP_REQUIRES(ctx, ctx->input({k}).NumElements() == {n},",
                f'        errors::InvalidArgument("{name}: input {k} has ",',
                f'            ctx->input({k}).NumElements(), " elements, expected {n}"));',
            ]
        prologue.append(f"    const float* X{k} = ctx->input({k}).flat<float>().data();")
    for o, value in enumerate(spec.outputs):
        dims = ", ".join(["rows", *map(str, spec.body[value].shape)])
        prologue += [
            f"    Tensor* out{o} = nullptr;",
            f"    OP_REQUIRES_OK(ctx, ctx->allocate_output({o}, ::tensorflow::TensorShape({{{dims}}}), &out{o}));",
            f"    float* Y{o} = out{o}->flat<float>().data();",
        ]
    lines = [
        *xy_op_head(
            name,
            [
                "// Generated by stitchrec compiler_opt/codegen_row.py: do not edit. One op for a",
                "// row program (reductions per example) of a serving graph.",
                f"// spec: {spec.to_json()}",
            ],
            ["#include <cstring>"],
            [_ROW_EXP],
        ),
        "    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {",
        f"      const int batched = {next(k for k, (b, _) in enumerate(spec.inputs) if b)};",
        "      auto rows = c->Dim(c->input(batched), 0);",
    ]
    for o, value in enumerate(spec.outputs):
        dims = ", ".join(["rows", *map(str, spec.body[value].shape)])
        lines.append(f"      c->set_output({o}, c->MakeShape({{{dims}}}));")
    lines += [
        "      return ::absl::OkStatus();",
        "    });",
        f"class {name}Op : public OpKernel {{",
        " public:",
        f"  explicit {name}Op(OpKernelConstruction* c) : OpKernel(c) {{}}",
        "  void Compute(OpKernelContext* ctx) override {",
        *prologue,
        "    auto body = [&](int64_t begin, int64_t end) {",
        "  for (int64_t r = begin; r < end; ++r) {",
        *row_program(spec, {}),
        "  }",
        *xy_op_tail(name, str(cost)),
    ]
    if cuda:
        lines.append(codegen_cuda.row_gpu_kernel(spec, prologue))
    return "\n".join(lines)


__all__ = [
    "RowSpec",
    "RowValue",
    "expressible",
    "expressible_parts",
    "generate",
    "has_gpu_kernel",
    "library_path",
    "load",
    "loaded_op",
    "row_program",
    "row_spec",
]
