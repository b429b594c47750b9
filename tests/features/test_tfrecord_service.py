"""``features.tfrecord.service``: the TFRecord input run by tf.data service workers (a
dispatcher and workers started in this process on 127.0.0.1) yields the local epoch: in its
order with one worker, every batch once with two."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from features.dataset import list_parquet
from features.schema import load_schema
from features.tfrecord.address import service_address
from features.tfrecord.convert import parquet_to_tfrecord
from features.tfrecord.dataset import make_tfrecord_dataset
from features.tfrecord.service import (
    InputStalledError,
    distribute,
    start_dispatcher,
    start_worker,
    within_deadline,
    worker_port,
)

KW = {"batch_size": 256, "shuffle": True, "seed": 3, "epoch": 1, "shuffle_buffer": 1024}


@pytest.fixture(scope="module")
def tfrecord(tmp_path_factory, shared_tiny_data):
    """The tiny training rows (4,000) as 5 TFRecord files; windows of 1,024 rows (4 batches)."""
    out = tmp_path_factory.mktemp("tfr") / "train"
    schema = load_schema(shared_tiny_data["schema"]).as_parquet()
    files = list_parquet(shared_tiny_data["train"])
    parquet_to_tfrecord(schema, files, out, rows_per_shard=900, block_rows=64)
    return schema, out


@pytest.fixture(scope="module")
def service():
    """A dispatcher and ``add_worker()``; the servers stop with the module."""
    dispatcher = start_dispatcher()
    workers = []

    def add_worker():
        address = dispatcher.target.removeprefix("grpc://")
        workers.append(start_worker(address, host="127.0.0.1"))
        return workers[-1]

    yield dispatcher, add_worker
    for w in workers:
        w._stop()
    dispatcher._stop()


def _batches(ds) -> list[np.ndarray]:
    return [b["price"].numpy() for b in ds]


def test_addresses_are_checked():
    assert service_address("127.0.0.1:5050") == "grpc://127.0.0.1:5050"
    assert service_address(" grpc://host-a:80 ") == "grpc://host-a:80"
    assert service_address("[::1]:7") == "grpc://[::1]:7"
    for bad in ("host", "host:0", "host:70000", "http://host:80", "a b:1", ""):
        with pytest.raises(ValueError, match=r"expected HOST:PORT or grpc://HOST:PORT"):
            service_address(bad)


def test_workers_yield_the_local_epoch(tfrecord, service):
    schema, path = tfrecord
    dispatcher, add_worker = service
    worker = add_worker()
    assert worker_port(worker) > 0
    local = _batches(make_tfrecord_dataset(schema, path, **KW))
    assert [len(b) for b in local] == [256] * 15 + [160]
    # one worker: the same batches in the same order, a resume point included
    for skip in (0, 6):
        served = _batches(
            distribute(
                make_tfrecord_dataset(schema, path, **KW, skip_batches=skip), dispatcher.target
            )
        )
        assert len(served) == len(local) - skip
        for a, b in zip(served, local[skip:], strict=True):
            np.testing.assert_array_equal(a, b)
    # two workers: every batch once, each window's 4 batches in their order
    add_worker()
    served = _batches(distribute(make_tfrecord_dataset(schema, path, **KW), dispatcher.target))
    assert sorted(map(bytes, served)) == sorted(map(bytes, local))
    order = [next(i for i, b in enumerate(local) if np.array_equal(a, b)) for a in served]
    for window in range(4):
        own = [i for i in order if i // 4 == window]
        assert own == sorted(own)


def _reader_threads(among: set[threading.Thread] | None = None) -> int:
    """The live reader threads, or those of them not in ``among`` (threads seen before)."""
    return sum(
        t.name == "data-service-input" and t.is_alive() and (among is None or t not in among)
        for t in threading.enumerate()
    )


def _wait_for_reader_threads(count: int, among: set[threading.Thread] | None = None) -> int:
    """The reader threads alive once they are ``count``, or after 10 s."""
    deadline = time.monotonic() + 10
    while _reader_threads(among) != count and time.monotonic() < deadline:
        time.sleep(0.05)
    return _reader_threads(among)


def test_within_deadline_hands_on_elements_errors_and_stalls():
    assert list(within_deadline(iter(range(50)), 5, "h:1")) == list(range(50))

    def failing():
        yield 1
        raise ValueError("bad record")

    got = []
    with pytest.raises(ValueError, match="bad record"):
        got.extend(within_deadline(failing(), 5, "h:1"))
    assert got == [1]
    release = threading.Event()

    def stalled():
        yield "first"
        release.wait(30)  # a lost worker's window: nothing more comes

    reader = within_deadline(stalled(), 0.5, "h:1")
    assert next(reader) == "first"
    t0 = time.monotonic()
    with pytest.raises(InputStalledError, match=r"at grpc://h:1 for 0.5 s"):
        next(reader)
    assert time.monotonic() - t0 < 5
    release.set()


def test_a_reader_closed_early_stops_its_thread():
    # a reader left blocked by another test in this process (a service without workers) is
    # not this test's: only threads started here are counted
    before = set(threading.enumerate())
    reader = within_deadline(iter(range(1000)), 5, "h:1")
    assert next(reader) == 0
    assert _reader_threads(before) == 1  # blocked with two elements read ahead
    reader.close()  # the loop stopped early
    assert _wait_for_reader_threads(0, before) == 0
