"""Shadow traffic on a real server: primary answers are the primary version's, the mirrored
rows reach the observers with ``shadow=True`` and the shadow version, a tiny shadow queue
flooded by calls drops and counts, and a shadow that fails is counted, never answered.

The primary (label ``stable``, v1) has bias 0.0, the shadow (``canary``, v2) bias 1.0; the
split sends every call to ``stable`` (``canary`` has weight 0: a dark launch).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving import testing
from serving.calls import ScoredCall
from serving.client import RankingClient, make_request
from serving.config import ServerOptions
from serving.shadow import mirrored
from serving.testing import ServerThread, reference_score, wait_until, write_linear_model

BIAS = {1: 0.0, 2: 1.0}
BASE = (
    "[labels]\nstable = 1\ncanary = 2\n"
    '[split]\nkey = "user"\nweights = { stable = 100, canary = 0 }\n'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("repo")
    for v, bias in BIAS.items():
        write_linear_model(root / "shd" / str(v), bias=bias)
    (root / "shd" / "traffic.toml").write_text(BASE)  # read at start
    options = ServerOptions(policy="all", poll_interval_s=0.1, warmup_sizes=(1,))
    with ServerThread(root, options) as s:
        s.root = root
        s.seen: list[ScoredCall] = []
        s.server.state.observers.add(s.seen.append)
        yield s


def set_traffic(server, text: str) -> None:
    testing.set_traffic(server, server.root, "shd", text)


def _count(server, outcome: str) -> float:
    labels = {"model": "shd", "outcome": outcome}
    return server.server.metrics.registry.get_sample_value("stitchrec_shadow_total", labels) or 0


def _idle(server) -> None:
    wait_until(lambda: server.server.state.shadow.pending("shd") == 0, timeout=20)


def _rank(client: RankingClient, user: str, request_id: str):
    return client.stub.Rank.with_call(
        _request(user), timeout=10, metadata=[("x-request-id", request_id)]
    )[0]


def _request(user: str):
    return make_request("shd", {"user": user}, {"item": [3, 4], "price": [1.0, 2.0]})


def _reference(version: int, user: str) -> list[float]:
    return [reference_score(BIAS[version], user, i, p) for i, p in ((3, 1.0), (4, 2.0))]


def test_shadow_never_changes_the_answer_and_reaches_the_observers(server):
    set_traffic(server, BASE + '[shadow]\nlabel = "canary"\nmax_share = 1.0\n')
    _idle(server)
    scored = _count(server, "scored")
    ids = [f"shadow-a-{i}" for i in range(6)]
    with RankingClient(server.target) as client:
        for i, rid in enumerate(ids):
            resp = _rank(client, f"u{i % 2}", rid)
            assert resp.model_version == 1
            np.testing.assert_allclose(resp.scores, _reference(1, f"u{i % 2}"), rtol=1e-6)
    _idle(server)
    assert _count(server, "scored") == scored + len(ids)
    rows = {c.request_id: c for c in server.seen if c.shadow and c.request_id in ids}
    primary = {c.request_id: c for c in server.seen if not c.shadow and c.request_id in ids}
    assert set(rows) == set(ids) == set(primary)
    for i, rid in enumerate(ids):
        shadow, first = rows[rid], primary[rid]
        assert (shadow.version, shadow.model, shadow.arm) == (2, "shd", "stable")
        assert (first.version, first.arm) == (1, "stable")
        assert shadow.timestamp == first.timestamp and shadow.protocol == "grpc"
        np.testing.assert_allclose(
            np.reshape(shadow.outputs["score"], -1), _reference(2, f"u{i % 2}"), rtol=1e-6
        )
        np.testing.assert_array_equal(shadow.features["item"], [3, 4])


def test_predict_calls_are_mirrored_too(server):
    set_traffic(server, BASE + "[shadow]\nversion = 2\nmax_share = 1.0\n")
    req = predict_pb2.PredictRequest()
    req.model_spec.name = "shd"
    req.inputs["user"].CopyFrom(tf.make_tensor_proto(np.array([b"u1"], dtype=object)))
    req.inputs["item"].CopyFrom(tf.make_tensor_proto(np.array([3], dtype=np.int64)))
    req.inputs["price"].CopyFrom(tf.make_tensor_proto(np.array([1.0], dtype=np.float32)))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.target))
    resp = stub.Predict(req, timeout=10, metadata=[("x-request-id", "shadow-predict")])
    score = tf.make_ndarray(resp.outputs["score"]).reshape(-1)
    np.testing.assert_allclose(score, [reference_score(0.0, "u1", 3, 1.0)], rtol=1e-6)
    _idle(server)
    rows = [c for c in server.seen if c.shadow and c.request_id == "shadow-predict"]
    assert [r.version for r in rows] == [2]
    np.testing.assert_allclose(
        np.reshape(rows[0].outputs["score"], -1), [reference_score(1.0, "u1", 3, 1.0)], 1e-6
    )


def test_fraction_mirrors_the_calls_drawn_by_request_id(server):
    set_traffic(server, BASE + '[shadow]\nlabel = "canary"\nfraction = 0.5\nmax_share = 1.0\n')
    ids = [f"shadow-f-{i}" for i in range(20)]
    with RankingClient(server.target) as client:
        for rid in ids:
            _rank(client, "u1", rid)
    _idle(server)
    got = {c.request_id for c in server.seen if c.shadow and c.request_id in ids}
    want = {rid for rid in ids if mirrored(rid, 0.5)}
    assert got == want and 0 < len(want) < len(ids)


def test_a_flooded_tiny_queue_drops_and_counts_instead_of_waiting(server):
    set_traffic(server, BASE + '[shadow]\nlabel = "canary"\nqueue = 1\n')
    _idle(server)
    before = {o: _count(server, o) for o in ("scored", "dropped", "failed")}
    n = 48
    with RankingClient(server.target) as client:

        def one(i: int) -> None:
            resp = _rank(client, "u1", f"shadow-flood-{i}")
            assert resp.model_version == 1
            np.testing.assert_allclose(resp.scores, _reference(1, "u1"), rtol=1e-6)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(n)))
    _idle(server)
    after = {o: _count(server, o) - before[o] for o in before}
    assert after["dropped"] >= 1 and after["failed"] == 0
    assert after["scored"] + after["dropped"] == n


def test_a_failing_shadow_is_counted_and_never_answered(server):
    set_traffic(server, BASE + "[shadow]\nversion = 9\n")  # not on disk
    failed = _count(server, "failed")
    with RankingClient(server.target) as client:
        resp = _rank(client, "u1", "shadow-fail")
    np.testing.assert_allclose(resp.scores, _reference(1, "u1"), rtol=1e-6)
    wait_until(lambda: _count(server, "failed") == failed + 1, timeout=10)
    assert not [c for c in server.seen if c.shadow and c.request_id == "shadow-fail"]


def test_the_shadow_pauses_to_stay_within_its_share(server):
    """After a mirrored call that took t seconds the shadow waits t * (1 - s) / s."""
    shadow = server.server.state.shadow
    set_traffic(server, BASE + '[shadow]\nlabel = "canary"\nmax_share = 0.05\n')
    assert shadow._pause("shd", 0.01) == pytest.approx(0.19)
    set_traffic(server, BASE + '[shadow]\nlabel = "canary"\nmax_share = 0.25\n')
    assert shadow._pause("shd", 0.02) == pytest.approx(0.06)
    set_traffic(server, BASE + '[shadow]\nlabel = "canary"\nmax_share = 1.0\n')
    assert shadow._pause("shd", 0.5) == 0.0
    set_traffic(server, BASE + '[shadow]\nlabel = "canary"\n')  # the default: 5%
    assert shadow._pause("shd", 0.01) == pytest.approx(0.19)
    assert shadow._pause("no-such-model", 0.01) == 0.0
