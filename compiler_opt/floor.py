"""The floor of a graph: the least time the machine's peak arithmetic and bandwidth allow.

A graph is cut into *units*, what runs as one kernel under a fusion plan: each planned group,
each matmul with the epilogue ops left to it (``Plan.epilogues``: bias, activation), and each
other kernel alone. For a unit ``U`` at ``batch`` examples (a roofline)::

    flops(U)  = sum over its matmuls of 2 * M * N * K          (CostModel.matmul_flops)
    bytes(U)  = what U reads from outside it + what it writes   (CostModel.group_cost: each
                that is read outside it                          tensor once, a gather's rows)
    floor(U)  = max(flops(U) / peak, bytes(U) / bandwidth)
    floor     = sum over the units of floor(U)

``peak`` is the machine's measured FP32 FMA rate (:func:`measure_fma_peak`: independent FMA
chains in a generated C++ loop on every core, the widest vector that runs fastest), not what a
library's matmul reaches; ``bandwidth`` is the calibrated streaming rate of
``compiler_opt.cost``. Launch overheads and gather latency are left out: they are costs of a
realization, not of the arithmetic and the bytes. Elementwise arithmetic is left out of
``flops`` (it is bandwidth-bound here).

:func:`measure` runs the signature at ``batch`` under TensorFlow's profiler and charges every
op's time to its unit, so each unit's measured time stands beside its floor; the wall time per
call (median of untraced calls) stands beside the total.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from compiler_opt import cost, graph_io, ir, planner, realize, toolchain
from compiler_opt.cost import Coefficients, CostModel
from compiler_opt.planner import Plan
from compiler_opt.trace import profiler_trace

PEAK_VERSION = 1
_CHAINS = 12  # independent accumulators: more than FMA latency x FMA ports on current cores

_FMA_SOURCE = r"""
// Independent FMA chains, one function per vector width: FP32 peak of one core.
typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));
#define CHAINS 12
#define FMA_LOOP(T, NAME)                                                        \
  extern "C" double NAME(long iters) {                                          \
    T acc[CHAINS];                                                               \
    T mul, add;                                                                  \
    for (unsigned i = 0; i < sizeof(T) / sizeof(float); ++i) {                   \
      mul[i] = 0.999999f; add[i] = 1e-7f;                                        \
    }                                                                            \
    for (int c = 0; c < CHAINS; ++c) acc[c] = mul * (float)(c + 1);              \
    for (long it = 0; it < iters; ++it) {                                        \
      _Pragma("GCC unroll 12")                                                   \
      for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * mul + add;              \
    }                                                                            \
    double s = 0;                                                                \
    for (int c = 0; c < CHAINS; ++c)                                             \
      for (unsigned i = 0; i < sizeof(T) / sizeof(float); ++i) s += acc[c][i];   \
    return s;                                                                    \
  }
