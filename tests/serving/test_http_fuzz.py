"""The HTTP side under bad input: malformed JSON, wrong types, huge declared shapes, huge and
chunked bodies, wrong base64, wrong binary headers and random byte flips. Every answer is a JSON
error with a 4xx code (no 500), nothing large is allocated, and the server answers after."""

from __future__ import annotations

import gzip
import json
import random
import re
import socket
import time
from pathlib import Path

import pytest
import requests

from serving.config import Limits, ServerOptions
from serving.testing import ServerThread, write_linear_model

MAX_BODY = 64 * 1024
GOOD_KSERVE = {
    "inputs": [
        {"name": "user", "shape": [2], "datatype": "BYTES", "data": ["u1", "u2"]},
        {"name": "item", "shape": [2], "datatype": "INT64", "data": [3, 1]},
        {"name": "price", "shape": [2], "datatype": "FP32", "data": [0.5, 1.0]},
    ]
}
GOOD_TFS = {"instances": [{"user": "u1", "item": 3, "price": 0.5}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "1", bias=0.0)
    opts = ServerOptions(
        http_port=0,
        warmup_sizes=(1,),
        max_message_bytes=MAX_BODY,
        max_inflight=1,
        retry_after_ms=1500,
        limits=Limits(max_request_rows=1000, max_tensor_elements=10_000),
    )
    with ServerThread(root, opts) as s:
        yield s


@pytest.fixture(scope="module")
def url(server):
    return f"http://127.0.0.1:{server.server.http_port}"


def _check(r: requests.Response, *codes: int) -> dict:
    assert r.status_code in codes, (r.status_code, r.text[:300])
    body = r.json()
    if r.status_code >= 400:
        assert set(body) == {"error"} and isinstance(body["error"], str)
    return body


def _kserve(**change) -> dict:
    body = json.loads(json.dumps(GOOD_KSERVE))
    body["inputs"][2].update(change)
    return body


BAD_BODIES = [
    b"",
    b"{",
    b"\xff\xfe\x00",
    b"[]",
    b"null",
    b'{"instances": 5}',
    b'{"instances": []}',
    b'{"instances": [{"user": "u1", "item": 3, "price": 0.5}], "inputs": {}}',
    b'{"instances": [{"user": "u1", "item": 3}, {"user": "u1", "item": 3, "price": 1}]}',
    b'{"instances": [{"user": true, "item": 3, "price": 0.5}]}',
    b'{"instances": [{"user": "u1", "item": 2.5, "price": 0.5}]}',
    b'{"instances": [{"user": "u1", "item": 3, "price": "x"}]}',
    b'{"instances": [{"user": "u1", "item": 1180591620717411303424, "price": 0.5}]}',
    b'{"instances": [{"user": "u1", "item": 3, "price": NaN}]}',
    b'{"instances": [{"user": ["u1", ["u2"]], "item": 3, "price": 0.5}]}',
    b'{"instances": [{"user": {"b64": "!!!"}, "item": 3, "price": 0.5}]}',
    b'{"instances": [{"user": {"b64": 5}, "item": 3, "price": 0.5}]}',
    b'{"instances": [{"user": {"b64": "aGk=", "x": 1}, "item": 3, "price": 0.5}]}',
    b'{"instances": [1, 2]}',
    b'{"signature_name": 7, "instances": [1]}',
    b"[" * 100_000 + b"]" * 100_000,
]


def test_tf_serving_bad_bodies(url):
    for body in BAD_BODIES:
        _check(requests.post(f"{url}/v1/models/lin:predict", data=body), 400, 413)


@pytest.mark.parametrize(
    "change",
    [
        {"shape": [1_000_000_000]},
        {"shape": [2**62, 2**62]},
        {"shape": [-1]},
        {"shape": "2"},
        {"shape": [2.0]},
        {"datatype": "FP128"},
        {"data": [0.5]},
        {"data": ["a", "b"]},
        {"data": [[0.5], [1.0, 2.0]]},
        {"parameters": {"binary_data_size": 8}},
        {"parameters": {"binary_data_size": -1}},
        {"parameters": {"shared_memory_region": "r"}},
        {"parameters": 3},
        {"name": 5},
        {"name": "user"},
        {"datatype": "INT8", "data": [300, 1]},
    ],
)
def test_kserve_bad_tensors(url, change):
    _check(requests.post(f"{url}/v2/models/lin/infer", json=_kserve(**change)), 400)


@pytest.mark.parametrize("header", ["abc", "-1", "99999", "1"])
def test_kserve_wrong_header_length(url, header):
    body = json.dumps(GOOD_KSERVE).encode()
    r = requests.post(
        f"{url}/v2/models/lin/infer", data=body, headers={"Inference-Header-Content-Length": header}
    )
    _check(r, 400)


def test_kserve_binary_sizes_must_match_the_body(url):
    head = json.dumps(_kserve(parameters={"binary_data_size": 8}, data=None)).encode()
    for tail in (b"\0" * 4, b"\0" * 12):  # too short, bytes left over
        r = requests.post(
            f"{url}/v2/models/lin/infer",
            data=head + tail,
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
        _check(r, 400)


def test_huge_and_chunked_bodies(url):
    big = b" " * (MAX_BODY + 1)
    _check(requests.post(f"{url}/v1/models/lin:predict", data=big), 413)

    def chunks(total: int):
        for _ in range(total // 1024):
            yield b" " * 1024

    _check(requests.post(f"{url}/v1/models/lin:predict", data=chunks(2 * MAX_BODY)), 413)
    good = json.dumps(GOOD_TFS).encode()
    r = requests.post(f"{url}/v1/models/lin:predict", data=iter([good[:5], good[5:]]))
    assert _check(r, 200)["predictions"][0]["score"] > 0


def test_compressed_bodies(url):
    good = json.dumps(GOOD_TFS).encode()
    predict = f"{url}/v1/models/lin:predict"
    for encoding in ("gzip", "deflate"):  # not the compression the header names: 400, not 500
        body = _check(
            requests.post(predict, data=b"xx", headers={"Content-Encoding": encoding}), 400
        )
        assert f"could not be decoded as {encoding}" in json.dumps(body)
    body = _check(requests.post(predict, data=good, headers={"Content-Encoding": "br"}), 415)
    assert "Content-Encoding 'br' is not supported" in json.dumps(body)
    r = requests.post(predict, data=gzip.compress(good), headers={"Content-Encoding": "gzip"})
    assert _check(r, 200)["predictions"][0]["score"] > 0


def test_random_byte_flips_never_crash(url):
    rng = random.Random(7)
    targets = [
        ("/v2/models/lin/infer", json.dumps(GOOD_KSERVE).encode()),
        ("/v1/models/lin:predict", json.dumps(GOOD_TFS).encode()),
        (
            "/v1/rank/lin",
            b'{"user": {"user": "u1"}, "candidates": {"item": [3, 1], "price": [0.5, 1.0]}}',
        ),
    ]
    with requests.Session() as s:
        for i in range(150):
            path, body = targets[i % len(targets)]
            data = bytearray(body)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            _check(s.post(url + path, data=bytes(data)), 200, 400, 404)


def test_garbage_on_the_socket_then_still_answering(url):
    host, port = url.removeprefix("http://").split(":")
    for junk in (
        b"GARBAGE\r\n\r\n",
        b"POST /v2/models/lin/infer HTTP/1.1\r\nContent-Length: x\r\n\r\n",
    ):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(junk)
            assert re.match(rb"HTTP/1\.[01] 4\d\d ", sock.recv(100))
    assert requests.get(f"{url}/v2/health/ready").json() == {"ready": True}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_small_requests_claiming_huge_shapes_allocate_nothing(url):
    head = {
        "inputs": [
            {"name": "price", "shape": [10**9], "datatype": "FP32",
             "parameters": {"binary_data_size": 4}},
        ]
    }  # fmt: skip
    binary = json.dumps(head).encode()
    strings = b'{"inputs":[{"name":"user","shape":[999999999],"datatype":"BYTES","data":["a"]}]}'
    before = _rss_mb()
    with requests.Session() as s:
        for _ in range(50):
            t0 = time.monotonic()
            r = s.post(
                f"{url}/v2/models/lin/infer",
                data=binary + b"\0\0\0\0",
                headers={"Inference-Header-Content-Length": str(len(binary))},
            )
            assert "declares more than 10000 elements" in _check(r, 400)["error"]
            assert time.monotonic() - t0 < 2.0
            _check(s.post(f"{url}/v2/models/lin/infer", data=strings), 400)
    assert _rss_mb() - before < 50


def test_overload_is_429_with_retry_after(server, url):
    held = server.server.state.admission.admit("Predict")

    async def hold() -> None:  # the one in-flight slot, taken on the server's loop
        held.__enter__()

    async def release() -> None:
        held.__exit__(None, None, None)

    server.call(hold())
    try:
        r = requests.post(f"{url}/v1/models/lin:predict", json=GOOD_TFS)
        assert "overloaded" in _check(r, 429)["error"]
        assert (r.headers["Retry-After"], r.headers["Retry-After-Ms"]) == ("2", "1500")
        assert requests.get(f"{url}/v2/health/ready").status_code == 200  # probes still pass
    finally:
        server.call(release())
    _check(requests.post(f"{url}/v1/models/lin:predict", json=GOOD_TFS), 200)
