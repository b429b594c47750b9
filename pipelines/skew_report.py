"""Console summary and a self-contained HTML page (inline CSS and SVG, no scripts, no network;
the style of the A/B report, ``pipelines.evaluation.report``) of a skew report (the dict
``pipelines.skew.run_skew`` returns and writes to ``skew.json``). Flagged fields come first,
then those to watch, then the rest."""

from __future__ import annotations

import html as _html
from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.evaluation import svg
from pipelines.evaluation.report import _CSS, _fmt

COLORS = {"train": "#1f77b4", "served": "#d62728", "reference": "#1f77b4"}
STATUS_CLASS = {"flagged": "worse", "watch": "flag", "ok": ""}


def _oov(d: Mapping[str, Any]) -> str:
    if "oov_rate_train" not in d:
        return ""
    return f"{d['oov_rate_train']:.3f} -> {d['oov_rate_served']:.3f}"


def _shift(d: Mapping[str, Any]) -> str:
    v = d.get("mean_shift_std")
    return "" if v is None else f"{v:+.2f}"


def console(result: Mapping[str, Any]) -> str:
    """A plain-text summary: one line per field (flagged first), the score, the field lists."""
    versions = ", ".join(str(v) for v in result["versions"])
    lines = [
        f"skew of run {result['run']} against {result['rows']:,} served rows of model "
        f"{result['model']!r} (versions {versions}; "
        f"{'shadow rows included' if result['include_shadow'] else 'shadow rows left out'})",
        f"thresholds: PSI > {result['thresholds']['psi']:g} flagged, > "
        f"{result['thresholds']['watch_psi']:g} watch; OOV rate growth > "
        f"{result['thresholds']['oov']:g} flagged",
        "",
        f"{'field':20s} {'kind':17s} {'status':8s} {'PSI':>8s} {'JS':>7s} "
        f"{'OOV train -> served':>20s} {'mean shift (std)':>17s}",
    ]
    for name, d in result["fields"].items():
        line = (
            f"{name[:20]:20s} {d['kind']:17s} {d['status']:8s} {d['psi']:8.4f} {d['js']:7.4f} "
            f"{_oov(d):>20s} {_shift(d):>17s}"
        )
        lines.append(line.rstrip())
    for name, why in result["skipped"].items():
        lines.append(f"{name[:20]:20s} skipped: {why}")
    if result["missing_fields"]:
        lines.append(f"model inputs not in the logs: {', '.join(result['missing_fields'])}")
    if result["extra_columns"]:
        lines.append(f"logged features not in the schema: {', '.join(result['extra_columns'])}")
    lines.append("")
    lines.append(_score_line(result.get("score")))
    flagged = result["flagged"]
    lines.append(f"flagged: {', '.join(flagged) if flagged else 'none'}")
    return "\n".join(lines)


def _score_line(s: Mapping[str, Any] | None) -> str:
    if s is None:
        return "score: the logs have no score output"
    if "psi" not in s:
        return (
            f"score ({s['output']}): mean {_fmt(s['mean_served'])} over {s['rows_served']:,} rows; "
            "no reference logs (--reference LOGS) to compare with"
        )
    return (
        f"score ({s['output']}): {s['status']}  PSI {s['psi']:.4f}  JS {s['js']:.4f}  mean "
        f"{_fmt(s['mean_reference'])} -> {_fmt(s['mean_served'])} ({s['mean_shift']:+.4f}) "
        f"against {s['rows_reference']:,} reference rows"
    )


def bars(
    labels: Sequence[str], series: Mapping[str, Sequence[float]], title: str, width: int = 420
) -> str:
    """Side-by-side bars of the proportions of each series per bin (``labels``), as SVG."""
    n = max(len(labels), 1)
    hi = max((v for vs in series.values() for v in vs), default=1.0) or 1.0
    f = svg.Frame(width, 170, 44, (-0.5, n - 0.5), (0.0, hi * 1.1))
    f.axes(title, "bins (hover a bar: its bin and share)", "share", xticks=False)
    w = (f.px(1) - f.px(0)) * 0.8 / max(len(series), 1)
    for j, (name, vs) in enumerate(series.items()):
        color = COLORS.get(name, svg.PALETTE[j % len(svg.PALETTE)])
        for i, v in enumerate(vs):
            x = f.px(i) + (j - len(series) / 2) * w
            y = f.py(v)
            f.add(
                f"<rect x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' height='{f.py(0) - y:.1f}' "
                f"fill='{color}'><title>{_e(labels[i])}: {name} {v:.4f}</title></rect>"
            )
    for j, name in enumerate(series):  # the legend in the top margin, right of the title
        x, color = width - 16 - 70 * (len(series) - j), COLORS.get(name, svg.PALETTE[j])
        f.add(f"<rect x='{x}' y='8' width='9' height='9' fill='{color}'/>")
        f.add(f"<text x='{x + 12}' y='16' {svg.FONT}>{_e(name)}</text>")
    return f.text()


