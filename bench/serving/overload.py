"""Overload: the server past its saturating concurrency, with a deadline on every call.

1. Sweep: throughput (h2load, or the Python generator) at each concurrency of ``sweep``; the
   saturating concurrency C is the smallest whose req/s is within 5% of the sweep's maximum.
2. The recording generator at 1x, 2x, 4x and 8x C, every call with a deadline (1 s): goodput
   (OK answers/s), p99 of the OK answers, the share of OK / RESOURCE_EXHAUSTED /
   DEADLINE_EXCEEDED / CANCELLED / other, and the p50/p99 latency of the rejections.

Step 2 runs against a server with default flags and against one with ``--max-inflight 2C``
(admission control answering RESOURCE_EXHAUSTED at once instead of letting calls queue).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bench.serving import drive
from bench.serving.servers import start_ours

CODES = ("OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "CANCELLED")


def saturating(sweep: list[tuple[int, float]], within: float = 0.05) -> int:
    """The smallest concurrency whose req/s is within ``within`` of the sweep's maximum."""
    best = max(q for _, q in sweep)
    return min(c for c, q in sweep if q >= (1 - within) * best)


def shares(by_code: dict[str, dict]) -> dict[str, float]:
    """The share of each of CODES and of ``other`` among all answers (they sum to 1)."""
    total = sum(v["count"] for v in by_code.values())
    if not total:
        return {**{c: 0.0 for c in CODES}, "other": 0.0}
    out = {c: by_code.get(c, {}).get("count", 0) / total for c in CODES}
    out["other"] = 1.0 - sum(out.values())
    return {k: round(v, 4) for k, v in out.items()}


def rejections(by_code: dict[str, dict]) -> dict[str, dict]:
    return {k: {"count": v["count"], "p50_ms": v["p50_ms"], "p99_ms": v["p99_ms"]}
            for k, v in by_code.items() if k != "OK"}  # fmt: skip


def run(repo: Path, out: Path, method: str, requests: Path, frame: Path, plan: drive.Plan,
        h2load_bin: str | None, sweep: tuple[int, ...], multiples: tuple[int, ...],
        deadline: float = 1.0, log=print) -> dict:  # fmt: skip
    """The sweep, C, and the rows of step 2 for both servers."""
    proc, port = start_ours(repo, out, "overload-default", [])
    try:
        points = []
        for c in sweep:
            r = drive.throughput(proc, port, method, requests, frame, plan, h2load_bin, c)
            points.append({"concurrency": c, "qps": r["qps"], "load": r["load"]})
            log(f"  sweep c={c:<4} {r['qps']:9.1f} req/s  ({r['driver']}, load {r['load']})")
        c_sat = saturating([(p["concurrency"], p["qps"]) for p in points])
        log(f"  saturating concurrency {c_sat}")
        rows = _multiples(proc, port, "default flags", method, requests, plan, c_sat, multiples,
                          deadline, log)  # fmt: skip
    finally:
        proc.stop()
    inflight = 2 * c_sat
    proc, port = start_ours(repo, out, "overload-inflight", ["--max-inflight", str(inflight)])
    try:
        rows += _multiples(proc, port, f"--max-inflight {inflight}", method, requests, plan,
                           c_sat, multiples, deadline, log)  # fmt: skip
    finally:
        proc.stop()
    return {"sweep": points, "saturating": c_sat, "deadline_s": deadline, "rows": rows}


def _multiples(proc, port, server, method, requests, plan, c_sat, multiples, deadline, log):
    rows = []
    p = dataclasses.replace(plan, deadline=deadline)
    for m in multiples:
        r = drive.loadgen(port, method, requests, p, concurrency=m * c_sat)
        row = {
            "server": server,
            "multiple": m,
            "concurrency": m * c_sat,
            "goodput": r["qps"],
            "ok_p99_ms": r["p99_ms"],
            "shares": shares(r["by_code"]),
            "rejections": rejections(r["by_code"]),
            "load": r["load"],
        }
        rows.append(row)
        log("  " + fmt(row))
    return rows


def fmt(r: dict) -> str:
    sh = " ".join(f"{k}={v:.3f}" for k, v in r["shares"].items() if v)
    rej = " ".join(f"{k} p50 {v['p50_ms']:.1f}/p99 {v['p99_ms']:.1f} ms"
                   for k, v in r["rejections"].items())  # fmt: skip
    return (f"{r['server']:>20} {r['multiple']}x (c={r['concurrency']}) goodput "
            f"{r['goodput']:.1f}/s OK p99 {r['ok_p99_ms']:.1f} ms  {sh}  {rej}  "
            f"(load {r['load']})")  # fmt: skip


def table(result: dict) -> str:
    lines = [
        f"Saturating concurrency {result['saturating']} (sweep: "
        + ", ".join(f"c={p['concurrency']}: {p['qps']:.0f} req/s" for p in result["sweep"])
        + f"); deadline {result['deadline_s']} s per call.",
        "",
        "| server | load | goodput OK/s | OK p99 ms | OK | RESOURCE_EXHAUSTED | "
        "DEADLINE_EXCEEDED | CANCELLED | other | rejections p50/p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        s = r["shares"]
        rej = "; ".join(f"{k} {v['p50_ms']:.1f}/{v['p99_ms']:.1f}"
                        for k, v in r["rejections"].items()) or "-"  # fmt: skip
        lines.append(
            f"| {r['server']} | {r['multiple']}x (c={r['concurrency']}) | {r['goodput']:.0f} | "
            f"{r['ok_p99_ms']:.1f} | "
            + " | ".join(f"{s[k]:.3f}" for k in (*CODES, "other"))
            + f" | {rej} |"
        )
    return "\n".join(lines)
