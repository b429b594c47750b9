"""Requests that would make the server allocate far more than their size, or hold its event
loop, answered at once with a status; small faults of the wire formats (a real server on
127.0.0.1:0, the hand-checkable linear model of ``serving.testing``)."""

from __future__ import annotations

import struct
import threading
import time
import tracemalloc

import grpc
import numpy as np
import pytest
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from protos import ranking_service_pb2 as rank_pb2
from protos import ranking_service_pb2_grpc as rank_grpc
from serving.codec import decode_bytes, encode_bytes
from serving.config import Limits, ServerOptions
from serving.inference import ServingError
from serving.testing import ServerThread, write_linear_model

MB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "1", bias=0.0)
    with ServerThread(root, ServerOptions(max_message_bytes=96 * MB)) as s:
        yield s


@pytest.fixture(scope="module")
def channel(server):
    options = [("grpc.max_send_message_length", 96 * MB)]
    with grpc.insecure_channel(server.target, options=options) as ch:
        yield ch


def _call_measured(fn):
    """``fn()``'s gRPC error and the peak bytes Python and numpy allocated meanwhile (the
    server runs in this process, so its allocations are traced too)."""
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(grpc.RpcError) as e:
            fn()
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return e.value, peak, seconds


def _predict_request(model: str, shape: list[int]) -> predict_pb2.PredictRequest:
    """The 38-byte request: one float value declared to fill ``shape``."""
    req = predict_pb2.PredictRequest()
    req.model_spec.name = model
    tp = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
    for d in shape:
        tp.tensor_shape.dim.add(size=d)
    tp.float_val.append(1.0)
    req.inputs["price"].CopyFrom(tp)
    return req


@pytest.mark.parametrize(
    "model,code,text",
    [
        ("nope", grpc.StatusCode.NOT_FOUND, "unknown model 'nope'"),
        ("lin", grpc.StatusCode.INVALID_ARGUMENT, "missing feature(s) ['item', 'user']"),
    ],
)
def test_tiny_predict_declaring_a_huge_tensor_allocates_nothing(channel, model, code, text):
    req = _predict_request(model, [250_000_000])
    assert len(req.SerializeToString()) < 64
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    err, peak, _ = _call_measured(lambda: stub.Predict(req, timeout=30))
    assert err.code() == code
    assert text in err.details()
    assert peak < 16 * MB, peak


