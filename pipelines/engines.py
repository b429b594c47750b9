"""The engines that run the data jobs' tasks (``features.tasks``): this process, or Dask
distributed, in its local mode or on a cluster.

* ``local`` (the default): every task in this process, one after the other.
* ``dask``: a Dask distributed cluster. With an address (``--cluster tcp://HOST:8786``, the
  scheduler of a cluster started with ``dask scheduler`` and ``dask worker``, or by the Dask
  Kubernetes operator, Helm chart or a cloud service) the job's tasks run on its workers; without
  one, on a local cluster of ``workers`` processes (one thread each) started for the command.
  Each task is retried ``retries`` times when it raises, and the scheduler moves the tasks of a
  worker that dies to the others (a task whose workers died ``distributed.scheduler.allowed-
  failures`` times, 3 by default, fails); a task that fails for good ends the job with one
  ``JobError`` naming the job, the task and the cause. A job also fails when the cluster has
  had no worker at all for ``no_workers_seconds`` (every worker lost and none back, or none
  started): Dask would keep its tasks waiting for one. The log names the dashboard, where the
  job's progress shows.

Workers read the inputs and write the outputs by path: on a cluster they need the same files
at the same paths (a shared file system), and StitchRec installed in the same version.
docs/scale.md has a cluster recipe and the measurements behind the choice of Dask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from features.partitions import CHUNK_BYTES
from features.tasks import JobError, LocalRunner, TaskRunner, lanes
from pipelines.config_sections import EngineConfig
from pipelines.errors import UsageError

R = TypeVar("R")
Log = Callable[[str], None]
POLL_S = 1.0  # how often a job waiting on a result checks that the cluster has workers


class DaskRunner:
    """Runs a job's tasks on a Dask distributed client (see the module docstring)."""

    name = "dask"

    def __init__(
        self, client: Any, retries: int, where: str, no_workers_s: float, poll_s: float = POLL_S
    ) -> None:
        self.client = client
        self.retries = retries
        self.where = where
        self.no_workers_s = no_workers_s
        self.poll_s = poll_s

    def _shared(self, shared: Any) -> tuple[Any, ...]:
        """The extra task argument of ``shared``: its handle, sent once to every worker (none
        when ``shared`` is None)."""
        if shared is None:
            return ()
        [handle] = self.client.scatter([shared], broadcast=True, hash=False)
        return (handle,)

    def _submit(
        self, fn: Callable[..., Any], items: Sequence[Any], shared: Any, name: str
    ) -> list[Any]:
        keys = [f"{name}-{uuid.uuid4().hex[:8]}-{i}" for i in range(len(items))]
        extra = [[handle] * len(items) for handle in self._shared(shared)]
        return self.client.map(fn, items, *extra, key=keys, pure=False, retries=self.retries)

    def map(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        *,
        shared: Any = None,
        label: str = "",
    ) -> list[R]:
        if not items:
            return []
        label = label or fn.__name__
        futures = self._submit(fn, items, shared, label.replace(" ", ""))
        try:
            n = len(items)
            return [self._result(f, label, f"task {i + 1} of {n}") for i, f in enumerate(futures)]
        finally:
            self.client.cancel(futures)

    def map_reduce(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        merge: Callable[[R, R], R],
        *,
        shared: Any = None,
        label: str = "",
    ) -> R:
        """The tasks, their results folded on the workers in lanes (``_fold_in_lanes``); only
        the final result travels to this process. Each result is freed once merged, so a
        worker holds a few results at once however many tasks the job has. A merge is not
        retried (it may consume its first argument): a worker lost under it recomputes its
        inputs."""
        if not items:
            raise ValueError("map_reduce needs at least one item")
        label = label or fn.__name__
        final = self._fold_in_lanes(fn, items, shared, merge, label.replace(" ", ""))
        try:
            return self._result(final, label, f"the tasks of {len(items)} and their merges")
        finally:
            self.client.cancel([final])  # releases every task and merge it still waits on

    def _fold_in_lanes(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        shared: Any,
        merge: Callable[[R, R], R],
        name: str,
    ) -> Any:
        """The future of ``fn`` over ``items`` merged in order: the items are cut into one
        contiguous lane per worker (``lanes``), each lane's results folded into its running
        result as they arrive, then the lanes' results folded in lane order. A task's Dask
        priority is minus its place in its lane, so every lane's first tasks run first and
        each fold keeps up with its tasks: a lane holds its running result and the results
        not yet merged into it, not one per task. Only the final future is kept here."""
        workers = len(self.client.scheduler_info().get("workers", {}))
        bounds = lanes(len(items), max(1, workers))
        extra = self._shared(shared)
        tag = uuid.uuid4().hex[:8]
        folded = []
        for lo, hi in bounds:
            running = None
            for i in range(lo, hi):
                key = f"{name}-{tag}-{i}"
                task = self.client.submit(
                    fn, items[i], *extra, key=key, pure=False, retries=self.retries, priority=lo - i
                )
                running = task if running is None else self._merge(merge, running, task, key)
            folded.append(running)
        final = folded[0]
        for k, lane in enumerate(folded[1:], start=1):
            final = self._merge(merge, final, lane, f"{name}-{tag}-lanes-{k}")
        return final

    def _merge(self, merge: Callable[[R, R], R], a: Any, b: Any, key: str) -> Any:
        """The future of ``merge(a, b)``, run before any task still waiting (priority 1)."""
        return self.client.submit(merge, a, b, key=f"{key}-merge", pure=False, priority=1)

    def _result(self, future: Any, label: str, what: str) -> Any:
        distributed = _distributed()
        try:
            return self._wait(future, label, what)
        except distributed.KilledWorker as e:
            raise JobError(
                f"{label}: {what} failed: the workers running it died ({e}); see the workers' "
                f"logs on {self.where}"
            ) from None
        except distributed.comm.core.CommClosedError as e:
            raise JobError(
                f"{label}: {what}: the connection to {self.where} was lost ({e})"
            ) from None

    def _wait(self, future: Any, label: str, what: str) -> Any:
        """``future.result()`` once the future is done on the cluster, checking every
        ``poll_s`` that the cluster has a worker: after ``no_workers_s`` without any, a
        ``JobError``. The waiting never times out a transfer: ``result(timeout=...)`` would
        abandon a result still on its way (a large one takes seconds) and fetch it again from
        the start on the next call, forever."""
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())  # done, failed or cancelled
        alone_since = None
        while True:
            if done.wait(self.poll_s):
                return future.result()
            if self.client.scheduler_info().get("workers"):
                alone_since = None
                continue
            now = time.monotonic()
            alone_since = alone_since or now
            if now - alone_since >= self.no_workers_s:
                raise JobError(
                    f"{label}: {what} could not run: {self.where} has had no workers for "
                    f"{self.no_workers_s:g} s; start workers (`dask worker ADDRESS`) or see "
                    f"their logs ([engine] no_workers_seconds)"
                )

    def describe(self) -> str:
        info = self.client.scheduler_info()
        workers = len(info.get("workers", {}))
        link = self.client.dashboard_link
        return f"dask on {self.where}: {workers} worker(s), dashboard {link}"


