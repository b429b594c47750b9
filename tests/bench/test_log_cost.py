"""bench.serving.log_cost with few calls: both conversions made equal tables, and the JSON line
has their CPU per call (no timing assertions)."""

from __future__ import annotations

import json

from bench.serving.log_cost import main


def test_quick_run_compares_the_two_conversions(capsys):
    assert main(["--calls", "20", "--sizes", "1,5"]) == 0
    out = json.loads(capsys.readouterr().out)
    for rows in (1, 5):
        cell = out[f"rows_{rows}"]
        assert cell["table_rows"] == 20 * rows
        assert cell["together_us"] > 0 and cell["one_at_a_time_us"] > 0
