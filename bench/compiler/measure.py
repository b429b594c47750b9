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
import os
import statistics
import time
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


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: every method, mode and batch; returns its figures."""
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import cost, executed, graph_io, ir, planner, realize, toolchain

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
        plain = workload.functions(w, jit=False)
        xla = workload.functions(w, jit=True)
        fused: dict[str, Any] = {}
        if args.kernels:
            try:
                fused = workload.fused_functions(w, coefficients)
            except toolchain.CompilerUnavailable as e:
                print(f"[process {args.process}] no generated kernels: {e}", flush=True)
        kernel_fns = {m: tf.function(fused[m]) for m in MODES if m in fused}
        kernel_xla_fns = {
            m: tf.function(fused[m + "_xla_rest"]) for m in ("inference", "train") if fused
        }
        htables = workload.htables_functions(w) if args.htables else {}
        htables_fns = {
            m: (tf.function(htables[m]), tf.function(htables[m], jit_compile=True))
            for m in ("sparse", "inference")
            if m in htables
        }
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
        for mode in args.modes:
            big = max(args.batches)
            spec = tf.nest.map_structure(
                lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype),
                workload.call_args(w, mode, big),
            )
            graph = ir.from_concrete_function(plain[mode].get_concrete_function(*spec))
            for batch in args.batches:
                key = f"{method}/{mode}/{batch}"
                row: dict[str, Any] = {
                    "method": method,
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
                variants: dict[str, tuple[Any, tuple]] = {
                    "plain": (plain[mode], call),
                    "xla": (xla[mode], call),
                }
                # the plan realized as XLA clusters: serving graphs frozen; the training step
                # inlined with its variables kept as handles (``frozen`` is then that step)
                r = realize.xla_clusters(
                    plain[mode].get_concrete_function(*spec),
                    coefficients,
                    batch,
                    keep_variables=mode == "train",
                )
                flat = tuple(tf.nest.flatten(call, expand_composites=True))
                variants["frozen"] = (r.unfused, flat)
                variants["clusters"] = (r.fused, flat)
                row["clusters"] = r.clusters
                if mode != "train":
                    variants["frozen_xla"] = (realize.single_cluster(r.frozen), flat)
                    ref = plain[mode](*call).numpy()
                    row["clusters_max_abs_diff"] = float(abs(r.fused(*flat)[0].numpy() - ref).max())
                    row["frozen_max_abs_diff"] = float(abs(r.unfused(*flat)[0].numpy() - ref).max())
                    if args.kernels and toolchain.compiler() is not None:
                        # the plan's elementwise loop groups as generated ops (loop_op)
                        rl = realize.generated_loops(
                            plain[mode].get_concrete_function(*spec), coefficients, batch
                        )
                        variants["loops"] = (rl.fused, flat)
                        row["loops"] = rl.loops
                        row["loops_rows"] = rl.rows
                        if rl.rows:  # the same plan without the row programs (row_op)
                            variants["loops_no_rows"] = (
                                realize.generated_loops(
                                    plain[mode].get_concrete_function(*spec),
                                    coefficients,
                                    batch,
                                    rows=False,
                                ).fused,
                                flat,
                            )
                        row["loops_left"] = {str(k): v for k, v in rl.left.items()}
                        row["loops_max_abs_diff"] = float(
                            abs(rl.fused(*flat)[0].numpy() - ref).max()
                        )
                if mode in kernel_fns:
                    variants["kernel"] = (kernel_fns[mode], call)
                    if mode != "train":  # called as the frozen graphs are: flat tensors
                        flat = tuple(tf.nest.flatten(call, expand_composites=True))
                        variants["kernel_flat"] = (_flat_function(fused[mode], call), flat)
                        # the whole pass on the serving path: the kernel's graph frozen (its
                        # tables stay handles), its loop groups generated (loop_op)
                        rk = realize.generated_loops(
                            variants["kernel_flat"][0], coefficients, batch
                        )
                        variants["kernel_frozen"] = (rk.unfused, flat)
                        variants["kernel_loops"] = (rk.fused, flat)
                        row["kernel_loops"] = rk.loops
                        row["kernel_loops_rows"] = rk.rows
                        if rk.rows:
                            variants["kernel_loops_no_rows"] = (
                                realize.generated_loops(
                                    variants["kernel_flat"][0], coefficients, batch, rows=False
                                ).fused,
                                flat,
                            )
                        row["kernel_loops_matmuls"] = rk.matmuls
                        if rk.matmuls:  # the same without the matmuls in the loop ops
                            ra = realize.generated_loops(
                                variants["kernel_flat"][0], coefficients, batch, matmuls=False
                            )
                            variants["kernel_loops_apart"] = (ra.fused, flat)
                        row["kernel_loops_tabulated"] = (
                            len(rk.tabulation.tables) if rk.tabulation else 0
                        )
                        row["kernel_loops_max_abs_diff"] = float(
                            abs(rk.fused(*flat)[0].numpy() - plain[mode](*call).numpy()).max()
                        )
                    else:  # the training step with the embedding op, inlined; groups as clusters
                        flat = tuple(tf.nest.flatten(call, expand_composites=True))
                        rkt = realize.xla_clusters(
                            _flat_function(fused[mode], call),
                            coefficients,
                            batch,
                            keep_variables=True,
                        )
                        variants["kernel_inlined"] = (rkt.unfused, flat)
                        variants["kernel_clusters"] = (rkt.fused, flat)
                        row["kernel_clusters"] = rkt.clusters
                    if mode in kernel_xla_fns and fused:
                        variants["kernel_xla"] = (kernel_xla_fns[mode], call)
                    if mode != "train":
                        ref = plain[mode](*call).numpy()
                        row["kernel_max_abs_diff"] = float(
                            max(
                                abs(f(*call).numpy() - ref).max()
                                for f, _ in [
                                    variants[n] for n in ("kernel", "kernel_xla") if n in variants
                                ]
                            )
                        )
                if mode in htables_fns:  # fused tables: graph mode and whole-function XLA
                    htables["sync"]()  # the model's current tables (a train mode moves them)
                    variants["htables"] = (htables_fns[mode][0], call)
                    variants["htables_xla"] = (htables_fns[mode][1], call)
                    row["htables_max_abs_diff"] = float(
                        abs(htables_fns[mode][0](*call).numpy() - plain[mode](*call).numpy()).max()
                    )
                    row["htables_xla_max_abs_diff"] = float(
                        abs(htables_fns[mode][1](*call).numpy() - xla[mode](*call).numpy()).max()
                    )
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
                for _ in range(args.rounds):
                    for n, (f, a) in variants.items():
                        times[n].append(_time_block(f, a, calls[n]))
                row["times_s"] = times
                for n in variants:
                    row[f"{n}_s"] = statistics.median(times[n])
                row["xla_speedup"] = row["plain_s"] / row["xla_s"]
                for n in (
                    "kernel",
                    "kernel_xla",
                    "kernel_flat",
                    "kernel_frozen",
                    "kernel_loops",
                    "kernel_inlined",
                    "kernel_clusters",
                ):
                    if n in variants:
                        row[f"{n}_over_plain"] = row["plain_s"] / row[f"{n}_s"]
                        row[f"{n}_over_xla"] = row["xla_s"] / row[f"{n}_s"]
                        if "frozen_xla_s" in row:
                            row[f"{n}_over_frozen_xla"] = row["frozen_xla_s"] / row[f"{n}_s"]
                if "htables" in variants:
                    row["htables_over_plain"] = row["plain_s"] / row["htables_s"]
                    row["htables_xla_over_xla"] = row["xla_s"] / row["htables_xla_s"]
                    row["htables_xla_over_plain"] = row["plain_s"] / row["htables_xla_s"]
                for base in ("loops", "kernel_loops"):
                    if f"{base}_no_rows" in variants:  # what the row programs bring
                        row[f"{base}_rows_speedup"] = row[f"{base}_no_rows_s"] / row[f"{base}_s"]
                for n in ("loops", "kernel_frozen", "kernel_loops", "kernel_loops_apart"):
                    if n in variants:
                        row[f"{n}_over_frozen"] = row["frozen_s"] / row[f"{n}_s"]
                        row[f"{n}_over_xla"] = row["xla_s"] / row[f"{n}_s"]
                        row[f"{n}_over_frozen_xla"] = row["frozen_xla_s"] / row[f"{n}_s"]
                if "clusters" in variants:
                    row["clusters_over_frozen"] = row["frozen_s"] / row["clusters_s"]
                    row["clusters_over_xla"] = row["xla_s"] / row["clusters_s"]
                    row["clusters_over_plain"] = row["plain_s"] / row["clusters_s"]
                    row["frozen_over_plain"] = row["plain_s"] / row["frozen_s"]
                    if "frozen_xla" in variants:
                        row["clusters_over_frozen_xla"] = row["frozen_xla_s"] / row["clusters_s"]
                if args.process == 0 and batch == big:
                    # TensorFlow's executor stops tracing ops it has found cheap after some
                    # calls: plain and frozen graphs are counted on fresh instances, on their
                    # second call; XLA kernels are always traced (warm instances).
                    fresh = {"plain": (workload.functions(w, jit=False)[mode], call)}
                    if "kernel" in variants:  # graph mode: counted on fresh instances too
                        fresh["kernel"] = (tf.function(fused[mode]), call)
                    if "htables" in variants:
                        fresh["htables"] = (tf.function(htables[mode]), call)
                    if "kernel_xla" in variants:
                        fresh["kernel_xla"] = (tf.function(fused[mode + "_xla_rest"]), call)
                    if "kernel_loops_apart" in variants:
                        fresh["kernel_loops_apart"] = (
                            graph_io.load_graph_def(
                                ra.tagged, ra.frozen.inputs, ra.fused.output_names, ra.frozen.bound
                            ),
                            flat,
                        )
                    if "kernel_loops" in variants:
                        fresh["kernel_loops"] = (
                            graph_io.load_graph_def(
                                rk.tagged, rk.frozen.inputs, rk.fused.output_names, rk.frozen.bound
                            ),
                            flat,
                        )
                    if "frozen" in variants:
                        fresh["frozen"] = (
                            graph_io.load_graph_def(
                                r.frozen.graph_def,
                                r.frozen.inputs,
                                r.frozen.outputs,
                                r.frozen.bound,
                            ),
                            flat,
                        )
                    for n, (f, a) in variants.items():
                        f, a = fresh.get(n, (f, a))
                        row[f"executed_{n}"] = executed.executed_kernels(f, *a)
                results["rows"][key] = row
                print(
                    f"[process {args.process}] {key}: "
                    + ", ".join(f"{n} {row[n + '_s'] * 1e3:.2f} ms" for n in variants)
                    + f" (xla {row['xla_speedup']:.2f}x over plain)",
                    flush=True,
                )
    results["load_end"] = os.getloadavg()
    return results
