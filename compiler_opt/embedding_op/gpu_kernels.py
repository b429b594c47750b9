"""The GPU ``OpKernel``s of an embedding op (g++, appended to its C++ source) and the host run of
its device code (``ctypes``: the tests check the device code against the CPU kernel)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import compiler_opt.csource as csource
from compiler_opt.embedding_op.cuda import gradient_on_gpu
from compiler_opt.embedding_op.rules import TABLE_READS, id_layout
from compiler_opt.embedding_op.spec import KernelSpec, op_names


def embedding_gpu_kernels(spec: KernelSpec) -> str:
    """C++ (g++) of the GPU ``OpKernel``s of embedding op ``spec``: the tables through their
    handles (shape and dtype checked, read under the shared locks, as the CPU kernel), the ids'
    and masks' shapes checked on the host, then the launch (see :func:`embedding_source`)."""
    with_grad = gradient_on_gpu(spec)
    inputs = _gpu_inputs(spec)
    lines = [*_gpu_declarations(spec, with_grad), "namespace {", *_gpu_forward(spec, inputs)]
    if with_grad:
        lines += _gpu_backward(spec, inputs)
    lines += ["}  // namespace", ""]
    return "\n".join(lines)


def _gpu_declarations(spec: KernelSpec, with_grad: bool) -> list[str]:
    """The GPU glue's header and the ``extern "C"`` declarations of the device code's launch
    functions (the gradient's with ``with_grad``)."""
    fwd, grad = op_names(spec)
    syms = [csource.symbol(fwd)] + ([csource.symbol(grad)] if with_grad else [])
    params = (
        "int, void*, int64_t, const void* const*, const int64_t* const*, const int64_t*, "
        "const float* const*"
    )
    lines = [
        *csource.gpu_glue_header(syms),
        "}  // namespace",
        f'extern "C" int {csource.symbol(fwd)}({params}, const float*, float*);',
    ]
    if with_grad:
        lines.append(
            f'extern "C" int {csource.symbol(grad)}({params}, const float*, int64_t* const*, '
            "float* const*, const int64_t*);"
        )
    return lines


def _gpu_inputs(spec: KernelSpec) -> list[str]:
    """The GPU kernels' input reads on the host: tables, ids (batch checked) and mask tables."""
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, len(spec.masked_fields)
    inputs = [
        *TABLE_READS,
        f"    const int64_t* ids[{ni}];",
        f"    int64_t nids[{ni}];",
        "    int64_t batch = -1;",
        f"    for (int i = 0; i < {ni}; ++i) {{",
        f"      const Tensor& x = ctx->input({nt} + i);",
        "      OP_REQUIRES(ctx, x.dims() == 1, errors::InvalidArgument(",
        '          "ids input ", i, " (field ", kIdField[i], ") must be a vector, got ",',
        "          x.shape().DebugString()));",
        "      ids[i] = x.flat<int64_t>().data();",
        "      nids[i] = x.dim_size(0);",
        "      const int64_t b = kIdKind[i] == 0 ? nids[i] : (kIdKind[i] == 2 ? nids[i] - 1 : -1);",
        "      if (kIdKind[i] == 2) OP_REQUIRES(ctx, b >= 0, errors::InvalidArgument(",
        '          "row splits of field ", kIdField[i], " must not be empty"));',
        "      if (b >= 0) {",
        "        OP_REQUIRES(ctx, batch < 0 || b == batch, errors::InvalidArgument(",
        '            "field ", kIdField[i], " has batch ", b, ", an earlier field ", batch));',
        "        batch = b;",
        "      }",
        "    }",
        f"    const float* masks[{max(nm, 1)}] = {{nullptr}};",
    ]
    for m, f in enumerate(spec.masked_fields):
        rows = f.param("num_rows")
        inputs += [
            f"    const Tensor& mask{m} = ctx->input({nt + ni + m});",
            f"    OP_REQUIRES(ctx, mask{m}.dims() == 2 && mask{m}.dim_size(0) == {rows} && "
            f"mask{m}.dim_size(1) == {f.dim},",
            f'                errors::InvalidArgument("mask table of field {f.name} must be '
            f'[{rows}, {f.dim}], got ", mask{m}.shape().DebugString()));',
            f"    masks[{m}] = mask{m}.flat<float>().data();",
        ]
    return inputs


def _gpu_forward(spec: KernelSpec, inputs: list[str]) -> list[str]:
    """The forward op's GPU kernel (``inputs``: its input reads) and its registration."""
    fwd, _ = op_names(spec)
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, len(spec.masked_fields)
    lines = [
        f"class {fwd}GpuOp : public OpKernel {{",
        " public:",
        f"  explicit {fwd}GpuOp(OpKernelConstruction* c) : OpKernel(c) {{}}",
        "  void Compute(OpKernelContext* ctx) override {",
        *inputs,
        "    const float* dense = nullptr;",
    ]
    if spec.dense_dim:
        lines += [
            f"    const Tensor& dense_t = ctx->input({nt + ni + nm});",
            "    OP_REQUIRES(ctx, dense_t.dims() == 2 && dense_t.dim_size(0) == batch &&",
            "                dense_t.dim_size(1) == kDenseDim,",
            '                errors::InvalidArgument("dense must be [batch, ", kDenseDim, "], got ",',
            "                                        dense_t.shape().DebugString()));",
            "    dense = dense_t.flat<float>().data();",
        ]
    lines += [
        "    Tensor* out = nullptr;",
        "    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, kOutDim}), &out));",
        *csource.launch_check(
            fwd,
            csource.symbol(fwd),
            f"{csource.symbol(fwd)}(0, stream_, batch, tables, ids, nids, masks, dense, "
            "out->flat<float>().data())",
        ),
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{fwd}").Device(::tensorflow::DEVICE_GPU), {fwd}GpuOp);',
    ]
    return lines