FMA_LOOP(v8, stitchrec_fma_256)
FMA_LOOP(v16, stitchrec_fma_512)
"""


@dataclasses.dataclass(frozen=True)
class Peak:
    """The measured FP32 FMA rate of a CPU: ``flops`` (FLOP/s, all ``threads``), the vector
    width that reached it (``vector_bits``), per width what was measured (``measured``)."""

    device: str
    flops: float
    threads: int
    vector_bits: int
    measured: dict[str, float] = dataclasses.field(default_factory=dict)
    created: str = ""
    version: int = PEAK_VERSION


def _fma_library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(toolchain.compile_kernel(_FMA_SOURCE).path))
    for bits in (256, 512):
        fn = getattr(lib, f"stitchrec_fma_{bits}")
        fn.argtypes, fn.restype = [ctypes.c_long], ctypes.c_double
    return lib


def _run_threads(fn: Any, iters: int, threads: int) -> float:
    """Seconds for ``threads`` threads to each run ``fn(iters)`` (ctypes releases the GIL)."""
    start = threading.Barrier(threads + 1)

    def work() -> None:
        start.wait()
        fn(iters)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return time.perf_counter() - t0


def measure_fma_peak(threads: int | None = None, seconds: float = 0.2, repeats: int = 3) -> Peak:
    """The FP32 FMA peak of this CPU on ``threads`` threads (default: the cores this process
    may run on), from the fastest of ``repeats`` runs of about ``seconds`` each per vector
    width. Raises ``toolchain.CompilerUnavailable`` without a C++ compiler."""
    threads = threads or len(os.sched_getaffinity(0))
    lib = _fma_library()
    measured: dict[str, float] = {}
    for bits in (256, 512):
        fn = getattr(lib, f"stitchrec_fma_{bits}")
        flops_per_iter = _CHAINS * (bits // 32) * 2
        iters = 100_000
        while True:  # size the run to about ``seconds``
            t = _run_threads(fn, iters, 1)
            if t >= seconds / 4:
                break
            iters *= 4
        iters = max(1, int(iters * seconds / t))
        best = min(_run_threads(fn, iters, threads) for _ in range(repeats))
        measured[f"fma{bits}_flops"] = iters * flops_per_iter * threads / best
    bits = max((256, 512), key=lambda b: measured[f"fma{b}_flops"])
    return Peak(
        cost.device_key("/CPU:0"),
        measured[f"fma{bits}_flops"],
        threads,
        bits,
        measured,
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def peak_path(directory: str | Path | None = None) -> Path:
    """``<directory or cost.cache_dir()>/peak-<cpu device key>.json``."""
    return Path(directory or cost.cache_dir()) / f"peak-{cost.device_key('/CPU:0')}.json"


def load_or_measure_peak(directory: str | Path | None = None, remeasure: bool = False) -> Peak:
    """The cached :class:`Peak` of this CPU, measured and saved (atomically) first when there is
    none, when ``remeasure``, or when the file is unreadable or of another format."""
    path = peak_path(directory)
    if path.exists() and not remeasure:
        try:
            peak = Peak(**json.loads(path.read_text()))
            if peak.version == PEAK_VERSION:
                return peak
        except (json.JSONDecodeError, TypeError, ValueError):
            pass  # measured again
    peak = measure_fma_peak()
    cost.write_atomically(path, json.dumps(dataclasses.asdict(peak), indent=1))
    return peak


# ------------------------------------------------------------------------------------ units


@dataclasses.dataclass
class Unit:
    """One kernel under the plan: ``label`` (``group 3``, ``matmul``, or the op), ``kind``,
    its nodes, FLOPs, bytes, floor and (after :func:`measure`) measured seconds per call."""

    label: str
    kind: str
    nodes: list[str]
    flops: int
    bytes: int
    floor_s: float
    measured_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "nodes": len(self.nodes)}


@dataclasses.dataclass
class Floor:
    """The units of a plan with their floors; totals; what was measured (:func:`measure`)."""

    batch: int
    peak_flops: float
    bandwidth: float
    units: list[Unit]
    wall_s: float | None = None
    unattributed_s: float | None = None
    peak_source: str = "FP32 FMA, measured"
    #: the wall time per call of the signature as the server realizes it (``fusion.json``),
    #: and what that realization is; None: not measured
    served_s: float | None = None
    served: str = ""

    @property
    def flops(self) -> int:
        return sum(u.flops for u in self.units)

    @property
    def bytes(self) -> int:
        return sum(u.bytes for u in self.units)

    @property
    def floor_s(self) -> float:
        return sum(u.floor_s for u in self.units)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "peak_flops": self.peak_flops,
            "peak_source": self.peak_source,
            "bandwidth": self.bandwidth,
            "flops": self.flops,
            "bytes": self.bytes,
            "floor_s": self.floor_s,
            "wall_s": self.wall_s,
            "unattributed_s": self.unattributed_s,
            "served_s": self.served_s,
            "served": self.served,
            "units": [u.to_dict() for u in self.units],
        }

    def to_text(self, max_units: int = 12) -> str:
        """The units, slowest (measured, else floor) first, and the totals."""
        key = (lambda u: -(u.measured_s or 0.0)) if self.wall_s is not None else None
        units = sorted(self.units, key=key or (lambda u: -u.floor_s))
        lines = [
            f"floor at batch {self.batch}: peak {self.peak_flops / 1e9:.1f} GFLOP/s "
            f"({self.peak_source}), bandwidth {self.bandwidth / 1e9:.1f} GB/s (calibrated)",
            f"{'unit':<22} {'kind':<8} {'MFLOP':>9} {'MB':>8} {'floor ms':>9} "
            f"{'measured ms':>12} {'x floor':>8}",
        ]
        for u in units[:max_units]:
            m = "" if u.measured_s is None else f"{u.measured_s * 1e3:.3f}"
            r = "" if not u.measured_s or u.floor_s < 1e-6 else f"{u.measured_s / u.floor_s:.2f}"
            lines.append(
                f"{u.label[:22]:<22} {u.kind[:8]:<8} {u.flops / 1e6:>9.1f} {u.bytes / 1e6:>8.3f} "
                f"{u.floor_s * 1e3:>9.3f} {m:>12} {r:>8}"
            )
        rest = units[max_units:]
        if rest:
            m = sum(u.measured_s or 0.0 for u in rest)
            lines.append(
                f"{f'{len(rest)} more unit(s)':<22} {'':<8} {sum(u.flops for u in rest) / 1e6:>9.1f} "
                f"{sum(u.bytes for u in rest) / 1e6:>8.3f} "
                f"{sum(u.floor_s for u in rest) * 1e3:>9.3f} "
                f"{'' if self.wall_s is None else f'{m * 1e3:.3f}':>12}"
            )
        matmul_s = self.flops / self.peak_flops
        lines.append(
            f"total: {self.flops / 1e9:.3f} GFLOP ({self.flops / self.batch / 1e6:.3f} "
            f"MFLOP/example), {self.bytes / 1e6:.3f} MB; floor {self.floor_s * 1e3:.3f} ms "
            f"({matmul_s * 1e3:.3f} ms of it arithmetic at peak)"
        )
        if self.wall_s is not None:
            lines.append(
                f"measured: {self.wall_s * 1e3:.3f} ms per call (median), "
                f"{self.wall_s / self.floor_s:.2f}x the floor; op time not in any unit "
                f"{(self.unattributed_s or 0.0) * 1e3:.3f} ms"
            )
        if self.served_s is not None:
            lines.append(
                f"as served ({self.served}): {self.served_s * 1e3:.3f} ms per call (median), "
                f"{self.served_s / self.floor_s:.2f}x the floor"
            )
        return "\n".join(lines)


def units(
    plan: Plan, peak_flops: float, unknown_dim: int = 1, peak_source: str = "FP32 FMA, measured"
) -> Floor:
    """The plan's units and their floors at ``peak_flops`` (where it comes from:
    ``peak_source``) and the plan's bandwidth."""
    model = CostModel(plan.graph, plan.coefficients, plan.batch, unknown_dim=unknown_dim)
    bandwidth = plan.coefficients.bandwidth
    out: list[Unit] = []
    for g in plan.groups:
        out.append(_unit(model, f"group {g.id}", g.kind, g.nodes, peak_flops, bandwidth))
    epilogue_of: dict[str, list[str]] = {}
    for node, matmul in plan.epilogues.items():
        epilogue_of.setdefault(matmul, []).append(node)
    grouped = set(plan.group_of) | set(plan.epilogues)
    for name, node in plan.graph.nodes.items():
        if name in grouped or not model.is_kernel(node):
            continue
        nodes = [name, *epilogue_of.get(name, [])]
        label = node.op
        if node.op_class == "matmul":
            label = f"{node.op} {'/'.join(name.split('/')[-3:-1]) or name}"
        out.append(_unit(model, label, node.op_class, nodes, peak_flops, bandwidth))
    return Floor(plan.batch, peak_flops, bandwidth, out, peak_source=peak_source)


