"""Version labels, sticky splits and tracing over HTTP: TF Serving REST ``/labels/{l}``, KServe
v2 version strings and ``/v1/rank``'s ``label`` name labels; calls naming neither follow the
split (by a header or by a feature), the arm and version in the response headers; a client's
``traceparent`` continues into the server's spans.

Versions differ in bias (v1: 0.0, v2: 1.0), so every answer shows which version scored it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from serving import testing, tracing
from serving.config import ServerOptions
from serving.routing import arm_of, key_bytes
from serving.testing import ServerThread, reference_score, write_linear_model
from serving.traffic import parse_traffic

BIAS = {1: 0.0, 2: 1.0}
LABELS = "[labels]\nstable = 1\ncanary = 2\nghost = 3\n"
BY_USER = LABELS + '[split]\nkey = "user"\nweights = { stable = 50, canary = 50 }\n'
BY_HEADER = LABELS + '[split]\nkey = "header:x-user-id"\nweights = { stable = 50, canary = 50 }\n'
ROW = {"user": "u1", "item": 3, "price": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("repo")
    for v, bias in BIAS.items():
        write_linear_model(root / "lin" / str(v), bias=bias)
    options = ServerOptions(policy="all", poll_interval_s=0.1, warmup_sizes=(1,), http_port=0)
    with ServerThread(root, options) as s:
        s.root = root
        s.url = f"http://127.0.0.1:{s.server.http_port}"
        yield s


def set_traffic(server, text: str) -> None:
    testing.set_traffic(server, server.root, "lin", text)


def _score(version: int, user: str = "u1") -> float:
    return reference_score(BIAS[version], user, 3, 1.0)


def _expected_arm(text: str, user: str) -> str:
    return arm_of(parse_traffic(text).split, key_bytes(user))


def test_tf_serving_rest_label_path(server):
    set_traffic(server, LABELS)
    for label, version in (("canary", 2), ("stable", 1)):
        r = requests.post(
            f"{server.url}/v1/models/lin/labels/{label}:predict", json={"instances": [ROW]}
        )
        assert r.status_code == 200, r.text
        assert r.headers["X-StitchRec-Arm"] == label
        assert r.headers["X-StitchRec-Version"] == str(version)
        np.testing.assert_allclose(r.json()["predictions"][0]["score"], _score(version), 1e-6)
    r = requests.get(f"{server.url}/v1/models/lin/labels/stable")
    assert [s["version"] for s in r.json()["model_version_status"]] == ["1"]
    r = requests.post(f"{server.url}/v1/models/lin/labels/nope:predict", json={"instances": [ROW]})
    assert r.status_code == 404 and "has no version label 'nope'" in r.json()["error"]
    r = requests.post(f"{server.url}/v1/models/lin/labels/ghost:predict", json={"instances": [ROW]})
    assert r.status_code == 503 and "version 3" in r.json()["error"]


def test_kserve_rest_version_string_is_a_label(server):
    set_traffic(server, LABELS)
    body = {
        "inputs": [
            {"name": "user", "shape": [1], "datatype": "BYTES", "data": ["u1"]},
            {"name": "item", "shape": [1], "datatype": "INT64", "data": [3]},
            {"name": "price", "shape": [1], "datatype": "FP32", "data": [1.0]},
        ]
    }
    r = requests.post(f"{server.url}/v2/models/lin/versions/canary/infer", json=body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    np.testing.assert_allclose(out["score"]["data"], [_score(2)], 1e-6)
    assert r.headers["X-StitchRec-Arm"] == "canary"
    assert requests.get(f"{server.url}/v2/models/lin/versions/stable/ready").status_code == 200


def test_split_by_feature_is_sticky_over_every_http_api(server):
    set_traffic(server, BY_USER)
    users = [f"user-{i}" for i in range(24)]
    arms = {u: _expected_arm(BY_USER, u) for u in users}
    assert set(arms.values()) == {"stable", "canary"}  # both arms get users
    version = {"stable": 1, "canary": 2}
    for u in users:
        for _ in range(2):  # the same user lands in the same arm every time
            r = requests.post(
                f"{server.url}/v1/models/lin:predict", json={"instances": [{**ROW, "user": u}]}
            )
            assert r.headers["X-StitchRec-Arm"] == arms[u], r.text
            want = _score(version[arms[u]], u)
            np.testing.assert_allclose(r.json()["predictions"][0]["score"], want, 1e-6)
        r = requests.post(
            f"{server.url}/v1/rank/lin",
            json={"user": {"user": u}, "candidates": {"item": [3], "price": [1.0]}},
        )
        assert r.headers["X-StitchRec-Arm"] == arms[u], r.text
        assert r.json()["model_version"] == version[arms[u]]
        infer = {
            "inputs": [
                {"name": "user", "shape": [1], "datatype": "BYTES", "data": [u]},
                {"name": "item", "shape": [1], "datatype": "INT64", "data": [3]},
                {"name": "price", "shape": [1], "datatype": "FP32", "data": [1.0]},
            ]
        }
        r = requests.post(f"{server.url}/v2/models/lin/infer", json=infer)
        assert r.headers["X-StitchRec-Arm"] == arms[u]
        assert r.json()["model_version"] == str(version[arms[u]])


def test_split_by_header(server):
    set_traffic(server, BY_HEADER)
    for u in ("a", "b", "c", "d", "e", "f"):
        r = requests.post(
            f"{server.url}/v1/models/lin:predict",
            json={"instances": [ROW]},
            headers={"X-User-Id": u},
        )
        assert r.headers["X-StitchRec-Arm"] == _expected_arm(BY_HEADER, u)


def test_http_trace_continues_and_access_log_has_ids(server):
    spans = InMemorySpanExporter()
    tracing.install(spans)
    try:
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        r = requests.post(
            f"{server.url}/v1/models/lin/versions/1:predict",
            json={"instances": [ROW]},
            headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"},
        )
        assert r.status_code == 200
        assert r.headers["traceparent"].startswith(f"00-{trace_id}-")
        assert tracing.flush()
        names = {
            s.name for s in spans.get_finished_spans() if s.context.trace_id == int(trace_id, 16)
        }
        assert {"stitchrec.call", "decode", "inference"} <= names
    finally:
        tracing.shutdown()
    r = requests.post(f"{server.url}/v1/models/lin/versions/1:predict", json={"instances": [ROW]})
    assert "traceparent" not in r.headers  # tracing off again
