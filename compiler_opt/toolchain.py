"""The compilers behind the generated ops: g++ for every op library, nvcc for their CUDA forms.

:func:`compile_kernel` builds a generated op's source into a shared library under
:func:`kernels_dir`, cached by a content hash of the source and of the toolchain (compiler
version, flags, TensorFlow's version, the CPU's feature flags), so each library is compiled once
per machine. :func:`cuda_enabled` decides whether the libraries also get their CUDA form
(``$STITCHREC_CUDA``: ``1`` always, ``0`` never, unset: when TensorFlow sees a GPU, ``nvcc`` is
found and the driver supports nvcc's CUDA version). With ``$STITCHREC_CXX_PCH`` (a folder), g++
reads the TensorFlow headers every generated op includes from a precompiled header kept there
(:func:`precompiled_header`): about half the seconds of a compile, the same library.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import tensorflow as tf

import compiler_opt.cost as cost
import compiler_opt.gemm as gemm

CXX_ENV = "CXX"
NVCC_ENV = "NVCC"
MODE_ENV = "STITCHREC_CUDA"
PCH_ENV = "STITCHREC_CXX_PCH"
#: headers every generated op's source includes before its own code (``xy_op.xy_op_head``,
#: ``embedding_op.cpu``): what the precompiled header holds
PCH_HEADERS = (
    "<algorithm>",
    "<cstdint>",
    '"tensorflow/core/framework/op.h"',
    '"tensorflow/core/framework/op_kernel.h"',
    '"tensorflow/core/framework/shape_inference.h"',
)
#: compute capabilities compiled when no GPU is visible (``$STITCHREC_CUDA=1``); PTX of the
#: last one lets the driver compile it for later GPUs
DEFAULT_ARCHS = ("80", "90")


class CompilerUnavailable(RuntimeError):
    """No C++ compiler, or the generated source did not compile."""


class CudaUnavailable(CompilerUnavailable):
    """The CUDA forms were asked for (``$STITCHREC_CUDA=1``) but cannot be built."""


# ----------------------------------------------------------------------------------- g++


def kernels_dir() -> Path:
    """``$STITCHREC_CACHE/compiler_opt/kernels`` (``~/.cache/stitchrec/...`` by default)."""
    return cost.cache_dir() / "kernels"


def compiler() -> str | None:
    """The C++ compiler: ``$CXX`` or ``g++`` on the PATH, None when there is none."""
    return shutil.which(os.environ.get(CXX_ENV) or "g++")


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """What the library depends on besides its source (part of the cache key)."""

    cxx: str
    cxx_version: str
    flags: tuple[str, ...]
    tf_version: str
    cpu: str

    def key(self, source: str) -> str:
        h = hashlib.sha256()
        for part in (source, self.cxx_version, " ".join(self.flags), self.tf_version, self.cpu):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]


def _cpu_flags() -> str:
    """The CPU's feature flags (``-march=native`` makes the library depend on them)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


_TOOLCHAIN: Toolchain | None = None


def cxx_toolchain() -> Toolchain:
    """The compiler, its version and the flags; raises CompilerUnavailable without a compiler."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        cxx = compiler()
        if cxx is None:
            raise CompilerUnavailable(
                f"no C++ compiler: ${CXX_ENV} is {os.environ.get(CXX_ENV)!r} and g++ is not on "
                "the PATH"
            )
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[:1]
        flags = (
            "-O3",
            "-march=native",
            "-shared",
            "-fPIC",
            "-fno-math-errno",
            "-fopenmp-simd",  # `#pragma omp simd`: vectorized reductions (row programs)
            "-Wno-deprecated-declarations",
            *tf.sysconfig.get_compile_flags(),
            *tf.sysconfig.get_link_flags(),
        )
        _TOOLCHAIN = Toolchain(
            cxx, version[0] if version else "", flags, tf.__version__, _cpu_flags()
        )
    return _TOOLCHAIN


def _compile_only(flags: Sequence[str]) -> list[str]:
    """``flags`` less the linker's (``-shared``, ``-L``, ``-l``): the flags of a precompiled
    header, which must equal the library's compile flags for g++ to use it."""
    return [f for f in flags if f != "-shared" and not f.startswith(("-L", "-l"))]


