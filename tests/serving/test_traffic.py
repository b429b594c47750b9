"""Version labels and sticky traffic splits on a real server: TF Serving ``version_label``,
KServe version strings and ``RankRequest.version_label`` name labels; requests naming neither
follow the split (arm and version in the response metadata); ``traffic.toml`` rewritten under
load loses no call; a bad file keeps the last good one serving.

Versions differ in bias (v1: 0.0, v2: 1.0), so every answer shows which version scored it.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from serving import routing, testing
from serving.client import RankingClient
from serving.codec import encode_bytes
from serving.config import ServerOptions
from serving.routing import arm_of, choose, key_bytes
from serving.testing import ServerThread, reference_score, wait_until, write_linear_model
from serving.traffic import parse_traffic

BIAS = {1: 0.0, 2: 1.0}
LABELS = "[labels]\nstable = 1\ncanary = 2\nghost = 3\n"
SPLIT = LABELS + '[split]\nkey = "user"\nweights = { stable = 90, canary = 10 }\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("repo")
    for v, bias in BIAS.items():
        write_linear_model(root / "lin" / str(v), bias=bias)
    (root / "lin" / "traffic.toml").write_text(LABELS)  # read at start
    options = ServerOptions(policy="all", poll_interval_s=0.1, warmup_sizes=(1,))
    with ServerThread(root, options) as s:
        s.root = root
        yield s


def set_traffic(server, text: str) -> None:
    testing.set_traffic(server, server.root, "lin", text)


def _metric(server, name: str, labels: dict) -> float:
    return server.server.metrics.registry.get_sample_value(name, labels) or 0.0


def _route_metadata(call) -> tuple[str, str]:
    md = dict(call.initial_metadata())
    return md[routing.ARM_HEADER], md[routing.VERSION_HEADER]


def _predict_request(user: str = "u1", label: str = "") -> predict_pb2.PredictRequest:
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "lin"
    if label:
        req.model_spec.version_label = label
    req.inputs["user"].CopyFrom(tf.make_tensor_proto(np.array([user.encode()], dtype=object)))
    req.inputs["item"].CopyFrom(tf.make_tensor_proto(np.array([3], dtype=np.int64)))
    req.inputs["price"].CopyFrom(tf.make_tensor_proto(np.array([1.0], dtype=np.float32)))
    return req


def _infer_request(version: str, user: str = "u1") -> kserve_pb2.ModelInferRequest:
    req = kserve_pb2.ModelInferRequest(model_name="lin", model_version=version)
    req.inputs.add(name="user", datatype="BYTES", shape=[1])
    req.inputs.add(name="item", datatype="INT64", shape=[1])
    req.inputs.add(name="price", datatype="FP32", shape=[1])
    req.raw_input_contents.extend(
        [
            encode_bytes(np.array([user.encode()], dtype=object)),
            np.array([3], np.int64).tobytes(),
            np.array([1.0], np.float32).tobytes(),
        ]
    )
    return req


def test_tf_serving_version_label(server):
    set_traffic(server, LABELS)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.target))
    for label, version in (("canary", 2), ("stable", 1)):
        resp, call = stub.Predict.with_call(_predict_request(label=label), timeout=10)
        assert resp.model_spec.version.value == version
        score = tf.make_ndarray(resp.outputs["score"]).reshape(-1)
        np.testing.assert_allclose(score, [reference_score(BIAS[version], "u1", 3, 1.0)], 1e-6)
        assert _route_metadata(call) == (label, str(version))
    # no label, no split: the highest live version, no arm
    resp, call = stub.Predict.with_call(_predict_request(), timeout=10)
    assert resp.model_spec.version.value == 2 and _route_metadata(call) == ("", "2")


def test_tf_serving_metadata_and_status_by_label(server):
    set_traffic(server, LABELS)
    channel = grpc.insecure_channel(server.target)
    req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    req.model_spec.name, req.model_spec.version_label = "lin", "stable"
    meta = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(req)
    assert meta.model_spec.version.value == 1
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name, status.model_spec.version_label = "lin", "canary"
    resp = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status)
    assert [s.version for s in resp.model_version_status] == [2]


def test_kserve_version_string_is_a_label(server):
    set_traffic(server, LABELS)
    stub = kserve_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.target))
    for label, version in (("canary", 2), ("stable", 1)):
        resp, call = stub.ModelInfer.with_call(_infer_request(label), timeout=10)
        assert resp.model_version == str(version)
        names = [o.name for o in resp.outputs]
        score = np.frombuffer(resp.raw_output_contents[names.index("score")], np.float32)
        np.testing.assert_allclose(score, [reference_score(BIAS[version], "u1", 3, 1.0)], 1e-6)
        assert _route_metadata(call) == (label, str(version))
    assert stub.ModelReady(kserve_pb2.ModelReadyRequest(name="lin", version="stable")).ready
    assert not stub.ModelReady(kserve_pb2.ModelReadyRequest(name="lin", version="ghost")).ready
    meta = stub.ModelMetadata(kserve_pb2.ModelMetadataRequest(name="lin", version="canary"))
    assert meta.name == "lin"


def test_rank_request_version_label(server):
    set_traffic(server, LABELS)
    before = _metric(server, "stitchrec_arm_requests_total", {"model": "lin", "arm": "canary"})
    with RankingClient(server.target) as client:
        for label, version in (("canary", 2), ("stable", 1)):
            result = client.rank(
                "lin", {"user": "u2"}, {"item": [3, 5], "price": [1.0, 2.0]}, version_label=label
            )
            assert (result.version, result.arm) == (version, label)
            np.testing.assert_allclose(
                result.scores,
                [reference_score(BIAS[version], "u2", i, p) for i, p in ((3, 1.0), (5, 2.0))],
                1e-6,
            )
        with pytest.raises(grpc.RpcError) as err:
            client.rank(
                "lin", {"user": "u2"}, {"item": [3], "price": [1.0]}, version=1, version_label="x"
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "both set" in err.value.details()
    after = _metric(server, "stitchrec_arm_requests_total", {"model": "lin", "arm": "canary"})
    assert after == before + 1


def test_unknown_label_and_label_of_a_version_not_loaded(server):
    set_traffic(server, LABELS)
    channel = grpc.insecure_channel(server.target)
    predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    infer = kserve_grpc.GRPCInferenceServiceStub(channel)
    with RankingClient(server.target) as client:
        calls = [
            lambda label: predict.Predict(_predict_request(label=label), timeout=10),
            lambda label: infer.ModelInfer(_infer_request(label), timeout=10),
            lambda label: client.rank(
                "lin", {"user": "u1"}, {"item": [3], "price": [1.0]}, version_label=label
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call("beta")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert "model 'lin' has no version label 'beta'" in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                call("ghost")
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "label 'ghost' names version 3, which is not ready" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        predict.Predict(_predict_request(label="no label!"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_split_over_10000_keys_with_choose(server):
    set_traffic(server, SPLIT)

    async def arms() -> list[str]:
        state = server.server.state
        return [choose(state, "lin", None, None, f"user-{i}").arm for i in range(10_000)]

    got = server.call(arms())
    n, se = len(got), math.sqrt(10_000 * 0.1 * 0.9)
    assert abs(got.count("canary") - 0.1 * n) <= 3 * se
    assert set(got) == {"stable", "canary"}


def test_split_is_sticky_over_grpc_with_arm_metadata(server):
    set_traffic(server, SPLIT)
    split = parse_traffic(SPLIT).split
    users = [f"user-{i}" for i in range(30)]
    expected = {u: arm_of(split, key_bytes(u)) for u in users}
    assert "canary" in expected.values()
    version_of = {"stable": 1, "canary": 2}
    channel = grpc.insecure_channel(server.target)
    predict = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    infer = kserve_grpc.GRPCInferenceServiceStub(channel)
    with RankingClient(server.target) as client:
        for user in users:
            arm = expected[user]
            for _ in range(2):  # the same user, the same arm
                result = client.rank("lin", {"user": user}, {"item": [3], "price": [1.0]})
                assert (result.arm, result.version) == (arm, version_of[arm])
                np.testing.assert_allclose(
                    result.scores, [reference_score(BIAS[version_of[arm]], user, 3, 1.0)], 1e-6
                )
            _, call = predict.Predict.with_call(_predict_request(user), timeout=10)
            assert _route_metadata(call) == (arm, str(version_of[arm]))
            _, call = infer.ModelInfer.with_call(_infer_request("", user), timeout=10)
            assert _route_metadata(call) == (arm, str(version_of[arm]))
    # an explicit version wins over the split
    _, call = predict.Predict.with_call(_predict_request("user-0", "stable"), timeout=10)
    assert _route_metadata(call) == ("stable", "1")


def test_split_by_header(server):
    text = LABELS + '[split]\nkey = "header:x-user-id"\nweights = { stable = 50, canary = 50 }\n'
    set_traffic(server, text)
    split = parse_traffic(text).split
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.target))
    for i in range(10):
        arm = arm_of(split, f"h{i}".encode())
        _, call = stub.Predict.with_call(
            _predict_request("u9"), timeout=10, metadata=[("x-user-id", f"h{i}")]
        )
        assert _route_metadata(call)[0] == arm


def test_relabelling_under_load_loses_no_call(server):
    set_traffic(server, LABELS)
    stop = time.monotonic() + 2.5
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.target))

    def load() -> list[int]:
        seen = []
        while time.monotonic() < stop:
            resp = stub.Predict(_predict_request(label="stable"), timeout=10)
            v = resp.model_spec.version.value
            score = tf.make_ndarray(resp.outputs["score"]).reshape(-1)
            np.testing.assert_allclose(score, [reference_score(BIAS[v], "u1", 3, 1.0)], 1e-6)
            seen.append(v)
        return seen

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(load) for _ in range(4)]
        time.sleep(0.8)
        set_traffic(server, "[labels]\nstable = 2\ncanary = 1\n")
        seen = [v for f in futures for v in f.result()]  # any failed call raises here
    assert seen[0] == 1 and seen[-1] == 2 and set(seen) == {1, 2}
    _, call = stub.Predict.with_call(_predict_request(label="canary"), timeout=10)
    assert _route_metadata(call) == ("canary", "1")


def test_bad_traffic_toml_keeps_the_last_good_one(server):
    set_traffic(server, LABELS)
    state = server.server.state
    before = _metric(server, "stitchrec_traffic_config_errors_total", {"model": "lin"})
    testing.write_atomic(
        server.root / "lin" / "traffic.toml", "[labels]\nstable = 1\ncanary = -2\n"
    )
    wait_until(lambda: "lin" in state.traffic.errors, timeout=10)
    assert "labels.canary is -2" in state.traffic.errors["lin"]
    assert _metric(server, "stitchrec_traffic_config_errors_total", {"model": "lin"}) == before + 1
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.target))
    resp = stub.Predict(_predict_request(label="canary"), timeout=10)
    assert resp.model_spec.version.value == 2
    testing.write_atomic(server.root / "lin" / "traffic.toml", LABELS)
    wait_until(lambda: "lin" not in state.traffic.errors, timeout=10)
