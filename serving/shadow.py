"""Shadow traffic: primary calls mirrored to a shadow version, off the hot path.

A model whose ``traffic.toml`` has a ``[shadow]`` table (``serving.traffic``) gets a share of
its calls scored a second time on the shadow version. ``ShadowTraffic`` is a call observer
(``serving.calls``): for each scored primary call (any protocol, not itself a shadow call, not
already answered by the shadow version) it draws the call by its request id::

    mirrored  <=>  blake2b("shadow:" + request_id) % 10000 < 10000 * fraction

and puts it on a queue without waiting (``put_nowait``); a model with ``queue`` mirrored calls
waiting already has the call dropped and counted. One background task per server scores the
queued calls one at a time through ``serving.inference.run`` on the shadow version (its own
batcher; the checks on a decode worker thread), with the primary call's request id, protocol,
start time and arm, and tells the observers with ``shadow=True``.

The shadow takes at most ``max_share`` of the server's time (default 0.05): after a mirrored
call that took ``t`` seconds the task pauses ``t * (1 - max_share) / max_share`` seconds before
the next one, so a slow shadow version or a busy server leaves the primary calls at least
``1 - max_share`` of the machine, and the mirrored calls past that rate queue and are dropped.
The prediction log writes the mirrored rows with ``shadow`` set and the shadow version. The shadow answer is never returned and
a shadow failure never reaches the client: it is counted and logged (at most once per model
every ``LOG_EVERY_S`` seconds).

Metrics: ``stitchrec_shadow_total{model, outcome}`` with outcome ``scored``, ``dropped`` (the
queue was full, or the server stopped with calls waiting) or ``failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from serving import inference
from serving.calls import ScoredCall, start_call
from serving.routing import BUCKETS, bucket

log = logging.getLogger("stitchrec.serving.shadow")

LOG_EVERY_S = 10.0


def mirrored(request_id: str, fraction: float) -> bool:
    """Whether the call with ``request_id`` is mirrored at ``fraction`` (deterministic)."""
    return bucket(b"shadow:" + request_id.encode()) < BUCKETS * fraction


class ShadowTraffic:
    """The shadow observer of one server (``state``: its ``serving.rpc.ServerState``).

    ``start()`` starts the background task (on the running loop), ``stop()`` ends it; calls
    still waiting then are counted as dropped.
    """

    __name__ = "shadow_traffic"

    def __init__(self, state: Any):
        self.state = state
        self._queue: asyncio.Queue[tuple[ScoredCall, int]] = asyncio.Queue()
        self._pending: dict[str, int] = {}
        self._task: asyncio.Task | None = None
        self._logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def pending(self, model: str) -> int:
        """Mirrored calls of ``model`` waiting or being scored."""
        return self._pending.get(model, 0)

    def __call__(self, call: ScoredCall) -> None:
        if call.shadow or self._task is None:
            return
        config = self.state.traffic.config(call.model)
        if config is None or config.shadow is None:
            return
        version = config.shadow_version()
        if version == call.version or not mirrored(call.request_id, config.shadow.fraction):
            return
        if self._pending.get(call.model, 0) >= config.shadow.queue:
            self.state.metrics.record_shadow(call.model, "dropped")
            return
        self._pending[call.model] = self._pending.get(call.model, 0) + 1
        self._queue.put_nowait((call, version))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Ends the background task (the call being scored is cancelled); what is still
        queued is counted as dropped."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        while not self._queue.empty():
            call, _ = self._queue.get_nowait()
            self._done(call.model, "dropped")

    def _done(self, model: str, outcome: str) -> None:
        self._pending[model] = max(0, self._pending.get(model, 0) - 1)
        self.state.metrics.record_shadow(model, outcome)

    async def _run(self) -> None:
        while True:
            call, version = await self._queue.get()
            t0 = time.monotonic()
            try:
                await self._mirror(call, version)
            except asyncio.CancelledError:
                self._done(call.model, "dropped")
                raise
            except Exception as e:
                self._done(call.model, "failed")
                self._log_failure(call, version, e)
            else:
                self._done(call.model, "scored")
            await asyncio.sleep(self._pause(call.model, time.monotonic() - t0))

    def _pause(self, model: str, seconds: float) -> float:
        """Seconds to wait after a mirrored call of ``model`` that took ``seconds``, keeping
        the shadow within its ``max_share`` of the time."""
        config = self.state.traffic.config(model)
        if config is None or config.shadow is None:
            return 0.0
        share = config.shadow.max_share
        return seconds * (1.0 - share) / share

    async def _offload(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.state.pool, fn)

    async def _mirror(self, primary: ScoredCall, version: int) -> None:
        info = start_call(primary.protocol, primary.request_id)
        info.arm, info.started = primary.arm, primary.timestamp
        target = inference.target_of(self.state.repo.get(primary.model, version), primary.signature)
        inputs: list[dict[str, np.ndarray]] = []

        def prepare() -> tuple[dict[str, np.ndarray], int]:
            checked, rows = inference.check_inputs(target, primary.features, self.state.limits)
            inputs.append(checked)
            return checked, rows

        outputs = await inference.run(target, prepare, None, self._offload, None)
        self.state.observers.notify(inference.scored_call(target, inputs[0], outputs, shadow=True))

    def _log_failure(self, call: ScoredCall, version: int, error: Exception) -> None:
        now = time.monotonic()
        self._unlogged[call.model] = self._unlogged.get(call.model, 0) + 1
        if now - self._logged.get(call.model, -LOG_EVERY_S) < LOG_EVERY_S:
            return
        self._logged[call.model] = now
        _, message = inference.status_of(error)
        log.warning(
            json.dumps(
                {
                    "event": "shadow_failed",
                    "model": call.model,
                    "version": version,
                    "error": message,
                    "failures": self._unlogged.pop(call.model),
                }
            )
        )
