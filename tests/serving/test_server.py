"""A real server on 127.0.0.1:0: our RankingService, TF Serving and KServe clients, health,
reflection, metrics, bad input, deadlines, auth, TLS and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from protos import ranking_service_pb2 as rank_pb2
from protos import ranking_service_pb2_grpc as rank_grpc
from serving.batching import BatchingConfig
from serving.client import AsyncRankingClient, RankingClient, make_request
from serving.inference import Limits
from serving.server import ServerOptions
from serving.testing import ServerThread, reference_score, write_linear_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "1", bias=0.0)
    write_linear_model(root / "lin" / "2", bias=1.0)
    write_linear_model(root / "cascade" / "1", bias=0.0, rank_signature=True)
    return root


@pytest.fixture(scope="module")
def server(repo):
    opts = ServerOptions(
        policy="all",
        metrics_port=0,
        max_message_bytes=256 * 1024,
        limits=Limits(max_request_rows=1000),
        batching=BatchingConfig(max_queue_delay_us=2000),
    )
    with ServerThread(repo, opts) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with RankingClient(server.target) as c:
        yield c


def test_rank_scores_match_reference_and_report_version(client):
    prices = [0.5, 2.0, -1.0, 0.0]
    items = [1, 3, 7, 3]
    r = client.rank("lin", {"user": "u1"}, {"item": items, "price": prices})
    assert r.version == 2  # the highest ready version by default
    expected = [reference_score(1.0, "u1", i, p) for i, p in zip(items, prices, strict=True)]
    np.testing.assert_allclose(r.scores, expected, rtol=1e-6)
    assert r.indices.tolist() == [0, 1, 2, 3]
    # an explicit version, and top-k: best first
    r1 = client.rank("lin", {"user": "u9"}, {"item": items, "price": prices}, version=1, top_k=2)
    ref1 = np.array([reference_score(0.0, "u9", i, p) for i, p in zip(items, prices, strict=True)])
    assert r1.version == 1
    assert r1.indices.tolist() == [1, 3]  # scores: item 3 at price 2.0, then item 3 at 0.0
    np.testing.assert_allclose(r1.scores, ref1[[1, 3]], rtol=1e-6)


def test_rank_uses_rank_request_signature_when_present(client):
    r = client.rank("cascade", {"user": "u1"}, {"item": [1, 3], "price": [0.0, 0.0]})
    # the test model's rank_request adds 10 to the logit: that path answered
    expected = [
        1 / (1 + math.exp(-(reference_score_logit + 10))) for reference_score_logit in (2.0, 3.0)
    ]
    np.testing.assert_allclose(r.scores, expected, rtol=1e-6)


def test_concurrent_requests_are_batched_and_correct(server):
    async def main():
        c = AsyncRankingClient(server.target)
        rs = await asyncio.gather(
            *[c.rank("lin", {"user": f"u{i}"}, {"item": [i], "price": [0.25]}) for i in range(40)]
        )
        await c.close()
        return rs

    before = server.server.repository.get("lin").batcher.batches
    rs = asyncio.run(main())
    for i, r in enumerate(rs):
        assert r.scores[0] == pytest.approx(reference_score(1.0, f"u{i}", i, 0.25), rel=1e-6)
    batches = server.server.repository.get("lin").batcher.batches - before
    assert batches < 40


BAD_RANK = [
    # (description, user, candidates, version, model, code, message pattern)
    (
        "missing",
        {"user": "u1"},
        {"item": [1]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"missing feature\(s\) \['price'\]",
    ),
    (
        "extra",
        {"user": "u1", "age": [3]},
        {"item": [1], "price": [1.0]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"unknown feature\(s\) \['age'\]",
    ),
    (
        "mistyped",
        {"user": "u1"},
        {"item": [1.5], "price": [1.0]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"'item' is float.*expects int64",
    ),
    (
        "string for int",
        {"user": "u1"},
        {"item": ["a"], "price": [1.0]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"'item' is string",
    ),
    (
        "nan",
        {"user": "u1"},
        {"item": [1, 2], "price": [1.0, float("nan")]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"'price' has a non-finite value nan at index 1",
    ),
    (
        "inf",
        {"user": "u1"},
        {"item": [1], "price": [float("inf")]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"non-finite value inf",
    ),
    (
        "empty",
        {"user": "u1"},
        {"item": [], "price": []},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"empty candidate list",
    ),
    (
        "lengths",
        {"user": "u1"},
        {"item": [1, 2], "price": [1.0]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"differ in length",
    ),
    (
        "two users",
        {"user": ["u1", "u2"]},
        {"item": [1], "price": [1.0]},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"user feature 'user' has 2 values",
    ),
    ("no candidates", {"user": "u1"}, {}, 0, "lin", "INVALID_ARGUMENT", r"no candidate features"),
    (
        "too many rows",
        {"user": "u1"},
        {"item": list(range(1001)), "price": [0.0] * 1001},
        0,
        "lin",
        "INVALID_ARGUMENT",
        r"at most 1000",
    ),
    (
        "unknown model",
        {"user": "u1"},
        {"item": [1], "price": [1.0]},
        0,
        "nope",
        "NOT_FOUND",
        r"unknown model 'nope'.*\['cascade', 'lin'\]",
    ),
    (
        "unknown version",
        {"user": "u1"},
        {"item": [1], "price": [1.0]},
        7,
        "lin",
        "NOT_FOUND",
        r"no ready version 7; ready versions: \[1, 2\]",
    ),
]


@pytest.mark.parametrize("case", BAD_RANK, ids=[c[0] for c in BAD_RANK])
def test_bad_rank_requests_get_clear_errors(client, case):
    _, user, cands, version, model, code, pattern = case
    with pytest.raises(grpc.RpcError) as e:
        client.rank(model, user, cands, version=version)
    assert e.value.code().name == code
    assert re.search(pattern, e.value.details()), e.value.details()
    # the server keeps serving everyone else
    assert client.rank("lin", {"user": "u1"}, {"item": [3], "price": [0.0]}).version == 2


def test_feature_without_values_and_top_k_checks(server):
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(server.target))
    req = make_request("lin", {"user": "u1"}, {"item": [1], "price": [1.0]})
    req.candidate_features["item"].Clear()
    with pytest.raises(grpc.RpcError) as e:
        stub.Rank(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "feature 'item' has no values" in e.value.details()
    req = make_request("lin", {"user": "u1"}, {"item": [1], "price": [1.0]}, top_k=-1)
    with pytest.raises(grpc.RpcError, match="top_k must be >= 0"):
        stub.Rank(req)


def test_too_large_message_is_refused_and_server_survives(client):
    n = 100_000  # 100k floats and ints: ~500 KB > 256 KiB
    with pytest.raises(grpc.RpcError) as e:
        client.rank("lin", {"user": "u1"}, {"item": [1] * n, "price": [0.0] * n})
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.rank("lin", {"user": "u1"}, {"item": [3], "price": [0.0]}).version == 2


def test_deadline_exceeded_in_queue(repo):
    # a 1 s batching window and a 50 ms deadline: the call ends at its deadline
    opts = ServerOptions(batching=BatchingConfig(max_queue_delay_us=1_000_000))
    with ServerThread(repo, opts) as s, RankingClient(s.target) as c:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            c.rank("lin", {"user": "u1"}, {"item": [1], "price": [1.0]}, timeout=0.05)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t0 < 0.9
        time.sleep(1.2)  # the window closed: the expired request left the queue uncomputed
        assert s.server.repository.get("lin").batcher.batches == 0
        assert c.rank("lin", {"user": "u1"}, {"item": [1], "price": [1.0]}).version == 2


def _tensor(values, dtype):
    return tf.make_tensor_proto(np.array(values, dtype=dtype))


def test_tf_serving_predict_metadata_status(server):
    channel = grpc.insecure_channel(server.target)
    predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "lin"
    req.model_spec.version.value = 1
    req.inputs["user"].CopyFrom(_tensor([b"u1", b"u2"], object))
    req.inputs["item"].CopyFrom(_tensor([3, 4], np.int64))
    req.inputs["price"].CopyFrom(_tensor([1.0, -2.0], np.float32))
    resp = predict.Predict(req, timeout=10)
    assert resp.model_spec.version.value == 1
    np.testing.assert_allclose(
        tf.make_ndarray(resp.outputs["score"]),
        [reference_score(0.0, "u1", 3, 1.0), reference_score(0.0, "u2", 4, -2.0)],
        rtol=1e-6,
    )
    assert set(resp.outputs) == {"score", "logit"}
    req.output_filter.append("logit")
    assert set(predict.Predict(req).outputs) == {"logit"}
    # mistyped input through the TF Serving API
    req.inputs["item"].CopyFrom(_tensor([3.0, 4.0], np.float32))
    with pytest.raises(grpc.RpcError) as e:
        predict.Predict(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'item'" in e.value.details()

    meta_req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    meta_req.model_spec.name = "cascade"
    meta = predict.GetModelMetadata(meta_req)
    sigs = get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(sigs)
    assert set(sigs.signature_def) == {"serving_default", "rank_request"}
    assert set(sigs.signature_def["serving_default"].inputs) == {"user", "item", "price"}

    status = model_service_pb2_grpc.ModelServiceStub(channel)
    st_req = get_model_status_pb2.GetModelStatusRequest()
    st_req.model_spec.name = "lin"
    st = status.GetModelStatus(st_req)
    assert [(v.version, v.state) for v in st.model_version_status] == [
        (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE),
    ]
    st_req.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as e:
        status.GetModelStatus(st_req)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


TRITON_CLIENT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tritonclient.grpc as g
    from tritonclient.utils import InferenceServerException

    c = g.InferenceServerClient(sys.argv[1])
    out = {"live": c.is_server_live(), "ready": c.is_server_ready(),
           "model_ready": c.is_model_ready("lin"), "v1_ready": c.is_model_ready("lin", "1"),
           "v9_ready": c.is_model_ready("lin", "9")}
    out["server"] = c.get_server_metadata(as_json=True)["name"]
    meta = c.get_model_metadata("lin", as_json=True)
    out["versions"] = meta["versions"]
    out["inputs"] = sorted((i["name"], i["datatype"]) for i in meta["inputs"])
    inputs = [g.InferInput("user", [3], "BYTES"), g.InferInput("item", [3], "INT64"),
              g.InferInput("price", [3], "FP32")]
    inputs[0].set_data_from_numpy(np.array([b"u1", b"u2", b"u1"], dtype=object))
    inputs[1].set_data_from_numpy(np.array([3, 1, 2], dtype=np.int64))
    inputs[2].set_data_from_numpy(np.array([0.5, 1.0, -1.0], dtype=np.float32))
    r = c.infer("lin", inputs, model_version="1", outputs=[g.InferRequestedOutput("score")])
    out["score"] = r.as_numpy("score").tolist()
    out["version"] = r.get_response().model_version
    bad = [g.InferInput("user", [1], "BYTES")]
    bad[0].set_data_from_numpy(np.array([b"u1"], dtype=object))
    try:
        c.infer("lin", bad)
    except InferenceServerException as e:
        out["bad"] = [e.status(), e.message()]
    print(json.dumps(out))
    """
)


