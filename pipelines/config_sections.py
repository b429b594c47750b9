"""The optional sections of the training config (``pipelines.config`` reads them):
``[fusion]``, ``[vocab]``, ``[distribute]``, ``[engine]`` and ``[pair_stats]``, and the config's
error type."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from features.crosses.pcf_config import PCFGNNConfig
from features.vocab_state import VocabOptions
from ranking.config import MLP_GRADIENTS


class ConfigError(ValueError):
    """A training config is invalid; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class FusionConfig:
    """``[fusion]``: compiler_opt's fusion in ``stitchrec train`` (docs/compiler_opt.md).

    Attributes:
      kernels: run the embedding block (lookups, AMTL masks, pooling, concat) as one generated
        C++ op (``compiler_opt.embedding_op``), compiled with g++ on first use and cached; fields it
        does not cover, a distributed run's variables and a machine without a compiler fall
        back to the plain layers with a warning. Checkpoints and ``model.json`` are the same
        as without it; exports stay unfused.
      tables: horizontal table fusion (``compiler_opt.table_fusion``): the ``full`` /
        ``hashing`` tables (``l2 = 0``) of one dim become one variable read by one gather per
        batch. The checkpoints hold the fused tables (the mapping is written next to them as
        ``checkpoints/table_fusion.json``); ``stitchrec export`` maps them back, so exports are
        the plain model's. Not together with ``kernels``.
      clusters: the training step planned (``compiler_opt.planner``) and realized with every
        planned group as one XLA cluster, its gradient and optimizer arithmetic included
        (``compiler_opt.realize.TrainingStep``); with ``kernels`` or ``tables`` too. Not with
        a distribution strategy.
      activations: ``"backprop"`` (TensorFlow's gradients) or ``"forward_ad"``: the MLP
        tower's (each task tower's) ReLU and dropout keep a boolean derivative computed in the
        forward pass instead of the ReLU's output and the keep mask (``ranking.forward_ad``;
        same outputs and gradients, less memory held for the backward pass with dropout; no
        change without dropout).
    """

    kernels: bool = False
    tables: bool = False
    clusters: bool = False
    activations: str = "backprop"

    def __post_init__(self) -> None:
        if not isinstance(self.kernels, bool):
            raise ConfigError(f"[fusion] kernels must be true or false, got {self.kernels!r}")
        if not isinstance(self.tables, bool):
            raise ConfigError(f"[fusion] tables must be true or false, got {self.tables!r}")
        if not isinstance(self.clusters, bool):
            raise ConfigError(f"[fusion] clusters must be true or false, got {self.clusters!r}")
        if self.activations not in MLP_GRADIENTS:
            raise ConfigError(
                f"[fusion] activations must be one of {list(MLP_GRADIENTS)}, got "
                f"{self.activations!r}"
            )
        if self.kernels and self.tables:
            raise ConfigError(
                "[fusion] kernels = true and tables = true: choose one (the generated op reads "
                "the per-field tables; fused tables are one variable it does not read)"
            )


@dataclasses.dataclass(frozen=True)
class VocabConfig:
    """``[vocab]``: how the vocabularies age when a run continues over a newer window
    (``features.vocab_state``; docs/continuous.md). Per field, the schema's ``min_count`` is
    compared with the decayed count and ``max_vocab`` caps the vocabulary.

    Attributes:
      decay: the counts of earlier windows are multiplied by ``decay`` once per window
        (``0 < decay <= 1``; 1: counts add up over all windows).
      evict_after: a value unseen for more than this many windows leaves the vocabulary and
        the counts (an integer >= 0; 0: never).
    """

    decay: float = 1.0
    evict_after: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.decay <= 1:
            raise ConfigError(f"[vocab] decay must be in (0, 1], got {self.decay!r}")
        if self.evict_after < 0:
            raise ConfigError(
                f"[vocab] evict_after must be >= 0 (windows; 0: never), got {self.evict_after!r}"
            )

    def to_options(self) -> VocabOptions:
        """The ``features.vocab_state.VocabOptions`` of this section."""
        return VocabOptions(decay=float(self.decay), evict_after=self.evict_after)


_STRATEGIES = ("auto", "none", "multi_worker_mirrored", "parameter_server")
_INPUTS = ("shard", "split")


