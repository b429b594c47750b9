"""Admission control on a real server: overload is answered at once (RESOURCE_EXHAUSTED with a
retry hint) while health answers, never CANCELLED; a deadline nearer than the queue's expected
wait is answered at once; the batcher's bound on queued examples."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import ranking_service_pb2_grpc as rank_grpc
from serving.batching import DynamicBatcher, QueueFull, WouldMissDeadline
from serving.client import make_request
from serving.config import BatchingConfig, ServerOptions
from serving.testing import ServerThread, write_linear_model

WINDOW_S = 1.5  # the batching window holds admitted calls in flight this long


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "1", bias=0.0)
    opts = ServerOptions(
        max_inflight=8,
        retry_after_ms=250,
        metrics_port=0,
        batching=BatchingConfig(max_queue_delay_us=int(WINDOW_S * 1e6)),
    )
    with ServerThread(root, opts) as s:
        yield s


def _rejected(port: int, reason: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    pattern = rf'^stitchrec_rejected_total\{{method="Rank",reason="{reason}"\}} (\S+)$'
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


async def _rank(stub: rank_grpc.RankingServiceStub, i: int, timeout: float) -> tuple:
    """(code, trailing metadata, details, seconds) of one Rank call."""
    t0 = time.monotonic()
    call = stub.Rank(
        make_request("lin", {"user": "u1"}, {"item": [i], "price": [0.0]}), timeout=timeout
    )
    with contextlib.suppress(grpc.aio.AioRpcError):
        await call
    code = await call.code()
    trailers = dict(await call.trailing_metadata() or ())
    return code, trailers, await call.details(), time.monotonic() - t0


def test_overload_is_refused_at_once_with_retry_hint_while_health_answers(server):
    before = _rejected(server.server.metrics_port, "inflight")

    async def main():
        async with (
            grpc.aio.insecure_channel(server.target) as ch,
            grpc.aio.insecure_channel(
                server.target, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as probe,
        ):
            stub = rank_grpc.RankingServiceStub(ch)
            calls = [asyncio.ensure_future(_rank(stub, i, 30)) for i in range(200)]
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            health = await health_pb2_grpc.HealthStub(probe).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            return await asyncio.gather(*calls), health.status, time.monotonic() - t0

    results, health, health_s = asyncio.run(main())
    codes = [r[0] for r in results]
    assert health == health_pb2.HealthCheckResponse.SERVING
    assert health_s < WINDOW_S  # answered while the admitted calls wait
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    refused = [r for r in results if r[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert 8 <= codes.count(grpc.StatusCode.OK) < 50 and len(refused) > 150
    for _code, trailers, details, seconds in refused:
        assert trailers["retry-after-ms"] == "250"
        assert trailers["grpc-retry-pushback-ms"] == "250"
        assert "max_inflight=8" in details
        assert seconds < WINDOW_S  # at once, not after the queue
    assert _rejected(server.server.metrics_port, "inflight") - before == len(refused)


def test_deadline_nearer_than_the_expected_wait_is_refused_at_once(server):
    before = _rejected(server.server.metrics_port, "deadline")

    async def main():
        async with grpc.aio.insecure_channel(server.target) as ch:
            stub = rank_grpc.RankingServiceStub(ch)
            queued = [asyncio.ensure_future(_rank(stub, i, 30)) for i in range(3)]
            await asyncio.sleep(0.3)  # queued: the window has > 1 s to run
            short = await _rank(stub, 9, 0.5)
            return short, await asyncio.gather(*queued)

    (code, trailers, details, seconds), queued = asyncio.run(main())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "expected wait in the batch queue" in details  # the server's answer, not the clock
    assert seconds < 0.5
    assert "retry-after-ms" not in trailers
    assert [r[0] for r in queued] == [grpc.StatusCode.OK] * 3
    assert _rejected(server.server.metrics_port, "deadline") - before == 1


def _req(v: int, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full(rows, v, dtype=np.int64)}


def test_batcher_bounds_queued_rows_and_refuses_deadlines_it_cannot_meet():
    def run(instance, features):
        time.sleep(0.05)
        return {"y": features["x"] * 2}

    async def main():
        cfg = BatchingConfig(max_batch_size=2, max_queue_delay_us=0, max_queued_rows=10)
        b = DynamicBatcher(run, 1, cfg)
        assert (await b.submit(_req(1, 2), 2))["y"].tolist() == [2, 2]  # one batch measured
        assert b.batch_seconds >= 0.05 and b.rows_per_second <= 40
        queued = [asyncio.ensure_future(b.submit(_req(v, 2), 2)) for v in range(5)]
        await asyncio.sleep(0.01)  # one runs, four (8 examples) wait: 0.2 s of batches
        with pytest.raises(QueueFull, match="max_queued_rows=10") as e:
            await b.submit(_req(5, 3), 3)
        assert e.value.reason == "queue_rows"
        t0 = time.monotonic()
        with pytest.raises(WouldMissDeadline, match="expected wait"):
            await b.submit(_req(5), 1, deadline=time.monotonic() + 0.1)
        refused_s = time.monotonic() - t0
        outs = await asyncio.gather(*queued)
        # an empty queue takes a request larger than max_queued_rows
        big = await b.submit(_req(3, 20), 20, deadline=time.monotonic() + 5)
        await b.close()
        return refused_s, [o["y"].tolist() for o in outs], big["y"].tolist()

    refused_s, outs, big = asyncio.run(main())
    assert refused_s < 0.05
    assert outs == [[2 * v, 2 * v] for v in range(5)]
    assert big == [6] * 20
