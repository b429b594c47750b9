"""Console summary and a self-contained HTML report (inline SVG plots; no scripts, no network)
of an A/B comparison result (the dict ``compare.run_ab`` returns and writes to ``ab.json``)."""

from __future__ import annotations

import html as _html
import io
from collections.abc import Mapping
from typing import Any

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
    lines = [
        f"control:   {result.get('control', {}).get('source', 'control')}",
        f"treatment: {result.get('treatment', {}).get('source', 'treatment')}",
        f"rows: {result['rows']:,}  clicks: {result['positives']:,}  bootstrap: "
        f"{result['settings']['resamples']} paired resamples (seed {result['settings']['seed']}, "
        f"unit {result['settings']['unit']})",
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
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# plots (matplotlib, Agg, inline SVG)


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def calibration_plot(result: Mapping[str, Any]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    hi = 0.0
    for m in ("control", "treatment"):
        pts = result["overall"]["reliability"][m]
        xs = [p["mean_score"] for p in pts]
        ys = [p["mean_label"] for p in pts]
        hi = max(hi, *xs, *ys)
        ax.plot(xs, ys, "o-", color=COLORS[m], label=m)
    ax.plot([0, hi], [0, hi], "--", color="grey", lw=1, label="perfect calibration")
    ax.set_xlabel("mean predicted click probability (equal-count bins)")
    ax.set_ylabel("observed click rate")
    ax.set_title("Reliability curves")
    ax.legend()
    return _svg(fig)


def delta_plot(result: Mapping[str, Any]) -> str | None:
    m = result["overall"]["metrics"]
    names = [n for n in _metric_order(list(m)) if m[n].get("ci_low") is not None]
    if not names:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(names), 1, figsize=(6.5, 0.62 * len(names) + 0.6), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        d = m[name]
        color = {"better": "#2ca02c", "worse": "#d62728"}.get(d["verdict"], "#555555")
        ax.errorbar(
            [d["delta"]],
            [0],
            xerr=[[d["delta"] - d["ci_low"]], [d["ci_high"] - d["delta"]]],
            fmt="o",
            color=color,
            capsize=4,
        )
        ax.axvline(0, color="grey", lw=1)
        ax.set_yticks([0])
        ax.set_yticklabels([name])
        span = max(abs(d["ci_low"]), abs(d["ci_high"]), 1e-12) * 1.3
        ax.set_xlim(-span, span)
        ax.tick_params(axis="x", labelsize=7)
    axes[0, 0].set_title("treatment - control, with 95% paired-bootstrap intervals")
    fig.tight_layout()
    return _svg(fig)


def slice_plot(fname: str, s: Mapping[str, Any], metric: str = "auc") -> str | None:
    plt = _plt()
    rows = [e for e in s["slices"] if e["metrics"].get(metric, {}).get("ci_low") is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(rows) + 1.2))
    for i, e in enumerate(rows):
        d = e["metrics"][metric]
        color = "#999999" if e["flags"] else "#1f77b4"
        ax.errorbar(
            [d["delta"]],
            [i],
            xerr=[[d["delta"] - d["ci_low"]], [d["ci_high"] - d["delta"]]],
            fmt="o",
            color=color,
            capsize=3,
        )
    ax.axvline(0, color="grey", lw=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([(e["value"][:28] + (" (!)" if e["flags"] else "")) for e in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"{metric} delta (treatment - control); grey (!): flagged slice")
    ax.set_title(f"{metric} delta per slice of {fname}")
    fig.tight_layout()
    return _svg(fig)


def offpolicy_plot(op: Mapping[str, Any]) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ests = ["ips", "snips", "dm", "dr"]
    names = list(op["policies"])
    width = 0.8 / max(len(ests), 1)
    for j, est in enumerate(ests):
        xs, ys, lo, hi = [], [], [], []
        for i, name in enumerate(names):
            v = op["policies"][name]["estimates"][est]
            if v["value"] is None or v["ci"][0] is None:
                continue
            xs.append(i + (j - 1.5) * width)
            ys.append(v["value"])
            lo.append(v["value"] - v["ci"][0])
            hi.append(v["ci"][1] - v["value"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=est.upper())
    ctr = op["logged"]["observed_ctr"]
    ax.axhline(ctr, color="grey", ls="--", lw=1, label="logged CTR")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("estimated click rate")
    ax.set_title("Off-policy estimates of each policy's click rate (95% CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _svg(fig)


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
        f"<p class=small>{st['resamples']} paired bootstrap resamples (seed {st['seed']}, "
        f"resampling unit: {st['unit']}); percentile intervals; two-sided bootstrap p-values.</p>"
    )
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
    op = result.get("off_policy")
    if op:
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
    parts.append("</body></html>")
    return "\n".join(parts)
