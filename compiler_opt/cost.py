"""Cost model of compiler_opt: kernel launches, bytes moved and an estimated time per fusion group.

For a group ``G`` of IR nodes run as one kernel (a single node when unfused)::

    launches(G) = 1 if G holds a kernel node else 0            (free / source nodes: 0)
    bytes(G)    = sum of the tensors G reads from outside       (each distinct tensor once;
                  + gathered rows (not whole tables)              a gather's table counts only
                  + sum of G's outputs read outside G              the rows it reads)
                    or returned by the graph
    time(G)     = launches * launch_s + bytes / bandwidth
                  + sum over gathers of rows * gather_row_s * min(1, table bytes / cache_bytes)
                  + flops / matmul_flops                         (matmul nodes only)

Tensor sizes come from the static shapes with the first unknown dimension set to ``batch`` and
later unknown ones to ``unknown_dim``. Free nodes (``Identity``, ``Reshape``...) are aliases:
a tensor seen through them is the same tensor. Small constants (<= 16 elements) are inlined
into kernels: no bytes, no argument.

The coefficients (``Coefficients``) are measured by ``calibrate`` with small graph-mode
microbenchmarks on the device they describe and cached as JSON per device:

* ``launch_s``: (time of a chain of 2,000 dependent ``Sin``/``Cos`` ops on one float - time of
  a chain of 10) / 1,990: what one more kernel costs the executor.
* ``bandwidth``: 8 elementwise kernels (``Mul``, ``AddV2``) over 2^24 floats (64 MB); bytes read and
  written / (time - the call's fixed cost - 8 launches).
* ``gather_row_s``: ``ResourceGather`` of 2^17 random rows (dim 16) of a 2^20-row table
  (64 MB, larger than the caches), minus the call's fixed cost and its bytes at ``bandwidth``,
  per row.
* ``matmul_flops``: a square float32 ``MatMul``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import tensorflow as tf

from compiler_opt.ir import Graph, Node, split_ref
from compiler_opt.op_classes import ALIAS_OPS

# inputs whose contents a kernel does not read (only their shape or size)
_META_INPUT_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike"})
_GATHER_PARAMS_OPS = frozenset(
    {"ResourceGather", "ResourceGatherNd", "GatherV2", "Gather", "GatherNd"}
)
SMALL_CONST = 16
CACHE_ENV = "STITCHREC_CACHE"
FORMAT_VERSION = 2
DEFAULT_CACHE_BYTES = 32 * 2**20


@dataclasses.dataclass(frozen=True)
class Coefficients:
    """Measured cost coefficients of one device (seconds, bytes/s, FLOP/s, bytes).

    ``cache_bytes``: the last-level cache (CPU: L3 from sysfs); a gather from a table of ``T``
    bytes pays ``gather_row_s * min(1, T / cache_bytes)`` per row (a table that fits in the
    cache costs about its bytes only).
    """

    device: str
    launch_s: float
    bandwidth: float
    gather_row_s: float
    matmul_flops: float
    cache_bytes: float = DEFAULT_CACHE_BYTES
    measured: dict[str, float] = dataclasses.field(default_factory=dict)
    tf_version: str = tf.__version__
    created: str = ""
    version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Coefficients:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"device", "launch_s", "bandwidth", "gather_row_s", "matmul_flops"} - set(data)
        if missing:
            raise ValueError(f"calibration file lacks {sorted(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclasses.dataclass(frozen=True)
class GroupCost:
    """Cost of one group (or a sum of groups)."""

    launches: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    gather_rows: int = 0
    flops: int = 0
    time_s: float = 0.0
    arguments: int = 0

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def __add__(self, other: GroupCost) -> GroupCost:
        return GroupCost(
            self.launches + other.launches,
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.gather_rows + other.gather_rows,
            self.flops + other.flops,
            self.time_s + other.time_s,
            max(self.arguments, other.arguments),
        )


# --------------------------------------------------------------------------------------------
# Per-graph cost model


class CostModel:
    """Costs of node groups of ``graph`` at ``batch`` examples under ``coefficients``.

    Args:
      graph: the IR.
      coefficients: measured (``load_or_calibrate``) or hand-set coefficients.
      batch: value of the first unknown dimension of every tensor.
      unknown_dim: value of later unknown dimensions (e.g. ids per multi-valued field).
    """

    def __init__(
        self, graph: Graph, coefficients: Coefficients, batch: int, unknown_dim: int = 1
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if unknown_dim < 1:
            raise ValueError(f"unknown_dim must be >= 1, got {unknown_dim}")
        self.graph = graph
        self.coefficients = coefficients
        self.batch = batch
        self.unknown_dim = unknown_dim
        self._root: dict[str, str] = {}
        self._resolve_aliases()
        self._uses: dict[str, set[str]] = {}  # root tensor -> kernel nodes that read it
        self._returned: set[str] = {self.root(r) for r in graph.outputs}
        self._reads: dict[str, list[tuple[str, int, bool]]] = {}
        for n in graph.nodes.values():
            self._reads[n.name] = self._node_reads(n)
            if self.is_kernel(n):
                for ref, _, _ in self._reads[n.name]:
                    self._uses.setdefault(ref, set()).add(n.name)

    # -- tensors --------------------------------------------------------------------------
    def _resolve_aliases(self) -> None:
        for n in self.graph.nodes.values():
            for i in range(len(n.outputs)):
                ref = f"{n.name}:{i}"
                if n.op in ALIAS_OPS and n.inputs:
                    src = n.inputs[i] if n.op == "IdentityN" else n.inputs[0]
                    self._root[ref] = self._root.get(src, self._canon(src))
                else:
                    self._root[ref] = ref

    @staticmethod
    def _canon(ref: str) -> str:
        name, idx = split_ref(ref)
        return f"{name}:{idx}"

    def root(self, ref: str) -> str:
        """The tensor ``ref`` aliases (through Identity, Reshape, ...), as ``"node:index"``."""
        ref = self._canon(ref)
        return self._root.get(ref, ref)

    def nbytes(self, ref: str) -> int:
        """Bytes of tensor ``ref`` at this batch (its root's shape when that is better known)."""
        info = self.graph.tensor(ref)
        root_info = self.graph.tensor(self.root(ref))
        a = info.nbytes(self.batch, self.unknown_dim)
        b = root_info.nbytes(self.batch, self.unknown_dim)
        if info.shape is None or None in (info.shape or ()):
            return b if root_info.shape is not None and None not in root_info.shape else max(a, b)
        return a

    def users(self, ref: str) -> set[str]:
        """Kernel nodes that read tensor ``ref`` (a root tensor, ``"node:index"``)."""
        return self._uses.get(ref, set())

    def is_kernel(self, node: Node) -> bool:
        return node.op_class not in ("free", "source")

    def _is_inlined_const(self, ref: str) -> bool:
        n = self.graph[split_ref(ref)[0]]
        if n.op != "Const":
            return False
        num = n.outputs[0].shape
        return num is not None and None not in num and int(np.prod(num or (1,))) <= SMALL_CONST

    def _node_reads(self, n: Node) -> list[tuple[str, int, bool]]:
        """(root tensor, bytes, is_gather_table) per data input that a kernel reads."""
        if not self.is_kernel(n):
            return []
        out = []
        for i, ref in enumerate(n.inputs):
            root = self.root(ref)
            if self._is_inlined_const(root):
                continue
            info = self.graph.tensor(ref)
            if info.dtype == "resource" and not (i == 0 and n.op in _GATHER_PARAMS_OPS):
                out.append((root, 0, False))  # a handle: an argument, no bytes
                continue
            if i == 0 and n.op in _GATHER_PARAMS_OPS:
                # the rows read = the gather's output
                out.append((root, n.outputs[0].nbytes(self.batch, self.unknown_dim), True))
            elif n.op in _META_INPUT_OPS:
                out.append((root, 0, False))
            else:
                out.append((root, self.nbytes(ref), False))
        return out

    def gather_latency_rows(self, n: Node) -> float:
        """Rows of a gather weighted by ``min(1, table bytes / cache_bytes)``."""
        rows = self.gather_rows(n)
        shape = n.attrs.get("table_shape")
        if not rows or shape is None or None in shape:
            return float(rows)
        table = float(np.prod(shape)) * n.outputs[0].itemsize
        return rows * min(1.0, table / max(self.coefficients.cache_bytes, 1.0))

    def gather_rows(self, n: Node) -> int:
        """Rows a gather node reads: the elements of its indices input."""
        if n.op_class != "gather" or len(n.inputs) < 2:
            return 0
        idx = self.graph.tensor(n.inputs[1])
        rows = idx.num_elements(self.batch, self.unknown_dim)
        if n.op in ("GatherNd", "ResourceGatherNd") and idx.shape:
            last = idx.shape[-1] or 1
            rows //= last
        return rows

    def _operand_shape(self, ref: str) -> tuple[int | None, ...] | None:
        """A matmul operand's static shape; a variable read without one (a training step's
        weights, read through their handles) takes the variable's shape."""
        shape = self.graph.tensor(ref).shape
        if shape is not None and None not in shape:
            return shape
        node = self.graph[split_ref(ref)[0]]
        if node.op == "ReadVariableOp" and node.inputs:
            handle = self.graph[split_ref(node.inputs[0])[0]]
            return handle.attrs.get("variable_shape", shape)
        return shape

    def matmul_flops(self, n: Node) -> int:
        """2 * M * N * K of a MatMul / BatchMatMul: ``M`` and ``K`` from the row operand, ``N``
        and (where the row operand does not say) ``K`` from the other one, either read through
        a variable's shape; an unknown ``M`` is the batch, another unknown size
        ``unknown_dim``. BatchMatMul: its output's elements times ``K``."""
        if n.op_class != "matmul" or len(n.inputs) < 2:
            return 0
        a = self._operand_shape(n.inputs[0])
        if a is None or not a:
            return 0
        b = self._operand_shape(n.inputs[1])
        ta, tb = n.attrs.get("transpose_a", False), n.attrs.get("transpose_b", False)
        k = a[-2] if ta and len(a) >= 2 else a[-1]
        if k is None and b is not None and len(b) >= 2:
            k = b[-1] if tb else b[-2]
        k = k if k is not None else self.unknown_dim
        if len(a) != 2 or b is None or len(b) != 2:
            return 2 * n.outputs[0].num_elements(self.batch, self.unknown_dim) * k
        m = a[-1] if ta else a[-2]
        cols = b[-2] if tb else b[-1]
        out = n.outputs[0].shape
        if out is not None and len(out) == 2:  # the output's static sizes where it has them
            m, cols = m if m is not None else out[0], cols if cols is not None else out[1]
        m = m if m is not None else self.batch
        cols = cols if cols is not None else self.unknown_dim
        return 2 * m * cols * k

    # -- groups ---------------------------------------------------------------------------
    def group_cost(self, nodes: Iterable[str]) -> GroupCost:
        """Cost of running ``nodes`` as one kernel (free and source nodes are ignored)."""
        members = set(nodes)
        kernels = [self.graph[m] for m in members if self.is_kernel(self.graph[m])]
        if not kernels:
            return GroupCost()
        kernel_names = {n.name for n in kernels}
        read: dict[str, int] = {}
        table_bytes = 0
        args: set[str] = set()
        rows = flops = 0
        latency_rows = 0.0
        for n in kernels:
            rows += self.gather_rows(n)
            latency_rows += self.gather_latency_rows(n)
            flops += self.matmul_flops(n)
            for root, nb, is_table in self._reads[n.name]:
                if split_ref(root)[0] in kernel_names:
                    continue
                args.add(root)
                if is_table:
                    table_bytes += nb
                else:
                    read[root] = max(read.get(root, 0), nb)
        written = 0
        outs = 0
        for n in kernels:
            for i in range(len(n.outputs)):
                ref = f"{n.name}:{i}"
                users = self._uses.get(ref, set())
                if ref in self._returned or users - kernel_names:
                    written += self.nbytes(ref)
                    outs += 1
        c = self.coefficients
        bytes_read = sum(read.values()) + table_bytes
        t = (
            c.launch_s
            + (bytes_read + written) / c.bandwidth
            + latency_rows * c.gather_row_s
            + flops / c.matmul_flops
        )
        return GroupCost(1, bytes_read, written, rows, flops, t, len(args) + outs)

    def node_cost(self, name: str) -> GroupCost:
        """Cost of one node run alone."""
        return self.group_cost([name])

    def unfused(self) -> GroupCost:
        """Sum over every kernel node run alone (the graph as TensorFlow executes it)."""
        total = GroupCost()
        for n in self.graph.nodes.values():
            if self.is_kernel(n):
                total = total + self.node_cost(n.name)
        return total


# --------------------------------------------------------------------------------------------
# Calibration

CHAIN = 200


def device_key(device: str | None = None) -> str:
    """A file-name-safe name of the device the coefficients describe, e.g.
    ``cpu-intel-xeon-platinum-8375c-2cores`` or ``gpu-nvidia-h200``."""
    device = device or default_device()
    if device.upper().startswith("/GPU") or device.upper().startswith("GPU"):
        name = "gpu"
        gpus = tf.config.list_physical_devices("GPU")
        idx = int(device.rsplit(":", 1)[-1]) if ":" in device else 0
        if gpus and idx < len(gpus):
            details = tf.config.experimental.get_device_details(gpus[idx])
            name = "gpu-" + details.get("device_name", "unknown")
    else:
        model = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1]
                    break
        except OSError:
            pass
        name = f"cpu-{model}-{os.cpu_count()}cores"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def default_device() -> str:
    """``/GPU:0`` when TensorFlow sees a GPU, else ``/CPU:0``."""
    return "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"


