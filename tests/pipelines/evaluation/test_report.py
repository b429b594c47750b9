"""The HTML report's charts are SVG written directly: the report is complete with matplotlib
unimportable, and every chart is well-formed SVG."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from pipelines.evaluation import compare, report, svg

ROOT = Path(__file__).resolve().parents[3]


def _result(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = 2000
    g = rng.integers(0, 80, n)
    z = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z - 1.5)))).astype(float)
    a = 1 / (1 + np.exp(-(z + rng.normal(size=n) - 1.5)))
    b = 1 / (1 + np.exp(-(z + 0.5 * rng.normal(size=n) - 1.5)))
    r = compare.compare_scores(y, a, b, groups=g, slices={"g": g % 4}, resamples=50)
    r["verdict"] = compare.verdict(r, "auc")
    return compare.clean_json(r)


def _svgs(page: str) -> list[str]:
    out, start = [], page.find("<svg")
    while start >= 0:
        end = page.index("</svg>", start) + len("</svg>")
        out.append(page[start:end])
        start = page.find("<svg", end)
    return out


def test_report_is_written_with_its_charts_when_matplotlib_is_unimportable(tmp_path):
    page = tmp_path / "ab.html"
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["matplotlib"] = None  # any `import matplotlib` now raises ImportError
        from pathlib import Path
        from tests.pipelines.evaluation.test_report import _result
        from pipelines.evaluation import report
        Path({str(page)!r}).write_text(report.html(_result()))
        assert not any(m.startswith("matplotlib.") for m in sys.modules), "matplotlib loaded"
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = page.read_text()
    charts = _svgs(text)
    assert len(charts) == 3  # metric deltas, reliability curves, slices of g
    assert "Reliability curves" in text and "AUC delta" in text


def test_every_chart_is_well_formed_svg():
    r = _result(1)
    charts = _svgs(report.html(r))
    assert len(charts) == 3
    for c in charts:
        root = ET.fromstring(c)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    op = {
        "policies": {
            "uniform": {"estimates": {e: {"value": 0.1, "ci": [0.08, 0.12]} for e in
                                      ("ips", "snips", "dm", "dr")}},
            "treatment": {"estimates": {e: {"value": 0.12, "ci": [None, None]} for e in
                                        ("ips", "snips", "dm", "dr")}},
        },
        "logged": {"observed_ctr": 0.09},
    }  # fmt: skip
    root = ET.fromstring(report.offpolicy_plot(op))
    assert root.tag.endswith("svg")
    circles = root.findall(".//{http://www.w3.org/2000/svg}circle")
    assert len(circles) == 4 + 5  # 4 estimates of one policy drawn + 5 legend entries


def test_nice_ticks():
    assert svg.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(-0.013, 0.013) == [-0.01, -0.005, 0, 0.005, 0.01]
    assert svg.nice_ticks(0.5, 0.5) == [0.5]


def test_chart_labels_are_escaped():
    text = svg.interval_rows([("<a&b>", (0.1, 0.0, 0.2), "#000")], "t", "x")
    assert "&lt;a&amp;b&gt;" in text and "<a&b>" not in text
    ET.fromstring(text)
