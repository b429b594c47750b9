"""The tables of bench/serving: repeats aggregated, ratios against Triton in the same run."""

from __future__ import annotations

from typing import Any

import numpy as np

KEY = ("model", "server", "protocol", "candidates", "driver")


def fmt(r: dict) -> str:
    """One cell as a log line."""
    lat = f"  p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms" if "p50_ms" in r else ""
    return (
        f"{r.get('model', '-'):>6} {r['server']:>12} {r.get('protocol', '-'):>7} "
        f"N={r['candidates']:<4} {r.get('driver', 'loadgen'):>7} {r['qps']:9.1f} req/s{lat}"
        f"  failed {r['failures']}  (load {r['load']})"
    )


def aggregate(rows: list[dict]) -> list[dict]:
    """Repeats of one (model, server, protocol, candidates, driver) cell -> mean and sample std
    of req/s (and p50 and p99 where measured), failures summed."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k, "-") for k in KEY), []).append(r)
    out = []
    for key, rs in groups.items():
        agg: dict[str, Any] = dict(zip(KEY, key, strict=True))
        agg["repeats"] = len(rs)
        for k in ("qps", "p50_ms", "p99_ms"):
            if k not in rs[0]:
                continue
            v = np.array([r[k] for r in rs], dtype=np.float64)
            agg[k] = float(v.mean())
            agg[k + "_std"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        agg["failures"] = sum(r["failures"] for r in rs)
        agg["load"] = [r.get("load", "?") for r in rs]
        out.append(agg)
    return out


def _pm(mean: float, std: float, digits: int) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std else f"{mean:.{digits}f}"


def _ratio(a: dict | None, b: dict | None, k: str) -> str:
    return f"{a[k] / b[k]:.2f}x" if a and b and k in a and k in b and b[k] else "-"


def table(aggregated: list[dict]) -> str:
    """Markdown table: per (model, server, protocol, N) the throughput driver's req/s and
    failures and the latency generator's req/s, p50 and p99; ratios of the means against
    Triton's (KServe) on the same model and N, driver for driver."""
    cells = {tuple(r[k] for k in KEY): r for r in aggregated}
    tput_driver = "h2load" if any(r["driver"] == "h2load" for r in aggregated) else "loadgen"
    lines = [
        f"| model | server | protocol | N | runs | {tput_driver} req/s | failed | "
        "loadgen req/s | p50 ms | p99 ms | req/s vs Triton | p99 vs Triton |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    seen = []
    for r in aggregated:
        head = (r["model"], r["server"], r["protocol"], r["candidates"])
        if head not in seen:
            seen.append(head)
    for model, server, proto, n in seen:
        t = cells.get((model, server, proto, n, tput_driver))
        lat = cells.get((model, server, proto, n, "loadgen"))
        tt = cells.get((model, "triton", "kserve", n, tput_driver))
        tl = cells.get((model, "triton", "kserve", n, "loadgen"))
        lines.append(
            f"| {model} | {server} | {proto} | {n} | {t['repeats'] if t else '-'} | "
            f"{_pm(t['qps'], t['qps_std'], 0) if t else '-'} | "
            f"{(t or lat or {}).get('failures', '-')} | "
            f"{_pm(lat['qps'], lat['qps_std'], 0) if lat else '-'} | "
            f"{_pm(lat['p50_ms'], lat['p50_ms_std'], 1) if lat else '-'} | "
            f"{_pm(lat['p99_ms'], lat['p99_ms_std'], 1) if lat else '-'} | "
            f"{_ratio(t, tt, 'qps')} | {_ratio(lat, tl, 'p99_ms')} |"
        )
    return "\n".join(lines)