def cache_dir() -> Path:
    """``$STITCHREC_CACHE/compiler_opt`` or ``~/.cache/stitchrec/compiler_opt``."""
    base = os.environ.get(CACHE_ENV)
    root = Path(base) if base else Path.home() / ".cache" / "stitchrec"
    return root / "compiler_opt"


def _time_fn(fn: object, repeats: int, *args: tf.Tensor) -> float:
    """Fastest of ``repeats`` calls in seconds (after two warm-up calls), results fetched: the
    minimum is the least disturbed by other processes on a shared machine."""
    for _ in range(2):
        fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args)
        np.asarray(out)  # waits for the device
        times.append(time.perf_counter() - t0)
    return min(times)


def _sin_chain(n: int) -> tf.types.experimental.PolymorphicFunction:
    """A function of ``n`` alternating sin/cos kernels on one float (launch cost only)."""

    @tf.function
    def f(x: tf.Tensor) -> tf.Tensor:
        for i in range(n):
            x = tf.sin(x) if i % 2 == 0 else tf.cos(x)
        return x

    return f


def _launch(chain: int, reps: int, measured: dict[str, float]) -> tuple[float, float]:
    """(seconds per kernel launch: the slope between a ``chain``-kernel and a 10-kernel
    chain, the 10-kernel chain's seconds: a call's fixed cost)."""
    x1 = tf.constant([0.5], tf.float32)
    t_long = _time_fn(_sin_chain(chain), reps, x1)
    t_short = _time_fn(_sin_chain(10), reps, x1)
    measured.update(chain_ops=float(chain), chain_s=t_long, chain10_s=t_short)
    return max((t_long - t_short) / (chain - 10), 1e-9), t_short