def _distributed() -> Any:
    """The ``distributed`` package (an optional dependency: imported when a command asks for
    the dask engine)."""
    try:
        import distributed
        import distributed.comm.core
    except ImportError:
        raise UsageError(
            "the dask engine needs Dask distributed: pip install 'stitchrec[scale]'"
        ) from None
    return distributed


class _LazyDask:
    """The dask runner of ``config``, connected (or its local cluster started) on the first
    ``map``: a command whose data is already prepared starts no cluster."""

    name = "dask"

    def __init__(self, config: EngineConfig, stack: contextlib.ExitStack, log: Log) -> None:
        self.config, self.stack, self.log = config, stack, log
        self._runner: DaskRunner | None = None

    def _open(self) -> DaskRunner:
        if self._runner is None:
            self._runner = _connect(self.config, self.stack)
            self.log(f"engine: {self._runner.describe()}")
        return self._runner

    def map(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        *,
        shared: Any = None,
        label: str = "",
    ) -> list[R]:
        return self._open().map(fn, items, shared=shared, label=label)

    def map_reduce(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        merge: Callable[[R, R], R],
        *,
        shared: Any = None,
        label: str = "",
    ) -> R:
        return self._open().map_reduce(fn, items, merge, shared=shared, label=label)

    def describe(self) -> str:
        return self._open().describe()


#: the Dask address schemes whose location is HOST:PORT (no scheme: tcp)
ADDRESS_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
_ADDRESS_FORM = (
    "expected HOST:PORT or SCHEME://HOST:PORT with a port from 1 to 65535 and SCHEME one of "
    f"{', '.join(ADDRESS_SCHEMES)} (e.g. tcp://HOST:8786; an IPv6 host in brackets, [::1]:8786)"
)


