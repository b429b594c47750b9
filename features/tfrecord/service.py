"""The TFRecord training input on tf.data service: a dispatcher and workers that read, parse
and permute the windows, so the training process only receives finished batches.

``tf.data.experimental.service`` runs a dataset graph on other processes (or machines): a
dispatcher hands out work, workers run the graph and send elements, the trainer's
``distribute`` transformation reads them. ``make_tfrecord_dataset`` holds no Python function
and its source has one element per window, so under dynamic sharding
(``ShardingPolicy.DYNAMIC``) the dispatcher hands each window of the epoch to one worker, once:

* one worker: the epoch's batches in the order ``make_tfrecord_dataset`` yields them locally;
* several: every batch of the epoch once, each window's batches in their order, windows in the
  order the workers finish them. A run resumed mid-epoch skips the first batches of the plan's
  order (``skip_batches``), which can differ from those trained by the windows that were in
  flight when the run stopped.

The workers read the TFRecord files by their absolute paths: they must see the same files
(the same machine, or a shared file system). Start the servers with ``stitchrec data-service``
(``pipelines.data_service``) or ``start_dispatcher`` / ``start_worker``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import tensorflow as tf

from features.tfrecord.address import service_address

#: seconds ``check_reachable`` waits for a dispatcher to answer
REACH_SECONDS = 10.0


def check_reachable(address: str, timeout: float | None = None) -> None:
    """Returns once a gRPC server answers at ``address`` (a dispatcher's ``HOST:PORT``);
    tf.data service itself would wait for it forever.

    Raises:
      ConnectionError: none answered within ``timeout`` seconds (default ``REACH_SECONDS``).
    """
    target = service_address(address)
    wait = REACH_SECONDS if timeout is None else timeout
    with grpc.insecure_channel(target.removeprefix("grpc://")) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=wait)
        except grpc.FutureTimeoutError:
            raise ConnectionError(
                f"no tf.data service dispatcher answers at {target} (waited {wait:g} s): start "
                "one with `stitchrec data-service dispatcher`, or correct the address"
            ) from None


def distribute(dataset: tf.data.Dataset, address: str) -> tf.data.Dataset:
    """``dataset`` run by the workers of the dispatcher at ``address`` under dynamic sharding:
    the elements of ``dataset``'s source (for ``make_tfrecord_dataset``, its windows) are
    handed out one at a time, each processed by one worker. Elements travel uncompressed:
    with tf.data service's default (snappy), receiving an epoch cost the training process
    more CPU than reading it itself (``bench/train/data_service.py``)."""
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=service_address(address),
            compression=None,  # snappy's decompression cost the trainer more than parsing
        )
    )


def served(make: Callable[..., tf.data.Dataset], address: str) -> Callable[..., tf.data.Dataset]:
    """``make`` (a ``make_tfrecord_dataset`` with its files bound) whose datasets are read
    from the tf.data service at ``address`` (``distribute``)."""

    def make_served(**kwargs: Any) -> tf.data.Dataset:
        return distribute(make(**kwargs), address)

    return make_served


def start_dispatcher(
    port: int = 0, work_dir: str | Path | None = None
) -> tf.data.experimental.service.DispatchServer:
    """A started dispatcher on ``port`` (0: any free port; ``server.target`` names it). With
    ``work_dir`` it journals its state there and, restarted on the same folder, resumes the
    jobs in progress (fault-tolerant mode)."""
    config = tf.data.experimental.service.DispatcherConfig(
        port=port,
        work_dir=str(work_dir) if work_dir else None,
        fault_tolerant_mode=work_dir is not None,
    )
    return tf.data.experimental.service.DispatchServer(config)


def start_worker(
    dispatcher: str, port: int = 0, host: str = "localhost"
) -> tf.data.experimental.service.WorkerServer:
    """A started worker on ``port`` (0: any free port) that registers with ``dispatcher``
    (``HOST:PORT``) as ``host:<port>``, the address trainers connect to."""
    address = service_address(dispatcher).removeprefix("grpc://")
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=address, worker_address=f"{host}:%port%", port=port
    )
    return tf.data.experimental.service.WorkerServer(config)


def worker_port(server: tf.data.experimental.service.WorkerServer) -> int:
    """The port ``server`` listens on (the one chosen when started on port 0)."""
    return int(server._address.rsplit(":", 1)[1])  # its only accessor of the bound port


class InputStalledError(RuntimeError):
    """No element came from tf.data service within the deadline: its workers were lost (a
    lost worker's window never ends) or none is running. ``stitchrec train`` exits with
    status 3 on it; started again, the run resumes from its last checkpoint."""


_END = object()


def within_deadline(iterator: Iterator[Any], seconds: float, address: str) -> Iterator[Any]:
    """``iterator``'s elements, read ahead (at most two) on a daemon thread; raises
    ``InputStalledError`` naming ``address`` when the next one takes more than ``seconds``.

    tf.data service's reader waits without end for a window whose worker was lost, and for
    workers when none is running; this turns that wait into an error.
    """
    ready: queue.Queue = queue.Queue(maxsize=2)
    closed = threading.Event()

    def hand(item: tuple[Any, Exception | None]) -> bool:
        """Puts ``item`` once there is room; False when the reader closed first."""
        while not closed.is_set():
            try:
                ready.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for element in iterator:
                if not hand((element, None)):
                    return  # the loop stopped reading (early stopping, max_steps)
            hand((_END, None))
        except Exception as e:  # handed to the reading thread
            hand((_END, e))

    threading.Thread(target=read, name="data-service-input", daemon=True).start()
    try:
        while True:
            try:
                element, error = ready.get(timeout=seconds)
            except queue.Empty:
                raise InputStalledError(
                    f"no batch from the tf.data service at {service_address(address)} for "
                    f"{seconds:g} s ([data] data_service_timeout): its workers were lost or "
                    "none is running; start workers (`stitchrec data-service worker`) and run "
                    "the same command again: training resumes from its last checkpoint"
                ) from None
            if error is not None:
                raise error
            if element is _END:
                return
            yield element
    finally:
        closed.set()
