"""bench/serving run as real processes: the request file format, the summary, the table of
aggregated runs and the load generator against a real server for one second."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from serving.client import make_request
from serving.testing import ServerThread, write_linear_model

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p


def _last_json(p: subprocess.CompletedProcess) -> dict:
    return json.loads(p.stdout.strip().splitlines()[-1])


def write_requests(path: Path, messages: list[bytes]) -> None:
    """The request file format: each message preceded by its 4-byte little-endian length."""
    path.write_bytes(b"".join(struct.pack("<I", len(m)) + m for m in messages))


def test_request_file_round_trip(tmp_path):
    msgs = [b"", b"a", bytes(range(256)) * 3]
    write_requests(tmp_path / "r.bin", msgs)
    p = _bench("bench.serving.loadgen", "--requests", str(tmp_path / "r.bin"), "--list-requests")
    assert [bytes.fromhex(m) for m in _last_json(p)["messages"]] == msgs


def test_summarize_by_hand(tmp_path):
    record = {
        "latencies_s": [0.001] * 98 + [0.010, 0.020],
        "seconds": 2.0,
        "failures_by_code": {"UNAVAILABLE": 3},
    }
    (tmp_path / "rec.json").write_text(json.dumps(record))
    s = _last_json(_bench("bench.serving.loadgen", "--summarize", str(tmp_path / "rec.json")))
    assert s["requests"] == 100 and s["qps"] == 50.0
    assert s["p50_ms"] == 1.0 and s["max_ms"] == 20.0
    assert 9.9 < s["p99_ms"] < 10.2  # numpy's linear interpolation between 10 and 20 ms
    assert s["failures"] == 3 and s["failures_by_code"] == {"UNAVAILABLE": 3}


def test_aggregate_and_table_ratios_against_triton(tmp_path):
    def row(server, qps, p99):
        return {
            "server": server,
            "candidates": 1,
            "qps": qps,
            "p50_ms": 1.0,
            "p99_ms": p99,
            "failures": 0,
        }

    rows = [row("batching", 280.0, 4.0), row("batching", 320.0, 6.0), row("triton", 200.0, 10.0)]
    (tmp_path / "results.json").write_text(json.dumps({"rows": rows}))
    p = _bench("bench.serving", "--report", str(tmp_path / "results.json"))
    b = _last_json(p)["aggregated"][0]
    assert (b["repeats"], b["qps"], b["p99_ms"]) == (2, 300.0, 5.0)
    assert b["qps_std"] == pytest.approx(28.284, abs=1e-3)  # sample std of 280 and 320
    text = p.stdout
    assert "| batching | 1 | 2 | 300 ± 28 | 1.0 | 5.0 ± 1.4 | 0 | 1.50x | 0.50x |" in text
    assert "| triton | 1 | 1 | 200 | 1.0 | 10.0 | 0 | 1.00x | 1.00x |" in text


def test_load_generator_against_a_real_server(tmp_path):
    write_linear_model(tmp_path / "repo" / "lin" / "1", bias=0.0)
    reqs = [
        make_request("lin", {"user": "u1"}, {"item": [i], "price": [0.5]}).SerializeToString()
        for i in range(4)
    ] + [make_request("nope", {"user": "u1"}, {"item": [1], "price": [0.5]}).SerializeToString()]
    write_requests(tmp_path / "r.bin", reqs)
    with ServerThread(tmp_path / "repo") as s:
        p = _bench(
            "bench.serving.loadgen", "--target", s.target,
            "--method", "/stitchrec.serving.RankingService/Rank", "--requests",
            str(tmp_path / "r.bin"), "--concurrency", "5", "--channels", "1", "--warmup", "0",
            "--seconds", "1", "--rank-versions", "--record", str(tmp_path / "rec.json"),
        )  # fmt: skip
    out = _last_json(p)
    # stream i sends requests i, i+1, ...: one in five is for the unknown model
    assert out["requests"] > 10 and out["failures"] > 0
    assert set(out["failures_by_code"]) == {"NOT_FOUND"}
    assert abs(out["failures"] * 4 - out["requests"]) <= 8
    assert out["versions"] == {"1": out["requests"]}
    record = json.loads((tmp_path / "rec.json").read_text())
    assert len(record["latencies_s"]) == out["requests"]
    assert record["failures_by_code"] == out["failures_by_code"]
