"""Dynamic batching: requests that arrive close together run as one model call.

Each request carries ``rows`` examples (one feature array of shape ``[rows]`` per input). The
batcher keeps a bounded FIFO queue of requests and one scheduler per model version; when a model
instance is free it takes requests from the head of the queue, concatenates their feature arrays
into one batch of ``B = sum(rows)`` examples, runs the model once on a worker thread (TensorFlow
releases the GIL), and slices the outputs back per request.

When to dispatch (the same rules as Triton's dynamic batcher):

- at once when the queued rows reach ``max_batch_size`` or exactly one of
  ``preferred_batch_sizes`` (the largest such prefix of the queue is taken);
- otherwise when the oldest queued request has waited ``max_queue_delay_us``;
- a request whose deadline has passed before its batch is formed is answered
  ``DeadlineExceeded`` and never computed; a request whose caller went away is dropped.

A full queue fails fast (``QueueFull``, mapped to RESOURCE_EXHAUSTED): more than
``max_queue_size`` requests or ``max_queued_rows`` examples waiting (a request larger than
``max_queued_rows`` is taken when the queue is empty). A request whose deadline is nearer than the
expected wait (``expected_wait``: the batching window still to run, or the queued examples over
the measured throughput) fails at once with ``WouldMissDeadline`` (DEADLINE_EXCEEDED) instead of
waiting for a deadline it cannot meet. A server that cannot keep up answers at once instead of
letting latency grow without bound. With ``enabled = False`` each
request runs alone (the "no batching" baseline), ``concurrency`` at a time per instance.

With tracing on (``serving.tracing``) each request carries its caller's trace context, and each
batch writes ``queue_wait``, ``batch`` and ``inference`` spans under the calls it served.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence

import numpy as np
from opentelemetry import context as otel_context

from serving import tracing
from serving.config import BatchingConfig

RunFn = Callable[[int, dict[str, np.ndarray]], dict[str, np.ndarray]]


class QueueFull(Exception):
    """The batch queue is full: the server is overloaded (RESOURCE_EXHAUSTED).

    ``reason``: ``queue_requests`` or ``queue_rows``, the bound that was reached."""

    def __init__(self, message: str, reason: str = "queue_requests"):
        super().__init__(message)
        self.reason = reason


class DeadlineExceeded(Exception):
    """The request's deadline passed while it waited in the queue (DEADLINE_EXCEEDED)."""


class WouldMissDeadline(DeadlineExceeded):
    """The request's deadline is nearer than the expected wait in the queue: refused at once."""

    reason = "deadline"


_EWMA = 0.2  # weight of the newest batch in the batch timing averages


class BatcherClosed(Exception):
    """The batcher has been closed (the model version was unloaded)."""


@dataclasses.dataclass(eq=False)
class _Item:
    features: dict[str, np.ndarray]
    rows: int
    deadline: float | None  # time.monotonic() seconds
    future: asyncio.Future
    enqueued: float
    trace: otel_context.Context | None = None  # the caller's trace context (tracing on)


