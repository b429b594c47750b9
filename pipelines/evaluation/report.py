"""Console summary and a self-contained HTML report (inline SVG plots written by
``pipelines.evaluation.svg``, no plotting library; no scripts, no network) of an A/B comparison
result (the dict ``ab_run.run_ab`` returns and writes to ``ab.json``)."""

from __future__ import annotations

import html as _html
from collections.abc import Mapping
from typing import Any

from pipelines.evaluation import svg

ORDER = ("auc", "gauc", "logloss", "ece", "calibration_ratio", "mean_score")
COLORS = {"control": "#1f77b4", "treatment": "#d62728"}


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"
    return str(x)


def _metric_order(names: list[str]) -> list[str]:
    first = [m for m in ORDER if m in names]

    def key(m: str) -> tuple[str, int]:
        head, _, k = m.partition("@")
        return head, int(k) if k.isdigit() else 0

    return first + sorted((m for m in names if m not in first), key=key)


def _ci(d: Mapping[str, Any]) -> str:
    if d.get("ci_low") is None:
        return "–"
    return f"[{_fmt(d['ci_low'])}, {_fmt(d['ci_high'])}]"


def console(result: Mapping[str, Any]) -> str:
    """A plain-text summary ending with the verdict on the primary metric."""
    pairing = result["settings"].get("pairing", "paired")
    lines = [
        f"control:   {result.get('control', {}).get('source', 'control')}",
        f"treatment: {result.get('treatment', {}).get('source', 'treatment')}",
        f"rows: {result['rows']:,}  clicks: {result['positives']:,}  bootstrap: "
        f"{result['settings']['resamples']} {pairing} resamples (seed {result['settings']['seed']}, "
        f"unit {result['settings']['unit']})",
    ]
    dropped = result.get("data", {}).get("rows_without_outcome")
    if dropped is not None:
        lines.append(f"prediction log: {dropped:,} logged rows without an outcome dropped")
    if result.get("comparison", {}).get("note"):
        lines.append("note: " + result["comparison"]["note"])
    lines += [
        "",
        f"{'metric':18s} {'control':>10s} {'treatment':>10s} {'delta':>10s} "
        f"{'95% CI of delta':>24s} {'p':>7s}  verdict",
    ]
    m = result["overall"]["metrics"]
    for name in _metric_order(list(m)):
        d = m[name]
        lines.append(
            f"{name:18s} {_fmt(d['control']):>10s} {_fmt(d['treatment']):>10s} "
            f"{_fmt(d['delta']):>10s} {_ci(d):>24s} {_fmt(d['p_value'], 3):>7s}  {d['verdict']}"
        )
    for fname, s in result.get("slices", {}).items():
        lines.append("")
        lines.append(f"slices of {fname} ({s['how']}; {s['flagged']} flagged): AUC delta")
        for e in s["slices"]:
            d = e["metrics"].get("auc", {})
            flag = ("  ! " + "; ".join(e["flags"])) if e["flags"] else ""
            lines.append(
                f"  {e['value'][:30]:30s} rows {e['rows']:>9,}  delta {_fmt(d.get('delta')):>9s} "
                f"{_ci(d) if d else '':>24s}  {d.get('verdict', '')}{flag}"
            )
    op = result.get("off_policy")
    if op:
        lines.append("")
        lines.append(
            f"off-policy (action {op['action']}, {op['candidates']} candidates; logged CTR "
            f"{_fmt(op['logged']['observed_ctr'])} [{_fmt(op['logged']['ci'][0])}, "
            f"{_fmt(op['logged']['ci'][1])}])"
        )
        for name, p in op["policies"].items():
            ests = "  ".join(
                f"{e.upper()} {_fmt(v['value'])} [{_fmt(v['ci'][0])}, {_fmt(v['ci'][1])}]"
                for e, v in p["estimates"].items()
            )
            lines.append(f"  {name:10s} {ests}")
        for name, reason in op.get("skipped", {}).items():
            lines.append(f"  {name:10s} skipped: {reason}")
        if "difference" in op:
            d = op["difference"]["dr"]
            lines.append(
                f"  DR treatment - control: {_fmt(d['delta'])} {_ci(d)} p={_fmt(d['p_value'], 3)}"
                f"  {d['verdict']}"
            )
    v = result.get("verdict")
    if v:
        lines.append("")
        lines.append(
            f"VERDICT ({v['primary_metric']}, 95%): treatment is {v['verdict'].upper()} "
            f"(delta {_fmt(v['delta'])}, CI {_ci(v)}, p {_fmt(v['p_value'], 3)})"
            if v["verdict"] in ("better", "worse")
            else f"VERDICT ({v['primary_metric']}, 95%): {v['verdict'].upper()} "
            f"(delta {_fmt(v['delta'])}, CI {_ci(v)}, p {_fmt(v['p_value'], 3)})"
        )
    lines += _task_lines(result)
    return "\n".join(lines)


