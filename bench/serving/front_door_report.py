"""The tables of bench.serving.front_door: repeats aggregated, ratios against the baseline of
the same run.

- ``protocols``: each HTTP form / gRPC Rank at the same N, driver for driver (req/s) and of the
  latency generator (p99);
- ``triton``: ours (KServe v2 JSON) / Triton's (KServe v2 JSON) at the same N;
- ``overheads`` and ``shadow``: per repeat, the variant's figure / the baseline server's of the
  same repeat (``base``; ``no-shadow``), then the mean, min and max of those ratios and the 95%
  interval of their geometric mean (Student's t on the log ratios; ``ci95``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

KEY = ("section", "server", "protocol", "candidates", "driver")
PAIRED = {"overheads": "base", "shadow": "no-shadow"}


def _cells(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in KEY), []).append(r)
    out = []
    for key, rs in groups.items():
        agg: dict[str, Any] = dict(zip(KEY, key, strict=True))
        agg["repeats"] = len(rs)
        for k in ("qps", "p50_ms", "p99_ms"):
            if k in rs[0]:
                v = np.array([r[k] for r in rs], dtype=np.float64)
                agg[k] = float(v.mean())
                agg[k + "_std"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        agg["failures"] = sum(r["failures"] for r in rs)
        agg["ok"] = sum(r.get("requests", r.get("answers", {}).get("OK", 0)) for r in rs)
        agg["load"] = [r.get("load", "?") for r in rs]
        out.append(agg)
    return out


def _paired(rows: list[dict], section: str) -> dict[str, dict]:
    """Per variant: p99 and req/s ratios against the section's baseline, repeat by repeat."""
    base_name = PAIRED[section]
    by_rep: dict[int, dict[str, dict]] = {}
    for r in rows:
        if r["section"] == section:
            by_rep.setdefault(r["repeat"], {})[r["server"]] = r
    out: dict[str, dict] = {}
    for servers in by_rep.values():
        base = servers.get(base_name)
        for name, r in servers.items():
            if name == base_name or base is None:
                continue
            d = out.setdefault(name, {"p99_ratio": [], "qps_ratio": [], "p50_ratio": []})
            for k in ("p99", "qps", "p50"):
                field = "qps" if k == "qps" else f"{k}_ms"
                if base[field]:
                    d[f"{k}_ratio"].append(r[field] / base[field])
    for d in out.values():
        for k in list(d):
            v = d[k]
            d[k] = {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v)),
                    "ci95": interval(v), "values": [round(x, 4) for x in v]} if v else None  # fmt: skip
    return out


def interval(ratios: list[float]) -> list[float] | None:
    """The 95% interval of the geometric mean of paired ratios: Student's t on their logs (None
    for fewer than two ratios or a ratio that is not positive)."""
    if len(ratios) < 2 or min(ratios) <= 0:
        return None
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs))
    return [float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))]


def aggregate(rows: list[dict]) -> dict:
    """{"cells": per (section, server, protocol, N, driver) mean/std, "ratios": ...}."""
    cells = _cells(rows)
    by = {tuple(c[k] for k in KEY): c for c in cells}
    ratios: dict[str, Any] = {"protocols": [], "triton": []}
    for c in cells:
        if c["section"] == "protocols" and c["protocol"] != "grpc":
            g = by.get(("protocols", "stitchrec", "grpc", c["candidates"], c["driver"]))
            ratios["protocols"].append(_ratio(c, g, c["protocol"]))
        if c["section"] == "triton":
            ours = by.get(("protocols", "stitchrec", "v2-json", c["candidates"], c["driver"]))
            ratios["triton"].append(_ratio(ours, c, "v2-json ours/triton"))
    for section in PAIRED:
        ratios[section] = _paired(rows, section)
    return {"cells": cells, "ratios": ratios}


def _ratio(a: dict | None, b: dict | None, what: str) -> dict:
    out: dict[str, Any] = {"what": what}
    ref = a or b or {}
    out["candidates"], out["driver"] = ref.get("candidates"), ref.get("driver")
    for k in ("qps", "p99_ms"):
        out[k] = round(a[k] / b[k], 3) if a and b and k in a and k in b and b[k] else None
    return out


