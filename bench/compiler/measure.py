"""One measuring process of bench/compiler: every method, mode and batch of DCN-v2.

``child`` builds the workload of each method (``bench/compiler/workload.py``), traces each
mode's function into the IR (``compiler_opt.ir``) and times its variants at each batch in
interleaved rounds: plain graph mode, whole-function XLA, the frozen graph and its planned
groups as XLA clusters (``compiler_opt.realize``), the generated embedding op and loop ops, and
horizontally fused tables, with the largest differences between their outputs. The first
process also records the fusion plan of each batch (``compiler_opt.planner``) and, at the
largest batch, the ops and XLA kernels one call of each variant executes. TensorFlow is
imported when ``child`` runs, not when this module loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("sparse", "inference", "train")
WARMUP = 5


def _time_block(fn: Any, args: tuple, calls: int) -> float:
    t0 = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn(*args)
    float(out.numpy().ravel()[0]) if hasattr(out, "numpy") else None
    return (time.perf_counter() - t0) / calls


def _calls_for(seconds: float, target: float = 0.25) -> int:
    return max(1, min(50, int(target / max(seconds, 1e-6))))


def _flat_function(fn: Any, call: tuple) -> Any:
    """``fn`` as a concrete function of the flat tensors of ``call`` (batch dimension free),
    called like the frozen graphs (no nested structure to convert on each call)."""
    import tensorflow as tf

    flat = tf.nest.flatten(call, expand_composites=True)
    specs = [tf.TensorSpec([None, *t.shape[1:]], t.dtype) for t in flat]

    def run(*xs: Any) -> Any:
        return fn(*tf.nest.pack_sequence_as(call, list(xs), expand_composites=True))

    return tf.function(run, input_signature=specs).get_concrete_function()


#: a variant to time: its function and the arguments it is called with
Variant = tuple[Any, tuple]
#: ratio rows: ``{n}_over_{base}`` = ``{base}_s / {n}_s`` for each variant ``n`` measured
_OVER = (
    (
        ("kernel", "kernel_xla", "kernel_flat", "kernel_frozen", "kernel_loops"),
        ("plain", "xla", "frozen_xla"),
    ),
    (("kernel_inlined", "kernel_clusters"), ("plain", "xla", "frozen_xla")),
    (
        ("loops", "kernel_frozen", "kernel_loops", "kernel_loops_apart"),
        ("frozen", "xla", "frozen_xla"),
    ),
    (("clusters",), ("frozen", "xla", "plain", "frozen_xla")),
    (("frozen",), ("plain",)),
)


@dataclasses.dataclass
class _Functions:
    """One method's functions by mode: plain graph mode, whole-function XLA, the generated
    embedding op (``fused``, as ``workload.fused_functions`` returns them; ``kernels`` its
    graph-mode functions, ``kernels_xla`` with the rest as one XLA sub-function) and
    horizontally fused tables (``htables``; ``htables_fns`` graph mode and XLA)."""

    plain: dict[str, Any]
    xla: dict[str, Any]
    fused: dict[str, Any]
    kernels: dict[str, Any]
    kernels_xla: dict[str, Any]
    htables: dict[str, Any]
    htables_fns: dict[str, tuple[Any, Any]]


def _method_functions(
    args: argparse.Namespace, w: Any, coefficients: Any, results: dict[str, Any], method: str
) -> _Functions:
    """The method's functions; records its fused tables and generated kernel in ``results``."""
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import toolchain

    fused: dict[str, Any] = {}
    if args.kernels:
        try:
            fused = workload.fused_functions(w, coefficients)
        except toolchain.CompilerUnavailable as e:
            print(f"[process {args.process}] no generated kernels: {e}", flush=True)
    htables = workload.htables_functions(w) if args.htables else {}
    if htables:
        layer = htables["layer"]
        results.setdefault("htables", {})[method] = {
            "fused_fields": len(layer.fused_fields),
            "groups": {k: list(v.shape) for k, v in layer.group_tables.items()},
            "uncovered": layer.uncovered,
        }
    if fused:
        results.setdefault("kernels", {})[method] = {
            "key": fused["kernel"].library.key,
            "compiled": fused["kernel"].library.compiled,
            "compile_s": fused["kernel"].library.seconds,
            "source_lines": fused["kernel"].source.count("\n"),
            "plan": fused["plan"],
        }
    return _Functions(
        plain=workload.functions(w, jit=False),
        xla=workload.functions(w, jit=True),
        fused=fused,
        kernels={m: tf.function(fused[m]) for m in MODES if m in fused},
        kernels_xla={
            m: tf.function(fused[m + "_xla_rest"]) for m in ("inference", "train") if fused
        },
        htables=htables,
        htables_fns={
            m: (tf.function(htables[m]), tf.function(htables[m], jit_compile=True))
            for m in ("sparse", "inference")
            if m in htables
        },
    )


