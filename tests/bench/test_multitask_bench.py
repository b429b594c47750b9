"""bench.multitask run as a program on a tiny synthetic log: its tables and its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.multitask.__main__ import parse
from bench.multitask.sequences import seq_model

ROOT = Path(__file__).resolve().parents[2]


def test_sequences_section_prints_its_table_and_writes_json(tmp_path):
    out = tmp_path / "result.json"
    cmd = [
        sys.executable, "-m", "bench.multitask", "--sections", "sequences",
        "--datasets", "synthetic", "--poolings", "mean,none", "--seeds", "1",
        "--rows", "2000", "--epochs", "1", "--latency-calls", "5",
        "--work", str(tmp_path / "work"), "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== sequences: synthetic (test rows " in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| mean |")]
    assert len(rows) == 1 and rows[0].count("|") == 9
    result = json.loads(out.read_text())
    seq = result["sequences"]["synthetic"]
    assert sorted(seq["methods"]) == ["mean", "none"]
    assert 200 < seq["test_rows"] < 512 and 0 < seq["positives"] < seq["test_rows"]
    none = seq["methods"]["none"]
    assert len(none["auc"]) == 1 and 0.0 <= none["auc"][0] <= 1.0
    assert none["vs_mean_auc"]["verdicts"][0] in {"better", "worse", "no significant difference"}
    assert seq["methods"]["mean"]["latency_ratio"] == 1.0
    assert none["latency_per_candidate_us"] > 0 and none["examples_per_second"] > 0
    assert seq["latency_batch_rows"] == seq["test_rows"]  # all of them: fewer than 512


def test_unknown_section_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["--sections", "sequences,nope"])
    assert exit_.value.code == 2
    assert "--sections: unknown ['nope']" in capsys.readouterr().err


def test_din_paper_is_din_on_the_raw_vectors():
    args = SimpleNamespace(embedding_dim=8, din_hidden=[32])
    paper = seq_model("din_paper", args)
    assert paper["sequence_pooling"] == "din"
    assert paper["sequence_options"] == {"normalize": False, "hidden": [32]}
    assert seq_model("din", args)["sequence_options"] == {"hidden": [32]}
    assert "sequence_options" not in seq_model("mean", args)
