"""bench.startup run as a program with one round: its table and JSON (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.startup import parse, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_one_round_prints_a_row_per_command_and_writes_json(tmp_path):
    out = tmp_path / "startup.json"
    cmd = [sys.executable, "-m", "bench.startup", "--rounds", "1", "--commands", "data,skew",
           "--json", str(out)]  # fmt: skip
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| command", "| baseline", "| data", "| skew"]
    summary = json.loads(out.read_text())["summary"]
    assert summary["baseline"]["ratio_to_baseline"] == 1.0
    assert "tensorflow" in summary["baseline"]["loaded"]
    assert "tensorflow" not in summary["data"]["loaded"] and summary["data"]["median_s"] > 0


def test_summary_takes_medians_and_per_round_ratios():
    rounds = [
        {
            "baseline": {"seconds": 2.0, "loaded": ["tensorflow"]},
            "train": {"seconds": 3.0, "loaded": []},
        },
        {
            "baseline": {"seconds": 4.0, "loaded": ["tensorflow"]},
            "train": {"seconds": 4.0, "loaded": []},
        },
        {
            "baseline": {"seconds": 3.0, "loaded": ["tensorflow"]},
            "train": {"seconds": 6.0, "loaded": []},
        },
    ]
    s = summarize(rounds)
    assert s["train"]["median_s"] == 4.0 and (s["train"]["min_s"], s["train"]["max_s"]) == (
        3.0,
        6.0,
    )
    assert s["train"]["ratio_to_baseline"] == 1.5  # median of 1.5, 1.0, 2.0
    assert s["baseline"]["ratio_to_baseline"] == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--commands", "train,nope"], "--commands: unknown ['nope']"),
        (["--rounds", "0"], "--rounds must be >= 1"),
    ],
)
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
