"""HTTP beside gRPC on a real server (127.0.0.1, port 0): TF Serving REST as its docs write the
calls, KServe v2 REST with tritonclient.http (JSON and binary tensors), /v1/rank, error codes and
shapes, request ids, observers, metrics and the drain."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from serving.batching import BatchingConfig
from serving.config import Limits, ServerOptions
from serving.testing import (
    ServerThread,
    reference_score,
    serve_process,
    wait_until,
    write_linear_model,
)
from serving.version_files import atomic_dir

ROOT = Path(__file__).resolve().parents[2]


class _Double(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"y": 2.0 * x}


def _write_double(path: Path) -> None:
    """A one-input, one-output model: y = 2 x."""
    with atomic_dir(path) as tmp:
        tf.saved_model.save(_Double(), str(tmp), signatures={"serving_default": _Double().serve})


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "1", bias=0.0)
    write_linear_model(root / "lin" / "2", bias=1.0)
    write_linear_model(root / "cascade" / "1", bias=0.0, rank_signature=True)
    _write_double(root / "double" / "1")
    return root


@pytest.fixture(scope="module")
def server(repo):
    opts = ServerOptions(
        policy="all",
        http_port=0,
        warmup_sizes=(1,),
        max_message_bytes=256 * 1024,
        limits=Limits(max_request_rows=1000),
        batching=BatchingConfig(max_queue_delay_us=200),
    )
    with ServerThread(repo, opts) as s:
        yield s


@pytest.fixture(scope="module")
def url(server) -> str:
    return f"http://127.0.0.1:{server.server.http_port}"


def _scores(bias, users, items, prices):
    return [reference_score(bias, u, i, p) for u, i, p in zip(users, items, prices, strict=True)]


# --------------------------------------------------------------------------------------------
# TF Serving REST


def test_tfs_row_form_with_b64_and_versions(url):
    body = {
        "instances": [
            {"user": "u1", "item": 3, "price": 0.5},
            {"user": {"b64": base64.b64encode(b"u2").decode()}, "item": 1, "price": 1},
        ]
    }
    r = requests.post(f"{url}/v1/models/lin:predict", json=body)
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert [sorted(p) for p in preds] == [["logit", "score"]] * 2
    want = _scores(1.0, ["u1", "u2"], [3, 1], [0.5, 1.0])
    np.testing.assert_allclose([p["score"] for p in preds], want, rtol=1e-6)
    assert r.headers["X-StitchRec-Version"] == "2"
    r = requests.post(f"{url}/v1/models/lin/versions/1:predict", json=body)
    want = _scores(0.0, ["u1", "u2"], [3, 1], [0.5, 1.0])
    np.testing.assert_allclose([p["score"] for p in r.json()["predictions"]], want, rtol=1e-6)


def test_tfs_columnar_form_and_signature_name(url):
    body = {
        "signature_name": "serving_default",
        "inputs": {"user": ["u1", "u2", "u1"], "item": [3, 1, 2], "price": [0.5, 1.0, -1.0]},
    }
    r = requests.post(f"{url}/v1/models/lin/versions/1:predict", json=body)
    out = r.json()["outputs"]
    want = _scores(0.0, ["u1", "u2", "u1"], [3, 1, 2], [0.5, 1.0, -1.0])
    np.testing.assert_allclose(out["score"], want, rtol=1e-6)
    body["signature_name"] = "nope"
    r = requests.post(f"{url}/v1/models/lin:predict", json=body)
    assert r.status_code == 404 and "no signature ['nope']" in r.json()["error"]


def test_tfs_one_input_bare_values(url):
    r = requests.post(f"{url}/v1/models/double:predict", json={"instances": [1.0, 2.5, 4]})
    assert r.json() == {"predictions": [2.0, 5.0, 8.0]}
    r = requests.post(f"{url}/v1/models/double:predict", json={"inputs": [3]})
    assert r.json() == {"outputs": [6.0]}


def test_tfs_status_and_metadata(url):
    r = requests.get(f"{url}/v1/models/lin")
    assert r.json() == {
        "model_version_status": [
            {
                "version": v,
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
            for v in ("2", "1")
        ]
    }
    r = requests.get(f"{url}/v1/models/lin/versions/1")
    assert [s["version"] for s in r.json()["model_version_status"]] == ["1"]
    meta = requests.get(f"{url}/v1/models/lin/versions/1/metadata").json()
    assert meta["model_spec"] == {"name": "lin", "signature_name": "", "version": "1"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["inputs"]["user"]["dtype"] == "DT_STRING"
    assert sorted(sig["outputs"]) == ["logit", "score"]
    assert requests.get(f"{url}/v1/models/lin/versions/7").status_code == 404


@pytest.mark.parametrize(
    "method,path,body,status,words",
    [
        ("post", "/v1/models/nope:predict", {"instances": [1]}, 404, "unknown model 'nope'"),
        ("post", "/v1/models/lin/versions/9:predict", {"instances": [1]}, 404, "version 9"),
        ("post", "/v1/models/lin/labels/canary:predict", {}, 404, "no version label 'canary'"),
        ("post", "/v1/models/lin:predict", {"instances": [{"user": "u1"}]}, 400, "missing"),
        ("post", "/v1/models/lin:predict", {"rows": []}, 400, "unknown key(s) ['rows']"),
        ("post", "/v1/models/lin:classify", {}, 501, "'classify' is not served"),
        ("get", "/v1/models/lin:predict", None, 405, "takes POST"),
        ("get", "/v2/models/nope", None, 404, "unknown model"),
        ("get", "/nowhere", None, 404, "Not Found"),
    ],
)
def test_errors_have_tf_serving_shape(url, method, path, body, status, words):
    r = getattr(requests, method)(url + path, json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and words in r.json()["error"]
    assert r.headers["X-Request-Id"]


def test_body_too_large_is_413_json(url):
    r = requests.post(f"{url}/v1/models/lin:predict", data=b"[" * (300 * 1024))
    assert r.status_code == 413 and "at most 262144 bytes" in r.json()["error"]


# --------------------------------------------------------------------------------------------
# KServe v2 REST

TRITON_HTTP = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tritonclient.http as h
    from tritonclient.utils import InferenceServerException

    c = h.InferenceServerClient(sys.argv[1])
    out = {"live": c.is_server_live(), "ready": c.is_server_ready(),
           "model_ready": c.is_model_ready("lin"), "v9_ready": c.is_model_ready("lin", "9")}
    out["server"] = c.get_server_metadata()["name"]
    meta = c.get_model_metadata("lin")
    out["versions"] = meta["versions"]
    out["inputs"] = sorted((i["name"], i["datatype"]) for i in meta["inputs"])
    for binary in (False, True):
        inputs = [h.InferInput("user", [3], "BYTES"), h.InferInput("item", [3], "INT64"),
                  h.InferInput("price", [3], "FP32")]
        inputs[0].set_data_from_numpy(np.array([b"u1", b"u2", b"u1"], dtype=object), binary)
        inputs[1].set_data_from_numpy(np.array([3, 1, 2], dtype=np.int64), binary)
        inputs[2].set_data_from_numpy(np.array([0.5, 1.0, -1.0], dtype=np.float32), binary)
        wanted = [h.InferRequestedOutput("score", binary_data=binary)]
        r = c.infer("lin", inputs, model_version="1", outputs=wanted, request_id="req-7")
        out[f"score_{binary}"] = r.as_numpy("score").tolist()
        out["version"] = r.get_response()["model_version"]
        out["id"] = r.get_response()["id"]
    r = c.infer("lin", inputs)  # no outputs named: every output, binary
    out["all"] = sorted(o["name"] for o in r.get_response()["outputs"])
    bad = [h.InferInput("user", [1], "BYTES")]
    bad[0].set_data_from_numpy(np.array([b"u1"], dtype=object))
    try:
        c.infer("lin", bad)
    except InferenceServerException as e:
        out["bad"] = [e.status(), e.message()]
    print(json.dumps(out))
    """
)


