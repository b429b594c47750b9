"""Model repository: version policies, polling, hot swap under load, rollback, failed warmup."""

from __future__ import annotations

import asyncio
import gc
import itertools
import shutil
import threading
import time
import weakref
from pathlib import Path

import grpc
import pytest
import tensorflow as tf

from serving.batching import BatchingConfig
from serving.client import AsyncRankingClient
from serving.repository import ModelNotFound, ModelRepository, VersionPolicy
from serving.server import ServerOptions
from serving.testing import (
    ServerThread,
    copy_version,
    reference_score,
    wait_until,
    write_linear_model,
)
from serving.version_files import MARKER


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """SavedModels built once: biases 0, 1 and 2."""
    root = tmp_path_factory.mktemp("built")
    return {b: write_linear_model(root / f"b{b}", float(b)) for b in (0, 1, 2)}


def test_version_policy_parse_and_select():
    assert VersionPolicy.parse("latest").select([3, 1, 2]) == [3]
    assert VersionPolicy.parse("latest:2").select([3, 1, 2]) == [2, 3]
    assert VersionPolicy.parse("all").select([3, 1]) == [1, 3]
    assert VersionPolicy.parse("specific:1,3").select([1, 2]) == [1]
    assert str(VersionPolicy.parse("specific:1,3")) == "specific:1,3"
    for bad in ("newest", "latest:x", "specific:", "latest:0", "all:2"):
        with pytest.raises(ValueError, match="version policy"):
            VersionPolicy.parse(bad)


def _load(root: Path, **kw) -> ModelRepository:
    async def main():
        repo = ModelRepository(root, **kw)
        await repo.start()
        versions = {n: repo.live_versions(n) for n in repo.model_names()}
        await repo.close()
        return repo, versions

    return asyncio.run(main())


def test_policies_select_loaded_versions(tmp_path, built):
    for v, b in ((1, 0), (2, 1), (3, 2)):
        copy_version(built[b], tmp_path / "a", v)
        copy_version(built[b], tmp_path / "b", v)
    (tmp_path / "a" / "notes").mkdir()  # not a version folder: ignored
    _, versions = _load(tmp_path, policy="latest:2", policies={"b": "specific:1,3"})
    assert versions == {"a": [2, 3], "b": [1, 3]}
    _, versions = _load(tmp_path, policy="all")
    assert versions == {"a": [1, 2, 3], "b": [1, 2, 3]}


def test_unknown_model_and_missing_root(tmp_path, built):
    copy_version(built[0], tmp_path / "m", 1)
    repo, _ = _load(tmp_path)
    with pytest.raises(ModelNotFound, match="unknown model 'x'"):
        repo.get("x")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        ModelRepository(tmp_path / "missing")


def _load_test(
    s: ServerThread, stop: threading.Event, results: list, errors: list, concurrency: int = 8
) -> threading.Thread:
    """Closed-loop load on the server from a client thread until ``stop`` is set."""

    async def worker(c: AsyncRankingClient, i: int):
        while not stop.is_set():
            try:
                r = await c.rank("m", {"user": "u1"}, {"item": [i, 3], "price": [0.0, 1.0]})
                results.append((time.monotonic(), r.version, float(r.scores[1])))
            except grpc.RpcError as e:
                errors.append((e.code(), e.details()))

    async def main():
        c = AsyncRankingClient(s.target)
        await asyncio.gather(*[worker(c, i) for i in range(concurrency)])
        await c.close()

    t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    t.start()
    return t


def test_hot_swap_and_rollback_under_load_fail_no_request(tmp_path, built):
    root = tmp_path / "repo"
    copy_version(built[0], root / "m", 1)
    opts = ServerOptions(poll_interval_s=0.1, batching=BatchingConfig(max_queue_delay_us=500))
    with ServerThread(root, opts) as s:
        stop = threading.Event()
        results: list = []
        errors: list = []
        t = _load_test(s, stop, results, errors)
        wait_until(lambda: len(results) > 50)
        copy_version(built[1], root / "m", 2)  # new version: swapped in under load
        wait_until(lambda: results[-1][1] == 2)
        n_v2 = len(results)
        wait_until(lambda: len(results) > n_v2 + 50)
        shutil.rmtree(root / "m" / "2")  # rollback: version 1 comes back before 2 leaves
        wait_until(lambda: results[-1][1] == 1)
        # a broken version 3 never serves; version 1 keeps serving
        bad = root / "m" / ".tmp3"
        bad.mkdir()
        (bad / "saved_model.pb").write_bytes(b"not a SavedModel")
        bad.rename(root / "m" / "3")
        wait_until(lambda: s.server.repository.status("m").get(3, None) is not None
                  and s.server.repository.status("m")[3].state == "END")  # fmt: skip
        n_end = len(results)
        wait_until(lambda: len(results) > n_end + 50)
        stop.set()
        t.join(30)
        status = s.server.repository.status("m")
    assert errors == []
    assert len(results) > 200
    seen = [v for _, v, _ in results]
    # versions in order 1 ... 2 ... 1, never 3. Answers are listed as they complete, so at each
    # switch the requests still in flight on the old version (at most one per client worker)
    # may complete after the first answers of the new one.
    assert set(seen) == {1, 2} and seen[0] == 1 and seen[-1] == 1
    first2, last2 = seen.index(2), len(seen) - 1 - seen[::-1].index(2)
    t_first2, t_last2 = results[first2][0], results[last2][0]
    stragglers = [t for t, v, _ in results[first2 : last2 + 1] if v == 1]
    # version 1 answers between the switches are in-flight requests finishing at a switch
    assert all(min(t - t_first2, t_last2 - t) < 2.0 for t in stragglers)
    longest = max(len(list(g)) for v, g in itertools.groupby(seen) if v == 2)
    assert longest >= 30  # version 2 alone served between the switches
    for _, v, score in results:  # each answer is the named version's score
        assert score == pytest.approx(reference_score(float(v - 1), "u1", 3, 1.0), rel=1e-6)
    assert status[3].state == "END"
    assert status[3].error.startswith("OSError: Cannot parse file")
    assert status[1].state == "AVAILABLE"


