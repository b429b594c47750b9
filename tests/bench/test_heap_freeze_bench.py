"""bench.serving.heap_freeze with tiny settings on the linear model: both servers answered and
their ratio is written (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_pairs_frozen_and_unfrozen_servers(tmp_path):
    out = tmp_path / "result.json"
    cmd = [
        sys.executable, "-m", "bench.serving.heap_freeze", "--model", "linear",
        "--cache", str(tmp_path / "cache"), "--repeats", "1", "--seconds", "0.5",
        "--warmup", "0.2", "--candidates", "3", "--trace-rates", "0", "--json", str(out),
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(out.read_text())
    assert sorted(r["variant"] for r in result["rows"]) == ["frozen", "unfrozen"]
    assert all(r["requests"] > 0 for r in result["rows"])
    (cell,) = result["ratios"]["0.0"]
    assert cell["rps"] > 0 and cell["p99"] > 0
    assert "| trace rate | req/s frozen / unfrozen" in p.stdout
