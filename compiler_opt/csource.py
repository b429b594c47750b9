"""C/C++ text shared by the generated ops: C types, lists, the id hash helpers, CUDA's launch glue.

The hash helper ``HashBucket`` is splitmix64 with the constants of embeddings/hashing.py, so
a generated op buckets ids exactly as ``HashingEmbedding`` does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embeddings.hashing import MIX1, MIX2

C_TYPES = {
    "float32": ("float", "DT_FLOAT"),
    "int32": ("int32_t", "DT_INT32"),
    "int64": ("int64_t", "DT_INT64"),
}
THREADS = 256
MAX_BLOCKS = 65535


# the row rules' helpers, shared with the CUDA form (``qual``: ``__host__ __device__ ``)
_ID_HELPERS = """\
{qual}inline int64_t OovSafe(int64_t id, int64_t rows) {{ return (id >= 0 && id < rows) ? id : 0; }}

{qual}inline int64_t HashBucket(int64_t id, uint64_t seed_add, int64_t buckets, bool oov) {{
  uint64_t z = static_cast<uint64_t>(id) + seed_add;
  z ^= z >> 30;
  z *= 0x{mix1:X}ULL;
  z ^= z >> 27;
  z *= 0x{mix2:X}ULL;
  z ^= z >> 31;
  const int64_t h = static_cast<int64_t>(z >> 1);
  return oov ? 0 : 1 + h % (buckets - 1);
}}
"""


def id_helpers(qual: str = "") -> str:
    """C++ of ``OovSafe`` and ``HashBucket`` (splitmix64, as embeddings/hashing.py)."""
    return _ID_HELPERS.format(qual=qual, mix1=MIX1, mix2=MIX2)


def c_list(values: Sequence[Any]) -> str:
    return ", ".join(str(int(v)) for v in values) if values else "0"


def python_name(op_name: str) -> str:
    """The name of op ``op_name``'s Python function in its ``tf.load_op_library`` module."""
    return "".join("_" + c.lower() if c.isupper() else c for c in op_name).lstrip("_")


# ------------------------------------------------------------------------------ CUDA text


def symbol(op_name: str) -> str:
    """The launcher's ``extern "C"`` name of op ``op_name`` (its error-string function adds
    ``_error``)."""
    return f"stitchrec_cuda_{op_name}"


CU_PRELUDE = """\
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


def launch_text(sym: str) -> str:
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


# ------------------------------------------------------------------------- host emulation


def c_pointers(arrays: Sequence[np.ndarray], ctype: Any = ctypes.c_void_p) -> Any:
    arr = (ctype * max(len(arrays), 1))()
    for k, a in enumerate(arrays):
        arr[k] = ctypes.cast(a.ctypes.data, ctype)
    return arr


def open_library(path: str | Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