def check_address(address: str, what: str) -> None:
    """Raises UsageError naming ``what`` (``--cluster``) and ``address`` when it is not the
    address of a Dask scheduler in a form Dask connects to: ``[SCHEME://]HOST:PORT``. Checked
    before connecting: Dask would raise a ValueError, after which its half-made client waits
    20 s to close."""
    scheme, sep, loc = address.rpartition("://")
    if sep and scheme not in ADDRESS_SCHEMES:
        raise UsageError(f"{what} {address!r}: unknown scheme {scheme!r}; {_ADDRESS_FORM}")
    problem, port = _location_problem(loc)
    if problem:
        raise UsageError(f"{what} {address!r}: {problem}; {_ADDRESS_FORM}")
    if not 1 <= int(port) <= 65535:
        raise UsageError(f"{what} {address!r}: port {port} is out of range; {_ADDRESS_FORM}")


def _location_problem(loc: str) -> tuple[str, str]:
    """(what is wrong with ``HOST:PORT`` ``loc``, or ""; its port)."""
    if loc.startswith("["):  # IPv6: [HOST]:PORT
        host, _, tail = loc[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, colon, port = loc.rpartition(":")
        if not colon:
            host, port = loc, ""
        elif ":" in host:
            return "an IPv6 host needs brackets", port
    if not loc:
        return "no HOST:PORT", port
    if not host:
        return "no host", port
    if not port:
        return "no port", port
    if not (port.isascii() and port.isdigit()):
        return f"port {port!r} is not a number", port
    return "", port


def _connect(config: EngineConfig, stack: contextlib.ExitStack) -> DaskRunner:
    distributed = _distributed()
    if config.address:
        check_address(config.address, "[engine] address")
        try:
            client = distributed.Client(
                config.address, timeout=f"{config.connect_seconds}s", set_as_default=False
            )
        except OSError as e:
            raise UsageError(
                f"engine address {config.address!r}: no Dask scheduler answered in "
                f"{config.connect_seconds:g} s ({e}; [engine] connect_seconds); expected the "
                "address of a running `dask scheduler`, e.g. tcp://HOST:8786"
            ) from None
        stack.callback(client.close)
        return DaskRunner(client, config.retries, config.address, config.no_workers_seconds)
    workers = config.workers or os.cpu_count() or 1
    cluster = _local_cluster(distributed, workers)
    stack.callback(cluster.close)
    client = distributed.Client(cluster, set_as_default=False)
    stack.callback(client.close)
    where = f"a local cluster of {workers} process(es)"
    return DaskRunner(client, config.retries, where, config.no_workers_seconds)


#: Dask's nannies set ``MALLOC_TRIM_THRESHOLD_`` in their workers (against memory
#: fragmentation); any value turns off glibc's adaptive mmap threshold, so the data jobs' large
#: numpy and Arrow buffers each cost an mmap: the statistics' tasks ran 1.6x slower with it. A
#: None in Dask's config unsets it (docs/scale.md: the same for a cluster of your own).
NO_MALLOC_TRIM = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def _local_cluster(distributed: Any, workers: int) -> Any:
    import dask  # installed with distributed, an optional dependency

    with dask.config.set(NO_MALLOC_TRIM):
        return distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR,
        )


@contextlib.contextmanager
def open_runner(config: EngineConfig | None, log: Log = print) -> Iterator[TaskRunner]:
    """The runner of ``config`` for the block: this process, or Dask (a cluster at
    ``config.address``, or a local cluster started here), connected when the first job runs
    and closed (a local cluster stopped) when the block ends. Logs where the tasks run."""
    config = config or EngineConfig()
    if config.name == "local":
        yield LocalRunner()
        return
    _distributed()  # a missing package is a usage error before any work
    with contextlib.ExitStack() as stack:
        yield _LazyDask(config, stack, log)


def engine_config(args: Any, base: EngineConfig | None = None) -> EngineConfig:
    """``base`` (a config's ``[engine]``) with the command's ``--engine``, ``--cluster``,
    ``--workers`` and ``--task-retries`` flags applied; ``--cluster`` alone means dask.
    UsageError for a ``--cluster`` that is not a scheduler's address (``check_address``)."""
    base = base or EngineConfig()
    name = getattr(args, "engine", None) or ("dask" if getattr(args, "cluster", None) else None)
    changes = {
        "name": name,
        "address": getattr(args, "cluster", None),
        "workers": getattr(args, "workers", None),
        "retries": getattr(args, "task_retries", None),
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    if changes.get("name") == "local" and "address" in changes:
        raise UsageError("--cluster names a Dask scheduler: drop --engine local, or --cluster")
    if changes.get("address"):
        check_address(changes["address"], "--cluster")
    if changes.get("name") == "local":
        changes["address"] = ""
    return dataclasses.replace(base, **changes)


def chunk_bytes(args: Any) -> int:
    """The ``--chunk-mb`` flag in bytes (``features.partitions.CHUNK_BYTES`` when not given)."""
    mb = getattr(args, "chunk_mb", None)
    return CHUNK_BYTES if mb is None else max(1, int(mb * (1 << 20)))
