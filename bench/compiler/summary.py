"""The markdown tables of bench/compiler: every process's figures summarized over processes.

Counts, bytes and launches come from the first process; times are the median [min-max] over
processes of each process's median of interleaved rounds, ratios per process, then median
[min-max] over processes.
"""

from __future__ import annotations

import statistics
from typing import Any


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def _ms(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1e3:.2f} [{min(values) * 1e3:.2f}-{max(values) * 1e3:.2f}]"
    )


def _col(procs: list[dict[str, Any]], key: str, field: str) -> list[float]:
    return [p["rows"][key][field] for p in procs if field in p["rows"].get(key, {})]


def _rows_with(procs: list[dict[str, Any]], *fields: str) -> dict[str, dict[str, Any]]:
    """The first process's rows that measured any of ``fields``."""
    return {k: r for k, r in procs[0]["rows"].items() if any(f in r for f in fields)}


def _cells_row(r0: dict[str, Any], cells: list[str]) -> str:
    """A table line: the row's method, mode and batch, then ``cells``."""
    return f"| {r0['method']} | {r0['mode']} | {r0['batch']} | " + " | ".join(cells) + " |"


def _counts_table(procs: list[dict[str, Any]]) -> list[str]:
    """IR kernels, executed ops and the plan's bytes and launches (first process)."""
    lines = [
        "| method | mode | batch | IR kernels | executed per call: plain ops / whole-function XLA "
        "kernels / clusters run (their XLA kernels, + TF ops outside) | B/example alone -> planned | launches alone -> planned | groups |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r0 in procs[0]["rows"].values():
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
        cells = [
            str(r0["ir_kernels"]),
            executed,
            f"{plan.get('bytes_per_example_before', 0):,.0f} -> "
            f"{plan.get('bytes_per_example_after', 0):,.0f}",
            f"{plan.get('launches_before', '')} -> {plan.get('launches_after', '')}",
            str(plan.get("groups", "")),
        ]
        lines.append(_cells_row(r0, cells))
    return lines


def _times_table(procs: list[dict[str, Any]]) -> list[str]:
    """Plain, whole-function XLA, the frozen graph and its planned groups as XLA clusters."""
    lines = [
        "",
        "| method | mode | batch | plain ms | XLA ms | XLA over plain | frozen ms | "
        "frozen XLA ms | clusters ms | clusters over frozen | clusters over frozen XLA | "
        "clusters over XLA | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r0 in procs[0]["rows"].items():
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
        lines.append(_cells_row(r0, cells))
    return lines


def _kernel_table(procs: list[dict[str, Any]]) -> list[str]:
    """The generated embedding op, alone and with the rest as one XLA sub-function."""
    rows = _rows_with(procs, "kernel_s")
    if not rows:
        return []
    lines = [
        "",
        "| method | mode | batch | executed per call: kernel ops / kernel + XLA rest "
        "(ops, XLA kernels) | kernel ms | kernel over plain | kernel over XLA | "
        "kernel over frozen XLA | kernel, flat call ms | flat call over frozen XLA | "
        "kernel + XLA rest ms | over plain | over XLA | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r0 in rows.items():
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
        lines.append(_cells_row(r0, cells))
    return lines


def _row_programs_table(procs: list[dict[str, Any]]) -> list[str]:
    """The serving path's generated ops with and without their row programs."""
    paths = (("loops", "loops"), ("kernel_loops", "kernel + loops"))
    if not any(f"{b}_rows_speedup" in r for r in procs[0]["rows"].values() for b, _ in paths):
        return []
    lines = [
        "",
        "Row programs (``row_op``: groups with reductions, e.g. the FM term) on the "
        "serving path: the generated ops with them and with the same plan without them.",
        "",
        "| method | mode | batch | path | row programs | with ms | without ms | without / with |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r0 in procs[0]["rows"].items():
        for base, path in paths:
            if f"{base}_rows_speedup" not in r0:
                continue
            cells = [
                path,
                str(r0[f"{base}_rows"]),
                _ms(_col(procs, key, f"{base}_s")),
                _ms(_col(procs, key, f"{base}_no_rows_s")),
                _spread(_col(procs, key, f"{base}_rows_speedup")),
            ]
            lines.append(_cells_row(r0, cells))
    return lines


def _serving_table(procs: list[dict[str, Any]]) -> list[str]:
    """The frozen serving graph with its loop groups and the embedding op generated."""
    rows = _rows_with(procs, "loops_s", "kernel_loops_s")
    if not rows:
        return []
    lines = [
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
    for key, r0 in rows.items():
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
        lines.append(_cells_row(r0, cells))
    return lines


def _matmuls_table(procs: list[dict[str, Any]]) -> list[str]:
    """The loop ops with their matmuls inside against the matmuls left to TensorFlow."""
    rows = _rows_with(procs, "kernel_loops_apart_s")
    if not rows:
        return []
    lines = [
        "",
        "The loop ops with the matmul feeding them inside (``attach_matmuls``, Eigen's GEMM: "
        "``kernel + loops`` above) against the same with the matmuls left to TensorFlow "
        "(oneDNN, ``apart``):",
        "",
        "| method | mode | batch | ops per call: with / apart | matmuls inside | "
        "with ms | apart ms | with over apart | apart over XLA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r0 in rows.items():
        executed = ""
        if "executed_kernel_loops_apart" in r0:
            executed = (
                f"{r0['executed_kernel_loops']['tf_ops']} / "
                f"{r0['executed_kernel_loops_apart']['tf_ops']}"
            )
        with_over = [
            p["rows"][key]["kernel_loops_apart_s"] / p["rows"][key]["kernel_loops_s"] for p in procs
        ]
        cells = [
            executed,
            str(r0.get("kernel_loops_matmuls", "")),
            _ms(_col(procs, key, "kernel_loops_s")),
            _ms(_col(procs, key, "kernel_loops_apart_s")),
            _spread(with_over),
            _spread(_col(procs, key, "kernel_loops_apart_over_xla")),
        ]
        lines.append(_cells_row(r0, cells))
    return lines


def _train_table(procs: list[dict[str, Any]]) -> list[str]:
    """The inlined training step and its planned groups as XLA clusters, without and with
    the embedding op."""
    rows = {k: r for k, r in procs[0]["rows"].items() if r["mode"] == "train" and "clusters_s" in r}
    if not rows:
        return []
    lines = [
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
    for key, r0 in rows.items():
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
    return lines


def _htables_table(procs: list[dict[str, Any]]) -> list[str]:
    """Horizontally fused tables in graph mode and under whole-function XLA."""
    rows = _rows_with(procs, "htables_s")
    if not rows:
        return []
    lines = [
        "",
        "| method | mode | batch | executed per call: plain ops / htables ops / XLA kernels / "
        "htables XLA kernels | plain ms | htables ms | htables over plain | XLA ms | "
        "htables XLA ms | htables XLA over XLA | htables XLA over plain | max abs diff "
        "(graph, XLA) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r0 in rows.items():
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
        lines.append(_cells_row(r0, cells))
    return lines


_TABLES = (
    _counts_table,
    _times_table,
    _kernel_table,
    _row_programs_table,
    _serving_table,
    _matmuls_table,
    _train_table,
    _htables_table,
)


def summarize(procs: list[dict[str, Any]]) -> str:
    """The markdown tables: counts and bytes (first process), times and ratios (all); a
    variant's table only where the first process measured it."""
    return "\n".join(line for table in _TABLES for line in table(procs))
