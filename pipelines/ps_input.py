"""Worker-side input under ParameterServerStrategy: every worker builds its own share's dataset,
so the chief reads no training data and only schedules steps.

``ClusterCoordinator.create_per_worker_dataset(fn)`` runs the same ``fn`` on every worker; it
cannot tell a worker its index (tensorflow/tensorflow#53080), so every worker would read the
same rows. ``per_worker_iterators`` therefore does what the coordinator's
``PerWorkerDatasetFromDatasetFunction.__iter__`` does, once per worker with that worker's own
function: the chief traces ``make(worker index)`` into a concrete function (the epoch's plan,
a few hundred bytes of file names and record ranges, is part of it), each worker runs it as a
resource closure (``Worker.create_resource``) and keeps the iterator, and the per-worker
iterators are wrapped in the coordinator's ``PerWorkerDistributedIterator`` (a
``PerWorkerValues``), which ``schedule`` hands to whichever worker runs a step as that
worker's own iterator. A worker that fails and comes back gets its resource closures run
again by the coordinator: its iterator is rebuilt from the start of its share.

Only a dataset built from TensorFlow ops can run on a worker: the TFRecord input
(``[data] input_format = "tfrecord"``, ``features.tfrecord``); the Parquet input is read by the
chief and sent with each step.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import input_lib
from tensorflow.python.distribute.coordinator import values as coordinator_values


@dataclasses.dataclass(frozen=True)
class WorkerBatch:
    """One step's input: the per-worker iterators, of which the worker running the step takes
    its next batch of ``rows`` rows."""

    iterators: Any  # coordinator_values.PerWorkerDistributedIterator
    rows: int


def _no_variables(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
    raise ValueError("a worker's dataset function must not create variables")


def per_worker_iterators(
    coordinator: tf.distribute.coordinator.ClusterCoordinator,
    make: Callable[[int], tf.data.Dataset],
) -> Any:
    """One iterator per worker over ``make(worker index)``, built on that worker; a
    ``PerWorkerValues`` ``coordinator.schedule`` accepts as an argument."""
    strategy = coordinator.strategy
    values = []
    for worker in coordinator._cluster.workers:  # no public API gives a worker its own function
        with tf.variable_creator_scope(_no_variables):
            share = functools.partial(make, worker.worker_index)
            fn = tf.function(share, autograph=False).get_concrete_function()

        def create(fn: Any = fn) -> Any:
            return iter(fn())

        value = worker.create_resource(create)
        # a python closure has no output spec: give it the iterator's, as the coordinator does
        value._type_spec = input_lib.get_iterator_spec_from_dataset(strategy, fn.structured_outputs)
        values.append(value)
    return coordinator_values.PerWorkerDistributedIterator(values)


def worker_batches(
    coordinator: tf.distribute.coordinator.ClusterCoordinator,
    make: Callable[..., tf.data.Dataset],
    batch_size: int,
    done: int,
    steps: int,
) -> Iterator[WorkerBatch]:
    """The epoch's remaining ``steps - done`` steps, each a ``WorkerBatch``.

    Worker ``w`` of ``W`` reads ``make(batch_size=batch_size, shard=(w, W),
    drop_remainder=True, skip_batches=done // W).repeat()``: its own share of the epoch in
    whole batches, the ``done`` batches already trained split evenly among the workers, and
    its share again from the start if it runs more steps than its share holds (asynchronous
    workers do not run equal numbers of steps)."""
    workers = len(coordinator._cluster.workers)

    def share(index: int) -> tf.data.Dataset:
        ds = make(
            batch_size=batch_size,
            shard=(index, workers),
            drop_remainder=True,
            skip_batches=done // workers,
        )
        return ds.repeat()

    if steps <= done:
        return
    batch = WorkerBatch(per_worker_iterators(coordinator, share), batch_size)
    for _ in range(steps - done):
        yield batch


def iterator_step(worker_step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``worker_step`` (a step on a batch) as a tf.function that takes the batch from the
    iterator it is given, on the worker running it."""

    @tf.function
    def step(iterator: Any) -> Any:
        return worker_step(next(iterator))

    return step