def _unit(
    model: CostModel, label: str, kind: str, nodes: list[str], peak: float, bandwidth: float
) -> Unit:
    c = model.group_cost(nodes)
    floor_s = max(c.flops / peak, c.bytes / bandwidth)
    return Unit(label, kind, list(nodes), c.flops, c.bytes, floor_s)


# -------------------------------------------------------------------------------- measuring


def dummy_inputs(signature_fn: Any, batch: int) -> list[tf.Tensor]:
    """Flat inputs of ``signature_fn`` (its keyword arguments in sorted order) at ``batch`` rows:
    strings ``b""``, numbers 0 (unknown dimensions after the first are 1). Every lookup then
    reads one row of its table, so a gather measures faster than on real ids."""
    kwargs = signature_fn.structured_input_signature[1]
    out = []
    for name in sorted(kwargs):
        spec = kwargs[name]
        dims = [batch] + [d if d is not None else 1 for d in spec.shape.as_list()[1:]]
        if spec.dtype == tf.string:
            out.append(tf.constant(np.full(dims, b"", dtype=object)))
        else:
            out.append(tf.zeros(dims, spec.dtype))
    return out


def of_signature(
    signature_fn: Any,
    coefficients: Coefficients,
    peak_flops: float,
    batch: int,
    *,
    unknown_dim: int = 1,
    max_args: int = 64,
    calls: int = 5,
    peak_source: str = "FP32 FMA, measured",
    inputs: Sequence[tf.Tensor] | None = None,
) -> Floor:
    """The floor of a SavedModel signature as served: frozen (variables as constants, calls
    inlined: every static shape but the batch is known), planned at ``batch``, cut into units,
    and each unit measured (``calls`` calls) on ``inputs`` (the signature's flat inputs, its
    keyword arguments in sorted order, ``batch`` rows; default :func:`dummy_inputs`)."""
    args = list(inputs) if inputs is not None else dummy_inputs(signature_fn, batch)
    return of_function(
        signature_fn,
        args,
        coefficients,
        peak_flops,
        batch,
        unknown_dim=unknown_dim,
        max_args=max_args,
        calls=calls,
        peak_source=peak_source,
    )


