"""Jobs as independent tasks: the runner interface the data jobs are written against, the
in-process runner, and atomic task outputs.

A data job (``convert``, ``stats``, the FIVES interaction screen, the PCF pair graph, batch
scoring) is planned on the driver as a list of tasks whose layout depends only on the data
(files, byte ranges, row groups), never on the number of workers. A ``TaskRunner`` runs a
module-level function over the tasks and returns the results in task order; the driver merges
them in that order. So a job gives the same result, bit for bit, whichever runner ran it:
``LocalRunner`` (this process, one task after the other: the default) or a cluster engine's
runner (``pipelines.engines``: Dask distributed, in its local mode or on a cluster).

A task may run more than once (a retry after a worker died, or a lost result recomputed), so a
task that writes files writes each under a temporary name and renames it into place
(``atomic_path``): a file it leaves is complete, and a second run replaces it with the same
bytes.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class JobError(RuntimeError):
    """A task of a distributed job failed for good: its worker died more often than the engine
    allows, or the cluster went away. The message names the job, the task and the cause."""


class TaskRunner(Protocol):
    """Runs a function over a job's tasks.

    ``map(fn, items, shared=None, label="")`` calls ``fn(item)`` for every item (``fn(item,
    shared)`` when ``shared`` is given: an object every task reads, sent once to each worker)
    and returns the results in the order of ``items``. ``fn`` must be a module-level function
    (a cluster pickles it by reference) and ``items``, ``shared`` and the results picklable.
    ``label`` names the job's step in logs and errors.
    """

    name: str

    def map(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        *,
        shared: Any = None,
        label: str = "",
    ) -> list[R]: ...

    def map_reduce(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        merge: Callable[[R, R], R],
        *,
        shared: Any = None,
        label: str = "",
    ) -> R:
        """``fn`` over ``items`` (as ``map``), the results combined by ``merge``: no more than
        a few results are held at once. ``merge(a, b)`` may consume ``a``; ``a`` holds items
        before ``b``'s, so order-keeping merges (list concatenation) keep item order. Runners
        group the merges differently (the local runner folds in item order; Dask folds the
        contiguous ``lanes`` of its workers, then the lanes' results), so ``merge`` must give
        the same result in any grouping: exact, not float-rounded, sums
        (``features.exact_sum``)."""
        ...

    def describe(self) -> str:
        """One line for the log: the engine, where it runs and its progress page, if any."""
        ...


class LocalRunner:
    """Runs every task in this process, one after the other, in task order."""

    name = "local"

    def map(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        *,
        shared: Any = None,
        label: str = "",
    ) -> list[R]:
        del label
        if shared is None:
            return [fn(item) for item in items]
        return [fn(item, shared) for item in items]

    def map_reduce(
        self,
        fn: Callable[..., R],
        items: Sequence[Any],
        merge: Callable[[R, R], R],
        *,
        shared: Any = None,
        label: str = "",
    ) -> R:
        del label
        if not items:
            raise ValueError("map_reduce needs at least one item")
        results = (fn(item) if shared is None else fn(item, shared) for item in items)
        total = next(results)
        for result in results:  # two results held at once, however many tasks
            total = merge(total, result)
        return total

    def describe(self) -> str:
        return "local (this process)"


def lanes(n: int, count: int) -> list[tuple[int, int]]:
    """Items ``[0, n)`` cut into ``min(count, n)`` contiguous ``(lo, hi)`` ranges of sizes
    that differ by at most one, the larger first, in item order."""
    count = max(1, min(count, n))
    size, extra = divmod(n, count)
    out, lo = [], 0
    for k in range(count):
        hi = lo + size + (1 if k < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def runner_or_local(runner: TaskRunner | None) -> TaskRunner:
    """``runner``, or a ``LocalRunner`` when None."""
    return LocalRunner() if runner is None else runner


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """A temporary path beside ``final`` (hidden, unique) to write; renamed to ``final`` when
    the block ends without an exception, removed otherwise."""
    final = Path(final)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


def balanced_groups(weights: Sequence[float], groups: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges that cut ``weights`` (in order) into at most ``groups`` contiguous
    runs of about equal total weight; every range is non-empty."""
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    n = len(weights)
    total = float(sum(weights))
    out: list[tuple[int, int]] = []
    lo, acc = 0, 0.0
    for i, w in enumerate(weights):
        acc += w
        target = total * (len(out) + 1) / groups
        if acc >= target and i + 1 < n and len(out) < groups - 1:
            out.append((lo, i + 1))
            lo = i + 1
    if lo < n:
        out.append((lo, n))
    return out
