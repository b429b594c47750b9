"""A graceful stop on a real server under load: health NOT_SERVING while calls are still served,
Watch streams end at once, then UNAVAILABLE, no call CANCELLED; per-model health; reflection v1;
the `stitchrec serve` flags of admission and drain."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from pipelines import serve
from pipelines.cli import build_parser
from protos import ranking_service_pb2_grpc as rank_grpc
from serving.client import make_request
from serving.config import BatchingConfig, ServerOptions
from serving.testing import ServerThread, write_linear_model

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DRAIN_S = 0.8


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    write_linear_model(root / "lin" / "1", bias=0.0)
    write_linear_model(root / "lin" / "2", bias=1.0)
    return root


async def _load(stub, calls: list, until: float) -> None:
    """Rank calls one after another, each recorded as (start, end, code), until a refusal."""
    while time.monotonic() < until:
        t0 = time.monotonic()
        call = stub.Rank(
            make_request("lin", {"user": "u1"}, {"item": [1], "price": [0.0]}), timeout=10
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call
        code = await call.code()
        calls.append((t0, time.monotonic(), code))
        if code != grpc.StatusCode.OK:
            return


async def _health(stub, seen: list, until: float) -> None:
    while time.monotonic() < until:
        try:
            r = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
            seen.append((time.monotonic(), r.status))
        except grpc.aio.AioRpcError as e:
            seen.append((time.monotonic(), e.code()))
            return
        await asyncio.sleep(0.02)


async def _watch(stub, seen: list) -> None:
    async for r in stub.Watch(health_pb2.HealthCheckRequest(service="lin")):
        seen.append((time.monotonic(), r.status))
    seen.append((time.monotonic(), "ended"))


def test_stop_drains_then_refuses_and_cancels_nothing(repo):
    opts = ServerOptions(drain_s=DRAIN_S, batching=BatchingConfig(max_queue_delay_us=2000))
    s = ServerThread(repo, opts)
    calls: list = []
    health: list = []
    watch: list = []

    async def main() -> tuple[float, float]:
        async with grpc.aio.insecure_channel(s.target) as ch:
            rank = rank_grpc.RankingServiceStub(ch)
            probe = health_pb2_grpc.HealthStub(ch)
            until = time.monotonic() + 8
            tasks = [asyncio.ensure_future(_load(rank, calls, until)) for _ in range(8)]
            tasks.append(asyncio.ensure_future(_health(probe, health, until)))
            watching = asyncio.ensure_future(_watch(probe, watch))
            await asyncio.sleep(0.4)
            t_stop = time.monotonic()
            stopping = asyncio.wrap_future(s.submit(s.server.stop(grace=10)))
            await stopping
            stopped = time.monotonic()
            await asyncio.gather(*tasks, watching)
            return t_stop, stopped

    try:
        t_stop, stopped = asyncio.run(main())
    finally:
        s.loop.call_soon_threadsafe(s.loop.stop)
        s.thread.join(10)
    codes = {c for _, _, c in calls}
    assert grpc.StatusCode.CANCELLED not in codes
    assert codes == {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    before = [c for t0, _, c in calls if t0 < t_stop]
    assert len(before) > 8 and set(before) == {grpc.StatusCode.OK}
    # the drain: NOT_SERVING is reported while calls started after the stop still succeed
    during = [(t0, c) for t0, t1, c in calls if t_stop + 0.1 < t0 and t1 < t_stop + DRAIN_S - 0.1]
    assert during and {c for _, c in during} == {grpc.StatusCode.OK}
    assert NOT_SERVING in {st for t, st in health if t_stop < t < t_stop + DRAIN_S - 0.1}
    assert all(st == SERVING for t, st in health if t < t_stop)
    # refused after the drain, not before: the server starts its drain after t_stop, so no
    # refusal can reach the client before t_stop + DRAIN_S (when a refused call was sent says
    # nothing: under load it may reach the server well after it was sent)
    refused = [t1 for _, t1, c in calls if c == grpc.StatusCode.UNAVAILABLE]
    assert len(refused) == 8 and min(refused) >= t_stop + DRAIN_S - 0.005
    # the Watch stream saw SERVING, then NOT_SERVING, and ended at the start of the stop
    assert [st for _, st in watch] == [SERVING, NOT_SERVING, "ended"]
    assert watch[-1][0] - t_stop < DRAIN_S / 2
    assert stopped - t_stop < DRAIN_S + 3  # the open Watch did not hold the stop for the grace


def test_per_model_health_and_reflection_v1(repo, tmp_path):
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "saved_model.pb").write_bytes(b"not a model")
    for v in (1, 2):
        write_linear_model(tmp_path / "lin" / str(v), bias=float(v))
    with ServerThread(tmp_path, ServerOptions(policy="all")) as s:
        channel = grpc.insecure_channel(s.target)
        h = health_pb2_grpc.HealthStub(channel)

        def check(name: str) -> int:
            return h.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status

        assert check("lin") == SERVING
        assert check("lin/2") == SERVING
        assert check("broken") == NOT_SERVING  # no ready version
        assert check("") == NOT_SERVING  # not every model is ready
        for unknown in ("nope", "lin/7"):
            with pytest.raises(grpc.RpcError) as e:
                check(unknown)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
        info = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        asks = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="grpc.reflection.v1.ServerReflection"
            ),
        ]
        listed, file = list(info(iter(asks), timeout=10))
        names = {sv.name for sv in listed.list_services_response.service}
        assert {
            "stitchrec.serving.RankingService",
            "inference.GRPCInferenceService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names
        assert file.file_descriptor_response.file_descriptor_proto
        channel.close()


def test_serve_flags_reach_the_options_and_the_workers():
    argv = ["serve", "--repo", "models", "--max-inflight", "8", "--max-queued-rows", "100"]
    argv += ["--retry-after-ms", "50", "--drain-seconds", "2.5", "--workers", "2"]
    args = build_parser().parse_args(argv)
    opts = serve._options(args)
    assert (opts.max_inflight, opts.retry_after_ms, opts.drain_s) == (8, 50, 2.5)
    assert opts.batching.max_queued_rows == 100
    worker = serve._worker_argv(args, 8500)
    for flag in ("--max-inflight", "--max-queued-rows", "--retry-after-ms", "--drain-seconds"):
        assert flag in worker
    defaults = serve._options(build_parser().parse_args(["serve", "--repo", "models"]))
    assert (defaults.max_inflight, defaults.drain_s) == (256, 5.0)


def test_no_heap_freeze_reaches_the_options_and_the_workers():
    args = build_parser().parse_args(["serve", "--repo", "models", "--workers", "2"])
    assert serve._options(args).freeze_heap is True
    assert "--no-heap-freeze" not in serve._worker_argv(args, 8500)
    args = build_parser().parse_args(["serve", "--repo", "models", "--no-heap-freeze"])
    assert serve._options(args).freeze_heap is False
    assert "--no-heap-freeze" in serve._worker_argv(args, 8500)
