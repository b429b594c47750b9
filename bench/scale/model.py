"""A cost model of the data jobs at a billion rows a day, from this run's measurements.

Measured here: each job's wall seconds per row on one process (one core busy; the machine has
two), and the speed of the 2-worker local cluster over one process (its parallel efficiency
``e = speed / 2``, the engine's overhead and the driver's merging included). Modelled: a cluster
of ``N`` single-core workers runs a job of ``R`` rows in ``R * s / (N * e)`` seconds.

Assumptions (stated in the output): the efficiency measured at 2 workers holds at ``N`` (the
tasks are independent and the driver merges ``O(tasks)`` results; Dask's scheduler handles
thousands of tasks a second, and a billion rows of 64 MiB chunks are a few thousand tasks); the
shared file system delivers ``N`` workers' reads; the statistics' value counts (the distinct
values of every field) fit in the driver's memory.
"""

from __future__ import annotations

import math
from typing import Any

DAY_ROWS = 1_000_000_000
WINDOWS_H = (1, 4)


def _per_row(results: dict[str, Any], job: str) -> tuple[float, float, int] | None:
    """(seconds per row on one process, 2-worker speed-up, rows) at the largest size."""
    size = results["sizes"][-1]
    cells = size.get(job, {})
    if "local" not in cells:
        return None
    speed = cells.get("dask2", {}).get("speed_vs_local", 0.0)
    return cells["local"]["seconds"] / size["rows"], speed, size["rows"]


def cost_table(results: dict[str, Any]) -> dict[str, Any]:
    """Workers of one core that a day of ``DAY_ROWS`` rows needs per job and window."""
    rows_out: list[dict[str, Any]] = []
    lines = []
    for job in ("convert", "stats"):
        got = _per_row(results, job)
        if got is None:
            continue
        s, speed, measured_rows = got
        e = min(max(speed / 2, 1e-3), 1.0) if speed else 1.0
        core_h = DAY_ROWS * s / 3600
        need = {w: math.ceil(DAY_ROWS * s / (w * 3600 * e)) for w in WINDOWS_H}
        rows_out.append(
            {"job": job, "s_per_row": s, "efficiency": e, "core_hours": core_h, "workers": need}
        )
        lines.append(
            f"{job}: {s * 1e6:.2f} us/row on one core (measured at {measured_rows:,} rows), "
            f"{core_h:,.1f} core-hours a day; 2-worker efficiency {e:.2f}; single-core workers "
            + ", ".join(f"{n:,} for a {w} h window" for w, n in need.items())
        )
    lines.append(
        "assumes: the measured 2-worker efficiency holds at N workers, the shared file system "
        "serves N workers' reads, the statistics' value counts fit in the driver's memory"
    )
    return {"day_rows": DAY_ROWS, "jobs": rows_out, "lines": lines}