def test_kserve_v2_with_tritonclient(server):
    # tritonclient registers the same proto package ("inference") as protos/: its own process
    p = subprocess.run(
        [sys.executable, "-c", TRITON_CLIENT, server.target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["live"] and out["ready"] and out["model_ready"] and out["v1_ready"]
    assert not out["v9_ready"]
    assert out["versions"] == ["1", "2"]
    assert out["server"] == "stitchrec"
    assert out["inputs"] == [["item", "INT64"], ["price", "FP32"], ["user", "BYTES"]]
    np.testing.assert_allclose(
        out["score"],
        [
            reference_score(0.0, "u1", 3, 0.5),
            reference_score(0.0, "u2", 1, 1.0),
            reference_score(0.0, "u1", 2, -1.0),
        ],
        rtol=1e-6,
    )
    assert out["version"] == "1"
    assert out["bad"][0] == "StatusCode.INVALID_ARGUMENT"
    assert "missing feature(s) ['item', 'price']" in out["bad"][1]


def test_health_and_reflection(server):
    channel = grpc.insecure_channel(server.target)
    h = health_pb2_grpc.HealthStub(channel)
    for name in ("", "stitchrec.serving.RankingService", "inference.GRPCInferenceService"):
        resp = h.Check(health_pb2.HealthCheckRequest(service=name))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {
        "stitchrec.serving.RankingService",
        "tensorflow.serving.PredictionService",
        "tensorflow.serving.ModelService",
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
    } <= services
    rank = db.FindFileContainingSymbol("stitchrec.serving.RankingService")
    assert "RankRequest" in [m.name for m in rank.message_type]


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def _value(text: str, name: str, labels: str) -> float:
    m = re.search(rf"^{re.escape(name)}\{{{labels}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_prometheus_metrics(server, client):
    before = _scrape(server.server.metrics_port)
    for _ in range(3):
        client.rank("lin", {"user": "u1"}, {"item": [1, 2], "price": [0.0, 0.0]})
    with pytest.raises(grpc.RpcError):
        client.rank("nope", {"user": "u1"}, {"item": [1], "price": [0.0]})
    after = _scrape(server.server.metrics_port)
    ok = 'code="OK",method="Rank"'
    nf = 'code="NOT_FOUND",method="Rank"'
    assert (
        _value(after, "stitchrec_requests_total", ok)
        - _value(before, "stitchrec_requests_total", ok)
        == 3
    )
    assert (
        _value(after, "stitchrec_request_failures_total", nf)
        - _value(before, "stitchrec_request_failures_total", nf)
        == 1
    )
    assert _value(after, "stitchrec_request_latency_seconds_count", 'method="Rank"') >= 3
    assert _value(after, "stitchrec_batch_rows_count", 'model="lin"') >= 3
    assert _value(after, "stitchrec_queue_seconds_count", 'model="lin"') >= 3
    assert (
        _value(after, "stitchrec_model_version_state", 'model="lin",state="AVAILABLE",version="2"')
        == 1
    )


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_and_token_auth(repo, tmp_path):
    key, cert = _self_signed(tmp_path)
    opts = ServerOptions(tokens=("s3cret",), tls_cert=str(cert), tls_key=str(key))
    with ServerThread(repo, opts) as s:
        root = cert.read_bytes()
        cands = {"item": [3], "price": [0.0]}
        with RankingClient(s.target, token="s3cret", root_cert=root) as ok:
            assert ok.rank("lin", {"user": "u1"}, cands).version == 2
        for token in (None, "wrong"):
            with RankingClient(s.target, token=token, root_cert=root) as bad:
                with pytest.raises(grpc.RpcError) as e:
                    bad.rank("lin", {"user": "u1"}, cands)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # health stays open for probes; plaintext is refused on the TLS port
        creds = grpc.ssl_channel_credentials(root)
        h = health_pb2_grpc.HealthStub(grpc.secure_channel(s.target, creds))
        assert (
            h.Check(health_pb2.HealthCheckRequest()).status
            == health_pb2.HealthCheckResponse.SERVING
        )
        with RankingClient(s.target, token="s3cret") as plain:
            with pytest.raises(grpc.RpcError) as e:
                plain.rank("lin", {"user": "u1"}, cands, timeout=2)
            assert e.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )


def test_graceful_stop_drains_in_flight_requests(repo):
    # a 120 s batching window keeps 20 requests in flight while the stop begins; the stop
    # dispatches them at once, well inside its 30 s grace (waiting out the window would not be)
    opts = ServerOptions(batching=BatchingConfig(max_queue_delay_us=120_000_000))
    s = ServerThread(repo, opts)
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(s.target))
    reqs = [make_request("lin", {"user": "u1"}, {"item": [i], "price": [0.0]}) for i in range(20)]
    futures = [stub.Rank.future(r, timeout=300) for r in reqs]  # beyond the window
    batcher = s.server.repository.get("lin").batcher
    t0 = time.monotonic()
    while batcher.queued < 20 and time.monotonic() - t0 < 20:
        time.sleep(0.01)
    assert batcher.queued == 20
    stopping = s.submit(s.server.stop(grace=30))
    time.sleep(0.05)
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(s.target))
    results = [f.result() for f in futures]  # every in-flight request completes
    assert [r.model_version for r in results] == [2] * 20
    np.testing.assert_allclose(
        [r.scores[0] for r in results],
        [reference_score(1.0, "u1", i, 0.0) for i in range(20)],
        rtol=1e-6,
    )
    stopping.result(30)
    with pytest.raises(grpc.RpcError) as e:  # stopped: new calls are refused
        health.Check(health_pb2.HealthCheckRequest(), timeout=2)
    assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    s.loop.call_soon_threadsafe(s.loop.stop)


