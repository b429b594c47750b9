"""What the generated ops over float inputs ``x`` and outputs ``y`` share (loop ops and row
programs): the elementwise ops they compute (CPU and device C++), the group a planned set of
nodes becomes, the opening and the end of their C++ source, their CUDA entry and GPU kernel,
the host run of their device code, and the rewrite of a GraphDef onto them."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

import compiler_opt.csource as csource
import compiler_opt.graph_io as graph_io
import compiler_opt.registry as registry

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


#: op -> device C++ of its operands (``OPS``' expressions, CUDA's math functions)
DEVICE_OPS: dict[str, str] = {
    "Maximum": "fmaxf({a}, {b})",
    "Minimum": "fminf({a}, {b})",
    "Relu": "fmaxf({a}, 0.0f)",
    "Relu6": "fminf(fmaxf({a}, 0.0f), 6.0f)",
    "Sigmoid": "1.0f / (1.0f + expf(-{a}))",
    "Tanh": "tanhf({a})",
    "Exp": "expf({a})",
    "Sqrt": "sqrtf({a})",
    "Rsqrt": "1.0f / sqrtf({a})",
}


@dataclasses.dataclass
class LoopGroup:
    """A group's spec (a loop op's ``LoopSpec`` or a row program's ``RowSpec``), its ``kind``
    (the registry's entry for the spec), and where it sits in the graph: ``input_refs`` (tensor per input),
    ``output_refs`` (the group node outputs the op replaces, in ``spec.outputs`` order),
    ``control_inputs`` (of the group's nodes, from outside) and ``nodes``."""

    spec: Any
    nodes: list[str]
    input_refs: list[str]
    output_refs: list[str]
    control_inputs: list[str]
    kind: registry.OpKind


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


def xy_entry(sym: str, n_in: int, n_out: int) -> list[str]:
    """The launch code and the ``extern "C"`` entry of an op over float inputs ``x`` and
    outputs ``y`` (loop and row ops): ``sym(on_host, stream, n, x, y)``."""
    return [
        csource.launch_text(sym),
        f'extern "C" int {sym}(int on_host, void* stream, int64_t n, const float* const* x,',
        "                     float* const* y) {",
        "  Args a;",
        f"  for (int k = 0; k < {n_in}; ++k) a.x[k] = x[k];",
        f"  for (int o = 0; o < {n_out}; ++o) a.y[o] = y[o];",
        "  return Run(on_host, stream, n, a);",
        "}",
        "",
    ]


def xy_gpu_kernel(name: str, n_in: int, n_out: int, prologue: Sequence[str], n: str) -> str:
    sym = csource.symbol(name)
    xs = ", ".join(f"X{k}" for k in range(n_in))
    ys = ", ".join(f"Y{o}" for o in range(n_out))
    lines = [
        *csource.gpu_glue_header([sym]),
        "}  // namespace",
        f'extern "C" int {sym}(int, void*, int64_t, const float* const*, float* const*);',
        "namespace {",
        f"class {name}GpuOp : public ::tensorflow::OpKernel {{",
        " public:",
        f"  explicit {name}GpuOp(::tensorflow::OpKernelConstruction* c) : OpKernel(c) {{}}",
        "  void Compute(::tensorflow::OpKernelContext* ctx) override {",
        *prologue,
        f"    const float* xs_[{n_in}] = {{{xs}}};",
        f"    float* ys_[{n_out}] = {{{ys}}};",
        *csource.launch_check(name, sym, f"{sym}(0, stream_, {n}, xs_, ys_)"),
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{name}").Device(::tensorflow::DEVICE_GPU), {name}GpuOp);',
        "}  // namespace",
        "",
    ]
    return "\n".join(lines)


def run_xy_on_host(
    library: str | Path, op: str, inputs: Sequence[np.ndarray], shapes: Sequence[tuple], n: int
) -> list[np.ndarray]:
    """Runs an x/y op's launcher on the host over ``[0, n)`` into NaN-filled outputs."""
    xs = [np.ascontiguousarray(x, np.float32) for x in inputs]
    ys = [np.full(shape, np.nan, np.float32) for shape in shapes]
    fn = getattr(csource.open_library(library), csource.symbol(op))
    fn.restype = ctypes.c_int
    e = fn(1, None, ctypes.c_int64(n), csource.c_pointers(xs), csource.c_pointers(ys))
    if e != 0:
        raise RuntimeError(f"{op}: host run returned {e}")
    return ys


def rewrite(
    graph_def: graph_pb2.GraphDef, groups: Sequence[LoopGroup], outputs: Sequence[str]
) -> tuple[graph_pb2.GraphDef, list[str]]:
    """A copy of ``graph_def`` with each group's nodes replaced by one node of its op
    (``stitch_loop_<i>``, loaded through the registry), and ``outputs`` renamed accordingly."""
    rename: dict[str, str] = {}  # "node:0" of a replaced node -> "stitch_loop_i:k"
    removed: dict[str, str] = {}  # replaced node -> its group's node name (control edges)
    new_nodes = []
    registry.precompile([(g.spec, g.kind) for g in groups])
    for i, g in enumerate(groups):
        op = registry.load(g.spec, g.kind).name
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

    return graph_io.replace_nodes(graph_def, new_nodes, removed, rename, outputs)
