"""bench/compiler: the baseline compiler_opt has to beat, measured on DCN-v2.

    .venv/bin/python -m bench.compiler --out runs/bench-compiler
    .venv/bin/python -m bench.compiler --out runs/bench-compiler --processes 1 --methods full

For DCN-v2 (``bench/compiler/workload.py``) with ``full``, ``amtl`` and ``bh`` embeddings, at
batch 256 and 4096, for the inference pass and the SGD training step:

* ops in the IR of the traced function (``compiler_opt.ir``: nodes, kernels) and the ops /
  XLA kernels one call executed (a profiler trace, ``compiler_opt/executed.py``; first
  process only, largest batch);
* cost-model bytes per example with every kernel alone and under the fusion plan, launches
  before / after (``compiler_opt.planner`` with this machine's calibrated coefficients);
* time per call of plain graph mode (``tf.function``) and of whole-function XLA
  (``jit_compile=True``), interleaved in one process (rounds of plain, then XLA), in
  ``--processes`` separate processes; the ratio plain / XLA of each process, then the median
  and min-max over processes;
* the generated kernel (``compiler_opt.embedding_op``: the embedding block, lookups through the
  concat with the dense inputs, as one generated C++ op) in the same rounds: ``kernel`` (the
  op, then the rest of the model in graph mode) and ``kernel_xla`` (the op, then the rest as
  one ``jit_compile`` sub-function); ``--no-kernels`` leaves them out;
* horizontally fused tables (``compiler_opt.table_fusion``: a dim's tables as one variable, one
  gather) in the same rounds, ``sparse`` and ``inference`` modes: ``htables`` (graph mode) and
  ``htables_xla`` (whole function ``jit_compile=True``), for the methods with at least two
  fused fields (``full``: all 26; ``amtl``, ``bh``: their small fields kept ``full``);
  ``--no-htables`` leaves them out;
* the serving path, ``sparse`` and ``inference`` modes, on the frozen graph as the server runs
  a fused export: ``loops`` (the plan's elementwise ``loop`` groups as generated C++ ops,
  ``compiler_opt.loop_op``), ``kernel_frozen`` (the generated embedding op, its graph
  frozen with the tables left as handles) and ``kernel_loops`` (both).

Prints a table, writes ``results.json`` (every process's figures) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BATCHES = (256, 4096)
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


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def _ms(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1e3:.2f} [{min(values) * 1e3:.2f}-{max(values) * 1e3:.2f}]"
    )


def _col(procs: list[dict[str, Any]], key: str, field: str) -> list[float]:
    return [p["rows"][key][field] for p in procs if field in p["rows"].get(key, {})]


def summarize(procs: list[dict[str, Any]]) -> str:
    """Two markdown tables: counts and bytes (first process), times and ratios (all)."""
    first = procs[0]
    keys = list(first["rows"])
    lines = [
        "| method | mode | batch | IR kernels | executed per call: plain ops / whole-function XLA "
        "kernels / clusters run (their XLA kernels, + TF ops outside) | B/example alone -> planned | launches alone -> planned | groups |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        r0 = first["rows"][key]
        plan = r0.get("plan", {})
        executed = ""
        if "executed_plain" in r0:
            executed = f"{r0['executed_plain']['tf_ops']} / {r0['executed_xla']['xla_kernels']}"
            if "executed_clusters" in r0:
                ex = r0["executed_clusters"]
                ran = ex["top_tf_ops"].get("_XlaRun", 0)
                executed += (
                    f" / {ran} ({ex['xla_kernels']} XLA kernels, +{ex['tf_ops_outside_xla']} ops)"
                )
        lines.append(
            f"| {r0['method']} | {r0['mode']} | {r0['batch']} | {r0['ir_kernels']} | {executed} | "
            f"{plan.get('bytes_per_example_before', 0):,.0f} -> "
            f"{plan.get('bytes_per_example_after', 0):,.0f} | "
            f"{plan.get('launches_before', '')} -> {plan.get('launches_after', '')} | "
            f"{plan.get('groups', '')} |"
        )
    lines += [
        "",
        "| method | mode | batch | plain ms | XLA ms | XLA over plain | frozen ms | "
        "frozen XLA ms | clusters ms | clusters over frozen | clusters over frozen XLA | "
        "clusters over XLA | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        r0 = first["rows"][key]
        cells = [
            _ms(_col(procs, key, "plain_s")),
            _ms(_col(procs, key, "xla_s")),
            _spread(_col(procs, key, "xla_speedup")),
        ]
        if "clusters_s" in r0:
            served = "frozen_xla_s" in r0  # a training step: no one-cluster form, no diff
            cells += [
                _ms(_col(procs, key, "frozen_s")),
                _ms(_col(procs, key, "frozen_xla_s")) if served else "",
                _ms(_col(procs, key, "clusters_s")),
                _spread(_col(procs, key, "clusters_over_frozen")),
                _spread(_col(procs, key, "clusters_over_frozen_xla")) if served else "",
                _spread(_col(procs, key, "clusters_over_xla")),
                f"{max(_col(procs, key, 'clusters_max_abs_diff')):.1e}" if served else "",
            ]
        else:
            cells += [""] * 7
        lines.append(
            f"| {r0['method']} | {r0['mode']} | {r0['batch']} | " + " | ".join(cells) + " |"
        )
    if any("kernel_s" in r for r in first["rows"].values()):
        lines += [
            "",
            "| method | mode | batch | executed per call: kernel ops / kernel + XLA rest "
            "(ops, XLA kernels) | kernel ms | kernel over plain | kernel over XLA | "
            "kernel over frozen XLA | kernel, flat call ms | flat call over frozen XLA | "
            "kernel + XLA rest ms | over plain | over XLA | max abs diff |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key in keys:
            r0 = first["rows"][key]
            if "kernel_s" not in r0:
                continue
            executed = ""
            if "executed_kernel" in r0:
                executed = f"{r0['executed_kernel']['tf_ops']}"
                if "executed_kernel_xla" in r0:
                    ex = r0["executed_kernel_xla"]
                    executed += f" / {ex['tf_ops']}, {ex['xla_kernels']}"
            cells = [
                executed,
                _ms(_col(procs, key, "kernel_s")),
                _spread(_col(procs, key, "kernel_over_plain")),
                _spread(_col(procs, key, "kernel_over_xla")),
                _spread(_col(procs, key, "kernel_over_frozen_xla"))
                if "kernel_over_frozen_xla" in r0
                else "",
            ]
            if "kernel_flat_s" in r0:
                cells += [
                    _ms(_col(procs, key, "kernel_flat_s")),
                    _spread(_col(procs, key, "kernel_flat_over_frozen_xla")),
                ]
            else:
                cells += ["", ""]
            if "kernel_xla_s" in r0:
                cells += [
                    _ms(_col(procs, key, "kernel_xla_s")),
                    _spread(_col(procs, key, "kernel_xla_over_plain")),
                    _spread(_col(procs, key, "kernel_xla_over_xla")),
                ]
            else:
                cells += ["", "", ""]
            diffs = _col(procs, key, "kernel_max_abs_diff")
            cells.append(f"{max(diffs):.1e}" if diffs else "")
            lines.append(
                f"| {r0['method']} | {r0['mode']} | {r0['batch']} | " + " | ".join(cells) + " |"
            )
    if any(
        f"{b}_rows_speedup" in r for r in first["rows"].values() for b in ("loops", "kernel_loops")
    ):
        lines += [
            "",
            "Row programs (``row_op``: groups with reductions, e.g. the FM term) on the "
            "serving path: the generated ops with them and with the same plan without them.",
            "",
            "| method | mode | batch | path | row programs | with ms | without ms | without / with |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for key in keys:
            r0 = first["rows"][key]
            for base, path in (("loops", "loops"), ("kernel_loops", "kernel + loops")):
                if f"{base}_rows_speedup" not in r0:
                    continue
                cells = [
                    path,
                    str(r0[f"{base}_rows"]),
                    _ms(_col(procs, key, f"{base}_s")),
                    _ms(_col(procs, key, f"{base}_no_rows_s")),
                    _spread(_col(procs, key, f"{base}_rows_speedup")),
                ]
                lines.append(
                    f"| {r0['method']} | {r0['mode']} | {r0['batch']} | " + " | ".join(cells) + " |"
                )
    if any("kernel_loops_s" in r or "loops_s" in r for r in first["rows"].values()):
        lines += [
            "",
            "The serving path (the graph frozen, as the server runs a fused export): ``loops`` "
            "the plan's elementwise loop groups as generated ops (``loop_op``); ``kernel "
            "frozen`` the embedding block as the generated op, frozen; ``kernel + loops`` both.",
            "",
            "| method | mode | batch | executed per call: kernel + loops ops (loop ops) | "
            "frozen ms | loops ms | loops over frozen | kernel frozen ms | kernel + loops ms | "
            "over frozen | over frozen XLA | over XLA | max abs diff |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key in keys:
            r0 = first["rows"][key]
            if "loops_s" not in r0 and "kernel_loops_s" not in r0:
                continue
            executed = ""
            if "executed_kernel_loops" in r0:
                executed = f"{r0['executed_kernel_loops']['tf_ops']} ({r0['kernel_loops']})"
            cells = [executed, _ms(_col(procs, key, "frozen_s"))]
            if "loops_s" in r0:
                cells += [
                    _ms(_col(procs, key, "loops_s")),
                    _spread(_col(procs, key, "loops_over_frozen")),
                ]
            else:
                cells += ["", ""]
            if "kernel_loops_s" in r0:
                cells += [
                    _ms(_col(procs, key, "kernel_frozen_s")),
                    _ms(_col(procs, key, "kernel_loops_s")),
                    _spread(_col(procs, key, "kernel_loops_over_frozen")),
                    _spread(_col(procs, key, "kernel_loops_over_frozen_xla")),
                    _spread(_col(procs, key, "kernel_loops_over_xla")),
                    f"{max(_col(procs, key, 'kernel_loops_max_abs_diff')):.1e}",
                ]
            else:
                cells += [""] * 6
            lines.append(
                f"| {r0['method']} | {r0['mode']} | {r0['batch']} | " + " | ".join(cells) + " |"
            )
    if any("kernel_loops_apart_s" in r for r in first["rows"].values()):
        lines += [
            "",
            "The loop ops with the matmul feeding them inside (``attach_matmuls``, Eigen's GEMM: "
            "``kernel + loops`` above) against the same with the matmuls left to TensorFlow "
            "(oneDNN, ``apart``):",
            "",
            "| method | mode | batch | ops per call: with / apart | matmuls inside | "
            "with ms | apart ms | with over apart | apart over XLA |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key in keys:
            r0 = first["rows"][key]
            if "kernel_loops_apart_s" not in r0:
                continue
            executed = ""
            if "executed_kernel_loops_apart" in r0:
                executed = (
                    f"{r0['executed_kernel_loops']['tf_ops']} / "
                    f"{r0['executed_kernel_loops_apart']['tf_ops']}"
                )
            with_over = [
                p["rows"][key]["kernel_loops_apart_s"] / p["rows"][key]["kernel_loops_s"]
                for p in procs
            ]
            cells = [
                executed,
                str(r0.get("kernel_loops_matmuls", "")),
                _ms(_col(procs, key, "kernel_loops_s")),
                _ms(_col(procs, key, "kernel_loops_apart_s")),
                _spread(with_over),
                _spread(_col(procs, key, "kernel_loops_apart_over_xla")),
            ]
            lines.append(
                f"| {r0['method']} | {r0['mode']} | {r0['batch']} | " + " | ".join(cells) + " |"
            )
    if any(r["mode"] == "train" and "clusters_s" in r for r in first["rows"].values()):
        lines += [
            "",
            "The training step inlined (variables kept as handles, ``realize.freeze("
            "keep_variables=True)``) and its planned groups as XLA clusters "
            "(``realize.xla_clusters(keep_variables=True)``), without and with the embedding op:",
            "",
            "| method | batch | clusters | plain ms | inlined ms | clusters ms | XLA ms | "
            "inlined over plain | clusters over plain | clusters over XLA | kernel ms | "
            "kernel inlined ms | kernel clusters ms | kernel inlined over XLA | "
            "kernel clusters over XLA |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key in keys:
            r0 = first["rows"][key]
            if r0["mode"] != "train" or "clusters_s" not in r0:
                continue
            cells = [
                str(r0["clusters"]),
                _ms(_col(procs, key, "plain_s")),
                _ms(_col(procs, key, "frozen_s")),
                _ms(_col(procs, key, "clusters_s")),
                _ms(_col(procs, key, "xla_s")),
                _spread(_col(procs, key, "frozen_over_plain")),
                _spread(_col(procs, key, "clusters_over_plain")),
                _spread(_col(procs, key, "clusters_over_xla")),
            ]
            if "kernel_clusters_s" in r0:
                cells += [
                    _ms(_col(procs, key, "kernel_s")),
                    _ms(_col(procs, key, "kernel_inlined_s")),
                    _ms(_col(procs, key, "kernel_clusters_s")),
                    _spread(_col(procs, key, "kernel_inlined_over_xla")),
                    _spread(_col(procs, key, "kernel_clusters_over_xla")),
                ]
            else:
                cells += [""] * 5
            lines.append(f"| {r0['method']} | {r0['batch']} | " + " | ".join(cells) + " |")
    if any("htables_s" in r for r in first["rows"].values()):
        lines += [
            "",
            "| method | mode | batch | executed per call: plain ops / htables ops / XLA kernels / "
            "htables XLA kernels | plain ms | htables ms | htables over plain | XLA ms | "
            "htables XLA ms | htables XLA over XLA | htables XLA over plain | max abs diff "
            "(graph, XLA) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key in keys:
            r0 = first["rows"][key]
            if "htables_s" not in r0:
                continue
            executed = ""
            if "executed_htables" in r0:
                executed = (
                    f"{r0['executed_plain']['tf_ops']} / {r0['executed_htables']['tf_ops']} / "
                    f"{r0['executed_xla']['xla_kernels']} / "
                    f"{r0['executed_htables_xla']['xla_kernels']}"
                )
            diffs = (
                max(_col(procs, key, "htables_max_abs_diff")),
                max(_col(procs, key, "htables_xla_max_abs_diff")),
            )
            cells = [
                executed,
                _ms(_col(procs, key, "plain_s")),
                _ms(_col(procs, key, "htables_s")),
                _spread(_col(procs, key, "htables_over_plain")),
                _ms(_col(procs, key, "xla_s")),
                _ms(_col(procs, key, "htables_xla_s")),
                _spread(_col(procs, key, "htables_xla_over_xla")),
                _spread(_col(procs, key, "htables_xla_over_plain")),
                f"{diffs[0]:.1e}, {diffs[1]:.1e}",
            ]
            lines.append(
                f"| {r0['method']} | {r0['mode']} | {r0['batch']} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compiler", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/bench-compiler")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows (vocabularies)")
    p.add_argument(
        "--model",
        default="dcn_v2",
        choices=["dcn_v2", "fm"],
        help="the model (fm: the FM term, a row program on the serving path)",
    )
    p.add_argument("--methods", nargs="+", default=["full", "amtl", "bh"])
    p.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--no-kernels",
        dest="kernels",
        action="store_false",
        help="leave out the generated-kernel variants (compiler_opt.embedding_op)",
    )
    p.add_argument(
        "--no-htables",
        dest="htables",
        action="store_false",
        help="leave out the horizontally fused tables variants (compiler_opt.table_fusion)",
    )
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the process-N.json files a cut-short run of the same --out already wrote",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        res = child(args)
        (out / f"process-{args.process}.json").write_text(json.dumps(res, indent=1))
        return 0
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import cost

    t0 = time.time()
    workload.write_data(out / "work", args.rows)  # once, before the processes
    coefficients = cost.load_or_calibrate()
    print(f"coefficients: {coefficients.to_json()}", flush=True)
    procs = []
    for i in range(args.processes):
        cmd = [sys.executable, "-m", "bench.compiler", "--child", "--process", str(i)]
        cmd += ["--out", str(out), "--rows", str(args.rows), "--rounds", str(args.rounds)]
        cmd += ["--seed", str(args.seed), "--methods", *args.methods, "--model", args.model]
        cmd += ["--batches", *map(str, args.batches), "--modes", *args.modes]
        if not args.kernels:
            cmd.append("--no-kernels")
        if not args.htables:
            cmd.append("--no-htables")
        if not (args.resume and (out / f"process-{i}.json").exists()):
            subprocess.run(cmd, check=True, cwd=ROOT)
        procs.append(json.loads((out / f"process-{i}.json").read_text()))
    table = summarize(procs)
    info = {
        "model": args.model,
        "tf_version": tf.__version__,
        "cpus": os.cpu_count(),
        "device": coefficients.device,
        "rows": args.rows,
        "processes": args.processes,
        "rounds": args.rounds,
        "seconds": round(time.time() - t0, 1),
        "load": [p["load_start"] for p in procs],
    }
    (out / "results.json").write_text(json.dumps({"info": info, "processes": procs}, indent=1))
    (out / "summary.md").write_text(
        f"# bench/compiler\n\n{json.dumps(info)}\n\n{table}\n"
        "\nTimes: median over processes [min-max] of each process's median of interleaved "
        "rounds; ratios: per process, then median [min-max] over processes. frozen: the serving "
        "graph with variables as constants, unfused; clusters: the same with the planned "
        "groups compiled as XLA clusters (compiler_opt.realize); frozen XLA: the frozen graph as "
        "one XLA cluster.\n"
    )
    print(table)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
