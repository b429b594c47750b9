"""Generated C++ kernels for the planner's elementwise ``loop`` groups of a serving graph.

A ``loop`` group of the plan (``compiler_opt.planner``) is a set of elementwise ops (``Mul``,
``AddV2``, ``Relu``...) that, run one by one, each read and write a whole tensor. Here such a
group becomes one TensorFlow op, generated from the group's nodes:

* :func:`loop_spec` reads the group out of the IR: its inputs, each classed by how it is indexed
  (``full`` ``[rows, width]`` like the result (a dimension the graph leaves unknown is checked
  when the op runs: a wrong-sized input is an ``InvalidArgument`` error, which the server's
  warm-up meets before a version turns ready), ``row`` ``[width]`` broadcast over the rows as a
  ``BiasAdd`` bias, ``scalar``), its nodes as an SSA expression list and the values read outside
  the group (the op's outputs). A group it cannot express (another dtype, an op outside
  ``OPS``, a broadcast other than these three) gives a ``None`` spec and a reason.
* :func:`generate` writes the op: one pass over the rows (split over TensorFlow's CPU thread
  pool), for each element ``j`` of a row every SSA value in registers, then the outputs; the
  width and every constant are compile-time constants, so the inner loop vectorizes.
* :func:`load` compiles it (``codegen.compile_kernel``: g++, cached by content hash) and loads it.
* :func:`rewrite` replaces the group's nodes in a ``GraphDef`` by one node of that op.

For ``y = x0 * (W x + b) + x`` (a DCN-v2 cross layer, the bias in the matmul's epilogue) the
``Mul`` and the ``AddV2`` read 4 and write 2 tensors of ``[batch, width]``; the generated op
reads 3 and writes 1. Serving graphs only: the op has no gradient.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

from compiler_opt import codegen, codegen_cuda
from compiler_opt.ir import Graph, split_ref

#: op -> (arity, C++ expression of its operands a, b)
OPS: dict[str, tuple[int, str]] = {
    "Add": (2, "{a} + {b}"),
    "AddV2": (2, "{a} + {b}"),
    "BiasAdd": (2, "{a} + {b}"),
    "Sub": (2, "{a} - {b}"),
    "Mul": (2, "{a} * {b}"),
    "RealDiv": (2, "{a} / {b}"),
    "Maximum": (2, "std::max({a}, {b})"),
    "Minimum": (2, "std::min({a}, {b})"),
    "SquaredDifference": (2, "({a} - {b}) * ({a} - {b})"),
    "Relu": (1, "std::max({a}, 0.0f)"),
    "Relu6": (1, "std::min(std::max({a}, 0.0f), 6.0f)"),
    "Neg": (1, "-{a}"),
    "Square": (1, "{a} * {a}"),
    "Sigmoid": (1, "1.0f / (1.0f + std::exp(-{a}))"),
    "Tanh": (1, "std::tanh({a})"),
    "Exp": (1, "std::exp({a})"),
    "Sqrt": (1, "std::sqrt({a})"),
    "Rsqrt": (1, "1.0f / std::sqrt({a})"),
    "Identity": (1, "{a}"),
}
INPUT_KINDS = ("full", "row", "scalar")


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """One elementwise group as an SSA program over ``[rows, width]`` tensors.

    ``inputs``: the kind of each input (``INPUT_KINDS``); ``body``: ``(op, operands)`` per
    value, an operand ``k < len(inputs)`` being input ``k`` and ``k >= len(inputs)`` the body
    value ``k - len(inputs)``; ``outputs``: the body values the op returns, in order.
    """

    width: int
    inputs: tuple[str, ...]
    body: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[int, ...]
    dims: tuple[int, ...] | None = None  # the outputs' static dims after the rows (None: the
    # first ``full`` input's shape)
    matmul: tuple[int, int, bool] | None = None  # (slot, k, bias): input ``slot`` computed in
    # the op as ``A W (+ b)`` (``attach_matmuls``): the op reads ``A`` [rows, k] there and
    # ``W`` [k, width] (and ``b`` [width]) after the other inputs

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if self.dims is not None and int(np.prod(self.dims, dtype=np.int64)) != self.width:
            raise ValueError(f"dims {self.dims} must hold width={self.width} elements")
        bad = [k for k in self.inputs if k not in INPUT_KINDS]
        if bad or "full" not in self.inputs:
            raise ValueError(
                f"inputs must be kinds from {INPUT_KINDS} with at least one 'full', got "
                f"{self.inputs}"
            )
        for i, (op, operands) in enumerate(self.body):
            if op not in OPS:
                raise ValueError(f"body value {i}: op {op!r} is not one of {sorted(OPS)}")
            if len(operands) != OPS[op][0]:
                raise ValueError(f"body value {i}: {op} takes {OPS[op][0]} operands")
            if any(not 0 <= k < len(self.inputs) + i for k in operands):
                raise ValueError(f"body value {i}: operands {operands} out of range")
        if not self.outputs or any(not 0 <= o < len(self.body) for o in self.outputs):
            raise ValueError(f"outputs {self.outputs} must name body values")
        if self.matmul is not None:
            slot, k, _ = self.matmul
            if not (0 <= slot < len(self.inputs) and self.inputs[slot] == "full" and k >= 1):
                raise ValueError(f"matmul {self.matmul}: needs a 'full' input slot and k >= 1")
            if self.dims is None or len(self.dims) > 1:
                raise ValueError(f"matmul {self.matmul}: needs [rows, width] or [rows] outputs")

    @property
    def num_inputs(self) -> int:
        """Tensors the op takes: one per input, and ``W`` (and ``b``) of a matmul."""
        extra = 0 if self.matmul is None else 1 + int(self.matmul[2])
        return len(self.inputs) + extra

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        if self.matmul is None:  # specs without one keep their names
            del d["matmul"]
        return json.dumps(d, sort_keys=True)

    @property
    def op_name(self) -> str:
        h = hashlib.sha256(self.to_json().encode()).hexdigest()[:12]
        return "StitchrecLoop" + "".join(chr(ord("a") + int(c, 16)) for c in h).capitalize()


@dataclasses.dataclass
class LoopGroup:
    """A group's spec and where it sits in the graph: ``input_refs`` (tensor per input),
    ``output_refs`` (the group node outputs the op replaces, in ``spec.outputs`` order),
    ``control_inputs`` (of the group's nodes, from outside) and ``nodes``."""

    spec: LoopSpec
    nodes: list[str]
    input_refs: list[str]
    output_refs: list[str]
    control_inputs: list[str]


def _canon(ref: str) -> str:
    name, idx = split_ref(ref)
    return f"{name}:{idx}"


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
            ref = _canon(ref)
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
    results = {_canon(r) for r in outputs}
    out_values = []
    for i, n in enumerate(nodes):
        readers = [c for c in graph.consumers(n) if c not in inside]
        if readers or f"{n}:0" in results:
            out_values.append(i)
    controls = sorted({c for n in nodes for c in graph[n].control_inputs if c not in inside})
    spec = LoopSpec(width, tuple(kinds), body, tuple(out_values), tuple(int(d) for d in shape[1:]))
    return (
        LoopGroup(spec, list(nodes), input_refs, [f"{nodes[i]}:0" for i in out_values], controls),
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
    results = {_canon(r) for r in outputs}

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
        if not isinstance(spec, LoopSpec) or spec.matmul is not None:
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
                bias, taken = _canon(node.inputs[1]), [node.name]
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
        refs[slot] = _canon(node.inputs[0])
        refs.append(_canon(node.inputs[1]))
        if bias is not None:
            refs.append(bias)
        controls = sorted(
            set(g.control_inputs)
            | {c for n in [node.name, *taken] for c in graph[n].control_inputs}
        )
        new_spec = dataclasses.replace(spec, matmul=(slot, k, bias is not None))
        out.append(
            LoopGroup(new_spec, [node.name, *taken, *g.nodes], refs, g.output_refs, controls)
        )
        attached += 1
    return out, attached


def xy_op_head(
    name: str, comment: Sequence[str], includes: Sequence[str], definitions: Sequence[str]
) -> list[str]:
    """The opening of a generated op's source over float inputs ``x: N`` and outputs ``y: M``
    (loop and row ops): ``comment``, the headers (``includes`` after TensorFlow's), the
    usings, ``definitions``, and ``REGISTER_OP`` up to its attributes (the shape function
    follows)."""
    return [
        *comment,
        "#include <algorithm>",
        "#include <cmath>",
        "#include <cstdint>",
        '#include "tensorflow/core/framework/op.h"',
        '#include "tensorflow/core/framework/op_kernel.h"',
        '#include "tensorflow/core/framework/shape_inference.h"',
        *includes,
        "namespace {",
        "using ::tensorflow::OpKernel;",
        "using ::tensorflow::OpKernelConstruction;",
        "using ::tensorflow::OpKernelContext;",
        "using ::tensorflow::Tensor;",
        "namespace errors = ::tensorflow::errors;",
        *definitions,
        f'REGISTER_OP("{name}")',
        '    .Input("x: N * float")',
        '    .Output("y: M * float")',
        '    .Attr("N: int >= 1")',
        '    .Attr("M: int >= 1")',
    ]


def generate(spec: LoopSpec, cuda: bool = False) -> str:
    """C++ source of the op of ``spec`` (see the module doc); with ``cuda`` also its GPU
    kernel, which calls the device code of ``codegen_cuda.loop_source(spec)``."""
    name = spec.op_name
    n_in = len(spec.inputs)
    full = spec.inputs.index("full")
    rows_dim = f"c->Dim(c->input({full}), 0)"
    shape_fn = (
        f"c->input({full})"
        if spec.dims is None
        else "c->MakeShape({" + ", ".join([rows_dim, *map(str, spec.dims)]) + "})"
    )
    lines = [
        *xy_op_head(
            name,
            [
                "// Generated by stitchrec compiler_opt/codegen_loop.py: do not edit. One op for an",
                "// elementwise group of a serving graph.",
                f"// spec: {spec.to_json()}",
            ],
            ['#include "Eigen/Core"'] if spec.matmul else [],
            [f"constexpr int64_t kWidth = {spec.width};"],
        ),
        "    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {",
        f"      auto s = {shape_fn};",
        "      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, s);",
        "      return ::absl::OkStatus();",
        "    });",
        f"class {name}Op : public OpKernel {{",
        " public:",
        f"  explicit {name}Op(OpKernelConstruction* c) : OpKernel(c) {{}}",
        "  void Compute(OpKernelContext* ctx) override {",
    ]
    # the checks and outputs, shared by the CPU and the GPU kernel
    prologue = [
        f"    OP_REQUIRES(ctx, ctx->num_inputs() == {spec.num_inputs} && ctx->num_outputs() == "
        f'{len(spec.outputs)}, errors::InvalidArgument("{name}: expected {spec.num_inputs} inputs and '
        f'{len(spec.outputs)} outputs"));',
        *_rows_code(spec, name),
        (
            "    const ::tensorflow::TensorShape out_shape = ref.shape();"
            if spec.dims is None
            else "    const ::tensorflow::TensorShape out_shape({"
            + ", ".join(["rows", *map(str, spec.dims)])
            + "});"
        ),
    ]
    want = {"full": "n", "row": "kWidth", "scalar": "1"}
    slot = spec.matmul[0] if spec.matmul else -1
    for k, kind in enumerate(spec.inputs):
        if k == slot:
            continue  # the matmul's A: checked and read below
        prologue += [
            f"    OP_REQUIRES(ctx, ctx->input({k}).NumElements() == {want[kind]},",
            f'        errors::InvalidArgument("{name}: input {k} ({kind}) has ",',
            f'            ctx->input({k}).NumElements(), " elements, expected ", {want[kind]}));',
            f"    const float* X{k} = ctx->input({k}).flat<float>().data();",
        ]
    # an output takes over the buffer of a full input no other op reads (as TensorFlow's
    # elementwise kernels do): every element is read before it is written, so in place is
    # safe, and the written tensor is the one still in the cache
    full_inputs = ", ".join(
        str(k) for k, kind in enumerate(spec.inputs) if kind == "full" and k != slot
    )
    for o in range(len(spec.outputs)):
        if o == 0 and spec.matmul:  # A W goes into output 0, read and overwritten in place
            prologue += [
                "    Tensor* out0 = nullptr;",
                "    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out0));",
                "    float* Y0 = out0->flat<float>().data();",
                *_matmul_code(spec, name),
            ]
            continue
        prologue += [
            f"    Tensor* out{o} = nullptr;",
            f"    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({{{full_inputs}}}, {o},",
            f"                                                             out_shape, &out{o}));",
            f"    float* Y{o} = out{o}->flat<float>().data();",
        ]
    lines += prologue
    lines.append("    auto body = [&](int64_t begin, int64_t end) {")
    if spec.matmul:  # this block's rows of A W (Eigen's GEMM), then the program while cached
        k = spec.matmul[1]
        lines += [
            "      using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, "
            "Eigen::RowMajor>;",
            f"      Eigen::Map<const RowMat> Am(Ap + begin * {k}, end - begin, {k});",
            f"      Eigen::Map<const RowMat> Wm(Wp, {k}, kWidth);",
            "      Eigen::Map<RowMat> Ym(Y0 + begin * kWidth, end - begin, kWidth);",
            "      Ym.noalias() = Am * Wm;",
        ]
    lines += [
        "      for (int64_t r = begin; r < end; ++r) {",
        "        const int64_t base = r * kWidth;",
        "#pragma GCC ivdep",
        "        for (int64_t j = 0; j < kWidth; ++j) {",
    ]
    for k, kind in enumerate(spec.inputs):
        index = {"full": "base + j", "row": "j", "scalar": "0"}[kind]
        bias = " + Bm[j]" if k == slot and spec.matmul[2] else ""
        lines.append(f"          const float v{k} = X{k}[{index}]{bias};")
    for i, (op, operands) in enumerate(spec.body):
        b = f"v{operands[1]}" if len(operands) > 1 else ""
        expr = OPS[op][1].format(a=f"v{operands[0]}", b=b)
        lines.append(f"          const float v{n_in + i} = {expr};")
    for o, value in enumerate(spec.outputs):
        lines.append(f"          Y{o}[base + j] = v{n_in + value};")
    cost = 4 * (sum(k == "full" for k in spec.inputs) + len(spec.outputs)) + 2 * len(spec.body)
    if spec.matmul:
        cost += 2 * spec.matmul[1]  # multiply-adds per element of A W
    lines += ["        }", "      }", *xy_op_tail(name, f"{cost} * kWidth")]
    if cuda:
        lines.append(codegen_cuda.loop_gpu_kernel(spec, prologue))
    return "\n".join(lines)


def xy_op_tail(name: str, cost_per_row: str) -> list[str]:
    """The end of a generated op's CPU kernel: the ``body`` lambda closed and run over the
    ``rows`` on TensorFlow's CPU pool, the kernel registered."""
    return [
        "    };",
        "    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(",
        f"        rows, {cost_per_row}, body);",
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{name}").Device(::tensorflow::DEVICE_CPU), {name}Op);',
        "}  // namespace",
        "",
    ]


def _rows_code(spec: LoopSpec, name: str) -> list[str]:
    """C++ computing ``n`` (elements of a result) and ``rows`` from a ``full`` input, or from
    the matmul's ``A`` when it is the only one."""
    slot = spec.matmul[0] if spec.matmul else -1
    full = next((k for k, kind in enumerate(spec.inputs) if kind == "full" and k != slot), None)
    if full is None:
        return [
            f"    const int64_t rows = ctx->input({slot}).dims() == 2 ? "
            f"ctx->input({slot}).dim_size(0) : -1;",
            "    OP_REQUIRES(ctx, rows >= 0, errors::InvalidArgument(",
            f'        "{name}: A must be a matrix, got ", ctx->input({slot}).shape().DebugString()));',
            "    const int64_t n = rows * kWidth;",
        ]
    return [
        f"    const Tensor& ref = ctx->input({full});",
        "    const int64_t n = ref.NumElements();",
        "    OP_REQUIRES(ctx, n % kWidth == 0, errors::InvalidArgument(",
        f'        "{name}: input {full} has ", n, " elements, not rows of ", kWidth));',
        "    const int64_t rows = n / kWidth;",
    ]


def _matmul_code(spec: LoopSpec, name: str) -> list[str]:
    """C++: checks ``A`` [rows, k], ``W`` [k, width] (and ``b`` [width]) and points the slot's
    ``X`` at ``Y0``, where the body writes ``A W`` one block of rows at a time."""
    slot, k, bias = spec.matmul
    n_in = len(spec.inputs)
    lines = [
        f"    const Tensor& A = ctx->input({slot});",
        f"    const Tensor& W = ctx->input({n_in});",
        f"    OP_REQUIRES(ctx, A.dims() == 2 && A.dim_size(0) == rows && A.dim_size(1) == {k},",
        f'        errors::InvalidArgument("{name}: A must be [", rows, ", {k}], got ",',
        "            A.shape().DebugString()));",
        f"    OP_REQUIRES(ctx, W.dims() == 2 && W.dim_size(0) == {k} && W.dim_size(1) == kWidth,",
        f'        errors::InvalidArgument("{name}: W must be [{k}, ", kWidth, "], got ",',
        "            W.shape().DebugString()));",
    ]
    if bias:
        lines += [
            f"    const Tensor& Bt = ctx->input({n_in + 1});",
            "    OP_REQUIRES(ctx, Bt.NumElements() == kWidth, errors::InvalidArgument(",
            f'        "{name}: b must have ", kWidth, " elements, got ", Bt.NumElements()));',
            "    const float* Bm = Bt.flat<float>().data();",
        ]
    lines += [
        "    const float* Ap = A.flat<float>().data();",
        "    const float* Wp = W.flat<float>().data();",
        f"    const float* X{slot} = Y0;  // A W, computed block by block in the body",
    ]
    return lines


_LOCK = threading.Lock()
_LOADED: dict[str, Any] = {}


_GPU: dict[str, bool] = {}


def _compile(spec: Any) -> tuple[codegen.Compiled, bool]:
    """The library of ``spec`` (a ``LoopSpec`` or a ``codegen_row.RowSpec``; compiled when
    absent) and whether it holds the GPU kernel: where ``codegen_cuda.enabled()`` and the spec
    has a CUDA form."""
    from compiler_opt import codegen_row

    if isinstance(spec, codegen_row.RowSpec):
        cuda = codegen_cuda.enabled()
        source = codegen_row.generate(spec, cuda=cuda)
        cu = codegen_cuda.row_source(spec) if cuda else None
    else:
        cuda = codegen_cuda.enabled() and codegen_cuda.loop_unsupported(spec) is None
        source = generate(spec, cuda=cuda)
        cu = codegen_cuda.loop_source(spec) if cuda else None
    return codegen.compile_kernel(source, cuda_source=cu), cuda


def load(spec: Any) -> str:
    """Compiles (or finds in the cache) and loads the op of ``spec`` (a ``LoopSpec`` or a
    ``codegen_row.RowSpec``: one registry for both); returns its name. The library holds the
    op's GPU kernel too where it has one (:func:`has_gpu_kernel`)."""
    with _LOCK:
        name = spec.op_name
        if name not in _LOADED:
            lib, cuda = _compile(spec)
            _LOADED[name] = tf.load_op_library(str(lib.path))
            _GPU[name] = cuda
        return name


def has_gpu_kernel(name: str) -> bool:
    """Whether loaded op ``name`` has a GPU kernel (its CUDA form)."""
    return _GPU.get(name, False)


def library_path(spec: Any) -> str:
    """The path of the library :func:`load` loads for ``spec`` (compiled when absent)."""
    return str(_compile(spec)[0].path)


def loaded_op(name: str) -> Any:
    """The Python function of loaded op ``name``: ``f(x: list of tensors, M=outputs)``."""
    if name not in _LOADED:
        raise KeyError(f"op {name!r} is not loaded; load(spec) loads it")
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return getattr(_LOADED[name], snake)


def precompile(specs: Sequence[Any], workers: int | None = None) -> None:
    """Compiles the libraries of ``specs`` (``LoopSpec`` / ``codegen_row.RowSpec``) that are
    not cached yet, ``workers`` (default: the CPUs) at a time: a graph's generated ops take a
    compile each (seconds), and g++ runs on one core."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    todo = [s for s in specs if s.op_name not in _LOADED]
    if len(todo) < 2:
        return
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for f in [pool.submit(_compile, s) for s in todo]:
            f.result()  # a compile error surfaces here, as it would in load()


def rewrite(
    graph_def: graph_pb2.GraphDef, groups: Sequence[LoopGroup], outputs: Sequence[str]
) -> tuple[graph_pb2.GraphDef, list[str]]:
    """A copy of ``graph_def`` with each group's nodes replaced by one node of its op
    (``stitch_loop_<i>``, loaded with :func:`load`), and ``outputs`` renamed accordingly."""
    rename: dict[str, str] = {}  # "node:0" of a replaced node -> "stitch_loop_i:k"
    removed: dict[str, str] = {}  # replaced node -> its group's node name (control edges)
    new_nodes = []
    precompile([g.spec for g in groups])
    for i, g in enumerate(groups):
        op = load(g.spec)
        name = f"stitch_loop_{i}"
        for k, ref in enumerate(g.output_refs):
            rename[ref] = f"{name}:{k}"
        for n in g.nodes:
            removed[n] = name
        node = node_def_pb2.NodeDef()
        node.name = name
        node.op = op
        node.input.extend(g.input_refs)
        node.input.extend(f"^{c}" for c in g.control_inputs)
        node.attr["N"].CopyFrom(attr_value_pb2.AttrValue(i=g.spec.num_inputs))
        node.attr["M"].CopyFrom(attr_value_pb2.AttrValue(i=len(g.output_refs)))
        new_nodes.append(node)

    return replace_nodes(graph_def, new_nodes, removed, rename, outputs)


def replace_nodes(
    graph_def: graph_pb2.GraphDef,
    new_nodes: Sequence[Any],
    removed: dict[str, str],
    tensors: dict[str, str],
    outputs: Sequence[str],
) -> tuple[graph_pb2.GraphDef, list[str]]:
    """A copy of ``graph_def`` without the ``removed`` nodes and with ``new_nodes`` (NodeDefs)
    added; every reference to a removed node is rewired: a data input ``"node:i"`` to
    ``tensors["node:i"]`` (a ``ValueError`` when it has no replacement), a control input
    ``"^node"`` to ``"^" + removed[node]``. Returns the GraphDef and ``outputs`` rewired."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)

    def fix(ref: str) -> str:
        if ref.startswith("^"):
            return "^" + removed.get(ref[1:], ref[1:])
        if split_ref(ref)[0] not in removed:
            return ref
        canon = _canon(ref)
        if canon not in tensors:
            raise ValueError(f"{ref} is read outside the replaced nodes but has no replacement")
        return tensors[canon]

    kept = [n for n in out.node if n.name not in removed]
    for n in kept + list(new_nodes):
        data = [fix(r) for r in n.input if not r.startswith("^")]
        controls = dict.fromkeys(fix(r) for r in n.input if r.startswith("^"))
        del n.input[:]
        n.input.extend(data + list(controls))  # a control edge may now appear twice
    del out.node[:]
    out.node.extend(kept + list(new_nodes))
    return out, [fix(o) for o in outputs]


__all__ = [
    "INPUT_KINDS",
    "OPS",
    "LoopGroup",
    "LoopSpec",
    "attach_matmuls",
    "generate",
    "load",
    "loop_spec",
    "replace_nodes",
    "rewrite",
]
