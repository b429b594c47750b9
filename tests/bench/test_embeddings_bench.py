"""bench/embeddings run as a program: its plan of runs (``--plan-only``) and its plot
(``--plot-only``, from a results.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> str:
    cmd = [sys.executable, "-m", "bench.embeddings", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_plan_sweeps_every_method_and_ratio(tmp_path):
    out = _bench(
        "--plan-only", "--ratios", "2", "10", "--amtl-penalties", "0", "0.02",
        "--out", str(tmp_path),
    )  # fmt: skip
    runs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    tags = [(r["method"], r["ratio"]) for r in runs]
    assert tags == [
        ("full", "1"),
        ("amtl", "learned"),
        ("amtl", "pen0.02"),
        ("hashing", "2"),
        ("hashing", "10"),
        ("qr", "2"),
        ("qr", "10"),
        ("bh", "2"),
        ("bh", "10"),
    ]
    configs = {(r["method"], r["ratio"]): r for r in runs}
    assert configs[("bh", "10")]["embedding_compression"] == 10.0
    assert configs[("amtl", "pen0.02")]["embedding_options"] == {"amtl": {"length_penalty": 0.02}}
    assert not (tmp_path / "movielens").exists()  # nothing trained, nothing written


def test_plot_writes_a_png(tmp_path):
    rows = [
        {"method": "full", "serve_bytes": 1e6, "auc_mean": 0.79, "auc_std": 0.001},
        {"method": "bh", "serve_bytes": 1e4, "auc_mean": 0.78, "auc_std": 0.002},
        {"method": "bh", "serve_bytes": 1e5, "auc_mean": 0.785, "auc_std": 0.001},
    ]
    (tmp_path / "movielens").mkdir()
    (tmp_path / "movielens" / "results.json").write_text(json.dumps(rows))
    out = _bench("--plot-only", "--out", str(tmp_path))
    png = tmp_path / "movielens" / "auc_vs_serving_bytes_movielens.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in out