def test_rank_request_proto_round_trip():
    req = make_request("m", {"u": "x"}, {"i": [1, 2], "p": np.array([0.5, 1.5])}, top_k=1)
    back = rank_pb2.RankRequest.FromString(req.SerializeToString())
    assert back.user_features["u"].bytes_list.value == [b"x"]
    assert list(back.candidate_features["i"].int64_list.value) == [1, 2]
    assert list(back.candidate_features["p"].float_list.value) == [0.5, 1.5]
    assert back.top_k == 1


def test_access_log_is_one_json_line_per_call(repo, caplog):
    caplog.set_level(logging.INFO, logger="stitchrec.serving.access")
    with ServerThread(repo, ServerOptions(access_log=True)) as s, RankingClient(s.target) as c:
        c.rank("lin", {"user": "u1"}, {"item": [3], "price": [0.0]})
        with pytest.raises(grpc.RpcError):
            c.rank("nope", {"user": "u1"}, {"item": [3], "price": [0.0]})
    lines = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "stitchrec.serving.access"
    ]
    assert [(x["method"], x["code"]) for x in lines] == [
        ("/stitchrec.serving.RankingService/Rank", "OK"),
        ("/stitchrec.serving.RankingService/Rank", "NOT_FOUND"),
    ]
    assert all(x["ms"] >= 0 and x["peer"].startswith("ipv4:127.0.0.1") for x in lines)