class _ScalarScore(tf.Module):
    """Loads fine but answers a scalar score: fails the warmup's shape check."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="price")])
    def serve(self, price):
        return {"score": tf.reduce_sum(price)}


def test_version_failing_warmup_never_turns_ready(tmp_path, built):
    copy_version(built[0], tmp_path / "m", 1)
    module = _ScalarScore()
    tf.saved_model.save(
        module, str(tmp_path / "m" / "2"), signatures={"serving_default": module.serve}
    )
    repo, versions = _load(tmp_path)
    assert versions == {"m": [1]}  # rolled back to 1
    status = repo.status("m")
    assert status[2].state == "END"
    assert "output 'score' has shape ()" in status[2].error


def test_health_follows_readiness(tmp_path, built):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    root = tmp_path / "repo"
    bad = root / "m" / "1"
    bad.mkdir(parents=True)
    (bad / "saved_model.pb").write_bytes(b"broken")
    with ServerThread(root, ServerOptions(poll_interval_s=0.1)) as s:
        h = health_pb2_grpc.HealthStub(grpc.insecure_channel(s.target))

        def status() -> int:
            return h.Check(health_pb2.HealthCheckRequest(), timeout=5).status

        assert status() == health_pb2.HealthCheckResponse.NOT_SERVING  # no ready version
        copy_version(built[0], root / "m", 2)
        wait_until(lambda: status() == health_pb2.HealthCheckResponse.SERVING)
        assert s.server.repository.live_versions("m") == [2]


def _halve_variables(version: Path) -> tuple[Path, bytes]:
    """Truncates the version's variables data file in place; returns it and its bytes."""
    data = next((version / "variables").glob("variables.data-*"))
    full = data.read_bytes()
    data.write_bytes(full[: len(full) // 2])
    return data, full


def test_copy_in_progress_is_not_loaded_until_it_is_complete(tmp_path, built):
    root = tmp_path / "repo"
    copy_version(built[0], root / "m", 1)
    with ServerThread(root, ServerOptions(poll_interval_s=0.05)) as s:
        # a copy that is not atomic (cp -r): the marker is there, a variables file is not yet
        partial = root / "m" / ".partial"
        shutil.copytree(built[1], partial)
        data, full = _halve_variables(partial)
        partial.rename(root / "m" / "2")
        data = root / "m" / "2" / data.relative_to(partial)
        time.sleep(0.3)  # several scans
        assert list(s.server.repository.status("m")) == [1]
        assert s.server.repository.live_versions("m") == [1]
        data.write_bytes(full)  # the copy completes
        wait_until(lambda: s.server.repository.live_versions("m") == [2])


def test_failed_version_is_retried_when_a_file_under_it_changes(tmp_path, built):
    root = tmp_path / "repo"
    v1 = copy_version(built[0], root / "m", 1)
    (v1 / MARKER).unlink(missing_ok=True)  # a SavedModel written by another tool
    data, full = _halve_variables(v1)
    with ServerThread(root, ServerOptions(poll_interval_s=0.05)) as s:
        status = s.server.repository.status("m")[1]
        assert status.state == "END"
        assert "Read less bytes than requested" in status.error
        data.write_bytes(full)  # rewritten in place: the folder and variables/ keep their mtimes
        wait_until(lambda: s.server.repository.live_versions("m") == [1])


def test_loaded_versions_are_frozen_and_an_unloaded_one_is_collected(tmp_path, built):
    model = tmp_path / "lin"
    model.mkdir()
    copy_version(built[0], model, 1)

    async def main() -> tuple[bool, bool, int]:
        repo = ModelRepository(tmp_path)
        await repo.start()
        first = repo.get("lin", 1)
        # frozen objects are outside the generations the collector scans
        first_frozen = not any(o is first for o in gc.get_objects())
        ref = weakref.ref(first.instances[0])
        del first
        shutil.rmtree(model / "1")
        copy_version(built[1], model, 2)
        await repo.poll()
        assert repo.live_versions("lin") == [2]
        second_frozen = not any(o is repo.get("lin", 2) for o in gc.get_objects())
        await repo.close()
        return first_frozen and second_frozen, ref() is None, gc.get_freeze_count()

    try:
        frozen, collected, count = asyncio.run(main())
    finally:
        gc.unfreeze()
    assert frozen and count > 0
    assert collected  # the unloaded version's objects were unfrozen, then collected