@dataclasses.dataclass(frozen=True)
class DistributeConfig:
    """``[distribute]``: how ``stitchrec train`` spreads over machines (docs/distributed.md).

    Attributes:
      strategy: ``auto`` (TF_CONFIG decides: no TF_CONFIG or a one-task cluster trains in one
        process, a cluster of workers uses ``multi_worker_mirrored``, one with ``ps`` tasks
        ``parameter_server``), ``none`` (one process, TF_CONFIG ignored),
        ``multi_worker_mirrored`` (synchronous data parallelism, tf.distribute
        MultiWorkerMirroredStrategy; needs TF_CONFIG) or ``parameter_server`` (asynchronous
        training with tf.distribute ParameterServerStrategy: TF_CONFIG with one ``chief``, some
        ``worker`` and some ``ps`` tasks; ``pipelines/distribute_ps.py``).
      input: how multi-worker training splits the data. ``shard`` (the default): worker ``w``
        of ``W`` reads only its own ``1/W`` of each epoch's rows (whole files and row groups of
        the others are never read) in local batches of ``batch_size / W`` rows, so the input
        pipeline scales with workers; ``batch_size`` must be divisible by ``W``, each worker
        trains on whole batches only, and up to ``batch_size`` rows per epoch are left out.
        ``split``: every worker reads every global batch and keeps its slice of rows, so the
        run follows the single-process trajectory up to float rounding (for checks; the input
        pipeline then runs ``W`` times). Not used by ``parameter_server``, where the chief reads
        every batch and sends it with its step.
      ps_min_shard_bytes: ``parameter_server`` only: a variable (embedding table, kernel) of
        more bytes is split along its rows into ``min(ps tasks, ceil(bytes / this), rows)``
        shards over the ps tasks (tf.distribute MinSizePartitioner); an integer >= 1, default
        256 KiB.
    """

    strategy: str = "auto"
    input: str = "shard"
    ps_min_shard_bytes: int = dataclasses.field(
        default=256 << 10, metadata={"expected": "an integer >= 1 (bytes)"}
    )

    def __post_init__(self) -> None:
        if self.strategy not in _STRATEGIES:
            raise ConfigError(
                f"[distribute] strategy {self.strategy!r} is not one of {list(_STRATEGIES)}"
            )
        if self.input not in _INPUTS:
            raise ConfigError(f"[distribute] input {self.input!r} is not one of {list(_INPUTS)}")
        b = self.ps_min_shard_bytes
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(
                f"[distribute] ps_min_shard_bytes must be an integer >= 1 (bytes), got {b!r}"
            )


ENGINES = ("local", "dask")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """``[engine]`` (and the ``--engine``/``--cluster``/``--workers``/``--task-retries`` flags of
    the data commands): where a command's data jobs run (docs/scale.md).

    Attributes:
      name: ``local`` (this process, the default) or ``dask`` (Dask distributed).
      address: a Dask scheduler's address (``tcp://HOST:8786``); empty: with ``dask``, a local
        cluster of ``workers`` processes started for the command.
      workers: processes of that local cluster (0: one per CPU core).
      retries: times a task that raised is run again before the job fails.
      no_workers_seconds: how long a job waits while the cluster has no worker at all (all
        lost, or none started yet) before it fails; a cluster that scales up may need minutes.
      connect_seconds: how long a command waits for the scheduler at ``address`` to answer
        before it fails (a scheduler that is still starting may need longer).
    """

    name: str = "local"
    address: str = ""
    workers: int = dataclasses.field(default=0, metadata={"expected": "an integer >= 0"})
    retries: int = dataclasses.field(default=2, metadata={"expected": "an integer >= 0"})
    no_workers_seconds: float = dataclasses.field(
        default=600.0, metadata={"expected": "a number of seconds > 0"}
    )
    connect_seconds: float = dataclasses.field(
        default=10.0, metadata={"expected": "a number of seconds > 0"}
    )

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise ConfigError(f"[engine] name {self.name!r} is not one of {list(ENGINES)}")
        if self.address and self.name != "dask":
            raise ConfigError(
                f'[engine] address {self.address!r} is a Dask scheduler\'s: set name = "dask" '
                f"(engine {self.name!r} runs in this process)"
            )
        for key in ("workers", "retries"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"[engine] {key} must be an integer >= 0, got {v!r}")
        for key in ("no_workers_seconds", "connect_seconds"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"[engine] {key} must be a number of seconds > 0, got {v!r}")