def _kserve_request(**overrides):
    from protos import grpc_service_pb2 as kserve_pb2

    req = kserve_pb2.ModelInferRequest(model_name="lin")
    req.inputs.add(name="user", datatype="BYTES", shape=[1])
    req.inputs.add(name="item", datatype="INT64", shape=[1])
    req.inputs.add(name="price", datatype="FP32", shape=[1])
    raws = {
        "user": struct.pack("<I", 2) + b"u1",
        "item": np.array([3], "<i8").tobytes(),
        "price": np.array([0.5], "<f4").tobytes(),
    }
    raws.update(overrides)
    for t in req.inputs:
        req.raw_input_contents.append(raws[t.name])
    return req


BAD_KSERVE = [
    (
        "short raw",
        {"item": b"\x03\x00"},
        r"input 'item': raw content has 2 bytes; shape \[1\] of INT64 needs 8",
    ),
    (
        "bytes overrun",
        {"user": struct.pack("<I", 9) + b"u1"},
        r"raw BYTES element 0 runs past the end",
    ),
    (
        "bytes left over",
        {"user": struct.pack("<I", 2) + b"u1xx"},
        r"2 bytes of raw content left after 1 elements",
    ),
    ("nan", {"price": np.array([np.nan], "<f4").tobytes()}, r"'price' has a non-finite value nan"),
]