def test_kserve_v2_rest_with_tritonclient(url):
    # tritonclient registers protos that clash with protos/: its own process
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", TRITON_HTTP, url.removeprefix("http://")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["live"] and out["ready"] and out["model_ready"] and not out["v9_ready"]
    assert out["server"] == "stitchrec" and out["versions"] == ["1", "2"]
    assert out["inputs"] == [["item", "INT64"], ["price", "FP32"], ["user", "BYTES"]]
    want = _scores(0.0, ["u1", "u2", "u1"], [3, 1, 2], [0.5, 1.0, -1.0])
    np.testing.assert_allclose(out["score_False"], want, rtol=1e-6)
    np.testing.assert_allclose(out["score_True"], want, rtol=1e-6)
    assert out["version"] == "1" and out["id"] == "req-7"
    assert out["all"] == ["logit", "score"]
    assert out["bad"][0] == "400" and "missing feature(s) ['item', 'price']" in out["bad"][1]


def test_kserve_binary_output_by_hand(url):
    body = {
        "inputs": [
            {"name": "user", "shape": [1], "datatype": "BYTES", "data": ["u1"]},
            {"name": "item", "shape": [1, 1], "datatype": "INT64", "data": [[3]]},
            {"name": "price", "shape": [1], "datatype": "FP32", "data": [2]},
        ],
        "outputs": [{"name": "logit", "parameters": {"binary_data": True}}],
    }
    r = requests.post(f"{url}/v2/models/lin/versions/2/infer", json=body)
    n = int(r.headers["Inference-Header-Content-Length"])
    head = json.loads(r.content[:n])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 4}
    logit = np.frombuffer(r.content[n:], dtype="<f4")
    np.testing.assert_allclose(logit, [1.0 + 1.0 + 1.0 + 2.0], rtol=1e-6)


