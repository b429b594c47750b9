"""Parameter-server training for ``stitchrec train``: ParameterServerStrategy + ClusterCoordinator.

A cluster of one ``chief``, ``N >= 1`` ``worker`` and ``M >= 1`` ``ps`` tasks (TF_CONFIG, as
tf.distribute defines it; ``[distribute] strategy = "parameter_server"``, or ``auto`` when the
cluster lists ``ps`` tasks):

* ``ps`` tasks hold the variables. Every variable created in the strategy's scope is split along
  its first axis by ``MinSizePartitioner(min_shard_bytes=[distribute] ps_min_shard_bytes,
  max_shards=M)``: a ``[rows, dim]`` float32 table of ``B = rows * dim * 4`` bytes becomes
  ``min(M, ceil(B / ps_min_shard_bytes), rows)`` shards of consecutive rows (a ShardedVariable
  when more than one), placed round-robin on the ps tasks. Every embedding layer of
  ``embeddings/`` reads its tables with ``tf.nn.embedding_lookup``, which reads a ShardedVariable
  shard by shard (only the rows a batch uses travel) and whose gradient is one IndexedSlices per
  shard, so only the touched rows of each shard are updated. Small variables (biases, dense
  kernels under the threshold) stay whole on one ps. Sharded kernels start as in one process
  (``_whole_shape_init``).
* ``worker`` tasks only run a ``tf.distribute.Server``; the chief sends them training steps.
  They exit on their own when the chief's run folder gets a new ``train_report.json`` (the
  file's stamp is polled every second), so a Kubernetes Job of worker and ps pods completes.
* the ``chief`` runs ``pipelines.train.train`` and schedules every step with
  ``ClusterCoordinator.schedule``, which runs it on whichever worker is free: the full batch's
  mean binary cross-entropy plus the L2 penalty, gradients applied to the ps variables at once
  (asynchronous: steps on different workers overlap and may read slightly stale variables).
  ``sync`` (``ClusterCoordinator.join``) waits for every scheduled step; the loop calls it
  before logging metrics, saving a checkpoint and evaluating, so checkpoints hold exactly the
  steps counted, and a restarted chief resumes like one process does.

Where a step's batch comes from (``use_input``):

* TFRecord input (``[data] input_format = "tfrecord"``): each worker builds its own share's
  dataset (``pipelines.ps_input``: worker ``w`` of ``W`` reads rows ``[w q, (w + 1) q)`` of the
  epoch, ``q = rows // W``, in whole batches, repeated) and the step takes its batch from the
  iterator of the worker running it. The chief reads no training data; an epoch is ``W *
  (q // batch_size)`` steps.
* Parquet input: the pyarrow pipeline runs Python, which cannot run on a remote worker; the
  chief reads every batch with the single-process pipeline (the same ``(seed, epoch)`` order)
  and sends it over gRPC with its step, so its input throughput is the cluster's ceiling.

Fault tolerance: a worker that dies mid-step has its step rescheduled on another worker by the
coordinator (training continues with the workers left; a step may be applied twice when the
worker died after updating the ps, the usual at-least-once of asynchronous training). A ps or
chief failure stops training: restart the chief (and the lost task); it restores the latest
checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from pipelines.config import ConfigError, DistributeConfig
from pipelines.ps_input import WorkerBatch, iterator_step, worker_batches
from pipelines.run.step import make_train_step

Log = Callable[[str], None]

_DOCS = "docs/distributed.md"
#: ``[distribute] ps_min_shard_bytes`` default: TensorFlow's own MinSizePartitioner default.
DEFAULT_MIN_SHARD_BYTES = 256 << 10
#: seconds between two looks of a worker or ps task at the chief's ``train_report.json``.
POLL_SECONDS = 1.0
REPORT = "train_report.json"
#: seconds the chief waits for every worker and ps task to accept connections.
START_TIMEOUT = 600.0


def check_cluster(spec: Any) -> None:
    """Raises ConfigError unless ``spec`` (a ``distribute.ClusterSpec``) is a parameter-server
    cluster: exactly one ``chief``, at least one ``worker`` and one ``ps``, no ``evaluator``."""
    sizes = {k: len(v) for k, v in spec.cluster.items()}
    if sizes.get("chief", 0) != 1:
        raise ConfigError(
            f"parameter_server: TF_CONFIG must list exactly one chief task (it runs the training "
            f"loop), got {sizes.get('chief', 0)}; cluster {sizes}; see {_DOCS}"
        )
    for kind in ("worker", "ps"):
        if sizes.get(kind, 0) < 1:
            raise ConfigError(
                f"parameter_server: TF_CONFIG must list at least one {kind} task; cluster "
                f"{sizes}; see {_DOCS}"
            )
    if "evaluator" in sizes:
        raise ConfigError(
            "parameter_server: evaluator tasks are not supported (the chief evaluates); remove "
            "them from TF_CONFIG"
        )


def local_cluster(ports: list[int], workers: int, ps: int, host: str = "127.0.0.1") -> dict:
    """A parameter-server cluster on ``host`` (tests, benchmarks): ``chief`` on ``ports[0]``, then
    ``workers`` workers and ``ps`` ps tasks on the next ports (``1 + workers + ps`` ports)."""
    if len(ports) != 1 + workers + ps:
        raise ValueError(f"ports must hold 1 + {workers} + {ps} ports, got {len(ports)}")
    addr = [f"{host}:{p}" for p in ports]
    return {"chief": addr[:1], "worker": addr[1 : 1 + workers], "ps": addr[1 + workers :]}


def wait_for_tasks(
    cluster: dict[str, list[str]], timeout: float, log: Log = print, poll: float = 0.5
) -> None:
    """Blocks until every task's ``host:port`` accepts TCP connections (tasks may start in any
    order, e.g. Kubernetes pods); raises TimeoutError naming the tasks still down after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pending = [(kind, i, a) for kind in ("worker", "ps") for i, a in enumerate(cluster[kind])]
    told = False
    while pending:
        left = []
        for kind, i, address in pending:
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    pass
            except OSError:
                left.append((kind, i, address))
        pending = left
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(f"{k}:{i} ({a})" for k, i, a in pending)
            raise TimeoutError(f"parameter_server: tasks not reachable after {timeout:g}s: {names}")
        if not told:
            log(
                f"waiting for {len(pending)} task(s) to start: " + ", ".join(a for *_, a in pending)
            )
            told = True
        time.sleep(poll)


