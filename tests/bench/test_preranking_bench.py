"""bench.preranking: its synthetic dataset's test split is the generated test rows, and a quick
run trains, selects and scores every model (no quality assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.preranking.__main__ import parser
from bench.preranking.datasets import synthetic_config
from pipelines.run.data import prepare_data
from pipelines.run.paths import RunPaths

ROOT = Path(__file__).resolve().parents[2]


def test_the_synthetic_run_keeps_its_generated_test_rows(tmp_path):
    args = parser().parse_args(["--dataset", "synthetic", "--rows", "2000"])
    cfg = synthetic_config(tmp_path, args)
    paths = RunPaths(tmp_path)
    _, train, _, test = prepare_data(cfg, paths, lambda _line: None)
    assert train and test  # the test folder was emptied when the two were the same folder
    assert not any(str(f).startswith(str(paths.data)) for f in test)


def test_quick_run_scores_every_model_and_reuses_the_first_seeds_choices(tmp_path):
    cmd = [
        sys.executable, "-m", "bench.preranking", "--dataset", "synthetic", "--rows", "3000",
        "--seeds", "0", "1", "--epochs", "1", "--budgets", "fields:2", "--requests", "4",
        "--repeats", "1", "--max-steps", "3", "--finetune-init", "best", "--out", str(tmp_path),
    ]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    first, second = json.loads((tmp_path / "results.json").read_text())["datasets"]["synthetic"][
        "runs"
    ]
    for run in (first, second):
        assert set(run["models"]) == {"rank", "two_tower", "fscd[fields:2]"}
        for label, entry in run["models"].items():
            assert 0 < entry["auc"] < 1 and entry["logloss"] > 0
            if label != "rank":  # the pre-rankers' recall of the ranking model's top 10
                assert 0 <= entry["recall_10_in_50"] <= 1
    # stage 3 tried three (init, lr) options on the first seed; the second reuses its choice
    fine = [run["training"]["fscd[fields:2]"] for run in (first, second)]
    assert fine[0]["init"] in ("stage1", "scratch")
    assert (fine[1]["init"], fine[1]["lr"]) == (fine[0]["init"], fine[0]["lr"])
    assert "cost" in first and "cost" not in second
