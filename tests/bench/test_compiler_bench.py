"""bench.compiler and bench.compiler.dynamic with tiny settings: every variant of the inference
pass and of the training step is timed, the fused forms score what plain graph mode scores,
one call's executed ops (or compilations) are counted and the summary tables name every row
(no timing assertions). The generated-op variants are left out (``--no-kernels``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.compiler.dynamic import VARIANTS

ROOT = Path(__file__).resolve().parents[2]
SERVED = {"plain", "xla", "frozen", "clusters", "frozen_xla", "htables", "htables_xla"}
TRAIN = {"plain", "xla", "frozen", "clusters"}


def _timed(row: dict) -> set[str]:
    return {k[:-2] for k in row if k.endswith("_s") and k not in ("times_s", "first_call_s")}


def test_quick_run_times_every_variant_and_scores_like_plain(tmp_path):
    # --no-kernels: the generated-op variants compile about five libraries (about 100 s on a
    # cold cache); the ops themselves are tested in tests/compiler_opt
    cmd = [
        sys.executable, "-m", "bench.compiler", "--out", str(tmp_path), "--rows", "2000",
        "--methods", "full", "--batches", "32", "--modes", "inference", "train",
        "--processes", "1", "--rounds", "1", "--no-kernels",
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (proc,) = json.loads((tmp_path / "results.json").read_text())["processes"]
    served, step = proc["rows"]["full/inference/32"], proc["rows"]["full/train/32"]
    assert _timed(served) == SERVED and _timed(step) == TRAIN
    for row in (served, step):
        assert all(t > 0 for ts in row["times_s"].values() for t in ts)
        assert {f"executed_{n}" for n in _timed(row)} <= set(row)  # first process, largest batch
        assert row["executed_plain"]["tf_ops"] > 0
    diffs = {k: v for k, v in served.items() if k.endswith("max_abs_diff")}
    assert len(diffs) == 4 and max(diffs.values()) < 1e-4, diffs
    assert served["plan"]["groups"] > 0 and served["ir_kernels"] > 0
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("| full | inference | 32 |") == 3  # counts, times, fused tables
    assert "| full | 32 |" in summary  # the training step's clusters table


def test_dynamic_quick_run_serves_every_variant_like_the_frozen_graph(tmp_path):
    cmd = [
        sys.executable, "-m", "bench.compiler.dynamic", "--out", str(tmp_path), "--rows", "2000",
        "--requests", "6", "--max-batch", "16", "--processes", "1",
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (proc,) = json.loads((tmp_path / "results.json").read_text())["processes"]
    assert len(proc["sizes"]) == 6 and all(1 <= n <= 16 for n in proc["sizes"])
    for name in VARIANTS:
        row = proc[name]
        assert len(row["latencies_s"]) == 6 and row["max_abs_diff"] < 1e-4, name
        if "buckets" in name:  # padded to the ladder 8, 16: never fewer rows than asked
            assert 0 <= row["padding_share"] < 1 and row["buckets_used"]
    # graph mode compiles nothing; warmed buckets compile nothing more while serving
    assert proc["frozen"]["compilations"] == 0 and proc["frozen+buckets"]["compilations"] == 0
    assert proc["xla+buckets warm"]["compilations"] == 0
    assert proc["clusters+buckets warm"]["compilations"] == 0
    assert proc["xla"]["compilations"] >= proc["xla+buckets"]["compilations"]
    assert "| clusters+buckets warm |" in (tmp_path / "summary.md").read_text()