def _bandwidth(n: int, reps: int, base: tuple[float, float], measured: dict[str, float]) -> float:
    """Bytes per second of a stream of elementwise kernels over ``n`` floats, less the call's
    fixed cost and the launches (``base``: seconds per launch, fixed seconds)."""
    launch, t_short = base
    big = tf.random.uniform([n], dtype=tf.float32)
    steps = 4

    @tf.function
    def stream(x: tf.Tensor) -> tf.Tensor:
        for k in range(steps):
            x = x * 1.0001 + float(k)  # Mul + AddV2: 2 kernels per step
        return x[:1]

    t_stream = _time_fn(stream, reps, big)
    stream_bytes = 2 * steps * 2 * n * 4  # each kernel reads and writes n floats
    measured.update(stream_s=t_stream, stream_bytes=float(stream_bytes))
    return stream_bytes / max(t_stream - t_short - 2 * steps * launch, 1e-6)


def _gather_row(
    shape: tuple[int, int],
    n_ids: int,
    reps: int,
    costs: tuple[float, float],
    measured: dict[str, float],
) -> float:
    """Seconds per random row of a ``shape`` table gathered by ``n_ids`` ids, beyond the bytes
    moved (``costs``: the call's fixed seconds, bytes per second)."""
    t_short, bandwidth = costs
    rows, dim = shape
    table = tf.Variable(tf.random.uniform([rows, dim]), trainable=False)
    ids = tf.constant(np.random.default_rng(0).integers(0, rows, n_ids), tf.int32)

    @tf.function
    def gather(i: tf.Tensor) -> tf.Tensor:
        return tf.gather(table, i)[:1]

    t_gather = _time_fn(gather, reps, ids)
    g_bytes = n_ids * 4 + 2 * n_ids * dim * 4
    measured.update(gather_s=t_gather, gather_rows=float(n_ids), gather_dim=float(dim))
    return max((t_gather - t_short - g_bytes / bandwidth) / n_ids, 1e-12)