def _max_diff(fn: Any, args: tuple, ref: Any) -> float:
    return float(abs(fn(*args)[0].numpy() - ref).max())


@dataclasses.dataclass
class _Row:
    """One row's measurement in the making: its figures, its variants to time and, for the
    executed-op counts, how to build a fresh instance of a variant (``fresh``)."""

    row: dict[str, Any]
    call: tuple
    flat: tuple
    spec: Any
    variants: dict[str, Variant] = dataclasses.field(default_factory=dict)
    fresh: dict[str, Callable[[], Variant]] = dataclasses.field(default_factory=dict)


def _add_clusters(m: _Row, fns: _Functions, mode: str, coefficients: Any, kernels: bool) -> None:
    """The plan realized as XLA clusters (serving graphs frozen; the training step inlined with
    its variables kept as handles: ``frozen`` is then that step), and on the serving path the
    plan's elementwise loop groups as generated ops (``loop_op``)."""
    from compiler_opt import graph_io, realize, toolchain

    batch, flat, concrete = m.row["batch"], m.flat, fns.plain[mode].get_concrete_function(*m.spec)
    r = realize.xla_clusters(concrete, coefficients, batch, keep_variables=mode == "train")
    m.variants["frozen"] = (r.unfused, flat)
    m.variants["clusters"] = (r.fused, flat)
    m.fresh["frozen"] = lambda: (
        graph_io.load_graph_def(
            r.frozen.graph_def, r.frozen.inputs, r.frozen.outputs, r.frozen.bound
        ),
        flat,
    )
    m.row["clusters"] = r.clusters
    if mode == "train":
        return
    m.variants["frozen_xla"] = (realize.single_cluster(r.frozen), flat)
    ref = fns.plain[mode](*m.call).numpy()
    m.row["clusters_max_abs_diff"] = _max_diff(r.fused, flat, ref)
    m.row["frozen_max_abs_diff"] = _max_diff(r.unfused, flat, ref)
    if not kernels or toolchain.compiler() is None:
        return
    rl = realize.generated_loops(concrete, coefficients, batch)
    m.variants["loops"] = (rl.fused, flat)
    m.row["loops"] = rl.loops
    m.row["loops_rows"] = rl.rows
    if rl.rows:  # the same plan without the row programs (row_op)
        no_rows = realize.generated_loops(concrete, coefficients, batch, rows=False)
        m.variants["loops_no_rows"] = (no_rows.fused, flat)
    m.row["loops_left"] = {str(k): v for k, v in rl.left.items()}
    m.row["loops_max_abs_diff"] = _max_diff(rl.fused, flat, ref)