def test_predict_tensor_element_limit_and_fill_limit(channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    req = _predict_request("lin", [250_000_000])
    for name, dt in (("user", types_pb2.DT_STRING), ("item", types_pb2.DT_INT64)):
        req.inputs[name].dtype = dt
        req.inputs[name].tensor_shape.dim.add(size=1)
    req.inputs["user"].string_val.append(b"u1")
    req.inputs["item"].int64_val.append(3)
    err, peak, _ = _call_measured(lambda: stub.Predict(req, timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "declares more than 1000000 elements" in err.details()
    assert peak < 16 * MB, peak
    # one 512 KiB string declared to fill 1,000 elements: 512 MB once filled
    req = _predict_request("lin", [1000])
    req.inputs["item"].CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64))
    req.inputs["item"].tensor_shape.dim.add(size=1000)
    req.inputs["item"].int64_val.append(3)
    user = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING)
    user.tensor_shape.dim.add(size=1000)
    user.string_val.append(b"x" * (512 * 1024))
    req.inputs["user"].CopyFrom(user)
    err, peak, _ = _call_measured(lambda: stub.Predict(req, timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "repeating the last one" in err.details()
    assert peak < 32 * MB, peak


def _rank_request(user: bytes, n: int) -> rank_pb2.RankRequest:
    req = rank_pb2.RankRequest(model_name="lin")
    req.user_features["user"].bytes_list.value.append(user)
    req.candidate_features["item"].int64_list.value.extend(range(n))
    req.candidate_features["price"].float_list.value.extend([0.5] * n)
    return req


@pytest.mark.parametrize(
    "user_bytes,candidates,text",
    [
        (4 * MB, 200, "the server accepts at most 1048576 bytes per value"),
        (512 * 1024, 1000, "repeated over 1000 candidates they would take 524288000 bytes"),
    ],
)
def test_rank_user_features_are_not_repeated_past_the_limit(channel, user_bytes, candidates, text):
    stub = rank_grpc.RankingServiceStub(channel)
    req = _rank_request(b"u" * user_bytes, candidates)
    err, peak, _ = _call_measured(lambda: stub.Rank(req, timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in err.details()
    # the request itself is parsed (and copied once or twice); no per-candidate copy
    assert peak < 3 * len(req.SerializeToString()) + 16 * MB, peak
    ok = stub.Rank(_rank_request(b"u1", candidates), timeout=30)
    assert len(ok.scores) == candidates


def test_rank_under_the_broadcast_limit_is_served(channel):
    stub = rank_grpc.RankingServiceStub(channel)
    r = stub.Rank(_rank_request(b"u" * 1000, 3000), timeout=30)
    assert len(r.scores) == 3000


def _kserve(shape: list[int], version: str = "") -> kserve_pb2.ModelInferRequest:
    req = kserve_pb2.ModelInferRequest(model_name="lin", model_version=version)
    req.inputs.add(name="user", datatype="BYTES", shape=shape)
    req.inputs.add(name="item", datatype="INT64", shape=[1])
    req.inputs.add(name="price", datatype="FP32", shape=[1])
    req.raw_input_contents.extend(
        [b"", np.array([3], "<i8").tobytes(), np.array([0.5], "<f4").tobytes()]
    )
    return req


def test_kserve_shape_whose_count_overflows_int64_is_invalid_argument(channel):
    stub = kserve_grpc.GRPCInferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(_kserve([2**32, 2**32]), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "declares more than 1000000 elements" in e.value.details()


@pytest.mark.parametrize("version", ["1_0", " 1 ", "+1", "١"])
def test_kserve_version_must_be_plain_digits(channel, version):
    stub = kserve_grpc.GRPCInferenceServiceStub(channel)
    req = _kserve([1], version)
    req.raw_input_contents[0] = struct.pack("<I", 2) + b"u1"
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a positive integer" in e.value.details()
    req.model_version = "1"
    assert stub.ModelInfer(req, timeout=30).model_version == "1"


def test_undecodable_request_is_invalid_argument_and_counted(server, channel):
    garbage = channel.unary_unary(
        "/tensorflow.serving.PredictionService/Predict",
        request_serializer=None,
        response_deserializer=None,
    )
    registry = server.server.metrics.registry
    labels = {"method": "Predict", "code": "INVALID_ARGUMENT"}
    before = registry.get_sample_value("stitchrec_requests_total", labels) or 0.0
    with pytest.raises(grpc.RpcError) as e:
        garbage(b"\xff\xff\xff\xff", timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid PredictRequest message" in e.value.details()
    assert registry.get_sample_value("stitchrec_requests_total", labels) == before + 1


def test_error_messages_are_bounded_and_name_no_paths(server, channel):
    stub = rank_grpc.RankingServiceStub(channel)
    req = _rank_request(b"u1", 2)
    for i in range(2000):
        req.candidate_features[f"unknown_feature_{i:04d}" * 4].int64_list.value.extend([1, 2])
    with pytest.raises(grpc.RpcError) as e:
        stub.Rank(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "and 1990 more" in e.value.details()
    assert len(e.value.details()) <= 1100
    with pytest.raises(grpc.RpcError) as e:
        stub.Rank(rank_pb2.RankRequest(model_name="x" * 5000), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "more characters)" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Rank(rank_pb2.RankRequest(model_name="nope"), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "unknown model 'nope'; the server serves ['lin']"


def test_health_answers_while_a_big_request_is_decoded(server, channel):
    # 900,000 strings of different lengths (under max_tensor_elements, so they are decoded):
    # the element-by-element decoder, then the row limit refuses the request
    n = 900_000
    values = np.array([b"u1", b"u22"] * (n // 2), dtype=object)
    req = _kserve([n])
    req.inputs[1].shape[:] = [n]
    req.inputs[2].shape[:] = [n]
    req.raw_input_contents[:] = [
        encode_bytes(values),
        np.full(n, 3, "<i8").tobytes(),
        np.full(n, 0.5, "<f4").tobytes(),
    ]
    stub = kserve_grpc.GRPCInferenceServiceStub(channel)
    live = kserve_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.target))
    assert live.ServerLive(kserve_pb2.ServerLiveRequest(), timeout=30).live
    done = threading.Event()
    result: dict = {}

    def big() -> None:
        t0 = time.perf_counter()
        try:
            stub.ModelInfer(req, timeout=120)
        except grpc.RpcError as e:
            result["error"] = e.code()
            result["details"] = e.details()
        result["seconds"] = time.perf_counter() - t0
        done.set()

    worker = threading.Thread(target=big)
    worker.start()
    waits = []
    while not done.is_set():
        t0 = time.perf_counter()
        live.ServerLive(kserve_pb2.ServerLiveRequest(), timeout=60)
        waits.append(time.perf_counter() - t0)
        time.sleep(0.01)
    worker.join()
    assert result["error"] == grpc.StatusCode.INVALID_ARGUMENT, result
    assert "900000 examples in one request" in result["details"], result  # after decoding
    assert len(waits) >= 3, (waits, result)
    assert max(waits) < result["seconds"] / 2, (max(waits), result["seconds"])


def test_decode_bytes_equal_lengths_and_mixed_lengths_agree():
    for values in (
        [b"ab\x00", b"cd\x00", b"\x00\x00\x00"],  # equal lengths, trailing NULs kept
        [b"", b"", b""],
        [b"a", b"bcd", b""],
    ):
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        out = decode_bytes(encode_bytes(arr), len(values), "t")
        assert out.dtype == object and out.shape == (len(values),)
        assert list(out) == values
    with pytest.raises(ServingError, match="at most 4 bytes per value"):
        decode_bytes(
            encode_bytes(np.array([b"12345", b"12345"], object)), 2, "t", Limits(max_string_bytes=4)
        )
    with pytest.raises(ServingError, match="at most 4 bytes per value"):
        decode_bytes(
            encode_bytes(np.array([b"1", b"12345"], object)), 2, "t", Limits(max_string_bytes=4)
        )


@pytest.mark.parametrize(
    "field,value",
    [("max_tensor_elements", 0), ("max_string_bytes", True), ("max_message_chars", 10)],
)
def test_limits_validate(field, value):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})