def merge_features(items: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenates per-request feature arrays ``[rows_i]`` into ``[sum(rows_i)]``."""
    if len(items) == 1:
        return items[0]
    return {name: np.concatenate([f[name] for f in items]) for name in items[0]}


def split_outputs(
    outputs: dict[str, np.ndarray], rows: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    """The inverse of ``merge_features`` on the outputs: slices ``[B, ...]`` back per request."""
    if len(rows) == 1:
        return [outputs]
    bounds = np.cumsum([0, *rows])
    return [{k: v[bounds[i] : bounds[i + 1]] for k, v in outputs.items()} for i in range(len(rows))]


def take_batch(
    rows: Sequence[int], max_batch_size: int, preferred: Sequence[int], expired: bool
) -> int | None:
    """How many queued requests (a prefix of ``rows``) to dispatch now; None: keep waiting.

    A plain function of the queue so the policy can be tested by hand: dispatch the largest
    prefix that fits ``max_batch_size`` once the queue holds that many rows or the wait expired,
    or the largest prefix whose row count is a preferred size.
    """
    if not rows:
        return None
    total = 0
    fit = 0
    best_preferred = 0
    for i, r in enumerate(rows):
        if total + r > max_batch_size and i > 0:
            break
        total += r
        fit = i + 1
        if total in preferred:
            best_preferred = fit
        if total >= max_batch_size:
            break
    full = total >= max_batch_size or fit < len(rows)
    if full or expired:
        return fit
    if best_preferred:
        return best_preferred
    return None


class DynamicBatcher:
    """Batches the requests of one model version over its model instances.

    ``run(instance_index, features) -> outputs`` runs one batch on one instance (a worker
    thread; one per concurrent batch). Instances are used round robin. Create and use it from
    one event loop.
    """

    def __init__(
        self,
        run: RunFn,
        instances: int,
        config: BatchingConfig,
        *,
        on_batch: Callable[[int, int, list[float]], None] | None = None,
        name: str = "model",
    ):
        if instances < 1:
            raise ValueError(f"batcher: instances must be >= 1, got {instances}")
        self._run = run
        self.config = config
        self._on_batch = on_batch
        self._queue: collections.deque[_Item] = collections.deque()
        self._queued_rows = 0
        slots = instances * config.concurrency
        self._pool = concurrent.futures.ThreadPoolExecutor(slots, thread_name_prefix=name)
        self._free = asyncio.Semaphore(slots)
        self._instances = itertools.cycle(range(instances))
        self._wakeup = asyncio.Event()
        self._running: set[asyncio.Task] = set()
        self._closed = False
        self._flushing = False
        self._scheduler = asyncio.get_running_loop().create_task(self._schedule())
        self._slots = slots
        self.batches = 0  # batches run (for tests and stats)
        self.batch_seconds: float | None = None  # EWMA of the model time of one batch
        self.rows_per_second: float | None = None  # EWMA of one batch's examples per second

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    def expected_wait(self, rows: int, now: float | None = None) -> float:
        """Seconds a request of ``rows`` examples queued now is expected to wait for its batch.

        0 with an empty queue. When the request still fits the first batch: the batching window
        left to the oldest request. Otherwise the batches ahead of it over the free model slots:
        the smaller of (queued rows / measured rows per second) and (batches ahead x measured
        seconds per batch), so a throughput measured on small batches does not overestimate a
        queue that runs as large ones. 0 until a batch has been measured.
        """
        if not self._queue:
            return 0.0
        cfg = self.config
        now = time.monotonic() if now is None else now
        if cfg.enabled and self._queued_rows + rows < cfg.max_batch_size:
            if self._flushing:
                return 0.0
            return max(0.0, self._queue[0].enqueued + cfg.max_queue_delay_us / 1e6 - now)
        if self.batch_seconds is None or self.rows_per_second is None:
            return 0.0
        ahead = -(-self._queued_rows // cfg.max_batch_size) if cfg.enabled else len(self._queue)
        by_rows = self._queued_rows / self.rows_per_second
        return min(by_rows, ahead * self.batch_seconds) / self._slots

    async def submit(
        self, features: dict[str, np.ndarray], rows: int, deadline: float | None = None
    ) -> dict[str, np.ndarray]:
        """Queues one request of ``rows`` examples; returns its outputs ``{name: [rows, ...]}``."""
        if self._closed:
            raise BatcherClosed("the model version is being unloaded")
        cfg = self.config
        if len(self._queue) >= cfg.max_queue_size:
            raise QueueFull(
                f"the batch queue is full ({cfg.max_queue_size} requests waiting); "
                f"retry later or add capacity"
            )
        if self._queue and self._queued_rows + rows > cfg.max_queued_rows:
            raise QueueFull(
                f"the batch queue is full ({self._queued_rows} examples waiting, this request "
                f"has {rows}, max_queued_rows={cfg.max_queued_rows}); retry later or add capacity",
                reason="queue_rows",
            )
        if deadline is not None:
            now = time.monotonic()
            wait = self.expected_wait(rows, now)
            if wait > deadline - now:
                raise WouldMissDeadline(
                    f"deadline exceeded: {1e3 * max(deadline - now, 0.0):.1f} ms left, the "
                    f"expected wait in the batch queue is {1e3 * wait:.1f} ms "
                    f"({self._queued_rows} examples waiting)"
                )
        fut = asyncio.get_running_loop().create_future()
        item = _Item(features, rows, deadline, fut, time.monotonic(), tracing.capture())
        self._queue.append(item)
        self._queued_rows += rows
        self._wakeup.set()
        return await fut

    def _drop_dead(self, now: float) -> None:
        """Removes cancelled and expired requests from the head of the queue."""
        q = self._queue
        while q:
            it = q[0]
            if it.future.done():
                pass
            elif it.deadline is not None and it.deadline <= now:
                it.future.set_exception(
                    DeadlineExceeded(
                        f"deadline exceeded after {1e3 * (now - it.enqueued):.1f} ms in the "
                        f"batch queue"
                    )
                )
            else:
                return
            q.popleft()
            self._queued_rows -= it.rows

    async def _schedule(self) -> None:
        cfg = self.config
        delay = cfg.max_queue_delay_us / 1e6
        while True:
            await self._free.acquire()
            items: list[_Item] = []
            while not items:
                now = time.monotonic()
                self._drop_dead(now)
                if not self._queue:
                    if self._closed:
                        self._free.release()
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if not cfg.enabled:
                    n = 1
                else:
                    expired = now >= self._queue[0].enqueued + delay
                    n = take_batch(
                        [it.rows for it in self._queue],
                        cfg.max_batch_size,
                        cfg.preferred_batch_sizes,
                        expired or self._closed or self._flushing,
                    )
                if n is None:
                    self._wakeup.clear()
                    timeout = self._queue[0].enqueued + delay - now
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), max(timeout, 0.0))
                    continue
                for _ in range(n):
                    it = self._queue.popleft()
                    self._queued_rows -= it.rows
                    if not it.future.done():
                        items.append(it)
            task = asyncio.get_running_loop().create_task(self._execute(items))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _execute(self, items: list[_Item]) -> None:
        try:
            start = time.monotonic()
            rows = [it.rows for it in items]
            features = merge_features([it.features for it in items])
            instance = next(self._instances)
            loop = asyncio.get_running_loop()
            model_start = time.monotonic()
            try:
                outputs = await loop.run_in_executor(self._pool, self._run, instance, features)
                model_end = time.monotonic()
                parts = split_outputs(outputs, rows)
            except Exception as e:  # a failed batch fails its requests, never the server
                self._trace(items, start, model_start, e)
                for it in items:
                    if not it.future.done():
                        it.future.set_exception(e)
                return
            self._measure(sum(rows), time.monotonic() - start)
            self._trace(items, start, model_start, None, model_end)
            for it, part in zip(items, parts, strict=True):
                if not it.future.done():
                    it.future.set_result(part)
            if self._on_batch is not None:
                self._on_batch(sum(rows), len(items), [start - it.enqueued for it in items])
        finally:
            self._free.release()

    @staticmethod
    def _trace(
        items: list[_Item],
        start: float,
        model_start: float,
        error: BaseException | None,
        model_end: float | None = None,
    ) -> None:
        """The batch's spans for each traced request (``serving.tracing.record_batch``)."""
        if not any(it.trace is not None for it in items):
            return
        now = time.monotonic()
        tracing.record_batch(
            [it.trace for it in items],
            [it.enqueued for it in items],
            [it.rows for it in items],
            tracing.BatchTimes(start, model_start, model_end or now, now),
            error,
        )

    def _measure(self, rows: int, seconds: float) -> None:
        """Updates the batch timing averages with one batch of ``rows`` that took ``seconds``."""
        self.batches += 1
        seconds = max(seconds, 1e-6)
        if self.batch_seconds is None or self.rows_per_second is None:
            self.batch_seconds, self.rows_per_second = seconds, rows / seconds
            return
        self.batch_seconds += _EWMA * (seconds - self.batch_seconds)
        self.rows_per_second += _EWMA * (rows / seconds - self.rows_per_second)

    def flush(self) -> None:
        """From now on dispatches queued requests at once instead of waiting out the window.

        For a graceful stop: no new request can join the queued ones, so waiting for the
        batching window would only spend the stop's grace period.
        """
        self._flushing = True
        self._wakeup.set()

    async def drain(self) -> None:
        """Stops taking requests and waits until every queued and running batch has finished."""
        self._closed = True
        self._wakeup.set()
        await self._scheduler
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def close(self) -> None:
        """Drains, then releases the worker threads."""
        await self.drain()
        self._pool.shutdown(wait=True)