def _pm(c: dict, k: str, digits: int) -> str:
    if k not in c:
        return "-"
    return f"{c[k]:.{digits}f} ± {c[k + '_std']:.{digits}f}" if c[k + "_std"] else \
        f"{c[k]:.{digits}f}"  # fmt: skip


def _r(d: dict | None) -> str:
    if not d:
        return "-"
    ci = d.get("ci95")
    within = f"; 95% {ci[0]:.3f} to {ci[1]:.3f}" if ci else ""
    return f"{d['mean']:.3f} [{d['min']:.3f}, {d['max']:.3f}]{within}"


def tables(agg: dict) -> str:
    """Markdown tables: cells (throughput and latency side by side) and the paired ratios."""
    by = {tuple(c[k] for k in KEY): c for c in agg["cells"]}
    heads = []
    for c in agg["cells"]:
        h = (c["section"], c["server"], c["protocol"], c["candidates"])
        if h not in heads:
            heads.append(h)
    lines = [
        "| section | server | protocol | N | runs | h2load req/s | loadgen req/s | p50 ms | "
        "p99 ms | failed | req/s vs gRPC | p99 vs gRPC | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, srv, proto, n in heads:
        t, lat = by.get((s, srv, proto, n, "h2load")), by.get((s, srv, proto, n, "loadgen"))
        g_t = by.get(("protocols", "stitchrec", "grpc", n, "h2load"))
        g_l = by.get(("protocols", "stitchrec", "grpc", n, "loadgen"))
        one = lat or t
        vs = s in ("protocols", "triton")
        lines.append(
            f"| {s} | {srv} | {proto} | {n} | {one['repeats']} | {_pm(t, 'qps', 0) if t else '-'}"
            f" | {_pm(lat, 'qps', 0) if lat else '-'} | {_pm(lat, 'p50_ms', 2) if lat else '-'}"
            f" | {_pm(lat, 'p99_ms', 2) if lat else '-'} | "
            f"{sum(c['failures'] for c in (t, lat) if c)} | "
            f"{_ratio(t, g_t, '')['qps'] if vs and t else '-'} | "
            f"{_ratio(lat, g_l, '')['p99_ms'] if vs and lat else '-'} | "
            f"{' / '.join(x.split()[0] for x in one['load'])} |"
        )
    lines += ["", "| paired against | variant | p99 ratio mean [min, max]; 95% interval | "
              "req/s ratio mean [min, max]; 95% interval | p50 ratio mean [min, max]; 95% interval |",
              "|---|---|---|---|---|"]  # fmt: skip
    for section, base in PAIRED.items():
        for name, d in agg["ratios"][section].items():
            lines.append(f"| {base} | {name} | {_r(d['p99_ratio'])} | {_r(d['qps_ratio'])} | "
                         f"{_r(d['p50_ratio'])} |")  # fmt: skip
    if agg["ratios"]["triton"]:
        lines += ["", "| ours / Triton (KServe v2 JSON over HTTP) | N | driver | req/s | p99 |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in agg["ratios"]["triton"]:
            lines.append(
                f"| | {r['candidates']} | {r['driver']} | {r['qps']} | {r['p99_ms'] or '-'} |"
            )
    return "\n".join(lines)


def show(result: dict) -> None:
    print()
    print(tables(result["aggregated"]))
    over = result.get("extra") or {}
    print(f"\nspans received: {over.get('spans_received')}; prediction log rows written: "
          f"{over.get('log_rows')}")  # fmt: skip
    shadow = [r.get("shadow") for r in result["rows"] if r.get("shadow")]
    total: dict[str, int] = {}
    for s in shadow:
        for k, v in s.items():
            total[k] = total.get(k, 0) + v
    print(f"shadow calls over the shadow cells: {total or '-'}")
    for note in result.get("notes", []):
        print(note)
    print(f"\nload average {result['load_start']} at the start, {result['load_end']} at the end; "
          f"finished in {result['seconds']} s")  # fmt: skip
