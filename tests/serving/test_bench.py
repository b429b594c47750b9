"""bench/serving run as real processes: the request file format, the summary, h2load's output,
the saturating concurrency, the table of aggregated runs, the load generator against a real
server for one second and the whole bench in quick mode on the linear model."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serving import h2load, overload
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
        timeout=180,
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
        "failure_latencies_s": {"UNAVAILABLE": [0.002, 0.002, 0.004]},
    }
    (tmp_path / "rec.json").write_text(json.dumps(record))
    s = _last_json(_bench("bench.serving.loadgen", "--summarize", str(tmp_path / "rec.json")))
    assert s["requests"] == 100 and s["qps"] == 50.0
    assert s["p50_ms"] == 1.0 and s["max_ms"] == 20.0
    assert 9.9 < s["p99_ms"] < 10.2  # numpy's linear interpolation between 10 and 20 ms
    assert s["failures"] == 3 and s["failures_by_code"] == {"UNAVAILABLE": 3}
    assert s["by_code"]["UNAVAILABLE"]["p50_ms"] == 2.0
    assert s["by_code"]["UNAVAILABLE"]["share"] == round(3 / 103, 4)
    assert s["by_code"]["OK"]["count"] == 100 and s["by_code"]["OK"]["p50_ms"] == 1.0


H2LOAD_OUTPUT = """
finished in 5.01s, 512.40 req/s, 3.21MB/s
requests: 2562 total, 2578 started, 2562 done, 2562 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 2562 2xx, 0 3xx, 0 4xx, 0 5xx
"""


def test_h2load_summary_and_frame_by_hand(tmp_path):
    r = h2load.parse(H2LOAD_OUTPUT)
    assert (r["qps"], r["h2_done"], r["h2_succeeded"], r["http_non_2xx"]) == (512.4, 2562, 2562, 0)
    with pytest.raises(RuntimeError, match="no summary"):
        h2load.parse("connect failed")
    frame = h2load.write_frame(b"abc", tmp_path / "f.bin").read_bytes()
    assert frame == b"\x00\x00\x00\x00\x03abc"  # uncompressed, big-endian length 3


def test_saturating_concurrency_and_shares_by_hand():
    assert overload.saturating([(4, 300.0), (16, 960.0), (64, 1000.0)]) == 16  # 960 >= 950
    assert overload.saturating([(4, 300.0), (16, 940.0), (64, 1000.0)]) == 64
    by_code = {"OK": {"count": 6}, "RESOURCE_EXHAUSTED": {"count": 3}, "UNAVAILABLE": {"count": 1}}
    s = overload.shares(by_code)
    assert s == {"OK": 0.6, "RESOURCE_EXHAUSTED": 0.3, "DEADLINE_EXCEEDED": 0.0,
                 "CANCELLED": 0.0, "other": 0.1}  # fmt: skip


def test_aggregate_and_table_ratios_against_triton(tmp_path):
    def row(server, protocol, driver, qps, p99=None):
        r = {"model": "bench", "server": server, "protocol": protocol, "candidates": 1,
             "driver": driver, "qps": qps, "failures": 0}  # fmt: skip
        return r if p99 is None else {**r, "p50_ms": 1.0, "p99_ms": p99}

    rows = [
        row("batching", "rank", "h2load", 280.0),
        row("batching", "rank", "h2load", 320.0),
        row("batching", "rank", "loadgen", 250.0, 4.0),
        row("batching", "rank", "loadgen", 250.0, 6.0),
        row("triton", "kserve", "h2load", 200.0),
        row("triton", "kserve", "loadgen", 150.0, 10.0),
    ]
    (tmp_path / "results.json").write_text(json.dumps({"rows": rows}))
    p = _bench("bench.serving", "--report", str(tmp_path / "results.json"))
    b = _last_json(p)["aggregated"][0]
    assert (b["repeats"], b["qps"], b["driver"]) == (2, 300.0, "h2load")
    assert b["qps_std"] == pytest.approx(28.284, abs=1e-3)  # sample std of 280 and 320
    text = p.stdout
    assert (
        "| bench | batching | rank | 1 | 2 | 300 ± 28 | 0 | 250 | 1.0 | 5.0 ± 1.4 | 1.50x | 0.50x |"
        in text
    )
    assert (
        "| bench | triton | kserve | 1 | 1 | 200 | 0 | 150 | 1.0 | 10.0 | 1.00x | 1.00x |" in text
    )


def _loadgen(tmp_path, models: list[str], *flags: str) -> dict:
    """``bench.serving.loadgen`` against a served linear model ``lin``: one Rank request per
    entry of ``models`` (the model each names; item ``i`` for the i-th), sent round robin."""
    write_linear_model(tmp_path / "repo" / "lin" / "1", bias=0.0)
    reqs = [
        make_request(m, {"user": "u1"}, {"item": [i], "price": [0.5]}).SerializeToString()
        for i, m in enumerate(models)
    ]
    write_requests(tmp_path / "r.bin", reqs)
    with ServerThread(tmp_path / "repo") as s:
        p = _bench(
            "bench.serving.loadgen", "--target", s.target,
            "--method", "/stitchrec.serving.RankingService/Rank",
            "--requests", str(tmp_path / "r.bin"), *flags,
        )  # fmt: skip
    return _last_json(p)


def test_load_generator_against_a_real_server(tmp_path):
    out = _loadgen(
        tmp_path, ["lin"] * 4 + ["nope"],
        "--concurrency", "5", "--channels", "1", "--warmup", "0", "--seconds", "1",
        "--rank-versions", "--record", str(tmp_path / "rec.json"),
    )  # fmt: skip
    # stream i sends requests i, i+1, ...: one in five is for the unknown model, so each of the
    # five streams is off the 4:1 ratio by at most 4 (where its last cycle stopped)
    assert out["requests"] > 10 and out["failures"] > 0
    assert set(out["failures_by_code"]) == {"NOT_FOUND"}
    assert abs(out["failures"] * 4 - out["requests"]) <= 5 * 4
    assert out["versions"] == {"1": out["requests"]}
    record = json.loads((tmp_path / "rec.json").read_text())
    assert len(record["latencies_s"]) == out["requests"]
    assert record["failures_by_code"] == out["failures_by_code"]
    assert len(record["failure_latencies_s"]["NOT_FOUND"]) == out["failures"]
    assert out["by_code"]["NOT_FOUND"]["p99_ms"] > 0


def test_open_loop_sends_at_its_rate_whatever_the_answers(tmp_path):
    """``--rate``: request i is due at i / rate seconds; the requests of the measured window
    are its share of them (not as many as the streams could send), spread over the messages."""
    out = _loadgen(
        tmp_path, ["lin", "lin", "lin", "nope"],
        "--concurrency", "8", "--channels", "2", "--warmup", "0.5", "--seconds", "1.5",
        "--rate", "40",
    )  # fmt: skip
    assert out["rate"] == 40.0
    sent = out["requests"] + out["failures"]
    assert 55 <= sent <= 62  # 60 due in the 1.5 s window (a closed loop sends hundreds)
    assert out["failures_by_code"] == {"NOT_FOUND": out["failures"]}
    assert abs(out["failures"] * 3 - out["requests"]) <= 6  # one message in four
    bad = subprocess.run(
        [sys.executable, "-m", "bench.serving.loadgen", "--target", "x", "--method", "/a/b",
         "--requests", str(tmp_path / "r.bin"), "--rate", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--rate must be > 0 requests per second, got 0" in bad.stderr


def test_quick_bench_on_the_linear_model(tmp_path):
    _bench(
        "bench.serving", "--quick", "--seconds", "0.3", "--warmup", "0.1", "--models", "linear",
        "--sizes", "100",
        "--servers", "batching", "--overload-model", "linear", "--skip-hot-swap",
        "--out", str(tmp_path), "--cache", str(tmp_path / "cache"),
    )  # fmt: skip
    result = json.loads((tmp_path / "results.json").read_text())
    want = "h2load" if shutil.which("h2load") else "loadgen"
    assert result["driver"] == want
    cells = {(r["protocol"], r["driver"]): r for r in result["rows"]}
    assert set(cells) == {(p, d) for p in ("rank", "kserve", "predict") for d in {want, "loadgen"}}
    for r in cells.values():
        assert r["qps"] > 0 and r["failures"] == 0, r
    if want == "h2load":  # the server's own counters saw the OK answers h2load drove
        assert all(cells[p, "h2load"]["answers"]["OK"] > 0 for p in ("rank", "kserve", "predict"))
    over = result["overload"]
    assert over["saturating"] in (4, 16)
    assert [r["multiple"] for r in over["rows"]] == [1, 4, 1, 4]
    for r in over["rows"]:
        assert sum(r["shares"].values()) == pytest.approx(1.0, abs=1e-3)
        assert r["goodput"] > 0