def _e(x: Any) -> str:
    return _html.escape(str(x))


def _field_row(name: str, d: Mapping[str, Any]) -> str:
    cls = STATUS_CLASS[d["status"]]
    chart = bars(d["bins"], {"train": d["train"], "served": d["served"]}, name)
    return (
        f"<tr><td>{_e(name)}</td><td>{_e(d['kind'])}</td><td class='{cls}'>{_e(d['status'])}"
        f"</td><td class=num>{d['psi']:.4f}</td><td class=num>{d['js']:.4f}</td>"
        f"<td class=num>{_e(_oov(d))}</td><td class=num>{_e(_shift(d))}</td>"
        f"<td class=flag>{_e('; '.join(d['reasons']))}</td><td>{chart}</td></tr>"
    )


def _score_html(s: Mapping[str, Any] | None) -> list[str]:
    parts = ["<h2>Score</h2>", f"<p>{_e(_score_line(s))}</p>"]
    if s is not None:
        series = (
            {"reference": s["reference"], "served": s["served"]}
            if "psi" in s
            else {"served": s["served"]}
        )
        parts.append(bars(s["bins"], series, f"output {s['output']}", width=560))
    return parts


def html(result: Mapping[str, Any]) -> str:
    """The report as one HTML document (inline CSS and SVG; opens from disk, no scripts)."""
    th = result["thresholds"]
    flagged = result["flagged"]
    kind = "b-worse" if flagged else "b-better"
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>StitchRec skew report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Training/serving skew</h1>",
        f"<p>run: <code>{_e(result['run'])}</code> ({result['training_rows']:,} training rows)"
        f"<br>served: <code>{_e(', '.join(result['data']))}</code> ({result['rows']:,} rows of "
        f"model <code>{_e(result['model'])}</code>, versions "
        f"{_e(', '.join(str(v) for v in result['versions']))})</p>",
        f"<div class='banner {kind}'>Flagged: <b>{_e(', '.join(flagged) or 'none')}</b>"
        + (f"; watch: {_e(', '.join(result['watch']))}" if result["watch"] else "")
        + "</div>",
        f"<p class=small>Flagged: PSI &gt; {th['psi']:g} or OOV rate growth &gt; {th['oov']:g}; "
        f"watch: PSI &gt; {th['watch_psi']:g}. PSI = &Sigma; (s - t) ln(s / t) with empty bins "
        f"raised to {result['epsilon']:g}; JS: Jensen-Shannon divergence in bits.</p>",
        "<h2>Fields</h2>",
        "<table><tr><th>field</th><th>kind</th><th>status</th><th>PSI</th><th>JS</th>"
        "<th>OOV train -&gt; served</th><th>mean shift (std)</th><th>reasons</th>"
        "<th>train vs served</th></tr>",
    ]
    parts += [_field_row(n, d) for n, d in result["fields"].items()]
    parts.append("</table>")
    for name, why in result["skipped"].items():
        parts.append(f"<p class=small>{_e(name)} skipped: {_e(why)}</p>")
    if result["missing_fields"]:
        parts.append(
            f"<p class=flag>Model inputs not in the logs: {_e(', '.join(result['missing_fields']))}"
            "</p>"
        )
    if result["extra_columns"]:
        parts.append(
            "<p class=small>Logged features not in the schema: "
            f"{_e(', '.join(result['extra_columns']))}</p>"
        )
    parts += _score_html(result.get("score"))
    parts.append("</body></html>")
    return "\n".join(parts)
