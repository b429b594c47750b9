"""bench.continuous's command line: its usage errors (the bench itself trains dozens of runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_unknown_dataset_and_too_few_days_are_usage_errors():
    for flags, message in (
        (["--datasets", "synthetic,nope"], "--datasets: unknown ['nope']"),
        (["--days", "2"], "--days 2: expected at least 3"),
    ):
        cmd = [sys.executable, "-m", "bench.continuous", *flags]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert message in proc.stderr