def of_function(
    concrete_fn: Any,
    args: Sequence[tf.Tensor],
    coefficients: Coefficients,
    peak_flops: float,
    batch: int,
    *,
    keep_variables: bool = False,
    unknown_dim: int = 1,
    max_args: int = 64,
    calls: int = 5,
    peak_source: str = "FP32 FMA, measured",
) -> Floor:
    """The floor of any ``ConcreteFunction`` on its flat ``args`` (``batch`` rows): frozen
    (``keep_variables``: a training step, its variables read and updated through their
    handles), planned, cut into units and measured as :func:`of_signature` does."""
    frozen = realize.freeze(concrete_fn, keep_variables=keep_variables)
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    # a kept variable is a handle input: its shape, for the matmuls that read it
    shapes = {id(v.handle): tuple(v.shape.as_list()) for v in concrete_fn.variables}
    first_bound = len(frozen.inputs) - len(frozen.bound)
    for name, handle in zip(frozen.inputs[first_bound:], frozen.bound, strict=True):
        node = graph.nodes.get(ir.split_ref(name)[0])
        if node is not None and id(handle) in shapes:
            node.attrs.setdefault("variable_shape", shapes[id(handle)])
    plan = planner.plan(graph, coefficients, batch, unknown_dim=unknown_dim, max_args=max_args)
    fn = graph_io.load_graph_def(frozen.graph_def, frozen.inputs, frozen.outputs, frozen.bound)
    floor = units(plan, peak_flops, unknown_dim=unknown_dim, peak_source=peak_source)
    return measure(floor, fn, list(args), calls=calls)


def _fetch(out: Any) -> None:
    tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)


def median_wall_s(call: Any, calls: int) -> float:
    """Median seconds of ``calls`` calls of ``call()``, results fetched."""
    walls = []
    for _ in range(calls):
        t0 = time.perf_counter()
        _fetch(call())
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def measure(floor: Floor, fn: Any, args: Sequence[tf.Tensor], calls: int = 5) -> Floor:
    """``floor`` with each unit's measured op time per call (``calls`` traced calls of
    ``fn(*args)``, the graph the floor was planned on, at the floor's batch; TensorFlow's
    profiler, every op's event charged to the unit holding the node of its name; a fused
    runtime op named after one of its nodes goes to that node's unit) and the median wall
    time of ``calls`` untraced calls."""
    for _ in range(2):
        _fetch(fn(*args))
    wall_s = median_wall_s(lambda: fn(*args), calls)
    unit_of = {n: i for i, u in enumerate(floor.units) for n in u.nodes}
    spent = [0.0] * len(floor.units)
    other = 0.0
    with profiler_trace(host_tracer_level=3) as trace:
        for _ in range(calls):
            _fetch(fn(*args))
    for plane in trace.space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        md = plane.event_metadata
        for line in plane.lines:
            for e in line.events:
                name = md[e.metadata_id].name
                if ":" not in name or "::" in name or name.startswith("end: "):
                    continue
                node = name.rsplit(":", 1)[0]
                if node in unit_of:
                    spent[unit_of[node]] += e.duration_ps * 1e-12
                elif "/" in node:  # inside the signature's call; not the call itself
                    other += e.duration_ps * 1e-12
    units = [
        dataclasses.replace(u, measured_s=s / calls)
        for u, s in zip(floor.units, spent, strict=True)
    ]
    return dataclasses.replace(floor, units=units, wall_s=wall_s, unattributed_s=other / calls)
