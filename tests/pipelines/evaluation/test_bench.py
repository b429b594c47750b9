"""bench/ab at toy size: every part runs and writes its JSON and reports (the figures come from
the full-size run, docs/ab.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_runs_at_toy_size(tmp_path):
    cmd = [
        sys.executable, "-m", "bench.ab", "--out", str(tmp_path), "--rows", "3000",
        "--resamples", "20", "--aa-seeds", "3", "--no-obd",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[speed, no bootstrap] 3,000 rows" in proc.stdout
    assert "ratio" in proc.stdout and "textbook loop" in proc.stdout
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["speed_bootstrap"]["resamples"] == 20
    assert res["aa"]["seeds"] == 3
    assert (tmp_path / "synthetic" / "point" / "ab.html").exists()
    assert (tmp_path / "synthetic" / "bootstrap" / "ab.html").exists()
