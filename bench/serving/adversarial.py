"""Requests built to make a server allocate or block: what each costs a real ``stitchrec serve``.

    .venv/bin/python -m bench.serving.adversarial [--repo DIR --model NAME] [--out DIR]

Without ``--repo`` the server serves the hand-checkable linear model of ``serving.testing``.
For each request the bench resets the server process's peak RSS (``/proc/PID/clear_refs``),
sends the request, and prints the status it got, how long the answer took, the growth of the
server's peak RSS (``VmHWM``) against the request's wire size, and the worst ``ServerLive``
latency seen by a second client polling every 5 ms meanwhile, with the idle ``ServerLive``
latency of the same run as the baseline; and the same for a third client polling ``GET
/v2/health/live`` on the server's probe port (``--probe-port``, ``serving.probes``).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bench.serving.servers import start_ours
from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from protos import ranking_service_pb2 as rank_pb2
from protos import ranking_service_pb2_grpc as rank_grpc
from serving.codec import encode_bytes
from serving.testing import write_linear_model

MB = 1024 * 1024


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def predict_huge_shape(model: str) -> predict_pb2.PredictRequest:
    """One float value declared to fill 250 million elements (38 bytes on the wire)."""
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    tp = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
    tp.tensor_shape.dim.add(size=250_000_000)
    tp.float_val.append(1.0)
    req.inputs["price"].CopyFrom(tp)
    return req


def rank_big_user(model: str, user_bytes: int, candidates: int) -> rank_pb2.RankRequest:
    req = rank_pb2.RankRequest(model_name=model)
    req.user_features["user"].bytes_list.value.append(b"u" * user_bytes)
    req.candidate_features["item"].int64_list.value.extend(range(candidates))
    req.candidate_features["price"].float_list.value.extend([0.5] * candidates)
    return req


def kserve_strings(model: str, rows: int, mean_len: int) -> kserve_pb2.ModelInferRequest:
    """A valid request of ``rows`` strings of mixed lengths around ``mean_len`` bytes."""
    req = kserve_pb2.ModelInferRequest(model_name=model)
    lengths = np.random.default_rng(0).integers(mean_len // 2, mean_len * 3 // 2, rows)
    users = np.empty(rows, dtype=object)
    users[:] = [b"u" * int(n) for n in lengths]
    for name, dt in (("user", "BYTES"), ("item", "INT64"), ("price", "FP32")):
        req.inputs.add(name=name, datatype=dt, shape=[rows])
    req.raw_input_contents.extend(
        [
            encode_bytes(users),
            np.full(rows, 3, "<i8").tobytes(),
            np.full(rows, 0.5, "<f4").tobytes(),
        ]
    )
    return req


def kserve_overflow(model: str) -> kserve_pb2.ModelInferRequest:
    req = kserve_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name="user", datatype="BYTES", shape=[2**32, 2**32])
    req.raw_input_contents.append(b"")
    return req


def rank_many_names(model: str) -> rank_pb2.RankRequest:
    req = rank_big_user(model, 2, 2)
    for i in range(2000):
        req.candidate_features[f"unknown_feature_{i:04d}" * 4].int64_list.value.extend([1, 2])
    return req


def _poll_live(stub: kserve_grpc.GRPCInferenceServiceStub, stop: threading.Event) -> list[float]:
    waits = []
    while not stop.is_set():
        t0 = time.perf_counter()
        stub.ServerLive(kserve_pb2.ServerLiveRequest(), timeout=60)
        waits.append(time.perf_counter() - t0)
        time.sleep(0.005)
    return waits


def _poll_probe(port: int, stop: threading.Event) -> list[float]:
    """``GET /v2/health/live`` on the probe port every 5 ms (one kept-alive connection)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    waits = []
    while not stop.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/v2/health/live")
        conn.getresponse().read()
        waits.append(time.perf_counter() - t0)
        time.sleep(0.005)
    conn.close()
    return waits


def _summary(waits: list[float], prefix: str) -> dict:
    if not waits:
        return {f"{prefix}_p50_ms": None, f"{prefix}_worst_ms": None, f"{prefix}_samples": 0}
    return {
        f"{prefix}_p50_ms": round(float(np.percentile(waits, 50)) * 1000, 1),
        f"{prefix}_worst_ms": round(max(waits) * 1000, 1),
        f"{prefix}_samples": len(waits),
    }


