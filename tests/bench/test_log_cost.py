"""bench.serving.log_cost with few calls: the conversions made equal tables, and the JSON line
has their CPU per call, both Parquet writes' CPU and bytes, and the lock waits (no timing
assertions)."""

from __future__ import annotations

import json

from bench.serving.log_cost import main


def test_quick_run_compares_the_two_conversions(capsys):
    assert main(["--calls", "20", "--sizes", "1,5"]) == 0
    out = json.loads(capsys.readouterr().out)
    for rows in (1, 5):
        cell = out[f"rows_{rows}"]
        assert cell["table_rows"] == 20 * rows
        assert cell["together_us"] > 0 and cell["one_at_a_time_us"] > 0 and cell["paused_us"] > 0
        assert cell["write_us"] > 0 and cell["write_default_us"] > 0 and cell["write_ratio"] > 0
        assert cell["bytes"] > 0 and cell["bytes_default"] > 0
        by = cell["compressions"]
        assert set(by) == {"snappy", "zstd", "none"}
        assert by["snappy"]["bytes"] == cell["bytes"]  # the log's default options
        assert all(c["write_us"] > 0 and c["bytes"] > 0 for c in by.values())
        for way in ("together", "paused"):
            waits = cell["lock_wait_ms"][way]
            assert 0 <= waits["p99"] <= waits["max"]
