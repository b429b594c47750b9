"""bench.serving.front_door end to end with tiny settings: every section's cells answered OK
and results.json has the tables' structure (no timing assertions)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORMS = {"grpc", "rank", "v2-json", "v2-binary", "tfs"}


@pytest.mark.skipif(shutil.which("h2load") is None, reason="needs h2load (nghttp2-client)")
def test_quick_run_answers_every_cell(tmp_path):
    cmd = [
        sys.executable, "-m", "bench.serving.front_door", "--quick", "--no-triton",
        "--model", "linear", "--sizes", "1", "--seconds", "0.3", "--warmup", "0.1",
        "--concurrency", "4", "--slow-matmuls", "4", "--rate", "50",
        "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = result["rows"]
    cells = {(r["section"], r["server"], r["protocol"], r["driver"]) for r in rows}
    assert {("protocols", "stitchrec", f, d) for f in FORMS for d in ("h2load", "loadgen")} <= cells
    servers = {r["server"] for r in rows if r["section"] in ("overheads", "shadow")}
    assert servers == {
        "base", "log-10%", "trace-1.0", "trace-1.0-call", "trace-0.1", "no-shadow", "shadow"
    }  # fmt: skip
    for r in rows:
        ok = r["requests"] if r["driver"] == "loadgen" else r["answers"].get("OK", 0)
        assert ok > 0 and r["failures"] == 0, r
        assert r["load"] and r["candidates"] == 1
    ratios = result["aggregated"]["ratios"]
    assert {r["what"] for r in ratios["protocols"]} == FORMS - {"grpc"}
    assert set(ratios["overheads"]) == {"log-10%", "trace-1.0", "trace-1.0-call", "trace-0.1"}
    assert ratios["overheads"]["trace-1.0"]["p99_ratio"]["values"]
    assert set(ratios["shadow"]) == {"shadow"}
    assert result["extra"]["spans_received"]["spans"] > 0
    assert result["extra"]["paired_rate"] == 50.0  # the overheads' and shadow's open loop
    shadow = [r["shadow"] for r in rows if r["server"] == "shadow"]
    assert shadow and sum(s.get("scored", 0) for s in shadow) > 0
    versions = {v for r in rows if r["section"] == "shadow" for v in r["versions"]}
    assert versions == {"2"}  # the primary answers; the shadow's answers are never returned
    assert result["notes"] == ["triton: skipped (--no-triton)"]
    assert "| paired against | variant |" in p.stdout