def precompiled_header(tc: Toolchain) -> Path | None:
    """The precompiled header of :data:`PCH_HEADERS` in ``$STITCHREC_CXX_PCH`` (None when unset):
    ``<folder>/<key>/stitchrec_ops.h`` beside its ``.gch``, built first when absent (a file lock
    and an atomic rename: once for concurrent processes). ``key`` hashes the header's text and
    the toolchain, flags included, so a header built for other flags is never read; g++ also
    checks the ``.gch`` against the command line and reads the text headers where it does not
    match. The includes of the generated sources make the library the same with or without it.
    Raises CompilerUnavailable when the compiler fails on the header."""
    base = os.environ.get(PCH_ENV)
    if not base:
        return None
    text = "".join(f"#include {h}\n" for h in PCH_HEADERS)
    d = Path(base) / tc.key(text)
    header, gch = d / "stitchrec_ops.h", d / "stitchrec_ops.h.gch"
    if gch.exists():
        return header
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if gch.exists():  # another process built it while this one waited
            return header
        header.write_text(text)
        fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=d)
        os.close(fd)
        cmd = [tc.cxx, "-x", "c++-header", str(header), "-o", tmp, *_compile_only(tc.flags)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            Path(tmp).unlink(missing_ok=True)
            raise CompilerUnavailable(
                f"{tc.cxx} failed (exit {r.returncode}) on the precompiled header {header} "
                f"(${PCH_ENV}; unset it to compile without one):\n{r.stderr[-2000:]}"
            )
        os.replace(tmp, gch)
    return header


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled library: its path, the cache key and whether this call compiled it."""

    path: Path
    key: str
    compiled: bool
    seconds: float


def compile_kernel(
    source: str, directory: str | Path | None = None, cuda_source: str | None = None
) -> Compiled:
    """The shared library of ``source``: ``<kernels_dir()>/<key>.so``, compiled first when absent.

    ``key`` hashes the source, the compiler's version, the flags, TensorFlow's version and the
    CPU flags (the library is built with ``-march=native``). Concurrent processes wait on a
    file lock and the library appears by an atomic rename, so it is compiled once. Raises
    CompilerUnavailable without a compiler or when the compiler fails (its output attached).
    With ``$STITCHREC_CXX_PCH``, g++ first reads :func:`precompiled_header` (``-include``).
    With ``cuda_source`` (a CUDA form), nvcc compiles it into an object linked into the
    library with CUDA's static runtime; the key then also hashes it and nvcc's toolchain.
    A source that calls ``gemm.SYMBOL`` is linked against the GEMM's library (:data:`gemm.SOURCE`,
    compiled first into the same folder when absent; found beside the library at load), and
    its key also hashes that library's.
    """
    tc = cxx_toolchain()
    d = Path(directory) if directory is not None else kernels_dir()
    d.mkdir(parents=True, exist_ok=True)
    if source == gemm.SOURCE:
        return _compile(tc, source, d, None, (), is_gemm=True)
    links = [compile_kernel(gemm.SOURCE, d)] if f"{gemm.SYMBOL}(" in source else []
    return _compile(tc, source, d, cuda_source, links)


def _compile(
    tc: Toolchain,
    source: str,
    d: Path,
    cuda_source: str | None,
    links: Sequence[Compiled],
    is_gemm: bool = False,
) -> Compiled:
    """:func:`compile_kernel` into folder ``d``, linked against the libraries ``links`` (found
    at load in the library's own folder: ``$ORIGIN``). ``is_gemm``: the GEMM's library, named by
    its file name (as the libraries linked against it ask for it) and compiled without the
    precompiled header (it includes no TensorFlow header; reading the header made it slower)."""
    cuda_tc = cuda_toolchain() if cuda_source is not None else None
    keyed = source + "".join(f"\0link\0{c.key}" for c in links)
    key = tc.key(
        keyed if cuda_tc is None else f"{keyed}\0cuda\0{cuda_source}\0{cuda_tc.signature()}"
    )
    so = d / f"{key}.so"
    if so.exists():
        return Compiled(so, key, False, 0.0)
    t0 = time.perf_counter()
    pch = None if is_gemm else precompiled_header(tc)
    prefix = ["-include", str(pch), "-Winvalid-pch"] if pch is not None else []
    link = [*(str(c.path) for c in links), "-Wl,-rpath,$ORIGIN"] if links else []
    if is_gemm:
        link.append(f"-Wl,-soname,{so.name}")
    with open(d / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so.exists():  # another process compiled it while this one waited
            return Compiled(so, key, False, time.perf_counter() - t0)
        cc = d / f"{key}.cc"
        cc.write_text(source)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
        os.close(fd)
        cmd = [tc.cxx, *prefix, str(cc), "-o", tmp, *tc.flags, *link]
        if cuda_tc is not None:
            cu, obj = d / f"{key}.cu", d / f"{key}.cu.o"
            cu.write_text(cuda_source or "")
            try:
                compile_object(cu, obj)
            except CudaUnavailable:
                Path(tmp).unlink(missing_ok=True)
                raise
            cmd = [tc.cxx, *prefix, str(cc), str(obj), "-o", tmp, *tc.flags, *cuda_tc.link, *link]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            Path(tmp).unlink(missing_ok=True)  # a failed link removes it itself
            errs = [ln for ln in r.stderr.splitlines() if "error" in ln] or [r.stderr[-2000:]]
            raise CompilerUnavailable(
                f"{tc.cxx} failed (exit {r.returncode}) on {cc}:\n" + "\n".join(errs[:20])
            )
        os.replace(tmp, so)
    return Compiled(so, key, True, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------- nvcc


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


def cuda_enabled() -> bool:
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
def _cuda_toolchain(path: str, archs: tuple[str, ...]) -> CudaToolchain:
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


def cuda_toolchain() -> CudaToolchain:
    """The CUDA toolchain; raises CudaUnavailable without nvcc."""
    path = nvcc()
    if path is None:
        raise CudaUnavailable(f"nvcc not found (${NVCC_ENV}, the PATH, /usr/local/cuda/bin)")
    return _cuda_toolchain(path, gpu_archs() or DEFAULT_ARCHS)


def compile_object(cu: Path, obj: Path) -> None:
    """``nvcc -c cu -o obj``; raises CudaUnavailable with nvcc's errors when it fails."""
    tc = cuda_toolchain()
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


if __name__ == "__main__":  # pragma: no cover
    print(cxx_toolchain(), file=sys.stderr)
