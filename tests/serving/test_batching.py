"""The dynamic batcher: its dispatch rule by hand, then real batches on worker threads."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from serving.batching import (
    BatchingConfig,
    DeadlineExceeded,
    DynamicBatcher,
    QueueFull,
    merge_features,
    split_outputs,
    take_batch,
)


def test_take_batch_rule_by_hand():
    # waits while below max, no preferred size reached and the delay has not expired
    assert take_batch([3, 4], 100, (), expired=False) is None
    assert take_batch([3, 4], 100, (), expired=True) == 2
    # a full batch goes at once; the request that does not fit waits for the next batch
    assert take_batch([60, 30, 20], 100, (), expired=False) == 2
    assert take_batch([50, 50, 1], 100, (), expired=False) == 2
    # one request larger than the max runs alone
    assert take_batch([500, 1], 100, (), expired=False) == 1
    # preferred sizes: the largest prefix that hits one exactly
    assert take_batch([4, 4, 8, 3], 100, (8, 16), expired=False) == 3
    assert take_batch([4, 3], 100, (8,), expired=False) is None
    assert take_batch([], 100, (), expired=True) is None


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchingConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="preferred_batch_sizes"):
        BatchingConfig(max_batch_size=8, preferred_batch_sizes=(16,))
    with pytest.raises(ValueError, match="max_queue_delay_us"):
        BatchingConfig(max_queue_delay_us=-1)
    assert BatchingConfig(preferred_batch_sizes=(8, 4, 8)).preferred_batch_sizes == (4, 8)


def test_merge_and_split_round_trip():
    a = {"x": np.array([1, 2]), "s": np.array([b"a", b"b"], dtype=object)}
    b = {"x": np.array([3]), "s": np.array([b"c"], dtype=object)}
    m = merge_features([a, b])
    assert m["x"].tolist() == [1, 2, 3] and m["s"].tolist() == [b"a", b"b", b"c"]
    parts = split_outputs({"y": m["x"] * 10}, [2, 1])
    assert [p["y"].tolist() for p in parts] == [[10, 20], [30]]


class _Recorder:
    """run(): y = 2 * x, recording each batch's size; an optional gate holds batches."""

    def __init__(self, gate: threading.Event | None = None):
        self.sizes: list[int] = []
        self.gate = gate

    def __call__(self, instance: int, features: dict) -> dict:
        if self.gate is not None:
            self.gate.wait(10)
        self.sizes.append(len(features["x"]))
        return {"y": features["x"] * 2}


def _req(*values: int) -> dict:
    return {"x": np.array(values, dtype=np.int64)}


def test_concurrent_requests_share_batches_and_get_their_rows():
    async def main():
        rec = _Recorder()
        b = DynamicBatcher(rec, 1, BatchingConfig(max_batch_size=64, max_queue_delay_us=20_000))
        outs = await asyncio.gather(*[b.submit(_req(i, i + 100), 2) for i in range(20)])
        await b.close()
        return rec, outs

    rec, outs = asyncio.run(main())
    for i, o in enumerate(outs):
        assert o["y"].tolist() == [2 * i, 2 * (i + 100)]
    assert sum(rec.sizes) == 40
    assert len(rec.sizes) < 20  # batched: fewer model calls than requests
    assert max(rec.sizes) <= 64


def test_flush_dispatches_the_queue_without_waiting_out_the_window():
    async def main():
        rec = _Recorder()
        b = DynamicBatcher(
            rec, 1, BatchingConfig(max_batch_size=64, max_queue_delay_us=600_000_000)
        )
        pending = [asyncio.ensure_future(b.submit(_req(i), 1)) for i in range(5)]
        while b.queued < 5:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)
        assert rec.sizes == []  # a 10 min window: nothing runs by itself
        b.flush()
        outs = await asyncio.wait_for(asyncio.gather(*pending), 30)
        later = await asyncio.wait_for(b.submit(_req(7), 1), 30)  # flushing stays on
        await b.close()
        return rec, outs, later

    rec, outs, later = asyncio.run(main())
    assert [o["y"].tolist() for o in outs] == [[0], [2], [4], [6], [8]]
    assert later["y"].tolist() == [14]
    assert rec.sizes == [5, 1]


def test_no_batching_runs_each_request_alone():
    async def main():
        rec = _Recorder()
        b = DynamicBatcher(rec, 1, BatchingConfig(enabled=False))
        await asyncio.gather(*[b.submit(_req(i), 1) for i in range(5)])
        await b.close()
        return rec

    assert asyncio.run(main()).sizes == [1] * 5


def test_full_queue_fails_fast_and_others_complete():
    async def main():
        gate = threading.Event()
        rec = _Recorder(gate)
        b = DynamicBatcher(
            rec, 1, BatchingConfig(max_batch_size=1, max_queue_delay_us=0, max_queue_size=2)
        )
        first = asyncio.ensure_future(b.submit(_req(1), 1))
        await asyncio.sleep(0.05)  # first is running (held by the gate); queue is empty
        queued = [asyncio.ensure_future(b.submit(_req(v), 1)) for v in (2, 3)]
        await asyncio.sleep(0)
        t0 = time.monotonic()
        with pytest.raises(QueueFull, match="queue is full"):
            await b.submit(_req(4), 1)
        fail_ms = 1e3 * (time.monotonic() - t0)
        gate.set()
        results = await asyncio.gather(first, *queued)
        await b.close()
        return fail_ms, [r["y"].tolist() for r in results]

    fail_ms, results = asyncio.run(main())
    assert fail_ms < 50
    assert results == [[2], [4], [6]]


def test_expired_requests_are_not_computed():
    async def main():
        gate = threading.Event()
        rec = _Recorder(gate)
        b = DynamicBatcher(rec, 1, BatchingConfig(max_batch_size=1, max_queue_delay_us=0))
        first = asyncio.ensure_future(b.submit(_req(1), 1))
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(b.submit(_req(7), 1, deadline=time.monotonic() + 0.01))
        await asyncio.sleep(0.1)
        gate.set()
        await first
        with pytest.raises(DeadlineExceeded, match="deadline exceeded"):
            await late
        await b.close()
        return rec

    assert asyncio.run(main()).sizes == [1]  # only the first request ran


def test_failed_batch_fails_its_requests_only():
    def run(instance, features):
        if (features["x"] < 0).any():
            raise ValueError("negative input")
        return {"y": features["x"]}

    async def main():
        b = DynamicBatcher(run, 1, BatchingConfig(enabled=False))
        bad = asyncio.ensure_future(b.submit(_req(-1), 1))
        good = asyncio.ensure_future(b.submit(_req(5), 1))
        with pytest.raises(ValueError, match="negative"):
            await bad
        out = await good
        await b.close()
        return out

    assert asyncio.run(main())["y"].tolist() == [5]
