"""Multi-worker training for ``stitchrec train``: strategy from TF_CONFIG, data split, chief I/O.

``setup`` reads ``[distribute]`` and the ``TF_CONFIG`` environment variable (the cluster and this
process's task, as tf.distribute defines it) and returns a ``Distribution``; ``pipelines.train``
asks it for a scope, a training step, the batches of an epoch and the folder to write to. With no
cluster the ``Distribution`` is inactive and training is the single-process loop, unchanged.

Multi-worker mirrored (synchronous data parallelism, one replica per worker):

* ``[distribute] input = "shard"`` (the default): every worker computes the same file order of
  the epoch (a pure function of ``(seed, epoch)``) and reads only its own rows
  ``[w * q, (w + 1) * q)``, ``q = rows // W``, of their concatenation
  (``features.dataset.shard_range``), in local batches of ``batch_size / W`` rows, whole batches
  only, so all workers take the same number of steps. The input pipeline scales with workers.
* ``input = "split"``: every worker reads the same stream of global batches the single-process
  loop reads and keeps only its slice of rows ``[w * ceil(n / W), (w + 1) * ceil(n / W))`` of
  each batch of ``n`` rows (disjoint slices that together are the batch): the run follows the
  single-process trajectory up to float rounding, at the cost of reading everything W times.
* Each replica's loss is its rows' mean task loss times ``rows / n`` plus ``L2 / W``
  (``sum_i BCE(y_i, logit_i) / n + L2 / W``, ``n`` the global batch's rows;
  ``pipelines.run.step.make_train_step``); the optimizer sums the replicas' gradients (an all-reduce), which is
  exactly the gradient of the mean loss of the whole batch.
* The chief (task ``chief``, or ``worker`` 0 when the cluster has no chief) writes the run
  folder; the other workers write into a temporary folder that is deleted at the end, and restore
  from the chief's checkpoints (so the run folder must be on storage every worker reads), as
  TensorFlow's multi-worker guide prescribes.
* A lost peer makes the collective ops fail; ``peers_guarded`` turns that into
  ``PeerLostError`` (exit status 3 from the CLI) naming the checkpoint a restart resumes from.

Parameter servers (a cluster with ``ps`` tasks) are in ``pipelines.distribute_ps``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import math
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import tensorflow as tf

from pipelines import distribute_ps
from pipelines.config import ConfigError, DistributeConfig
from pipelines.run.step import make_train_step

Log = Callable[[str], None]


class MakeDataset(Protocol):
    """``make(batch_size=, shard=None, drop_remainder=False, skip_batches=0)``: one epoch's
    tf.data input."""

    def __call__(
        self,
        *,
        batch_size: int,
        shard: tuple[int, int] | None = None,
        drop_remainder: bool = False,
        skip_batches: int = 0,
    ) -> tf.data.Dataset: ...


_DOCS = "docs/distributed.md"


class PeerLostError(RuntimeError):
    """A task of the cluster stopped answering during a synchronous step (killed, crashed,
    preempted or cut off). Every task must be started again; they resume from the chief's
    last checkpoint. ``stitchrec train`` exits with status 3 on it."""


# what a collective op raises when a peer is gone: "Socket closed", "Connection reset",
# "failed to connect", an aborted or timed-out collective
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
)


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """The parsed ``TF_CONFIG``: ``{"cluster": {type: [host:port, ...]}, "task": {...}}``."""

    cluster: dict[str, list[str]]
    task_type: str
    task_index: int

    @property
    def workers(self) -> int:
        """Tasks that train (chief plus workers)."""
        return len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", []))

    @property
    def is_chief(self) -> bool:
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` right now (bound to port 0 together, then closed)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int = 0) -> str:
    """The TF_CONFIG value of task ``task_type:index`` of ``cluster`` (``{type: [host:port]}``)."""
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def worker_tf_config(ports: list[int], index: int, host: str = "127.0.0.1") -> str:
    """TF_CONFIG of worker ``index`` in a cluster of workers on ``host``, one per port (a local
    cluster for tests and benchmarks; on real hosts each task's address differs)."""
    return tf_config({"worker": [f"{host}:{port}" for port in ports]}, "worker", index)


def parse_tf_config(text: str | None) -> ClusterSpec | None:
    """The cluster of a ``TF_CONFIG`` value, or None for an unset or empty one.

    Raises ConfigError naming the problem for malformed JSON, a missing task or a task that is
    not in the cluster.
    """
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"TF_CONFIG is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster = data.get("cluster") or {}
    if not cluster:
        return None
    if not isinstance(cluster, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) for v in cluster.values()
    ):
        raise ConfigError(
            'TF_CONFIG cluster must map task types to lists of "host:port", e.g. '
            '{"worker": ["h0:2222", "h1:2222"]}'
        )
    unknown = sorted(set(cluster) - {"chief", "worker", "ps", "evaluator"})
    if unknown:
        raise ConfigError(f"TF_CONFIG cluster: unknown task types {unknown}")
    task = data.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ConfigError('TF_CONFIG needs a task, e.g. "task": {"type": "worker", "index": 0}')
    task_type, index = task["type"], task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"TF_CONFIG task index must be an integer, got {index!r}")
    if task_type not in cluster or not 0 <= index < len(cluster[task_type]):
        raise ConfigError(
            f"TF_CONFIG task {task_type}:{index} is not in the cluster "
            f"({ {k: len(v) for k, v in cluster.items()} })"
        )
    return ClusterSpec({k: list(v) for k, v in cluster.items()}, task_type, index)