# --------------------------------------------------------------------------------------------
# /v1/rank, request ids, observers, metrics


def test_rank_endpoint(url):
    body = {
        "user": {"user": "u1"},
        "candidates": {"item": [1, 3, 7], "price": [0.5, 2.0, -1.0]},
        "top_k": 2,
        "version": 1,
    }
    r = requests.post(f"{url}/v1/rank/lin", json=body)
    out = r.json()
    want = _scores(0.0, ["u1"] * 3, [1, 3, 7], [0.5, 2.0, -1.0])
    assert out["model_name"] == "lin" and out["model_version"] == 1
    assert out["indices"] == [1, 0] and out["task_scores"] == {}
    np.testing.assert_allclose(out["scores"], [want[1], want[0]], rtol=1e-6)
    r = requests.post(f"{url}/v1/rank/lin", json={**body, "top_k": -1})
    assert r.status_code == 400 and "top_k must be an integer >= 0" in r.json()["error"]


def test_request_id_observers_and_metrics(server, url):
    seen = []
    server.server.state.observers.add(seen.append)
    body = {"instances": [{"user": "u1", "item": 3, "price": 0.5}]}
    r = requests.post(f"{url}/v1/models/lin:predict", json=body, headers={"X-Request-Id": "abc-1"})
    assert r.headers["X-Request-Id"] == "abc-1"
    wait_until(lambda: any(c.request_id == "abc-1" for c in seen), 5)
    call = next(c for c in seen if c.request_id == "abc-1")
    assert (call.protocol, call.model, call.version) == ("http", "lin", 2)
    assert call.features["user"].tolist() == [b"u1"]
    assert requests.get(f"{url}/v2/health/live").headers["X-Request-Id"]
    text = requests.get(f"{url}/metrics").status_code  # not served on the HTTP port
    assert text == 404
    counted = server.server.metrics.requests.labels("http.Predict", "OK")._value.get()
    assert counted >= 1


def test_tokens_then_ready_is_503_from_the_start_of_the_drain(repo):
    opts = ServerOptions(
        http_port=0, warmup_sizes=(1,), drain_s=1.0, policy="latest", tokens=("s3cret",)
    )
    s = ServerThread(repo, opts)
    url = f"http://127.0.0.1:{s.server.http_port}"
    body = {"inputs": {"user": ["u1"], "item": [3], "price": [0.5]}}
    try:
        r = requests.post(f"{url}/v1/models/lin:predict", json=body)
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]
        auth = {"Authorization": "Bearer s3cret"}
        r = requests.post(f"{url}/v1/models/lin:predict", json=body, headers=auth)
        assert r.status_code == 200
        assert requests.get(f"{url}/v2/health/ready").status_code == 200  # open without token
        stopping = s.submit(s.server.stop(2.0))
        wait_until(lambda: requests.get(f"{url}/v2/health/ready").status_code == 503, 5)
        assert requests.get(f"{url}/v2/health/ready").json() == {"ready": False}
        assert requests.get(f"{url}/v2/health/live").status_code == 200  # still live
        stopping.result(30)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{url}/v2/health/live", timeout=2)
    finally:
        s.stop()


def test_cli_serve_http_port(tmp_path):
    write_linear_model(tmp_path / "lin" / "1", bias=0.0)
    proc, line = serve_process(
        "--repo", str(tmp_path), "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
        "--poll-seconds", "0", "--log-level", "WARNING", "--drain-seconds", "0",
        "--grace-seconds", "1",
    )  # fmt: skip
    try:
        port = line["http_port"]
        assert isinstance(port, int) and port > 0
        t0 = time.monotonic()
        r = requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5)
        assert r.status_code == 200 and time.monotonic() - t0 < 5
        proc.terminate()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_server_without_models_is_not_ready_on_http_nor_grpc(tmp_path):
    opts = ServerOptions(http_port=0, warmup_sizes=(1,), poll_interval_s=0.1)
    with ServerThread(tmp_path, opts) as s:
        url = f"http://127.0.0.1:{s.server.http_port}/v2/health/ready"
        channel = grpc.insecure_channel(s.target)
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)

        def grpc_ready() -> bool:
            ready = stub.ServerReady(kserve_pb2.ServerReadyRequest(), timeout=5).ready
            answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert ready == (answer.status == health_pb2.HealthCheckResponse.SERVING)
            return ready

        r = requests.get(url, timeout=5)
        assert (r.status_code, r.json(), grpc_ready()) == (503, {"ready": False}, False)
        write_linear_model(tmp_path / "lin" / "1", bias=0.0)
        wait_until(lambda: requests.get(url, timeout=5).status_code == 200, 60)
        assert requests.get(url, timeout=5).json() == {"ready": True} and grpc_ready()