@pytest.mark.parametrize("case", BAD_KSERVE, ids=[c[0] for c in BAD_KSERVE])
def test_bad_kserve_requests(server, case):
    from protos import grpc_service_pb2_grpc as kserve_grpc

    stub = kserve_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.target))
    good = stub.ModelInfer(_kserve_request())
    assert np.frombuffer(good.raw_output_contents[0], "<f4").shape == (1,)
    _, overrides, pattern = case
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(_kserve_request(**overrides))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(pattern, e.value.details()), e.value.details()


def test_bad_kserve_datatype_shape_and_tf_serving_shape(server):
    from protos import grpc_service_pb2_grpc as kserve_grpc

    stub = kserve_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.target))
    req = _kserve_request()
    req.inputs[2].datatype = "FP8"
    with pytest.raises(grpc.RpcError, match="unsupported datatype 'FP8'"):
        stub.ModelInfer(req)
    req = _kserve_request()
    del req.raw_input_contents[2]
    with pytest.raises(grpc.RpcError, match="2 raw_input_contents for 3 inputs"):
        stub.ModelInfer(req)
    req = _kserve_request()
    req.model_version = "-1"
    with pytest.raises(grpc.RpcError, match="model version '-1' is not a positive integer"):
        stub.ModelInfer(req)
    req = _kserve_request()
    req.model_version = "x"
    with pytest.raises(grpc.RpcError, match="model 'lin' has no version label 'x'"):
        stub.ModelInfer(req)
    predict = prediction_service_pb2_grpc.PredictionServiceStub(
        grpc.insecure_channel(server.target)
    )
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "lin"
    req.inputs["user"].CopyFrom(_tensor([[b"u1", b"u2"]], object))
    req.inputs["item"].CopyFrom(_tensor([[3, 4]], np.int64))
    req.inputs["price"].CopyFrom(_tensor([[1.0, 2.0]], np.float32))
    with pytest.raises(grpc.RpcError) as e:
        predict.Predict(req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "feature 'item' has shape [1, 2]; expected [batch]" in e.value.details()
