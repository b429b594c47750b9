"""Embedding ops in the process: generated, compiled, loaded (through the registry) with their
gradient registered, and looked up by name."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

import compiler_opt.csource as csource
import compiler_opt.registry as registry
from compiler_opt.embedding_op import cpu, cuda
from compiler_opt.embedding_op.gradient import register_gradient
from compiler_opt.embedding_op.spec import KernelSpec, op_names
from compiler_opt.toolchain import Compiled


def _sources(spec: KernelSpec, cuda_form: bool) -> tuple[str, str | None]:
    if not cuda_form:
        return cpu.generate(spec), None
    return cpu.generate(spec, cuda=True), cuda.embedding_source(spec)


#: the registry's entry for embedding ops
EMBEDDING = registry.OpKind("embedding", _sources, cuda.embedding_unsupported)


@dataclasses.dataclass
class Kernel:
    """A loaded fused op: ``kernel(tables, ids, masks, wheres, dense) -> [batch, out_dim]``."""

    spec: KernelSpec
    source: str
    library: Compiled
    forward_name: str
    gradient_name: str
    module: Any
    gpu: bool = False  # the library holds the ops' GPU kernels (its CUDA form)

    def _fn(self, op: str) -> Any:
        return getattr(self.module, csource.python_name(op))

    def __call__(
        self,
        tables: Sequence[Any],
        ids: Sequence[tf.Tensor],
        masks: Sequence[tf.Tensor] = (),
        wheres: Sequence[tf.Tensor] = (),
        dense: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """``tables``: the table variables (or their handles) in ``spec.tables`` order; ``ids``:
        per field ``[batch]`` int64, or ragged values ``[nnz]`` then row splits ``[batch + 1]``;
        ``masks``/``wheres``: per AMTL field ``[unique, dim]`` float and ``[ids]`` int32;
        ``dense``: ``[batch, dense_dim]`` float when the spec has dense columns."""
        handles = []
        for t in tables:
            if hasattr(t, "handle"):
                resource_variable_ops.variable_accessed(t)  # the tape watches it
                handles.append(t.handle)
            else:
                handles.append(t)
        args: dict[str, Any] = {"tables": handles, "ids": [tf.cast(x, tf.int64) for x in ids]}
        if self.spec.masked_fields:
            args["masks"] = list(masks)
            if not self.spec.mask_rows:
                args["wheres"] = [tf.cast(w, tf.int32) for w in wheres]
        if self.spec.dense_dim:
            if dense is None:
                raise ValueError(f"dense must be a [batch, {self.spec.dense_dim}] tensor, got None")
            args["dense"] = dense
        return self._fn(self.forward_name)(**args)


_LOCK = threading.Lock()
_KERNELS: dict[str, Kernel] = {}


# run while a model traces: AutoGraph would convert the code generator and the compiler calls
@tf.autograph.experimental.do_not_convert
def load(spec: KernelSpec, directory: str | Path | None = None) -> Kernel:
    """The op of ``spec`` in this process: generated, compiled (or found in the cache), loaded
    with ``tf.load_op_library`` and its gradient registered, once per process and spec."""
    source = cpu.generate(spec)
    with _LOCK:
        forward, gradient = op_names(spec)
        if forward in _KERNELS:
            return _KERNELS[forward]
        op = registry.load(spec, EMBEDDING, directory)
        if spec.trainable:
            register_gradient(spec, forward, gradient, op.module)
        kernel = Kernel(spec, source, op.library, forward, gradient, op.module, op.gpu)
        _KERNELS[forward] = kernel
        return kernel


def gpu_fallback(kernel: Kernel, devices: Sequence[str]) -> str:
    """Why ``kernel`` cannot read tables placed on ``devices`` (variables' device strings), or
    "": tables on a GPU need the op's GPU kernel (its CUDA form); its CPU kernel would read
    device memory as host memory."""
    on_gpu = [d for d in devices if "GPU" in d.upper().rsplit("/", 1)[-1]]
    if not on_gpu or kernel.gpu:
        return ""
    why = cuda.embedding_unsupported(kernel.spec) or (
        "its CUDA form was not built (no nvcc, or $STITCHREC_CUDA=0)"
    )
    return f"tables on {on_gpu[0]} but op {kernel.forward_name} has no GPU kernel: {why}"


def kernel_named(forward_name: str) -> Kernel:
    """The loaded kernel whose forward op is ``forward_name``."""
    if forward_name not in _KERNELS:
        raise KeyError(f"no generated kernel {forward_name!r} is loaded in this process")
    return _KERNELS[forward_name]


def loaded_kernels() -> list[Kernel]:
    """The kernels loaded in this process (for exports)."""
    return list(_KERNELS.values())
