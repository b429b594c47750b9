"""The generated ops loaded in this process: one registry for every kind of op.

A generated op is a spec (anything with an ``op_name``) and its :class:`OpKind`: how to write
the spec's sources (the C++ of the op, and the ``.cu`` of its CUDA form) and why a spec has no
CUDA form. :func:`load` compiles the library (``toolchain.compile_kernel``, cached by content
hash), loads it once per process and name, and keeps it; :func:`loaded` and
:func:`op_function` look an op up by name.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import tensorflow as tf

import compiler_opt.csource as csource
from compiler_opt.toolchain import Compiled, compile_kernel, cuda_enabled


class OpSpec(Protocol):
    """What the registry reads of a spec: the name of its (forward) op."""

    @property
    def op_name(self) -> str: ...


@dataclasses.dataclass(frozen=True)
class OpKind:
    """A kind of generated op: ``sources(spec, cuda)`` gives ``(C++, .cu or None)`` (the C++
    holds the GPU kernel when ``cuda``), ``cuda_unsupported(spec)`` why ``spec`` has no CUDA
    form (None: it has one)."""

    name: str
    sources: Callable[[Any, bool], tuple[str, str | None]]
    cuda_unsupported: Callable[[Any], str | None]


@dataclasses.dataclass(frozen=True)
class LoadedOp:
    """A loaded library: its op name, the library, the ``tf.load_op_library`` module and whether
    it holds the op's GPU kernel."""

    name: str
    library: Compiled
    module: Any
    gpu: bool

    def function(self, op_name: str | None = None) -> Any:
        """The Python function of op ``op_name`` (default: :attr:`name`) in the library."""
        return getattr(self.module, csource.python_name(op_name or self.name))


_LOCK = threading.Lock()
_LOADED: dict[str, LoadedOp] = {}


def compile_op(
    spec: OpSpec, kind: OpKind, directory: str | Path | None = None
) -> tuple[Compiled, bool]:
    """The library of ``spec`` (compiled when absent) and whether it holds the GPU kernel: where
    ``toolchain.cuda_enabled()`` and the spec has a CUDA form."""
    cuda = cuda_enabled() and kind.cuda_unsupported(spec) is None
    source, cu = kind.sources(spec, cuda)
    return compile_kernel(source, directory, cuda_source=cu), cuda


# run while a graph traces: AutoGraph would convert the source writers and the compiler calls
@tf.autograph.experimental.do_not_convert
def load(spec: OpSpec, kind: OpKind, directory: str | Path | None = None) -> LoadedOp:
    """Compiles (or finds in the cache) and loads the op of ``spec``, once per process and
    name; the library holds the op's GPU kernel too where it has one."""
    with _LOCK:
        name = spec.op_name
        if name not in _LOADED:
            lib, cuda = compile_op(spec, kind, directory)
            _LOADED[name] = LoadedOp(name, lib, tf.load_op_library(str(lib.path)), cuda)
        return _LOADED[name]


def loaded(name: str) -> LoadedOp:
    """The loaded op ``name``; KeyError when it is not loaded."""
    if name not in _LOADED:
        raise KeyError(f"op {name!r} is not loaded; load(spec, kind) loads it")
    return _LOADED[name]


def has_gpu_kernel(name: str) -> bool:
    """Whether loaded op ``name`` has a GPU kernel (its CUDA form)."""
    op = _LOADED.get(name)
    return op is not None and op.gpu


def op_function(name: str) -> Any:
    """The Python function of loaded op ``name`` (loop and row ops: ``f(x, M=outputs)``)."""
    return loaded(name).function()


def precompile(ops: Sequence[tuple[OpSpec, OpKind]], workers: int | None = None) -> None:
    """Compiles the libraries of ``ops`` (``(spec, kind)``) that are not loaded yet, ``workers``
    (default: the CPUs) at a time: a graph's generated ops take a compile each (seconds), and
    g++ runs on one core."""
    todo = [(s, k) for s, k in ops if s.op_name not in _LOADED]
    if len(todo) < 2:
        return
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        for f in [pool.submit(compile_op, s, k) for s, k in todo]:
            f.result()  # a compile error surfaces here, as it would in load()