def resolve_strategy(cfg: DistributeConfig | None, spec: ClusterSpec | None) -> str:
    """``none``, ``multi_worker_mirrored`` or ``parameter_server``: what ``[distribute] strategy``
    and TF_CONFIG ask for.

    Raises ConfigError for a cluster strategy without TF_CONFIG and for a cluster that does not
    fit the strategy (ps tasks under multi_worker_mirrored; the parameter-server layout is checked
    by ``distribute_ps.check_cluster``).
    """
    name = (cfg or DistributeConfig()).strategy
    if name == "none":
        return "none"
    if name == "auto":
        if spec is None or (spec.workers <= 1 and "ps" not in spec.cluster):
            return "none"
        name = "parameter_server" if "ps" in spec.cluster else "multi_worker_mirrored"
    if spec is None:
        raise ConfigError(
            f"[distribute] strategy {name} needs TF_CONFIG (the cluster and this "
            f"process's task); see {_DOCS}"
        )
    if name == "parameter_server":
        distribute_ps.check_cluster(spec)
        return name
    if "ps" in spec.cluster:
        raise ConfigError("multi_worker_mirrored: TF_CONFIG must not list ps tasks")
    if spec.task_type not in ("chief", "worker"):
        raise ConfigError(
            f"multi_worker_mirrored: task type {spec.task_type!r} does not train; run only "
            "chief and worker tasks"
        )
    return "multi_worker_mirrored"


def require_single_process(cfg: DistributeConfig | None, what: str) -> None:
    """Raises ConfigError when ``[distribute]`` and TF_CONFIG ask for a cluster: ``what``
    trains in one process only."""
    if resolve_strategy(cfg, parse_tf_config(os.environ.get("TF_CONFIG"))) != "none":
        raise ConfigError(
            f"{what} trains in one process only; unset TF_CONFIG or set [distribute] "
            f'strategy = "none" (see {_DOCS})'
        )