def _add_kernel_serving(m: _Row, fns: _Functions, mode: str, coefficients: Any) -> None:
    """The embedding op called as the frozen graphs are (flat tensors), and the whole pass on
    the serving path: its graph frozen (tables stay handles), its loop groups generated
    (``loop_op``), with and without the row programs and the matmuls inside."""
    from compiler_opt import graph_io, realize

    batch, flat = m.row["batch"], m.flat
    kernel_flat = _flat_function(fns.fused[mode], m.call)
    m.variants["kernel_flat"] = (kernel_flat, flat)
    rk = realize.generated_loops(kernel_flat, coefficients, batch)
    m.variants["kernel_frozen"] = (rk.unfused, flat)
    m.variants["kernel_loops"] = (rk.fused, flat)
    m.fresh["kernel_loops"] = lambda: (
        graph_io.load_graph_def(
            rk.tagged, rk.frozen.inputs, rk.fused.output_names, rk.frozen.bound
        ),
        flat,
    )
    m.row["kernel_loops"] = rk.loops
    m.row["kernel_loops_rows"] = rk.rows
    if rk.rows:
        no_rows = realize.generated_loops(kernel_flat, coefficients, batch, rows=False)
        m.variants["kernel_loops_no_rows"] = (no_rows.fused, flat)
    m.row["kernel_loops_matmuls"] = rk.matmuls
    if rk.matmuls:  # the same without the matmuls in the loop ops
        ra = realize.generated_loops(kernel_flat, coefficients, batch, matmuls=False)
        m.variants["kernel_loops_apart"] = (ra.fused, flat)
        m.fresh["kernel_loops_apart"] = lambda: (
            graph_io.load_graph_def(
                ra.tagged, ra.frozen.inputs, ra.fused.output_names, ra.frozen.bound
            ),
            flat,
        )
    m.row["kernel_loops_tabulated"] = len(rk.tabulation.tables) if rk.tabulation else 0
    ref = fns.plain[mode](*m.call).numpy()
    m.row["kernel_loops_max_abs_diff"] = _max_diff(rk.fused, flat, ref)


def _add_kernel(m: _Row, fns: _Functions, mode: str, coefficients: Any) -> None:
    """The generated embedding op: in graph mode, on the serving path (``_add_kernel_serving``)
    or, for the training step, inlined with its groups as XLA clusters; and with the rest of
    the model as one XLA sub-function."""
    import tensorflow as tf

    from compiler_opt import realize

    m.variants["kernel"] = (fns.kernels[mode], m.call)
    m.fresh["kernel"] = lambda: (tf.function(fns.fused[mode]), m.call)
    if mode != "train":
        _add_kernel_serving(m, fns, mode, coefficients)
    else:
        step = _flat_function(fns.fused[mode], m.call)
        rkt = realize.xla_clusters(step, coefficients, m.row["batch"], keep_variables=True)
        m.variants["kernel_inlined"] = (rkt.unfused, m.flat)
        m.variants["kernel_clusters"] = (rkt.fused, m.flat)
        m.row["kernel_clusters"] = rkt.clusters
    if mode in fns.kernels_xla:
        m.variants["kernel_xla"] = (fns.kernels_xla[mode], m.call)
        m.fresh["kernel_xla"] = lambda: (tf.function(fns.fused[mode + "_xla_rest"]), m.call)
    if mode != "train":
        ref = fns.plain[mode](*m.call).numpy()
        m.row["kernel_max_abs_diff"] = max(
            float(abs(m.variants[n][0](*m.call).numpy() - ref).max())
            for n in ("kernel", "kernel_xla")
            if n in m.variants
        )


def _add_htables(m: _Row, fns: _Functions, mode: str) -> None:
    """Horizontally fused tables in graph mode and under whole-function XLA."""
    import tensorflow as tf

    graph, xla = fns.htables_fns[mode]
    fns.htables["sync"]()  # the model's current tables (a train mode moves them)
    m.variants["htables"] = (graph, m.call)
    m.variants["htables_xla"] = (xla, m.call)
    m.fresh["htables"] = lambda: (tf.function(fns.htables[mode]), m.call)
    m.row["htables_max_abs_diff"] = float(
        abs(graph(*m.call).numpy() - fns.plain[mode](*m.call).numpy()).max()
    )
    m.row["htables_xla_max_abs_diff"] = float(
        abs(xla(*m.call).numpy() - fns.xla[mode](*m.call).numpy()).max()
    )