def poll_main() -> None:
    """The pollers' process (``python -c``; argv: gRPC target, probe port): polls
    ``ServerLive`` and the probe port in two threads until its standard input closes, then
    prints ``{"live": [...], "probe": [...]}`` (seconds). In a process of its own, a poll never
    waits for the interpreter lock of the client sending the big request."""
    target, probe_port = sys.argv[1], int(sys.argv[2])
    live = kserve_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target))
    live.ServerLive(kserve_pb2.ServerLiveRequest(), timeout=30)
    stop = threading.Event()
    waits: dict[str, list[float]] = {"live": [], "probe": []}
    pollers = [
        threading.Thread(target=lambda: waits["live"].extend(_poll_live(live, stop))),
        threading.Thread(target=lambda: waits["probe"].extend(_poll_probe(probe_port, stop))),
    ]
    for poller in pollers:
        poller.start()
    print("polling", flush=True)
    sys.stdin.read()
    stop.set()
    for poller in pollers:
        poller.join()
    print(json.dumps(waits), flush=True)


def measure(pid: int, target: str, call: Callable[[], object], wire: int, probe_port: int) -> dict:
    _reset_peak(pid)
    base_kb = _status_kb(pid, "VmRSS")
    code = "from bench.serving.adversarial import poll_main; poll_main()"
    poller = subprocess.Popen(
        [sys.executable, "-c", code, target, str(probe_port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert poller.stdout.readline().strip() == "polling", "the poller did not start"
    t0 = time.perf_counter()
    try:
        call()
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    seconds = time.perf_counter() - t0
    waits, _ = poller.communicate(timeout=60)
    waits = json.loads(waits.strip().splitlines()[-1])
    growth = (_status_kb(pid, "VmHWM") - base_kb) * 1024
    return {
        "code": code,
        "answer_ms": round(seconds * 1000, 1),
        "wire_bytes": wire,
        "peak_rss_growth_mb": round(growth / MB, 1),
        "bound_mb": round(max(64 * MB, 8 * wire) / MB, 1),
        **_summary(waits["live"], "live"),
        **_summary(waits["probe"], "probe"),
    }


def cases(model: str) -> list[tuple[str, str, object]]:
    return [
        ("predict 38 B, unknown model, shape [2.5e8]", "predict", predict_huge_shape("nope")),
        ("predict 38 B, shape [2.5e8]", "predict", predict_huge_shape(model)),
        ("rank 4 MiB user string x 200 candidates", "rank", rank_big_user(model, 4 * MB, 200)),
        ("rank 1 MiB user string x 100k candidates", "rank", rank_big_user(model, MB, 100_000)),
        ("rank 2,000 unknown feature names", "rank", rank_many_names(model)),
        ("kserve shape [2^32, 2^32]", "kserve", kserve_overflow(model)),
        ("kserve 60 MB of strings (100k rows)", "kserve", kserve_strings(model, 100_000, 600)),
    ]


def _stubs(target: str) -> dict[str, Callable]:
    opts = [("grpc.max_send_message_length", 128 * MB)]
    ch = grpc.insecure_channel(target, options=opts)
    return {
        "predict": prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict,
        "rank": rank_grpc.RankingServiceStub(ch).Rank,
        "kserve": kserve_grpc.GRPCInferenceServiceStub(ch).ModelInfer,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", help="model repository (default: the linear test model)")
    ap.add_argument("--model", default="lin")
    ap.add_argument("--out", default="bench/results/adversarial")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(args.repo) if args.repo else Path(tmp)
        if not args.repo:
            write_linear_model(repo / args.model / "1", bias=0.0)
        extra = ["--max-message-mb", "128", "--probe-port", "0"]
        proc, port = start_ours(repo, out, "adversarial", extra)
        probe = int(proc.info["probe_port"])
        try:
            target = f"127.0.0.1:{port}"
            stubs = _stubs(target)
            pid = proc.p.pid
            idle = measure(pid, target, lambda: time.sleep(0.5), 0, probe)
            print(
                f"idle: ServerLive worst {idle['live_worst_ms']} ms ({idle['live_samples']}), "
                f"probe port worst {idle['probe_worst_ms']} ms ({idle['probe_samples']})"
            )
            rows = []
            for title, kind, req in cases(args.model):
                wire = len(req.SerializeToString())
                call = functools.partial(stubs[kind], req, timeout=120)
                r = measure(pid, target, call, wire, probe)
                r["request"] = title
                rows.append(r)
                print(json.dumps(r), flush=True)
            (out / "adversarial.json").write_text(
                json.dumps({"idle": idle, "rows": rows}, indent=1)
            )
        finally:
            proc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