def _gpu_backward(spec: KernelSpec, inputs: list[str]) -> list[str]:
    """The gradient op's GPU kernel (``inputs``: its input reads) and its registration."""
    _, grad = op_names(spec)
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, len(spec.masked_fields)
    return [
        f"class {grad}GpuOp : public OpKernel {{",
        " public:",
        f"  explicit {grad}GpuOp(OpKernelConstruction* c) : OpKernel(c) {{}}",
        "  void Compute(OpKernelContext* ctx) override {",
        *inputs,
        f"    const Tensor& dy_t = ctx->input({nt + ni + nm});",
        "    OP_REQUIRES(ctx, dy_t.dims() == 2 && dy_t.dim_size(0) == batch && "
        "dy_t.dim_size(1) == kOutDim,",
        '                errors::InvalidArgument("dy must be [batch, ", kOutDim, "], got ",',
        "                                        dy_t.shape().DebugString()));",
        f"    int64_t* rows[{nt}];",
        f"    float* values[{nt}];",
        f"    int64_t off[{nt + 1}];",
        "    off[0] = 0;",
        f"    for (int t = 0; t < {nt}; ++t) {{",
        "      // the field's ids (ragged: its values input) times the rows each reads",
        "      int first = 0;",
        "      while (kIdField[first] != kFieldOfTable[t]) ++first;",
        "      const int64_t n = nids[first] * kRowsPerId[t];",
        "      Tensor* r = nullptr;",
        "      Tensor* v = nullptr;",
        "      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, TensorShape({n}), &r));",
        f"      OP_REQUIRES_OK(ctx, ctx->allocate_output({nt} + t, TensorShape({{n, "
        "kTableCols[t]}), &v));",
        "      rows[t] = r->flat<int64_t>().data();",
        "      values[t] = v->flat<float>().data();",
        "      off[t + 1] = off[t] + n * kTableCols[t];",
        "    }",
        *csource.launch_check(
            grad,
            csource.symbol(grad),
            f"{csource.symbol(grad)}(0, stream_, batch, tables, ids, nids, masks, "
            "dy_t.flat<float>().data(), rows, values, off)",
        ),
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{grad}").Device(::tensorflow::DEVICE_GPU), {grad}GpuOp);',
    ]


def run_embedding_on_host(
    library: str | Path,
    spec: KernelSpec,
    tables: Sequence[np.ndarray],
    ids: Sequence[np.ndarray],
    masks: Sequence[np.ndarray] = (),
    dense: np.ndarray | None = None,
    dy: np.ndarray | None = None,
) -> Any:
    """Runs embedding op ``spec``'s device code on the host. Without ``dy``: the forward output
    ``[batch, out_dim]``; with ``dy``: the gradient's ``(rows, values)`` per table."""
    fwd, grad = op_names(spec)
    lib = csource.open_library(library)
    tabs = [np.ascontiguousarray(t) for t in tables]
    idv = [np.ascontiguousarray(x, np.int64) for x in ids]
    msk = [np.ascontiguousarray(m, np.float32) for m in masks]
    nids = np.array([len(x) for x in idv], np.int64)
    _, kinds, _ = id_layout(spec)
    batch = next(len(x) - (1 if k == 2 else 0) for x, k in zip(idv, kinds, strict=True) if k != 1)
    common = [
        ctypes.c_int64(batch),
        csource.c_pointers(tabs),
        csource.c_pointers(idv),
        nids.ctypes.data_as(ctypes.c_void_p),
        csource.c_pointers(msk),
    ]
    if dy is None:
        y = np.full((batch, spec.out_dim), np.nan, np.float32)
        d = None if dense is None else np.ascontiguousarray(dense, np.float32)
        fn = getattr(lib, csource.symbol(fwd))
        fn.restype = ctypes.c_int
        dense_ptr = None if d is None else d.ctypes.data_as(ctypes.c_void_p)
        e = fn(1, None, *common, dense_ptr, y.ctypes.data_as(ctypes.c_void_p))
        if e != 0:
            raise RuntimeError(f"{fwd}: host run returned {e}")
        return y
    _, _, first = id_layout(spec)
    g = np.ascontiguousarray(dy, np.float32)
    rows, values, off = [], [], [0]
    for t, table in enumerate(spec.tables):
        f = next(f for f in spec.fields if t in f.tables)
        n = int(nids[first[f.name]]) * f.rows_per_id
        rows.append(np.full(n, -1, np.int64))
        values.append(np.full((n, table.cols), np.nan, np.float32))
        off.append(off[-1] + n * table.cols)
    offs = np.array(off, np.int64)
    fn = getattr(lib, csource.symbol(grad))
    fn.restype = ctypes.c_int
    e = fn(
        1,
        None,
        *common,
        g.ctypes.data_as(ctypes.c_void_p),
        csource.c_pointers(rows),
        csource.c_pointers(values),
        offs.ctypes.data_as(ctypes.c_void_p),
    )
    if e != 0:
        raise RuntimeError(f"{grad}: host run returned {e}")
    return rows, values