def _time_variants(row: dict[str, Any], variants: dict[str, Variant], rounds: int) -> None:
    """First-call times, then ``rounds`` interleaved rounds of every variant (each a block of
    calls of about 0.25 s); records the times, their medians and the ratios between them."""
    t_first = {}
    for name, (fn, a) in variants.items():
        t0 = time.perf_counter()
        fn(*a)
        t_first[name] = time.perf_counter() - t0
        for _ in range(WARMUP):  # XLA clusters compile lazily, after a few calls
            fn(*a)
    row["first_call_s"] = t_first
    calls = {n: _calls_for(_time_block(f, a, 1)) for n, (f, a) in variants.items()}
    times: dict[str, list[float]] = {n: [] for n in variants}
    for _ in range(rounds):
        for n, (f, a) in variants.items():
            times[n].append(_time_block(f, a, calls[n]))
    row["times_s"] = times
    for n in variants:
        row[f"{n}_s"] = statistics.median(times[n])
    row["xla_speedup"] = row["plain_s"] / row["xla_s"]
    for names, bases in _OVER:
        for n in names:
            for base in bases:
                if n in variants and f"{base}_s" in row:
                    row[f"{n}_over_{base}"] = row[f"{base}_s"] / row[f"{n}_s"]
    if "htables" in variants:
        row["htables_over_plain"] = row["plain_s"] / row["htables_s"]
        row["htables_xla_over_xla"] = row["xla_s"] / row["htables_xla_s"]
        row["htables_xla_over_plain"] = row["plain_s"] / row["htables_xla_s"]
    for base in ("loops", "kernel_loops"):
        if f"{base}_no_rows" in variants:  # what the row programs bring
            row[f"{base}_rows_speedup"] = row[f"{base}_no_rows_s"] / row[f"{base}_s"]


def _count_executed(m: _Row) -> None:
    """The ops and XLA kernels one call of each variant executes. TensorFlow's executor stops
    tracing ops it has found cheap after some calls: graph-mode functions and frozen graphs
    are counted on fresh instances, on their second call; XLA kernels are always traced (warm
    instances)."""
    from compiler_opt import executed

    for n, variant in m.variants.items():
        f, a = m.fresh[n]() if n in m.fresh else variant
        m.row[f"executed_{n}"] = executed.executed_kernels(f, *a)


def _measure(
    args: argparse.Namespace, w: Any, fns: _Functions, mode: str, coefficients: Any
) -> dict[str, dict[str, Any]]:
    """The rows of one method and mode, one a batch: ``{method/mode/batch: figures}``."""
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import ir, planner

    big = max(args.batches)
    spec = tf.nest.map_structure(
        lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), workload.call_args(w, mode, big)
    )
    graph = ir.from_concrete_function(fns.plain[mode].get_concrete_function(*spec))
    rows = {}
    for batch in args.batches:
        key = f"{w.method}/{mode}/{batch}"
        row: dict[str, Any] = {
            "method": w.method,
            "mode": mode,
            "batch": batch,
            "ir_nodes": len(graph),
            "ir_kernels": graph.kernel_count(),
            "ir_classes": graph.class_counts(),
            "table_rows": w.table_rows,
        }
        if args.process == 0:
            row["plan"] = planner.plan(graph, coefficients, batch).summary()
        call = workload.call_args(w, mode, batch)
        m = _Row(row, call, tuple(tf.nest.flatten(call, expand_composites=True)), spec)
        m.variants = {"plain": (fns.plain[mode], call), "xla": (fns.xla[mode], call)}
        m.fresh["plain"] = lambda call=call: (workload.functions(w, jit=False)[mode], call)
        _add_clusters(m, fns, mode, coefficients, args.kernels)
        if mode in fns.kernels:
            _add_kernel(m, fns, mode, coefficients)
        if mode in fns.htables_fns:
            _add_htables(m, fns, mode)
        _time_variants(row, m.variants, args.rounds)
        if args.process == 0 and batch == big:
            _count_executed(m)
        rows[key] = row
        print(
            f"[process {args.process}] {key}: "
            + ", ".join(f"{n} {row[n + '_s'] * 1e3:.2f} ms" for n in m.variants)
            + f" (xla {row['xla_speedup']:.2f}x over plain)",
            flush=True,
        )
    return rows


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: every method, mode and batch; returns its figures."""
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import cost

    tf.keras.utils.set_random_seed(args.seed)
    coefficients = cost.load_or_calibrate()
    data_dir = workload.write_data(Path(args.out) / "work", args.rows)
    results: dict[str, Any] = {
        "process": args.process,
        "coefficients": coefficients.to_json(),
        "load_start": os.getloadavg(),
        "rows": {},
    }
    for method in args.methods:
        w = workload.build(
            data_dir, method, tuple(args.batches), seed=args.seed, model_type=args.model
        )
        fns = _method_functions(args, w, coefficients, results, method)
        for mode in args.modes:
            results["rows"].update(_measure(args, w, fns, mode, coefficients))
    results["load_end"] = os.getloadavg()
    return results