def report_stamp(path: Path) -> tuple[int, int, int] | None:
    """``(mtime_ns, size, inode)`` of ``path``, or None when it does not exist."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def wait_for_chief(output_dir: str | Path, log: Log = print, poll: float = POLL_SECONDS) -> None:
    """Blocks until ``output_dir/train_report.json`` is (re)written after this call began.

    The stamp seen at the start (or the file's absence) is the old run's; any other stamp is the
    chief finishing this run.
    """
    path = Path(output_dir) / REPORT
    start = report_stamp(path)
    log(f"serving; will exit when the chief writes {path}")
    while True:
        now = report_stamp(path)
        if now is not None and now != start:
            return
        time.sleep(poll)


def sharded_summary(model: tf.keras.Model) -> dict[str, int]:
    """``{variable name: shards}`` of the model's partitioned variables (Keras lists a
    ShardedVariable's shards as weights named ``<name>/part_<k>:0``)."""
    out: dict[str, int] = {}
    for w in model.weights:
        base, sep, part = w.name.rpartition("/part_")
        if sep and part.split(":")[0].isdigit():
            out[base] = out.get(base, 0) + 1
    return dict(sorted(out.items()))


#: initializers whose rows are independent of the variable's shape: a shard can be drawn alone.
_ROW_INDEPENDENT = ("Zeros", "Ones", "RandomNormal", "RandomUniform", "TruncatedNormal")


def _whole_shape_init(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
    """Variable creator: shape-dependent Keras initializers draw the whole variable, then shard.

    ParameterServerStrategy asks a Keras initializer for each shard with ``partition_shape``, and
    Keras then computes the fans of Glorot/He/LeCun (VarianceScaling) from the shard's shape, not
    the variable's: a kernel split in ``k`` shards of rows would start with up to ``k`` times the
    variance one process gives it. Hiding the partition arguments makes the strategy draw the whole
    value and slice it, as one process draws it. Row-independent initializers (the embedding
    tables' normal and uniform ones, zeros, ones, scalar constants) keep drawing one shard at a
    time, so a large table is never materialized whole.
    """
    init = kwargs.get("initial_value")
    if isinstance(init, functools.partial) and isinstance(
        init.func, tf.keras.initializers.Initializer
    ):
        name = type(init.func).__name__
        scalar = name == "Constant" and np.ndim(getattr(init.func, "value", 0)) == 0
        if name not in _ROW_INDEPENDENT and not scalar:
            kwargs["initial_value"] = functools.partial(_draw_whole, init)
    return next_creator(**kwargs)


def _draw_whole(init: Callable[[], tf.Tensor]) -> tf.Tensor:
    """``init()``, without Keras' warning that an initializer called once per shard repeats its
    values (wanted here: every shard slices the same whole value)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The initializer .* is unseeded")
        return init()


@dataclasses.dataclass
class PSDistribution:
    """How this process takes part in parameter-server training (same interface as
    ``distribute.Distribution``, plus ``sync`` and, for worker and ps tasks, ``serve``).

    On the chief ``strategy`` and ``coordinator`` are set; on a worker or ps task ``server``.
    """

    spec: Any  # distribute.ClusterSpec
    strategy: tf.distribute.experimental.ParameterServerStrategy | None = None
    coordinator: tf.distribute.coordinator.ClusterCoordinator | None = None
    server: tf.distribute.Server | None = None
    log: Log = print
    #: every worker reads its own share of the training input (``use_input``)
    worker_input: bool = False

    @property
    def active(self) -> bool:
        return True

    @property
    def is_chief(self) -> bool:
        return self.spec.task_type == "chief"

    @property
    def serves_only(self) -> bool:
        """True on worker and ps tasks: they run a server and wait (``serve``)."""
        return not self.is_chief

    @property
    def workers(self) -> int:
        return len(self.spec.cluster["worker"])

    @property
    def ps_tasks(self) -> int:
        return len(self.spec.cluster["ps"])

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """The strategy's scope: variables made in it live (sharded) on the ps tasks, initialized
        as one process initializes them (``_whole_shape_init``)."""
        if self.strategy is None:
            raise RuntimeError(f"{self.spec.task_type} tasks only serve; the chief trains")
        with self.strategy.scope(), tf.variable_creator_scope(_whole_shape_init):
            yield

    def check_supported(self, warm_start: str | None) -> None:
        """Raises ConfigError for what parameter-server training does not support yet:
        ``[train] warm_start`` (Keras ``set_weights`` sees the shards of a sharded table)."""
        if warm_start:
            raise ConfigError(
                f"[train] warm_start = {warm_start!r} is not supported with the parameter_server "
                f"strategy yet; warm-start in one process or under multi_worker_mirrored "
                f"(see {_DOCS})"
            )

    def run_root(self, output_dir: str | Path) -> Path:
        """The run folder: only the chief writes (workers and ps tasks write nothing)."""
        return Path(output_dir)

    def latest_checkpoint(self, own: str | None, chief_checkpoints: Path) -> str | None:
        """The chief's own latest checkpoint (it is the only task that restores)."""
        del chief_checkpoints
        return own

    def use_input(self, worker_side: bool) -> None:
        """``worker_side``: the training input is built from TensorFlow ops alone (TFRecord),
        so every worker reads its own share (``pipelines.ps_input``); else the chief reads
        every batch."""
        self.worker_input = worker_side
        how = "each worker reads its own share" if worker_side else "the chief reads every batch"
        self.log(f"parameter_server: training input: {how}")

    def check_batch_size(self, batch_size: int) -> None:
        """Any ``batch_size`` works: every step trains one whole global batch."""
        del batch_size

    def steps_per_epoch(self, rows: int, batch_size: int) -> int:
        """Chief-fed: ``ceil(rows / batch_size)``, as in one process (the last batch may be
        short). Worker-side: the whole batches of every worker's share, ``W * (rows // W //
        batch_size)``.

        Raises ConfigError when a worker's share holds no whole batch."""
        if not self.worker_input:
            return math.ceil(rows / batch_size)
        steps = self.workers * (rows // self.workers // batch_size)
        if steps == 0:
            raise ConfigError(
                f"[train] batch_size {batch_size}: each of the {self.workers} workers reads "
                f"{rows // self.workers:,} of the {rows:,} training rows, not one whole batch; "
                "lower batch_size"
            )
        return steps

    def batches(
        self,
        make: Callable[..., tf.data.Dataset],
        label: str,
        batch_size: int,
        skip: int = 0,
        steps: int | None = None,
    ) -> Iterable[Any]:
        """The epoch's input after its first ``skip`` steps. Chief-fed: the single-process
        input read by the chief (``make(batch_size=..., skip_batches=skip)``), each batch sent
        to a worker with its step. Worker-side: ``steps - skip`` ``ps_input.WorkerBatch``es,
        each worker reading its own share (``ps_input.worker_batches``)."""
        del label
        if not self.worker_input:
            return make(batch_size=batch_size, skip_batches=skip)
        if steps is None:
            raise ValueError("worker-side input needs the epoch's steps")
        return worker_batches(self.coordinator, make, batch_size, skip, steps)

    def rows(self, element: Any, label: str) -> int:
        """Rows of the batch ``element``."""
        if isinstance(element, WorkerBatch):
            return element.rows
        return int(element[label].shape[0])

    def train_step(
        self,
        model: tf.keras.Model,
        optimizer: tf.keras.optimizers.Optimizer,
        loss_metric: tf.keras.metrics.Mean,
        auc_metric: tf.keras.metrics.AUC,
    ) -> Callable[[Any], Any]:
        """Schedules one step on a free worker; returns the step's RemoteValue (batch loss).

        The step is the single-process one: ``mean_i BCE(y_i, logit_i) + sum(model.losses)``
        over the batch, its gradient applied to the (sharded) ps variables.
        """
        strategy, coordinator = self.strategy, self.coordinator
        shards = sharded_summary(model)
        if self.ps_tasks == 1:
            what = "one ps task holds every variable (nothing to shard)"
        elif shards:
            what = ", ".join(f"{name} in {n} shards" for name, n in shards.items())
            what += f" over {self.ps_tasks} ps tasks"
        else:
            what = f"no variable is over ps_min_shard_bytes: none sharded over {self.ps_tasks} ps"
        self.log(f"parameter_server: {what}")

        worker_step = make_train_step(
            model, optimizer, strategy, loss_metric=loss_metric, auc_metric=auc_metric
        )
        from_iterator = iterator_step(worker_step)

        def step(element: Any) -> Any:
            if isinstance(element, WorkerBatch):  # the worker takes its own next batch
                return coordinator.schedule(from_iterator, args=(element.iterators,))
            return coordinator.schedule(worker_step, args=(element,))

        return step

    def sync(self) -> None:
        """Waits until every scheduled step has run (``ClusterCoordinator.join``); raises the
        first error a step raised."""
        if self.coordinator is not None:
            self.coordinator.join()

    def serve(self, output_dir: str | Path) -> dict[str, Any]:
        """Worker and ps tasks: serve until the chief finishes the run; returns a small report."""
        task = f"{self.spec.task_type}:{self.spec.task_index}"
        wait_for_chief(output_dir, self.log)
        self.log(f"{task}: the chief finished; exiting")
        return {"task": task, "served": True}

    def finish(self) -> None:
        """Waits for the last scheduled steps."""
        self.sync()


def setup(cfg: DistributeConfig | None, spec: Any, log: Log = print) -> PSDistribution:
    """This task's ``PSDistribution``: the chief builds ParameterServerStrategy (connecting to
    every task, which must be up) and a ClusterCoordinator; worker and ps tasks start their
    gRPC server."""
    cfg = cfg or DistributeConfig()
    check_cluster(spec)
    # a lost worker makes remote calls fail at once (and the coordinator reschedules) rather
    # than gRPC retrying them forever; set before any channel is made
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    sizes = {k: len(v) for k, v in spec.cluster.items()}
    if spec.task_type in ("worker", "ps"):
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=spec.task_type,
            task_index=spec.task_index,
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        )
        log(f"distributed: parameter_server {sizes}, this is {spec.task_type}:{spec.task_index}")
        return PSDistribution(spec=spec, server=server, log=log)
    wait_for_tasks(spec.cluster, START_TIMEOUT, log)
    min_bytes = getattr(cfg, "ps_min_shard_bytes", DEFAULT_MIN_SHARD_BYTES)
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_bytes, max_shards=sizes["ps"]
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    log(
        f"distributed: parameter_server {sizes}, this is chief:0; variables over "
        f"{min_bytes:,} bytes sharded over up to {sizes['ps']} ps task(s)"
    )
    return PSDistribution(spec=spec, strategy=strategy, coordinator=coordinator, log=log)