def _task_lines(result: Mapping[str, Any]) -> list[str]:
    """One verdict line per task of a multi-task comparison (the tables above are the first
    task's)."""
    tasks = result.get("tasks")
    if not tasks:
        return []
    lines = ["", f"tasks (the tables above: {result.get('task')}):"]
    for name, t in tasks.items():
        v = t["verdict"]
        lines.append(
            f"  {name:12s} label {t['label']:12s} rows {t['rows']:>9,}  positives "
            f"{t['positives']:>8,}  {v['primary_metric']} delta {_fmt(v['delta'])} CI {_ci(v)}"
            f"  {v['verdict']}"
        )
    return lines


# --------------------------------------------------------------------------------------------
# plots (inline SVG, written by pipelines.evaluation.svg)


def calibration_plot(result: Mapping[str, Any]) -> str:
    series = {}
    for m in ("control", "treatment"):
        pts = result["overall"]["reliability"][m]
        xs = [p["mean_score"] for p in pts]
        ys = [p["mean_label"] for p in pts]
        series[m] = (xs, ys, COLORS[m])
    return svg.line_chart(
        series,
        "Reliability curves",
        "mean predicted click probability (equal-count bins)",
        "observed click rate",
        diagonal=True,
    )


def _verdict_color(d: Mapping[str, Any]) -> str:
    return {"better": "#2ca02c", "worse": "#d62728"}.get(d["verdict"], "#555555")


def delta_plot(result: Mapping[str, Any]) -> str | None:
    m = result["overall"]["metrics"]
    names = [n for n in _metric_order(list(m)) if m[n].get("ci_low") is not None]
    if not names:
        return None
    rows = [
        (n, (m[n]["delta"], m[n]["ci_low"], m[n]["ci_high"]), _verdict_color(m[n])) for n in names
    ]
    return svg.interval_rows(
        rows, "treatment - control, with 95% paired-bootstrap intervals", "delta", 130
    )


def slice_plot(fname: str, s: Mapping[str, Any], metric: str = "auc") -> str | None:
    rows = []
    for e in s["slices"]:
        d = e["metrics"].get(metric, {})
        if d.get("ci_low") is None:
            continue
        label = e["value"][:28] + (" (!)" if e["flags"] else "")
        color = "#999999" if e["flags"] else "#1f77b4"
        rows.append((label, (d["delta"], d["ci_low"], d["ci_high"]), color))
    if not rows:
        return None
    return svg.interval_rows(
        rows,
        f"{metric} delta per slice of {fname}",
        f"{metric} delta (treatment - control); grey (!): flagged slice",
        200,
    )


