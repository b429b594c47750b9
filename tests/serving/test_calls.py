"""Call observers: every scored call (Rank, TF Serving Predict, KServe ModelInfer) reaches them
with its request id, model version, checked features and outputs; an observer that raises does
not fail the call."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from protos import grpc_service_pb2 as kserve_pb2
from protos import grpc_service_pb2_grpc as kserve_grpc
from protos import ranking_service_pb2_grpc as rank_grpc
from serving.calls import MAX_REQUEST_ID_CHARS, CallObservers, ScoredCall, clean_request_id
from serving.client import make_request
from serving.codec import encode_bytes
from serving.config import ServerOptions
from serving.testing import ServerThread, reference_score, write_linear_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "3", bias=0.5)
    with ServerThread(root, ServerOptions()) as s:
        seen: list[ScoredCall] = []

        def broken(call: ScoredCall) -> None:
            raise RuntimeError("observer failure")

        s.server.state.observers.add(broken)
        s.server.state.observers.add(seen.append)
        s.seen = seen
        yield s


def _last(server) -> ScoredCall:
    assert server.seen, "no scored call reached the observers"
    return server.seen[-1]


def test_rank_call_reaches_observers_with_client_request_id(server):
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(server.target))
    req = make_request("lin", {"user": "u1"}, {"item": [3, 4], "price": [1.0, 2.0]})
    resp = stub.Rank(req, timeout=10, metadata=[("x-request-id", "req-42")])
    np.testing.assert_allclose(
        sorted(resp.scores, reverse=True),
        sorted(
            [reference_score(0.5, "u1", 3, 1.0), reference_score(0.5, "u1", 4, 2.0)],
            reverse=True,
        ),
        rtol=1e-6,
    )
    call = _last(server)
    assert (call.request_id, call.protocol, call.model, call.version) == (
        "req-42",
        "grpc",
        "lin",
        3,
    )
    assert call.signature == "serving_default" and not call.shadow and call.arm == ""
    assert list(call.features["user"]) == [b"u1", b"u1"]  # the user feature repeated
    np.testing.assert_array_equal(call.features["item"], [3, 4])
    np.testing.assert_allclose(
        np.reshape(call.outputs["score"], -1),
        [reference_score(0.5, "u1", 3, 1.0), reference_score(0.5, "u1", 4, 2.0)],
        rtol=1e-6,
    )


def test_predict_and_model_infer_reach_observers_with_fresh_ids(server):
    channel = grpc.insecure_channel(server.target)
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "lin"
    req.inputs["user"].CopyFrom(tf.make_tensor_proto(np.array([b"u2"], dtype=object)))
    req.inputs["item"].CopyFrom(tf.make_tensor_proto(np.array([7], dtype=np.int64)))
    req.inputs["price"].CopyFrom(tf.make_tensor_proto(np.array([-1.0], dtype=np.float32)))
    prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(req, timeout=10)
    first = _last(server)
    assert first.version == 3 and len(first.request_id) == 32
    np.testing.assert_allclose(
        np.reshape(first.outputs["score"], -1), [reference_score(0.5, "u2", 7, -1.0)], rtol=1e-6
    )

    infer = kserve_pb2.ModelInferRequest(model_name="lin")
    infer.inputs.add(name="user", datatype="BYTES", shape=[1])
    infer.inputs.add(name="item", datatype="INT64", shape=[1])
    infer.inputs.add(name="price", datatype="FP32", shape=[1])
    infer.raw_input_contents.extend(
        [
            encode_bytes(np.array([b"u1"], dtype=object)),
            np.array([3], np.int64).tobytes(),
            np.array([0.0], np.float32).tobytes(),
        ]
    )
    kserve_grpc.GRPCInferenceServiceStub(channel).ModelInfer(infer, timeout=10)
    second = _last(server)
    assert second.request_id != first.request_id and len(second.request_id) == 32
    assert list(second.features["user"]) == [b"u1"]


def test_failed_call_reaches_no_observer(server):
    before = len(server.seen)
    stub = rank_grpc.RankingServiceStub(grpc.insecure_channel(server.target))
    with pytest.raises(grpc.RpcError) as err:
        stub.Rank(make_request("lin", {"user": "u1"}, {"item": [3]}), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(server.seen) == before


@pytest.mark.parametrize(
    "given,kept",
    [
        ("abc-123", True),
        (b"abc", True),
        ("", False),
        (None, False),
        ("has space", False),
        ("x" * (MAX_REQUEST_ID_CHARS + 1), False),
        ("é", False),
    ],
)
def test_clean_request_id(given, kept):
    out = clean_request_id(given)
    if kept:
        assert out == (given.decode() if isinstance(given, bytes) else given)
    else:
        assert len(out) == 32 and all(c in "0123456789abcdef" for c in out)


def test_observers_run_in_order_and_survive_a_failure():
    seen: list[str] = []
    obs = CallObservers()
    assert not obs
    obs.add(lambda c: seen.append("a"))
    obs.add(lambda c: (_ for _ in ()).throw(ValueError("x")))
    obs.add(lambda c: seen.append("c"))
    call = ScoredCall("r", 0.0, "grpc", "m", 1, "serving_default", "", False, {}, {})
    obs.notify(call)
    assert seen == ["a", "c"]
