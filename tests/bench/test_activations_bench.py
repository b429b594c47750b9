"""bench.compiler.activations with tiny settings: every variant's memory figures are read from
the CPU allocator's counters and its gradients equal back-propagation's (no timing
assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_measures_every_variant(tmp_path):
    cmd = [
        sys.executable, "-m", "bench.compiler.activations", "--out", str(tmp_path),
        "--rows", "2000", "--batches", "128", "--steps", "1", "--rounds", "1",
        "--processes", "1", "--mlp", "32", "16",
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (proc,) = json.loads((tmp_path / "results.json").read_text())["processes"]
    cell = proc["128"]
    for variant in ("backprop", "forward_ad", "recompute"):
        assert cell[variant]["held_bytes"] > 0 and cell[variant]["peak_bytes"] > 0
        assert cell["grad_max_abs_diff"][variant] < 1e-5
    assert "| 128 | forward_ad |" in (tmp_path / "summary.md").read_text()