def slice_bounds(rows: tf.Tensor, index: int, parts: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Rows ``[lo, hi)`` of part ``index`` of ``parts`` of a batch of ``rows`` rows.

    ``per = ceil(rows / parts)``, ``lo = min(index * per, rows)``, ``hi = min(lo + per, rows)``:
    disjoint, in order, covering the batch; trailing parts of a short batch may be empty.
    """
    per = (rows + parts - 1) // parts
    lo = tf.minimum(index * per, rows)
    return lo, tf.minimum(lo + per, rows)


def slice_batch(
    features: dict[str, tf.Tensor], label: str, index: int, parts: int
) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """(this part's rows of every field, rows of the whole batch)."""
    rows = tf.shape(features[label], out_type=tf.int64)[0]
    lo, hi = slice_bounds(rows, index, parts)
    return {k: v[lo:hi] for k, v in features.items()}, rows


@dataclasses.dataclass
class Distribution:
    """How this process takes part in training; ``strategy`` None: one process, as before."""

    strategy: tf.distribute.Strategy | None = None
    spec: ClusterSpec | None = None
    scratch: Path | None = None
    input: str = "shard"

    @property
    def active(self) -> bool:
        return self.strategy is not None

    @property
    def serves_only(self) -> bool:
        """True for tasks that only serve (parameter_server's worker and ps tasks); never here."""
        return False

    def sync(self) -> None:
        """Waits for pending steps (parameter_server); synchronous here, so nothing to do."""

    @property
    def is_chief(self) -> bool:
        return self.spec is None or self.spec.is_chief

    @property
    def workers(self) -> int:
        return self.strategy.num_replicas_in_sync if self.strategy is not None else 1

    def scope(self) -> contextlib.AbstractContextManager:
        """The strategy's scope (variables become mirrored), or a no-op."""
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def check_supported(self, warm_start: str | None) -> None:
        """Everything ``[train]`` offers runs under multi_worker_mirrored and in one process."""
        del warm_start

    def run_root(self, output_dir: str | Path) -> Path:
        """Where this process writes: the run folder for the chief, a temporary one otherwise."""
        if self.is_chief:
            return Path(output_dir)
        if self.scratch is None:
            task = f"{self.spec.task_type}-{self.spec.task_index}"
            self.scratch = Path(tempfile.mkdtemp(prefix=f"stitchrec-{task}-"))
            atexit.register(shutil.rmtree, self.scratch, ignore_errors=True)  # also on errors
        return self.scratch

    def latest_checkpoint(self, own: str | None, chief_checkpoints: Path) -> str | None:
        """The checkpoint to resume from: the chief's latest, which every worker restores."""
        if self.is_chief:
            return own
        return tf.train.latest_checkpoint(str(chief_checkpoints))

    def check_batch_size(self, batch_size: int) -> None:
        """Raises ConfigError when sharded input cannot split ``batch_size`` over the workers."""
        if self.strategy is not None and self.input == "shard" and batch_size % self.workers:
            raise ConfigError(
                f"[train] batch_size {batch_size} is not divisible by the {self.workers} workers "
                '(each reads batch_size / workers rows per step with [distribute] input = "shard")'
            )

    def steps_per_epoch(self, rows: int, batch_size: int) -> int:
        """Global steps in an epoch of ``rows`` rows: every batch, the last one maybe short; or,
        sharded, the full local batches of one worker's ``rows // W`` rows."""
        if self.strategy is None or self.input == "split":
            return math.ceil(rows / batch_size)
        return (rows // self.workers) // (batch_size // self.workers)

    def use_input(self, worker_side: bool) -> None:
        """Nothing to choose: every worker builds its input (``parameter_server`` chooses)."""
        del worker_side

    def batches(
        self,
        make: MakeDataset,
        label: str,
        batch_size: int,
        skip: int = 0,
        steps: int | None = None,
    ) -> Iterable[Any]:
        """The epoch's input after its first ``skip`` steps: ``make(batch_size)`` as is, or per
        worker ``(its rows, global batch rows)``: its shard in local batches (``input =
        "shard"``) or its slice of each global batch (``"split"``). ``steps``: the epoch's
        steps (not needed here)."""
        del steps
        make = functools.partial(make, skip_batches=skip)
        if self.strategy is None:
            return make(batch_size=batch_size)

        def per_worker(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            index, parts = ctx.input_pipeline_id, ctx.num_input_pipelines
            if self.input == "split":
                return make(batch_size=batch_size).map(
                    lambda f: slice_batch(f, label, index, parts)
                )
            rows = tf.constant(batch_size, tf.int64)
            local = make(batch_size=batch_size // parts, shard=(index, parts), drop_remainder=True)
            return local.map(lambda f: (f, rows))

        return self.strategy.distribute_datasets_from_function(per_worker)

    def rows(self, element: Any, label: str) -> int:
        """Rows of the global batch ``element`` (one of ``batches``)."""
        if self.strategy is None:
            return int(element[label].shape[0])
        return int(self.strategy.experimental_local_results(element[1])[0])

    def train_step(
        self,
        model: tf.keras.Model,
        optimizer: tf.keras.optimizers.Optimizer,
        loss_metric: tf.keras.metrics.Mean,
        auc_metric: tf.keras.metrics.AUC,
    ) -> Callable[[Any], tf.Tensor]:
        """One synchronous step on an element of ``batches``; returns the batch's mean loss.

        Replica loss ``sum(BCE over its rows) / batch rows + L2 / workers``; gradients are summed
        over replicas by the optimizer, giving the gradient of the batch's mean loss
        (``pipelines.run.step.make_train_step`` under the strategy).
        """
        return make_train_step(
            model, optimizer, self.strategy, loss_metric=loss_metric, auc_metric=auc_metric
        )

    def finish(self) -> None:
        """Deletes a non-chief worker's temporary folder."""
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


@contextlib.contextmanager
def peers_guarded(cfg: DistributeConfig | None, output_dir: str | Path) -> Iterator[None]:
    """Turns TensorFlow's errors of a lost peer (a failed collective in a step or in a
    checkpoint save) into ``PeerLostError`` naming the checkpoint to resume from; a no-op when
    this process trains alone."""
    try:
        yield
    except _PEER_ERRORS as e:
        if resolve_strategy(cfg, parse_tf_config(os.environ.get("TF_CONFIG"))) == "none":
            raise
        lines = str(e.message).splitlines()
        cause = next(
            (ln.split("aborted by:", 1)[1].strip() for ln in lines if "aborted by:" in ln), ""
        )
        reason = f"a collective op was aborted: {cause}" if cause else type(e).__name__
        latest = tf.train.latest_checkpoint(str(Path(output_dir) / "checkpoints"))
        raise PeerLostError(
            f"lost a task of the cluster ({reason}); the last checkpoint is "
            f"{latest or 'none yet (training starts over)'}: start every task again with the "
            f"same config and TF_CONFIG to resume from it (see {_DOCS})"
        ) from None


def setup(cfg: DistributeConfig | None, log: Log = print) -> Distribution:
    """The ``Distribution`` of this process; create it before any other TensorFlow work.

    Reads ``TF_CONFIG``; builds a MultiWorkerMirroredStrategy (which starts this task's gRPC
    server and waits for the other workers) when the cluster asks for one; for
    ``parameter_server`` returns ``distribute_ps.setup``'s ``PSDistribution`` (same interface).
    """
    spec = parse_tf_config(os.environ.get("TF_CONFIG"))
    name = resolve_strategy(cfg, spec)
    if name == "none":
        return Distribution()
    if name == "parameter_server":
        return distribute_ps.setup(cfg, spec, log)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    workers = spec.workers
    if strategy.num_replicas_in_sync != workers:
        raise ConfigError(
            f"multi_worker_mirrored: {strategy.num_replicas_in_sync} replicas for {workers} "
            "workers; give each worker one device (e.g. CUDA_VISIBLE_DEVICES=0)"
        )
    log(
        f"distributed: multi_worker_mirrored, {workers} workers, this is "
        f"{spec.task_type}:{spec.task_index}{' (chief)' if spec.is_chief else ''}"
    )
    return Distribution(strategy=strategy, spec=spec, input=(cfg or DistributeConfig()).input)
