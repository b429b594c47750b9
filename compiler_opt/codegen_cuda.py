"""CUDA forms of the generated ops: the GPU kernel beside each generated CPU kernel.

Where a GPU and ``nvcc`` exist, every library that ``codegen.compile_kernel`` builds for a
generated op (the embedding op of ``codegen``, the elementwise ops of ``codegen_loop``) also
holds a ``DEVICE_GPU`` kernel of the same op, so a graph placed on the GPU runs the fused op
there, reading the tables through their resource handles in device memory:

* the device code of an op is one ``__host__ __device__`` function per output element,
  ``Element(i, args)``, generated from the same spec and the same C++ expressions as the CPU
  kernel (row rules, hashes, pooling, the SSA program of a loop group), and a grid-stride
  ``__global__`` kernel that runs it over ``[0, n)`` on the op's stream: one kernel launch per
  op and call (the embedding op's gradient: one more);
* the ``.cu`` source is compiled by ``nvcc`` (``-gencode`` for the visible GPUs' compute
  capabilities, or ``DEFAULT_ARCHS`` with PTX for later ones) into an object linked into the
  op library by g++ with CUDA's static runtime; the GPU ``OpKernel`` (g++, TensorFlow's
  headers) takes the stream from the op's device context and calls the ``extern "C"`` launcher;
* the launcher also runs ``Element`` on the host (``on_host=1``): :func:`run_on_host` calls it
  through ``ctypes``, so the tests check the very code the GPU runs against the CPU op, element
  by element, on a machine without a GPU.

When the CUDA forms are built: ``$STITCHREC_CUDA`` = ``1`` always (nvcc required: the tests
use it to compile them here), ``0`` never, unset: when TensorFlow sees a GPU, ``nvcc`` is
found (``$NVCC``, the PATH, ``/usr/local/cuda/bin``) and the driver supports nvcc's CUDA
version (the runtime is linked statically). Otherwise a GPU warns once, with the reason; the
generated ops then have CPU kernels only and the callers keep their tables out of them
(``FusedEmbeddingCollection`` runs the layers, the serving path uses XLA clusters).

What the device code does differently from the CPU kernel: ragged row splits are clamped to
``[0, nnz]`` instead of checked (the CPU op's ``InvalidArgument``; reading device memory on the
host to check it would cost a copy per call); ``fmaxf``/``expf``/``tanhf`` for ``std::``'s.
Not covered on the GPU (:func:`embedding_unsupported` names the reason): AMTL masks in their
training form (``wheres`` are int32, which TensorFlow keeps in host memory for GPU kernels),
int32 tables, and loop ops with their matmul inside (``attach_matmuls``); the gradient of an
op with tabulated masks (a serving form) has its CPU kernel only.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import re
import shutil
import subprocess
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from compiler_opt.codegen import (
    _C_TYPES,
    TABLE_READS,
    CompilerUnavailable,
    FieldSpec,
    KernelSpec,
    _grad_components,
    _id_layout,
    _ptr_code,
    _row_code,
    _segments,
    id_helpers,
    op_names,
)

if TYPE_CHECKING:  # codegen_loop imports this module
    from compiler_opt.codegen_loop import LoopSpec

NVCC_ENV = "NVCC"
MODE_ENV = "STITCHREC_CUDA"
#: compute capabilities compiled when no GPU is visible (``$STITCHREC_CUDA=1``); PTX of the
#: last one lets the driver compile it for later GPUs
DEFAULT_ARCHS = ("80", "90")
THREADS = 256
MAX_BLOCKS = 65535


class CudaUnavailable(CompilerUnavailable):
    """The CUDA forms were asked for (``$STITCHREC_CUDA=1``) but cannot be built."""


def nvcc() -> str | None:
    """``$NVCC``, else ``nvcc`` on the PATH, else ``/usr/local/cuda/bin/nvcc``; None if none."""
    env = os.environ.get(NVCC_ENV)
    if env:
        return shutil.which(env)
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if os.access(default, os.X_OK) else None


def gpu_archs() -> tuple[str, ...]:
    """Compute capabilities of the GPUs TensorFlow sees, as ``"90"``; () without a GPU."""
    archs = set()
    for gpu in tf.config.list_physical_devices("GPU"):
        cc = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if cc:
            archs.add(f"{cc[0]}{cc[1]}")
    return tuple(sorted(archs))


_WARNED: set[str] = set()


def enabled() -> bool:
    """Whether generated op libraries get their CUDA form (see the module doc)."""
    mode = os.environ.get(MODE_ENV, "")
    if mode not in ("", "0", "1"):
        raise ValueError(f"${MODE_ENV} must be '0', '1' or unset, got {mode!r}")
    if mode == "0":
        return False
    if mode == "1":
        if nvcc() is None:
            raise CudaUnavailable(
                f"${MODE_ENV}=1 asks for the CUDA forms of the generated ops, but nvcc was not "
                f"found (${NVCC_ENV}, the PATH, /usr/local/cuda/bin)"
            )
        return True
    if not tf.config.list_physical_devices("GPU"):
        return False
    path = nvcc()
    why = ""
    if path is None:
        why = "nvcc is not found ($NVCC, the PATH, /usr/local/cuda/bin)"
    else:
        # the library links nvcc's CUDA runtime statically: the driver must support it
        runtime, driver = nvcc_version(path), driver_version()
        if runtime is not None and driver is not None and driver < runtime:
            why = (
                f"nvcc builds for CUDA {runtime // 1000}.{runtime % 1000 // 10} but the driver "
                f"supports CUDA {driver // 1000}.{driver % 1000 // 10}"
            )
    if why:
        if why not in _WARNED:
            _WARNED.add(why)
            warnings.warn(
                f"compiler_opt: a GPU is present but {why}: the generated ops get CPU kernels "
                "only, so fused embeddings run unfused and served graphs use XLA clusters on "
                "the GPU",
                RuntimeWarning,
                stacklevel=2,
            )
        return False
    return True


@functools.cache
def _banner(path: str) -> str:
    """``nvcc --version``'s output (read once per nvcc)."""
    return subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout


def nvcc_version(path: str) -> int | None:
    """nvcc's CUDA version as the driver API writes it (``13000`` for 13.0), or None."""
    m = re.search(r"release (\d+)\.(\d+)", _banner(path))
    return int(m.group(1)) * 1000 + int(m.group(2)) * 10 if m else None


@functools.cache
def driver_version() -> int | None:
    """The newest CUDA version the installed driver supports (``cuDriverGetVersion``), or
    None without a driver."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    return int(v.value) if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else None


@dataclasses.dataclass(frozen=True)
class CudaToolchain:
    """nvcc, its version, the flags and the libraries to link (part of the cache key)."""

    nvcc: str
    version: str
    flags: tuple[str, ...]
    link: tuple[str, ...]

    def signature(self) -> str:
        return "\0".join((self.version, " ".join(self.flags), " ".join(self.link)))


def _library_dirs(path: str) -> list[str]:
    """The folders nvcc links CUDA's runtime from (``nvcc --dryrun``'s LIBRARIES line; nvcc
    may be a wrapper script, so its own path says little)."""
    r = subprocess.run(
        [path, "--dryrun", "-o", "/dev/null", "x.cu"], capture_output=True, text=True, check=False
    )
    dirs = []
    for line in (r.stdout + r.stderr).splitlines():
        if "LIBRARIES=" in line:
            dirs += [d for d in re.findall(r'-L"?([^"\s]+)', line) if not d.endswith("stubs")]
    return [d for d in dirs if Path(d, "libcudart_static.a").exists()]


@functools.cache
def _toolchain(path: str, archs: tuple[str, ...]) -> CudaToolchain:
    banner = _banner(path).strip()
    version = banner.splitlines()[-1] if banner else ""
    gencode = []
    for a in archs:
        gencode += [f"-gencode=arch=compute_{a},code=sm_{a}"]
    gencode += [f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
    flags = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--diag-suppress=177", *gencode)
    link = (
        *(f"-L{d}" for d in _library_dirs(path)),
        "-l:libcudart_static.a",
        "-ldl",
        "-lrt",
        "-lpthread",
    )
    return CudaToolchain(path, version, flags, link)


def toolchain() -> CudaToolchain:
    """The CUDA toolchain; raises CudaUnavailable without nvcc."""
    path = nvcc()
    if path is None:
        raise CudaUnavailable(f"nvcc not found (${NVCC_ENV}, the PATH, /usr/local/cuda/bin)")
    return _toolchain(path, gpu_archs() or DEFAULT_ARCHS)


def compile_object(cu: Path, obj: Path) -> None:
    """``nvcc -c cu -o obj``; raises CudaUnavailable with nvcc's errors when it fails."""
    tc = toolchain()
    r = subprocess.run(
        [tc.nvcc, "-c", str(cu), "-o", str(obj), *tc.flags],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        errs = [ln for ln in r.stderr.splitlines() if "error" in ln] or [r.stderr[-2000:]]
        raise CudaUnavailable(
            f"nvcc failed (exit {r.returncode}) on {cu}:\n" + "\n".join(errs[:20])
        )


# ------------------------------------------------------------------------------ shared text


def symbol(op_name: str) -> str:
    """The launcher's ``extern "C"`` name of op ``op_name`` (its error-string function adds
    ``_error``)."""
    return f"stitchrec_cuda_{op_name}"


_CU_PRELUDE = """\
#include <cstdint>
#include <cuda_runtime.h>
"""

# grid-stride launch of Element over [0, n), or the same loop on the host
_CU_LAUNCH = """\
__global__ void Kernel(int64_t n, Args a) {{
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    Element(i, a);
}}

int Run(int on_host, void* stream, int64_t n, const Args& a) {{
  if (on_host) {{
    for (int64_t i = 0; i < n; ++i) Element(i, a);
    return 0;
  }}
  if (n <= 0) return 0;
  int device = 0;
  cudaError_t e = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device);
  if (e == cudaSuccess) e = cudaSetDevice(device);
  if (e != cudaSuccess) return static_cast<int>(e);
  int64_t blocks = (n + {threads} - 1) / {threads};
  if (blocks > {max_blocks}) blocks = {max_blocks};
  Kernel<<<static_cast<unsigned>(blocks), {threads}, 0, static_cast<cudaStream_t>(stream)>>>(n, a);
  return static_cast<int>(cudaGetLastError());
}}
}}  // namespace

extern "C" const char* {sym}_error(int e) {{
  return cudaGetErrorString(static_cast<cudaError_t>(e));
}}
"""


def _launch_text(sym: str) -> str:
    return _CU_LAUNCH.format(threads=THREADS, max_blocks=MAX_BLOCKS, sym=sym)


def gpu_glue_header(syms: Sequence[str]) -> list[str]:
    """C++ (g++, appended to the op's source): the stream of a GPU op and the launchers'
    declarations."""
    lines = [
        "",
        "// ---- GPU kernels (compiler_opt/codegen_cuda.py): the device code is in the .cu",
        '#include "xla/stream_executor/stream.h"',
    ]
    for s in syms:
        lines.append(f'extern "C" const char* {s}_error(int e);')
    return [
        *lines,
        "namespace {",
        "void* StitchrecStream(::tensorflow::OpKernelContext* ctx) {",
        "  auto* dc = ctx->op_device_context();",
        "  return dc != nullptr && dc->stream() != nullptr",
        "             ? dc->stream()->platform_specific_handle().stream",
        "             : nullptr;",
        "}",
    ]


def launch_check(op: str, sym: str, call: str) -> list[str]:
    """C++ statements: ``call`` (an int-returning launcher call), then an Internal error naming
    the op and CUDA's message when it failed."""
    return [
        "    void* stream_ = StitchrecStream(ctx);",
        f'    OP_REQUIRES(ctx, stream_ != nullptr, errors::Internal("{op}: no GPU stream"));',
        f"    const int e_ = {call};",
        f'    OP_REQUIRES(ctx, e_ == 0, errors::Internal("{op}: CUDA kernel launch failed: ",',
        f"                                               {sym}_error(e_)));",
    ]


# -------------------------------------------------------------------------------- loop ops

#: op -> device C++ of its operands (codegen_loop.OPS's expressions, CUDA's math functions)
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


def loop_unsupported(spec: LoopSpec) -> str | None:
    """Why loop op ``spec`` has no CUDA form, or None."""
    if spec.matmul is not None:
        return "a loop op with its matmul inside (attach_matmuls) has no CUDA form"
    return None


def loop_source(spec: LoopSpec) -> str:
    """The ``.cu`` source of loop op ``spec``: ``Element(i)`` computes element ``i`` of every
    output (``j = i % width``: a ``row`` input is read at ``j``, a ``scalar`` at 0)."""
    from compiler_opt.codegen_loop import OPS

    reason = loop_unsupported(spec)
    if reason:
        raise ValueError(reason)
    sym = symbol(spec.op_name)
    n_in, n_out = len(spec.inputs), len(spec.outputs)
    lines = [
        "// Generated by stitchrec compiler_opt/codegen_cuda.py: do not edit.",
        f"// loop spec: {spec.to_json()}",
        _CU_PRELUDE,
        "namespace {",
        f"constexpr int64_t kWidth = {spec.width};",
        f"struct Args {{ const float* x[{n_in}]; float* y[{n_out}]; }};",
        "__host__ __device__ inline void Element(int64_t i, const Args& a) {",
        "  const int64_t j = i % kWidth;",
        "  (void)j;",
    ]
    for k, kind in enumerate(spec.inputs):
        index = {"full": "i", "row": "j", "scalar": "0"}[kind]
        lines.append(f"  const float v{k} = a.x[{k}][{index}];")
    for i, (op, operands) in enumerate(spec.body):
        b = f"v{operands[1]}" if len(operands) > 1 else ""
        template = DEVICE_OPS.get(op, OPS[op][1])
        lines.append(f"  const float v{n_in + i} = {template.format(a=f'v{operands[0]}', b=b)};")
    for o, value in enumerate(spec.outputs):
        lines.append(f"  a.y[{o}][i] = v{n_in + value};")
    lines += [
        "}",
        *_xy_entry(sym, n_in, n_out),
    ]
    return "\n".join(lines)


def _xy_entry(sym: str, n_in: int, n_out: int) -> list[str]:
    """The launch code and the ``extern "C"`` entry of an op over float inputs ``x`` and
    outputs ``y`` (loop and row ops): ``sym(on_host, stream, n, x, y)``."""
    return [
        _launch_text(sym),
        f'extern "C" int {sym}(int on_host, void* stream, int64_t n, const float* const* x,',
        "                     float* const* y) {",
        "  Args a;",
        f"  for (int k = 0; k < {n_in}; ++k) a.x[k] = x[k];",
        f"  for (int o = 0; o < {n_out}; ++o) a.y[o] = y[o];",
        "  return Run(on_host, stream, n, a);",
        "}",
        "",
    ]


def loop_gpu_kernel(spec: LoopSpec, prologue: Sequence[str]) -> str:
    """C++ (g++) of the GPU ``OpKernel`` of loop op ``spec``: ``prologue`` (the CPU kernel's
    checks and outputs: ``n``, ``X<k>``, ``Y<o>``) then the launch."""
    return _gpu_kernel(spec.op_name, len(spec.inputs), len(spec.outputs), prologue, "n")


# ---------------------------------------------------------------------------- row programs


def row_source(spec: Any) -> str:
    """The ``.cu`` source of row op ``spec`` (``codegen_row.RowSpec``): ``Element(r)`` runs
    the whole program of row ``r`` (one thread per row, its values in local arrays)."""
    from compiler_opt.codegen_row import row_program

    sym = symbol(spec.op_name)
    n_in, n_out = len(spec.inputs), len(spec.outputs)
    return "\n".join(
        [
            "// Generated by stitchrec compiler_opt/codegen_cuda.py: do not edit.",
            f"// row spec: {spec.to_json()}",
            _CU_PRELUDE,
            "#include <math.h>",
            "namespace {",
            f"struct Args {{ const float* x[{n_in}]; float* y[{n_out}]; }};",
            "__host__ __device__ inline void Element(int64_t r, const Args& a) {",
            *[f"  const float* X{k} = a.x[{k}];" for k in range(n_in)],
            *[f"  float* Y{o} = a.y[{o}];" for o in range(n_out)],
            *row_program(spec, DEVICE_OPS),
            "}",
            *_xy_entry(sym, n_in, n_out),
        ]
    )


def row_gpu_kernel(spec: Any, prologue: Sequence[str]) -> str:
    """C++ (g++) of the GPU ``OpKernel`` of row op ``spec``: ``prologue`` (the CPU kernel's
    checks and outputs: ``rows``, ``X<k>``, ``Y<o>``) then the launch over the rows."""
    return _gpu_kernel(spec.op_name, len(spec.inputs), len(spec.outputs), prologue, "rows")


def _gpu_kernel(name: str, n_in: int, n_out: int, prologue: Sequence[str], n: str) -> str:
    sym = symbol(name)
    xs = ", ".join(f"X{k}" for k in range(n_in))
    ys = ", ".join(f"Y{o}" for o in range(n_out))
    lines = [
        *gpu_glue_header([sym]),
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
        *launch_check(name, sym, f"{sym}(0, stream_, {n}, xs_, ys_)"),
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{name}").Device(::tensorflow::DEVICE_GPU), {name}GpuOp);',
        "}  // namespace",
        "",
    ]
    return "\n".join(lines)


def run_row_on_host(
    library: str | Path, spec: Any, inputs: Sequence[np.ndarray], rows: int
) -> list[np.ndarray]:
    """Runs row op ``spec``'s device code on the host: the outputs ``[rows, *shape]``."""
    shapes = [(rows, *spec.body[v].shape) for v in spec.outputs]
    return _run_xy_on_host(library, spec.op_name, inputs, shapes, rows)


def _run_xy_on_host(
    library: str | Path, op: str, inputs: Sequence[np.ndarray], shapes: Sequence[tuple], n: int
) -> list[np.ndarray]:
    """Runs an x/y op's launcher on the host over ``[0, n)`` into NaN-filled outputs."""
    xs = [np.ascontiguousarray(x, np.float32) for x in inputs]
    ys = [np.full(shape, np.nan, np.float32) for shape in shapes]
    fn = getattr(_library(library), symbol(op))
    fn.restype = ctypes.c_int
    e = fn(1, None, ctypes.c_int64(n), _ptrs(xs), _ptrs(ys))
    if e != 0:
        raise RuntimeError(f"{op}: host run returned {e}")
    return ys


# --------------------------------------------------------------------------- embedding op


def embedding_unsupported(spec: KernelSpec) -> str | None:
    """Why embedding op ``spec`` has no CUDA form, or None."""
    if spec.masked_fields and not spec.mask_rows:
        return (
            "AMTL masks in their training form (int32 wheres, kept in host memory for GPU "
            "kernels) have no CUDA form; the tabulated serving form (mask_rows) has"
        )
    if any(t.dtype == "int32" for t in spec.tables):
        return "int32 tables (row offsets) have no CUDA form; export them as int64"
    return None


def gradient_on_gpu(spec: KernelSpec) -> bool:
    """Whether the CUDA form of ``spec`` has the gradient op too: trainable specs without
    masks (the tabulated masks are a serving form: its gradient stays on the CPU kernel)."""
    return spec.trainable and not spec.masked_fields


_CU_HELPERS = """\
__host__ __device__ inline int64_t Clamp(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// The row b of a ragged field holding value k (splits[b] <= k < splits[b + 1]).
__host__ __device__ inline int64_t RowOf(const int64_t* splits, int64_t batch, int64_t k) {
  int64_t lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (splits[mid] <= k) lo = mid; else hi = mid;
  }
  return lo;
}
"""


def _tables_code(spec: KernelSpec) -> list[str]:
    lines = []
    for t, table in enumerate(spec.tables):
        ctype = _C_TYPES[table.dtype][0]
        lines.append(f"  const {ctype}* T{t} = static_cast<const {ctype}*>(a.t[{t}]);")
    for i in range(spec.num_id_inputs):
        lines.append(f"  const int64_t* I{i} = a.ids[{i}];")
    for m in range(len(spec.masked_fields)):
        lines.append(f"  const float* M{m} = a.m[{m}];")
    lines.append("  (void)T0; (void)I0;")
    return lines


def _segment_select(segs: Sequence[tuple[int, int, str]], jf: str, assign: str) -> list[str]:
    """C++: ``assign`` (``v = `` or ``acc += ``) the expression of the segment holding column
    ``jf`` of the field, with ``j`` the column within the segment."""
    lines = []
    for n, (start, width, expr) in enumerate(segs):
        cond = "if" if n == 0 else "else if"
        lines.append(
            f"    {cond} ({jf} < {start + width}) {{ const int64_t j = {jf} - {start}; "
            f"{assign}{expr}; }}"
        )
    return lines


def _field_element(
    f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int | None
) -> list[str]:
    """C++: ``v`` = column ``c`` of example ``b`` for field ``f`` (columns ``[offset, +dim)``)."""
    body = _row_code(f, "id_") + _ptr_code(f, spec)
    if mask_index is not None:  # the tabulated form: the mask row of the table row
        body.append(f"const float* m_ = M{mask_index} + r0 * {f.dim};")
    segs = _segments(f)
    lines = [
        f"    // field {f.name!r}: {f.method}, dim {f.dim}",
        f"    const int64_t jf = c - {f.offset};",
    ]
    if not f.ragged:
        lines.append(f"    const int64_t id_ = I{first_id}[b];")
        lines += [f"    {s}" for s in body]
        lines += _segment_select(segs, "jf", "v = ")
        return lines
    vals, splits = f"I{first_id}", f"I{first_id + 1}"
    lines += [
        f"    const int64_t nnz_ = a.nids[{first_id}];",
        f"    const int64_t s_ = Clamp({splits}[b], 0, nnz_);",
        f"    const int64_t e_ = Clamp({splits}[b + 1], s_, nnz_);",
        "    float acc = 0.0f;",
        "    for (int64_t k_ = s_; k_ < e_; ++k_) {",
        f"    const int64_t id_ = {vals}[k_];",
        *[f"    {s}" for s in body],
        *_segment_select(segs, "jf", "acc += "),
        "    }",
    ]
    if f.combiner == "mean":
        lines.append("    v = acc / static_cast<float>(e_ - s_ > 1 ? e_ - s_ : 1);")
    else:
        lines.append("    v = acc;")
    return lines


def _dispatch(parts: Sequence[tuple[int, list[str]]], var: str, indent: str = "  ") -> list[str]:
    """A binary search over ``parts`` (``(first value of var, code)``, ascending): the code of
    the part holding ``var``, in ``log2(len(parts))`` comparisons."""
    if len(parts) == 1:
        return [f"{indent}{{", *parts[0][1], f"{indent}}}"]
    mid = len(parts) // 2
    return [
        f"{indent}if ({var} < {parts[mid][0]}) {{",
        *_dispatch(parts[:mid], var, indent + "  "),
        f"{indent}}} else {{",
        *_dispatch(parts[mid:], var, indent + "  "),
        f"{indent}}}",
    ]


def _embedding_args(spec: KernelSpec, grad: bool) -> str:
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, max(len(spec.masked_fields), 1)
    common = (
        f"const void* t[{nt}]; const int64_t* ids[{ni}]; int64_t nids[{ni}]; "
        f"const float* m[{nm}]; int64_t batch;"
    )
    if grad:
        return (
            f"struct Args {{ {common} const float* dy; int64_t* rows[{nt}]; float* values[{nt}]; "
            f"int64_t off[{nt + 1}]; }};"
        )
    return f"struct Args {{ {common} const float* dense; float* y; }};"


def embedding_source(spec: KernelSpec) -> str:
    """The ``.cu`` source of embedding op ``spec`` (forward, and the gradient when trainable).

    Forward ``Element(i)``: ``b = i / out_dim``, ``c = i % out_dim``; the field holding column
    ``c`` (a binary search over the fields' offsets) computes that one column (ragged fields
    pool over the row's ids), or ``c`` is a dense column. Gradient ``Element(i)``: ``i`` runs
    over the ``values`` outputs of every table, one after the other (``off``: their starts),
    ``pos = e / cols`` is the id's row entry, ``j = e % cols`` the column; the value is
    ``dy[b, o_f + start + j] (/ n) * factor[j]`` as in the CPU gradient, and ``j == 0`` also
    writes ``rows[pos]``.
    """
    reason = embedding_unsupported(spec)
    if reason:
        raise ValueError(reason)
    fwd, grad = op_names(spec)
    _, _, first_id = _id_layout(spec)
    mask_of = {f.name: i for i, f in enumerate(spec.masked_fields)}
    head = [
        "// Generated by stitchrec compiler_opt/codegen_cuda.py: do not edit.",
        f"// spec: {spec.to_json()}",
        _CU_PRELUDE,
        "namespace {",
        f"constexpr int64_t kOutDim = {spec.out_dim};",
        f"constexpr int64_t kEmbDim = {spec.emb_dim};",
        f"constexpr int64_t kDenseDim = {spec.dense_dim};",
        id_helpers("__host__ __device__ "),
        _CU_HELPERS,
    ]
    parts = [
        (f.offset, _field_element(f, spec, first_id[f.name], mask_of.get(f.name)))
        for f in spec.fields
    ]
    if spec.dense_dim:
        parts.append((spec.emb_dim, ["    v = a.dense[b * kDenseDim + (c - kEmbDim)];"]))
    sym = symbol(fwd)
    forward = [
        *head,
        _embedding_args(spec, grad=False),
        "__host__ __device__ inline void Element(int64_t i, const Args& a) {",
        "  const int64_t b = i / kOutDim, c = i % kOutDim;",
        *_tables_code(spec),
        "  float v = 0.0f;",
        *_dispatch(parts, "c"),
        "  a.y[i] = v;",
        "}",
        _launch_text(sym),
        _extern_entry(
            sym,
            "float* y",
            "a.y = y;",
            "batch * kOutDim",
            spec,
            "const float* dense",
            "a.dense = dense;",
        ),
    ]
    if not gradient_on_gpu(spec):
        return "\n".join(forward)
    gsym = symbol(grad)
    backward = [
        "",
        "// ------------------------------------------------------------------ gradient",
        "namespace {",  # the gradient's Element/Kernel/Run: namespace grad in the anonymous one
        "namespace grad {",
        _embedding_args(spec, grad=True),
        "__host__ __device__ inline void Element(int64_t i, const Args& a) {",
        *_tables_code(spec),
        "  int t = 0;",
        f"  while (t + 1 < {len(spec.tables)} && i >= a.off[t + 1]) ++t;",
        "  const int64_t e = i - a.off[t];",
        "  switch (t) {",
    ]
    for t in range(len(spec.tables)):
        backward += [f"  case {t}: {{", *_table_gradient(t, spec, first_id), "    break;", "  }"]
    backward += [
        "  }",
        "}",
        _launch_text(gsym).replace("}  // namespace", "}  // namespace grad\n}  // namespace"),
        _extern_entry(
            gsym,
            "const float* dy, int64_t* const* rows, float* const* values, const int64_t* off",
            f"a.dy = dy; for (int t = 0; t < {len(spec.tables)}; ++t) {{ a.rows[t] = rows[t]; "
            f"a.values[t] = values[t]; }} for (int t = 0; t <= {len(spec.tables)}; ++t) "
            "a.off[t] = off[t];",
            f"off[{len(spec.tables)}]",
            spec,
            "",
            "",
            prefix="grad::",
        ),
    ]
    return "\n".join(forward + backward)


def _extern_entry(
    sym: str,
    out_params: str,
    out_set: str,
    n: str,
    spec: KernelSpec,
    extra_param: str,
    extra_set: str,
    prefix: str = "",
) -> str:
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, len(spec.masked_fields)
    params = [
        "int on_host",
        "void* stream",
        "int64_t batch",
        "const void* const* tables",
        "const int64_t* const* ids",
        "const int64_t* nids",
        "const float* const* masks",
    ]
    if extra_param:
        params.append(extra_param)
    params.append(out_params)
    return "\n".join(
        [
            f'extern "C" int {sym}({", ".join(params)}) {{',
            f"  {prefix}Args a = {{}};",
            "  a.batch = batch;",
            f"  for (int t = 0; t < {nt}; ++t) a.t[t] = tables[t];",
            f"  for (int k = 0; k < {ni}; ++k) {{ a.ids[k] = ids[k]; a.nids[k] = nids[k]; }}",
            f"  for (int m = 0; m < {nm}; ++m) a.m[m] = masks[m];",
            f"  {extra_set}" if extra_set else "",
            f"  {out_set}",
            f"  return {prefix}Run(on_host, stream, {n}, a);",
            "}",
            "",
        ]
    )


def _table_gradient(t: int, spec: KernelSpec, first_id: dict[str, int]) -> list[str]:
    """C++ of one table's gradient entries (see :func:`embedding_source`)."""
    f = next(f for f in spec.fields if t in f.tables)
    cols = spec.tables[t].cols
    nrow = f.rows_per_id
    first = first_id[f.name]
    lines = [
        f"    // table {t}: field {f.name!r} ({f.method})",
        f"    const int64_t pos = e / {cols}, j = e % {cols};",
        f"    const int64_t k_ = pos / {nrow};",
        f"    const int64_t slot = pos % {nrow};",
        "    (void)slot;",
    ]
    if f.ragged:
        splits = f"I{first + 1}"
        lines += [
            f"    const int64_t b = RowOf({splits}, a.batch, k_);",
            f"    const int64_t n_ = {splits}[b + 1] - {splits}[b];",
        ]
        scale = " / static_cast<float>(n_ > 1 ? n_ : 1)" if f.combiner == "mean" else ""
    else:
        lines.append("    const int64_t b = k_;")
        scale = ""
    lines.append(f"    const int64_t id_ = I{first}[k_];")
    lines += [f"    {s}" for s in _row_code(f, "id_") + _ptr_code(f, spec)]
    lines.append(f"    const float* g_ = a.dy + b * kOutDim + {f.offset};")
    comps = _grad_components(f)
    first_branch = True
    for ci, (table, slot, start, width, factor) in enumerate(comps):
        if table != t:
            continue
        if width != cols:
            raise ValueError(f"field {f.name!r}: gradient width {width} != table {t}'s {cols}")
        row = f"r{slot}" if f.method == "bh" else f"r{ci}"
        mult = f" * {factor}[j]" if factor else ""
        cond = "if" if first_branch else "else if"
        first_branch = False
        lines += [
            f"    {cond} (slot == {slot}) {{",
            f"      a.values[{t}][pos * {cols} + j] = g_[{start} + j]{scale}{mult};",
            f"      if (j == 0) a.rows[{t}][pos] = {row};",
            "    }",
        ]
    return lines


def embedding_gpu_kernels(spec: KernelSpec) -> str:
    """C++ (g++) of the GPU ``OpKernel``s of embedding op ``spec``: the tables through their
    handles (shape and dtype checked, read under the shared locks, as the CPU kernel), the ids'
    and masks' shapes checked on the host, then the launch (see :func:`embedding_source`)."""
    fwd, grad = op_names(spec)
    nt, ni, nm = len(spec.tables), spec.num_id_inputs, len(spec.masked_fields)
    with_grad = gradient_on_gpu(spec)
    syms = [symbol(fwd)] + ([symbol(grad)] if with_grad else [])
    params = (
        "int, void*, int64_t, const void* const*, const int64_t* const*, const int64_t*, "
        "const float* const*"
    )
    lines = [
        *gpu_glue_header(syms),
        "}  // namespace",
        f'extern "C" int {symbol(fwd)}({params}, const float*, float*);',
    ]
    if with_grad:
        lines.append(
            f'extern "C" int {symbol(grad)}({params}, const float*, int64_t* const*, '
            "float* const*, const int64_t*);"
        )
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
    lines += [
        "namespace {",
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
        *launch_check(
            fwd,
            symbol(fwd),
            f"{symbol(fwd)}(0, stream_, batch, tables, ids, nids, masks, dense, "
            "out->flat<float>().data())",
        ),
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{fwd}").Device(::tensorflow::DEVICE_GPU), {fwd}GpuOp);',
    ]
    if with_grad:
        lines += [
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
            *launch_check(
                grad,
                symbol(grad),
                f"{symbol(grad)}(0, stream_, batch, tables, ids, nids, masks, "
                "dy_t.flat<float>().data(), rows, values, off)",
            ),
            "  }",
            "};",
            f'REGISTER_KERNEL_BUILDER(Name("{grad}").Device(::tensorflow::DEVICE_GPU), '
            f"{grad}GpuOp);",
        ]
    lines += ["}  // namespace", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------- host emulation


def _ptrs(arrays: Sequence[np.ndarray], ctype: Any = ctypes.c_void_p) -> Any:
    arr = (ctype * max(len(arrays), 1))()
    for k, a in enumerate(arrays):
        arr[k] = ctypes.cast(a.ctypes.data, ctype)
    return arr


def _library(path: str | Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


def run_loop_on_host(
    library: str | Path, spec: LoopSpec, inputs: Sequence[np.ndarray], rows: int
) -> list[np.ndarray]:
    """Runs loop op ``spec``'s device code (``Element``) on the host: ``inputs`` as the op
    takes them (float32), the outputs ``[rows, width]``."""
    shapes = [(rows, spec.width)] * len(spec.outputs)
    return _run_xy_on_host(library, spec.op_name, inputs, shapes, rows * spec.width)


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
    lib = _library(library)
    tabs = [np.ascontiguousarray(t) for t in tables]
    idv = [np.ascontiguousarray(x, np.int64) for x in ids]
    msk = [np.ascontiguousarray(m, np.float32) for m in masks]
    nids = np.array([len(x) for x in idv], np.int64)
    _, kinds, _ = _id_layout(spec)
    batch = next(len(x) - (1 if k == 2 else 0) for x, k in zip(idv, kinds, strict=True) if k != 1)
    common = [
        ctypes.c_int64(batch),
        _ptrs(tabs),
        _ptrs(idv),
        nids.ctypes.data_as(ctypes.c_void_p),
        _ptrs(msk),
    ]
    if dy is None:
        y = np.full((batch, spec.out_dim), np.nan, np.float32)
        d = None if dense is None else np.ascontiguousarray(dense, np.float32)
        fn = getattr(lib, symbol(fwd))
        fn.restype = ctypes.c_int
        dense_ptr = None if d is None else d.ctypes.data_as(ctypes.c_void_p)
        e = fn(1, None, *common, dense_ptr, y.ctypes.data_as(ctypes.c_void_p))
        if e != 0:
            raise RuntimeError(f"{fwd}: host run returned {e}")
        return y
    _, _, first = _id_layout(spec)
    g = np.ascontiguousarray(dy, np.float32)
    rows, values, off = [], [], [0]
    for t, table in enumerate(spec.tables):
        f = next(f for f in spec.fields if t in f.tables)
        n = int(nids[first[f.name]]) * f.rows_per_id
        rows.append(np.full(n, -1, np.int64))
        values.append(np.full((n, table.cols), np.nan, np.float32))
        off.append(off[-1] + n * table.cols)
    offs = np.array(off, np.int64)
    fn = getattr(lib, symbol(grad))
    fn.restype = ctypes.c_int
    e = fn(
        1,
        None,
        *common,
        g.ctypes.data_as(ctypes.c_void_p),
        _ptrs(rows),
        _ptrs(values),
        offs.ctypes.data_as(ctypes.c_void_p),
    )
    if e != 0:
        raise RuntimeError(f"{grad}: host run returned {e}")
    return rows, values