_PAIR_SOURCES = ("pcf_gnn", "table")


_GNN = PCFGNNConfig()
_GNN_FIELDS = dataclasses.fields(PCFGNNConfig)


@dataclasses.dataclass(frozen=True)
class PairStatsConfig:
    """``[pair_stats]``: pair statistics as extra dense model inputs (docs/pcf_gnn.md).

    ``stitchrec crosses pcf-gnn --config FILE`` builds the pair graph and pre-trains PCF-GNN into
    ``artifact``; ``stitchrec train`` with the same config then adds one input per pair.

    Attributes:
      source: ``pcf_gnn`` (statistics predicted from cached node vectors) or ``table`` (the
        explicit smoothed-CTR table of the same graph, the baseline).
      artifact: the artifact folder (default: ``<output_dir>/pcf_gnn``).
      pairs: field pairs, e.g. ``[["userId", "movieId"], ["userId", "genres"]]``.
      output: ``logit`` or ``ctr`` scale of the inputs.
      graph_data: Parquet shards the graph is built from (default: the training split). Logs
        disjoint from the ranking model's training rows (e.g. an earlier period) avoid the
        statistic leaking the row's own label.
      min_count, max_nodes: the node cap per field (values under ``min_count`` or past the
        ``max_nodes`` most frequent share the OOV node; ``max_nodes = 0``: no cap).
      alpha: smoothing, ``(clicks + alpha * prior) / (impressions + alpha)``.
      min_impressions: edges with fewer impressions are dropped.
      dim, layers, head, relation_dim, steps, batch_edges, learning_rate, l2, seed, log_every:
        ``features.crosses.pcf_config.PCFGNNConfig``.
    """

    pairs: tuple[tuple[str, str], ...] = ()
    source: str = "pcf_gnn"
    artifact: str = ""
    output: str = "logit"
    graph_data: tuple[str, ...] = ()
    min_count: int = 1
    max_nodes: int = 0
    alpha: float = 10.0
    min_impressions: int = 1
    # PCF-GNN's hyper-parameters, flat in the section; defaults and checks: PCFGNNConfig.
    dim: int = _GNN.dim
    layers: int = _GNN.layers
    head: tuple[int, ...] = _GNN.head
    relation_dim: int = _GNN.relation_dim
    steps: int = _GNN.steps
    batch_edges: int = _GNN.batch_edges
    learning_rate: float = _GNN.learning_rate
    l2: float = _GNN.l2
    seed: int = _GNN.seed
    log_every: int = _GNN.log_every

    def gnn(self) -> PCFGNNConfig:
        """The pre-training hyper-parameters of this section."""
        return PCFGNNConfig(**{f.name: getattr(self, f.name) for f in _GNN_FIELDS})

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ConfigError('[pair_stats] pairs: give at least one pair, e.g. [["a", "b"]]')
        seen: set[frozenset[str]] = set()
        for p in self.pairs:
            if isinstance(p, str) or len(p) != 2 or not all(isinstance(f, str) for f in p):
                raise ConfigError(f"[pair_stats] pairs: {p!r} is not a pair of field names")
            if p[0] == p[1]:
                raise ConfigError(
                    f"[pair_stats] pairs: {list(p)}: a pair needs two different fields"
                )
            if frozenset(p) in seen:
                raise ConfigError(f"[pair_stats] pairs: {list(p)} is given twice")
            seen.add(frozenset(p))
        if self.source not in _PAIR_SOURCES:
            raise ConfigError(
                f"[pair_stats] source = {self.source!r} is not one of {list(_PAIR_SOURCES)}"
            )
        if self.output not in ("logit", "ctr"):
            raise ConfigError(f"[pair_stats] output = {self.output!r}: expected logit or ctr")
        for key, lo in (("min_count", 1), ("max_nodes", 0), ("min_impressions", 1)):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ConfigError(f"[pair_stats] {key} must be an integer >= {lo}, got {v!r}")
        if not (isinstance(self.alpha, int | float) and self.alpha >= 0):
            raise ConfigError(f"[pair_stats] alpha must be a number >= 0, got {self.alpha!r}")
        try:
            self.gnn()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"[pair_stats] {e}") from None

    def artifact_dir(self, output_dir: str) -> str:
        return self.artifact or str(Path(output_dir) / "pcf_gnn")