def offpolicy_plot(op: Mapping[str, Any]) -> str:
    names = list(op["policies"])
    series: dict[str, list[tuple[float, float, float] | None]] = {}
    for est in ("ips", "snips", "dm", "dr"):
        series[est.upper()] = []
        for name in names:
            v = op["policies"][name]["estimates"][est]
            ok = v["value"] is not None and v["ci"][0] is not None
            series[est.upper()].append((v["value"], v["ci"][0], v["ci"][1]) if ok else None)
    return svg.interval_groups(
        names,
        series,
        "Off-policy estimates of each policy's click rate (95% CI)",
        "estimated click rate",
        reference=("logged CTR", op["logged"]["observed_ctr"]),
    )


# --------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.better{color:#1a7f1a;font-weight:bold}.worse{color:#c62828;font-weight:bold}
.banner{padding:10px 14px;border-radius:6px;font-size:18px;margin:12px 0}
.b-better{background:#e5f5e5}.b-worse{background:#fde8e8}.b-none{background:#eee}
.flag{color:#a65c00}.small{color:#666;font-size:12px}
"""


def _e(x: Any) -> str:
    return _html.escape(str(x))


def _metric_table(m: Mapping[str, Any]) -> str:
    out = [
        "<table><tr><th>metric</th><th>control</th><th>treatment</th><th>delta</th>"
        "<th>95% CI</th><th>p</th><th>verdict</th></tr>"
    ]
    for name in _metric_order(list(m)):
        d = m[name]
        cls = d["verdict"] if d["verdict"] in ("better", "worse") else ""
        out.append(
            f"<tr><td>{_e(name)}</td><td class=num>{_fmt(d['control'])}</td>"
            f"<td class=num>{_fmt(d['treatment'])}</td><td class=num>{_fmt(d['delta'])}</td>"
            f"<td class=num>{_e(_ci(d))}</td><td class=num>{_fmt(d['p_value'], 3)}</td>"
            f"<td class='{cls}'>{_e(d['verdict'])}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _slice_section(fname: str, s: Mapping[str, Any]) -> list[str]:
    """The HTML of one sliced field: its plot and its table."""
    parts: list[str] = []
    parts.append(f"<h2>Slices of {_e(fname)}</h2>")
    parts.append(f"<p class=small>{_e(s['how'])}; {s['flagged']} slice(s) flagged.</p>")
    svg = slice_plot(fname, s)
    if svg:
        parts.append(svg)
    parts.append(
        "<table><tr><th>slice</th><th>rows</th><th>clicks</th><th>AUC control</th>"
        "<th>AUC treatment</th><th>AUC delta [95% CI]</th><th>logloss delta [95% CI]</th>"
        "<th>verdict (AUC)</th><th>flags</th></tr>"
    )
    for e in s["slices"]:
        a = e["metrics"].get("auc", {})
        ll = e["metrics"].get("logloss", {})
        parts.append(
            f"<tr><td>{_e(e['value'])}</td><td class=num>{e['rows']:,}</td>"
            f"<td class=num>{e['positives']:,}</td><td class=num>{_fmt(a.get('control'))}</td>"
            f"<td class=num>{_fmt(a.get('treatment'))}</td>"
            f"<td class=num>{_fmt(a.get('delta'))} {_e(_ci(a) if a else '')}</td>"
            f"<td class=num>{_fmt(ll.get('delta'))} {_e(_ci(ll) if ll else '')}</td>"
            f"<td>{_e(a.get('verdict', ''))}</td>"
            f"<td class=flag>{_e('; '.join(e['flags']))}</td></tr>"
        )
    parts.append("</table>")
    return parts


def _off_policy_section(op: Mapping[str, Any]) -> list[str]:
    """The HTML of the off-policy estimates: the plot, the table and the difference."""
    parts: list[str] = []
    parts.append("<h2>Off-policy estimates</h2>")
    parts.append(
        f"<p class=small>Action <code>{_e(op['action'])}</code> over {op['candidates']} "
        f"candidates, propensity <code>{_e(op['propensity'])}</code>; policy: "
        f"{_e(op['policy'])}; reward model for DM/DR: {_e(op['reward_model'])}. Logged "
        f"click rate {_fmt(op['logged']['observed_ctr'])} [{_fmt(op['logged']['ci'][0])}, "
        f"{_fmt(op['logged']['ci'][1])}].</p>"
    )
    if op["policies"]:
        parts.append(offpolicy_plot(op))
    parts.append(
        "<table><tr><th>policy</th><th>IPS</th><th>SNIPS</th><th>DM</th><th>DR</th>"
        "<th>effective sample size</th><th>max weight</th></tr>"
    )
    for name, p in op["policies"].items():
        cells = "".join(
            f"<td class=num>{_fmt(v['value'])} [{_fmt(v['ci'][0])}, {_fmt(v['ci'][1])}]</td>"
            for v in p["estimates"].values()
        )
        dg = p["diagnostics"]
        parts.append(
            f"<tr><td>{_e(name)}</td>{cells}<td class=num>"
            f"{_fmt(dg['effective_sample_size'], 1)}</td>"
            f"<td class=num>{_fmt(dg['max_weight'], 1)}</td></tr>"
        )
    parts.append("</table>")
    for name, reason in op.get("skipped", {}).items():
        parts.append(f"<p class=flag>{_e(name)} skipped: {_e(reason)}</p>")
    if "difference" in op:
        parts.append("<h3>Treatment - control policy value</h3>")
        parts.append(_metric_table(op["difference"]))
    return parts


def html(result: Mapping[str, Any]) -> str:
    """The report as one HTML document (inline CSS and SVG; opens from disk, no scripts)."""
    v = result.get("verdict", {})
    kind = {"better": "b-better", "worse": "b-worse"}.get(v.get("verdict"), "b-none")
    st = result["settings"]
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>StitchRec A/B report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Offline A/B report</h1>",
        f"<p>control: <code>{_e(result.get('control', {}).get('source', ''))}</code><br>"
        f"treatment: <code>{_e(result.get('treatment', {}).get('source', ''))}</code><br>"
        f"data: {_e(', '.join(result.get('data', {}).get('files', [])))} "
        f"({result['rows']:,} rows, {result['positives']:,} clicks)</p>",
    ]
    if v:
        parts.append(
            f"<div class='banner {kind}'>Verdict on {_e(v['primary_metric'])} at 95%: "
            f"<b>{_e(v['verdict'])}</b> (delta {_fmt(v['delta'])}, CI {_e(_ci(v))}, "
            f"p {_fmt(v['p_value'], 3)})</div>"
        )
    parts.append(
        f"<p class=small>{st['resamples']} {_e(st.get('pairing', 'paired'))} bootstrap "
        f"resamples (seed {st['seed']}, resampling unit: {st['unit']}); percentile intervals; "
        f"two-sided bootstrap p-values.</p>"
    )
    if result.get("comparison", {}).get("note"):
        parts.append(f"<p><b>Note:</b> {_e(result['comparison']['note'])}</p>")
    parts.append("<h2>Metrics</h2>")
    parts.append(_metric_table(result["overall"]["metrics"]))
    g = result.get("groups")
    if g:
        parts.append(
            f"<p class=small>Grouped metrics over {g['groups']:,} groups of "
            f"<code>{_e(result.get('group_field') or 'the group column')}</code>; scored groups: "
            + ", ".join(f"{_e(k)} {n:,}" for k, n in g["scored_groups"].items())
            + " (GAUC needs both classes in a group, NDCG/recall a click).</p>"
        )
    parts.append("<h2>Metric deltas</h2>")
    svg = delta_plot(result)
    parts.append(svg or "<p class=small>No bootstrap (--bootstrap 0): no intervals to plot.</p>")
    parts.append("<h2>Calibration</h2>")
    parts.append(calibration_plot(result))
    for fname, s in result.get("slices", {}).items():
        parts.extend(_slice_section(fname, s))
    op = result.get("off_policy")
    if op:
        parts.extend(_off_policy_section(op))
    parts.append("</body></html>")
    return "\n".join(parts)