def _matmul_flops(mm: int, reps: int, t_short: float, measured: dict[str, float]) -> float:
    """FLOP per second of an ``mm`` x ``mm`` float32 matmul."""
    a = tf.random.uniform([mm, mm])

    @tf.function
    def matmul(x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(x, x)[:1, :1]

    t_mm = _time_fn(matmul, max(3, reps // 2), a)
    measured.update(matmul_s=t_mm, matmul_n=float(mm))
    return 2 * mm**3 / max(t_mm - t_short, 1e-6)


def calibrate(device: str | None = None, quick: bool = False) -> Coefficients:
    """Measures the coefficients on ``device`` (default: ``default_device()``) in ~1-5 s.

    Grappler is switched off while the microbenchmarks are traced and first run (its arithmetic
    optimizer would fold the chains of ops being timed) and restored afterwards. ``quick`` uses
    smaller sizes and fewer repeats (for tests; less precise).
    """
    device = device or default_device()
    reps = 5 if quick else 9
    chain = 400 if quick else CHAIN * 10
    n_big = (1 << 20) if quick else (1 << 24)
    rows = (1 << 18) if quick else (1 << 20)
    n_ids = (1 << 15) if quick else (1 << 17)
    mm = 256 if quick else 1024
    measured: dict[str, float] = {}
    saved = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        with tf.device(device):
            launch, t_short = _launch(chain, reps, measured)
            bandwidth = _bandwidth(n_big, reps, (launch, t_short), measured)
            gather_row = _gather_row((rows, 16), n_ids, reps, (t_short, bandwidth), measured)
            flops = _matmul_flops(mm, reps, t_short, measured)
    finally:
        tf.config.optimizer.set_experimental_options(
            {"disable_meta_optimizer": bool(saved.get("disable_meta_optimizer", False))}
        )
    return Coefficients(
        device=device_key(device),
        launch_s=launch,
        bandwidth=bandwidth,
        gather_row_s=gather_row,
        matmul_flops=flops,
        cache_bytes=last_level_cache_bytes()
        if "GPU" not in device.upper()
        else DEFAULT_CACHE_BYTES,
        measured=measured,
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def last_level_cache_bytes() -> float:
    """The CPU's largest cache (sysfs), or ``DEFAULT_CACHE_BYTES`` when unknown."""
    best = 0.0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, float(digits) * mult)
    return best or float(DEFAULT_CACHE_BYTES)


def calibration_path(device: str | None = None, directory: str | Path | None = None) -> Path:
    """``<directory or cache_dir()>/<device_key>.json``."""
    return Path(directory or cache_dir()) / f"{device_key(device)}.json"


def write_atomically(path: str | Path, text: str) -> Path:
    """Writes ``text`` to ``path`` through a temporary file renamed into place (a reader sees
    the old file or the new one, never half of one); creates the folder."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(p)
    return p


def save(coefficients: Coefficients, path: str | Path) -> Path:
    return write_atomically(path, coefficients.to_json())


def load(path: str | Path) -> Coefficients:
    """Reads a calibration file; ``ValueError`` naming the file when it is not one."""
    p = Path(path)
    try:
        return Coefficients.from_json(p.read_text())
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise ValueError(f"{str(p)!r} is not a compiler_opt calibration file: {e}") from None


def load_or_calibrate(
    device: str | None = None,
    directory: str | Path | None = None,
    recalibrate: bool = False,
    quick: bool = False,
) -> Coefficients:
    """The cached coefficients of ``device``, measured and saved first when there are none (or
    when ``recalibrate``, or when the file was written by another TensorFlow version)."""
    path = calibration_path(device, directory)
    if path.exists() and not recalibrate:
        try:
            c = load(path)
            if c.tf_version == tf.__version__ and c.version == FORMAT_VERSION:
                return c
        except ValueError:
            pass  # a broken cache file is measured again
    c = calibrate(device, quick=quick)
    save(c, path)
    return c
