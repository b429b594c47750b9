"""The model of a run: building it from the config and statistics (with the ``[pair_stats]``
block), warm start, the optimizer, saving it, and loading a trained run's model."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import tensorflow as tf

from compiler_opt import FuseSpec, fuse, table_fusion
from embeddings.protocols import WarmStartable
from features.crosses.pcf_artifact import GRAPH_DIR, PCFArtifact
from features.crosses.pcf_graph import PairGraph
from features.dataset import field_tf_dtype, make_dataset
from features.json_files import read_json_object
from features.preprocessing import build_preprocessor
from features.schema import FeatureKind, FeatureSpec, Schema, load_schema
from features.stats import DatasetStats
from pipelines.config import ConfigError, PipelineConfig
from pipelines.errors import UsageError
from pipelines.run.adam import FusedAdam
from pipelines.run.paths import Log, RunPaths
from ranking.config import ModelConfig
from ranking.models import ClickModel, RankingModel, build_model, planned_method
from ranking.multitask import MultiTaskModel
from ranking.pair_stats import PairStatsGNN, PairStatsTable
from ranking.sequence_features import SequenceOptionsError

#: ``[train] optimizer`` names and the Keras optimizers they make (``adam``: Keras's Adam with
#: the fused update kernel, ``pipelines.run.adam``). ``ftrl`` (FTRL-proximal,
#: learning-rate power -0.5) and ``adagrad`` keep one accumulator per weight, so a rare id's
#: weight keeps a large step while a frequent one's shrinks: they suit the sparse wide weights of
#: a linear model (``type = "lr"``).
OPTIMIZERS = {
    "adam": FusedAdam,
    "adagrad": tf.keras.optimizers.Adagrad,
    "ftrl": tf.keras.optimizers.Ftrl,
    "sgd": tf.keras.optimizers.SGD,
}

#: The starting value of every accumulator, per optimizer (``make_optimizer``'s default). One
#: id's gradient of a batch's mean loss is about its share of the batch times its residual, so
#: FTRL's accumulators start small enough for those squares to count from the first steps.
INITIAL_ACCUMULATOR = {"adagrad": 0.1, "ftrl": 1e-3}


def initial_bias(stats: DatasetStats) -> float:
    """The logit of the training label mean (clipped to [1e-6, 1 - 1e-6]): the output bias a
    model starts with."""
    p = min(max(stats.label_mean, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def check_tasks(model: ModelConfig, schema: Schema) -> None:
    """Raises ConfigError unless every ``[model] tasks`` label is a label of ``schema``, task 0
    reads the schema's first label (the primary task, which evaluation and selection score),
    and a task ``defined_on`` another reads the label its schema label is defined on (when
    the schema says)."""
    if not model.tasks:
        return
    labels = {f.name: f for f in schema.labels}
    by_name = {t.name: t for t in model.tasks}
    for i, task in enumerate(model.tasks):
        where = f"[model] tasks[{i}] ({task.name!r})"
        if task.label not in labels:
            raise ConfigError(
                f"{where}: label {task.label!r} is not a label of schema {schema.name!r}; its "
                f"labels: {list(labels)}"
            )
        parent = by_name[task.defined_on].label if task.defined_on is not None else None
        declared = labels[task.label].defined_on
        if parent is not None and declared is not None and declared != parent:
            raise ConfigError(
                f"{where}: defined_on task {task.defined_on!r} reads label {parent!r}, but the "
                f"schema defines label {task.label!r} on {declared!r}"
            )
    if model.tasks[0].label != schema.label.name:
        raise ConfigError(
            f"[model] tasks[0] ({model.tasks[0].name!r}) is the primary task and must read the "
            f"schema's first label {schema.label.name!r}, got {model.tasks[0].label!r}"
        )


def row_counts(schema: Schema, stats: DatasetStats) -> dict[str, list[int]]:
    """Per categorical input, the training count of each table row by id: row 0 gathers the
    OOV and missing cells, rows 1.. the vocabulary."""
    return {
        f.name: [stats[f.name].oov_count + stats[f.name].missing, *stats[f.name].vocab_counts]
        for f in schema.model_inputs
        if f.kind in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL)
    }


def build_run_model(cfg: PipelineConfig, schema: Schema, stats: DatasetStats) -> ClickModel:
    """The ranking model of ``cfg`` over ``schema`` (its preprocessor from ``stats``); a
    multi-task one with ``[model] tasks`` (checked against the schema's labels)."""
    check_tasks(cfg.model, schema)
    counts = row_counts(schema, stats)
    categorical = list(counts)
    dims = {f.name: f.embedding_dim or cfg.model.embedding_dim for f in schema.model_inputs}
    codes = {
        n: cfg.model.bh_codes()
        for n in categorical
        if planned_method(cfg.model, n, stats[n].vocab_size + 1, dims[n], True) == "bh"
    }
    try:
        return _build_model(cfg, schema, stats, codes, counts)
    except SequenceOptionsError as e:
        raise ConfigError(f"[model] {e}") from None


def _build_model(
    cfg: PipelineConfig,
    schema: Schema,
    stats: DatasetStats,
    codes: dict[str, str],
    counts: dict[str, list[int]],
) -> ClickModel:
    return build_model(
        cfg.model,
        build_preprocessor(schema, stats, codes),
        schema.label.name,
        field_dims={f.name: f.embedding_dim for f in schema.model_inputs if f.embedding_dim},
        field_combiners={
            f.name: f.combiner
            for f in schema.model_inputs
            if f.kind == FeatureKind.MULTI_CATEGORICAL
        },
        counts=counts,
        initial_bias=initial_bias(stats),
        dense_blocks=pair_stats_blocks(cfg),
        label_means=dict(stats.label_means) if cfg.model.tasks else None,
    )


def pair_stats_blocks(cfg: PipelineConfig) -> list[tf.keras.layers.Layer]:
    """The ``[pair_stats]`` input block (PCF-GNN or the explicit table), or none."""
    if cfg.pair_stats is None:
        return []
    return [pair_stats_layer(cfg.pair_stats, cfg.output_dir)]


def table_layer(graph: Any, pairs: list[tuple[str, str]], output: str = "logit") -> Any:
    """The explicit statistics table (``ranking.pair_stats.PairStatsTable``) of a pair graph:
    every seen pair of two known values -> its smoothed CTR; the prior otherwise."""

    known = graph.pairs
    entries, oriented = [], []
    for p in pairs:
        if tuple(p) in known:
            r = known.index(tuple(p))
        elif (p[1], p[0]) in known:
            r = known.index((p[1], p[0]))
        else:
            raise ValueError(f"pair {list(p)} is not in the pair graph; it has {known}")
        rel = graph.relations[r]
        keep = (rel.u > 0) & (rel.v > 0)
        va, vb = graph.vocab[rel.pair[0]], graph.vocab[rel.pair[1]]
        entries.append(
            (
                [va[i - 1] for i in rel.u[keep]],
                [vb[i - 1] for i in rel.v[keep]],
                graph.statistic(r)[keep],
            )
        )
        oriented.append(rel.pair)
    used = {f for p in oriented for f in p}
    return PairStatsTable.from_pairs(
        oriented,
        entries,
        prior=graph.prior,
        separators={f: s for f, s in graph.multi.items() if f in used},
        output=output,
    )


def pair_stats_layer(ps: Any, output_dir: str) -> Any:
    """The dense input block of a ``[pair_stats]`` config (``PairStatsConfig``): PCF-GNN's
    ``PairStatsGNN`` or the explicit ``PairStatsTable``, from the artifact folder."""

    directory = Path(ps.artifact_dir(output_dir))
    if directory.exists() and not directory.is_dir():
        raise ConfigError(
            f"[pair_stats] artifact {str(directory)!r} is a file: expected the folder "
            "`stitchrec crosses pcf-gnn --config ...` writes"
        )
    pairs = [tuple(p) for p in ps.pairs]
    if ps.source == "table":
        return table_layer(PairGraph.load(directory / GRAPH_DIR), pairs, ps.output)
    return PairStatsGNN.from_artifact(PCFArtifact.load(directory), pairs, output=ps.output)


def warm_start(model: ClickModel, run_dir: str, log: Log) -> None:
    """Copies a trained run's weights into ``model`` (built, same fields and architecture; a
    multi-task model from a multi-task run: its interaction, head and towers).

    Embedding layers of the same class copy all their weights; an AMTL layer replacing a full
    table takes the trained table (``warm_start_from``) and starts at full length, so training
    continues from the trained model's behaviour (AMTL's warm start).
    """

    source, _, ckpt = load_trained_model(run_dir)
    multitask = isinstance(model, MultiTaskModel)
    if multitask != isinstance(source, MultiTaskModel):
        raise ValueError(
            f"warm_start {run_dir}: one model is multi-task ([model] tasks), the other not"
        )
    parts = (
        ("interaction", "head", "towers") if multitask else ("interaction", "tower", "head", "wide")
    )
    for part in parts:
        dst, src = getattr(model, part), getattr(source, part)
        if (dst is None) != (src is None):
            raise ValueError(f"warm_start {run_dir}: the models differ in their {part!r} block")
        if dst is not None and part != "wide":
            if type(dst) is not type(src):
                raise ValueError(
                    f"warm_start {run_dir}: {part!r} is a {type(src).__name__} there, a "
                    f"{type(dst).__name__} here"
                )
            try:
                dst.set_weights(src.get_weights())
            except ValueError as e:
                raise ValueError(f"warm_start {run_dir}: {part!r} differs: {e}") from None
    if not multitask and model.wide is not None:
        _copy_embeddings(model.wide.field_weights, source.wide.field_weights, run_dir)
    if model.embedding is not None:
        _copy_embeddings(model.embedding, source.embedding, run_dir)
    if not multitask:
        model.bias.assign(source.bias)
    log(f"warm start from {ckpt}")


def _copy_embeddings(dst: Any, src: Any, run_dir: str) -> None:
    if dst is None or src is None:
        return
    for name, layer in dst.layers_by_field.items():
        if name not in src.layers_by_field:
            raise ValueError(f"warm_start {run_dir}: the trained model has no field {name!r}")
        other = src.layers_by_field[name]
        if type(layer) is type(other):
            layer.set_weights(other.get_weights())
        elif isinstance(layer, WarmStartable) and hasattr(other, "table"):
            layer.warm_start_from(other.table.numpy())
        else:
            raise ValueError(
                f"warm_start {run_dir}: field {name!r} cannot go from {type(other).__name__} "
                f"to {type(layer).__name__}"
            )


def make_optimizer(
    name: str,
    lr: float | tf.keras.optimizers.schedules.LearningRateSchedule,
    *,
    l1: float = 0.0,
    l2: float = 0.0,
    initial_accumulator: float | None = None,
) -> tf.keras.optimizers.Optimizer:
    """The Keras optimizer ``[train] optimizer = name`` names, at learning rate ``lr`` (a
    float or a Keras learning-rate schedule).

    ``adagrad`` and ``ftrl`` start their accumulators at ``initial_accumulator`` (None: the
    optimizer's ``INITIAL_ACCUMULATOR``, 0.1 and 0.001); ``ftrl`` uses
    learning-rate power -0.5 and the L1 / L2 regularization strengths ``l1`` / ``l2`` (FTRL's
    own, applied to every weight it updates, the bias too; a linear model's usual penalty is
    ``[model] l2_wide``, which leaves the bias alone). ``l1`` / ``l2`` are for ``ftrl`` only.

    Raises:
      ConfigError: ``name`` is not one of ``OPTIMIZERS``, or ``l1`` / ``l2`` are set for
        another optimizer, or a value is negative.
    """
    if name not in OPTIMIZERS:
        raise ConfigError(
            f"[train] optimizer = {name!r} is not an optimizer; expected one of "
            f"{sorted(OPTIMIZERS)}"
        )
    if initial_accumulator is None:
        initial_accumulator = INITIAL_ACCUMULATOR.get(name, 0.0)
    if not (l1 >= 0 and l2 >= 0 and initial_accumulator >= 0):
        raise ConfigError(
            f"optimizer {name!r}: l1, l2 and initial_accumulator must be >= 0, got "
            f"l1={l1!r}, l2={l2!r}, initial_accumulator={initial_accumulator!r}"
        )
    if name == "ftrl":
        return tf.keras.optimizers.Ftrl(
            lr,
            learning_rate_power=-0.5,
            initial_accumulator_value=initial_accumulator,
            l1_regularization_strength=l1,
            l2_regularization_strength=l2,
        )
    if l1 or l2:
        raise ConfigError(
            f"optimizer {name!r}: l1={l1!r} / l2={l2!r} are FTRL's regularization strengths; "
            f"use optimizer 'ftrl', or [model] l2_wide / l1_wide"
        )
    if name == "adagrad":
        return tf.keras.optimizers.Adagrad(lr, initial_accumulator_value=initial_accumulator)
    return OPTIMIZERS[name](lr)


def build_on_sample(model: tf.keras.Model, schema: Schema, files: list[Path]) -> None:
    """Builds ``model``'s variables by calling it on two rows of ``files``."""
    model(next(iter(make_dataset(schema, files, batch_size=2))))


def save_model(model: tf.keras.Model, schema: Schema, root: Path) -> str:
    """``model.json``, ``schema.toml`` and one checkpoint under ``root`` (what
    ``load_trained_model`` reads)."""
    paths = RunPaths(root)
    root.mkdir(parents=True, exist_ok=True)
    if paths.checkpoints.exists():
        shutil.rmtree(paths.checkpoints)
    paths.model_json.write_text(json.dumps(tf.keras.layers.serialize(model)))
    schema.save(paths.schema)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), paths.checkpoints, max_to_keep=1
    )
    return manager.save()


def dummy_batch(fields: list[FeatureSpec]) -> dict[str, tf.Tensor]:
    out = {}
    for f in fields:
        dtype = field_tf_dtype(f)
        value = "" if dtype == tf.string else 0
        out[f.name] = tf.constant([value], dtype=dtype)
    return out


#: The folder under ``checkpoints/`` holding the best validation checkpoint of a run.
BEST_DIR = "best"


#: what a run's ``train_report.json`` holds
REPORT_WHAT = "the report `stitchrec train` writes"


def selected_checkpoint(checkpoints: Path) -> str | None:
    """The checkpoint a run's model is taken from: the best validation checkpoint
    (``checkpoints/best/``) when the run kept one, else the latest; None before the first."""
    best = tf.train.latest_checkpoint(str(checkpoints / BEST_DIR))
    return best or tf.train.latest_checkpoint(str(checkpoints))


def trained_optimizer(cfg: PipelineConfig, paths: RunPaths) -> str:
    """The ``[train] optimizer`` that trained the run of ``cfg`` in ``paths``: ``auto``'s
    choice as its ``train_report.json`` records it (``ftrl`` for a run without one)."""
    if cfg.train.optimizer != "auto":
        return cfg.train.optimizer
    report = read_json_object(paths.report, REPORT_WHAT) if paths.report.is_file() else {}
    return str(report.get("optimizer", "ftrl"))


def load_trained_model(run_dir: str | Path) -> tuple[RankingModel, Schema, str]:
    """Rebuilds the run's model from ``model.json`` and restores its selected checkpoint (the
    best validation checkpoint when the run kept one, else the latest: ``selected_checkpoint``).

    A run trained with ``[fusion] tables = true`` is restored fused, then mapped back to the
    plain model's per-field tables (``compiler_opt.table_fusion``)."""
    paths = RunPaths(Path(run_dir))
    if not paths.model_json.exists():
        raise FileNotFoundError(
            f"{str(paths.root)!r} is not a training run: it has no model.json "
            f"(run `stitchrec train` first)"
        )
    latest = selected_checkpoint(paths.checkpoints)
    if latest is None:
        raise FileNotFoundError(f"training run {str(paths.root)!r} has no checkpoint yet")
    schema = load_schema(paths.schema)
    return restore_run_model(paths, latest, schema), schema, latest


def restore_run_model(paths: RunPaths, prefix: str | Path, schema: Schema) -> RankingModel:
    """The run's model (``model.json``) with the weights of checkpoint ``prefix`` (one the run's
    ``CheckpointManager`` wrote, or a ``Checkpoint.write`` snapshot: read, not restored, so no
    save counter is needed). A run trained with ``[fusion] tables = true`` is read fused, then
    mapped back to the plain model's per-field tables (``compiler_opt.table_fusion``)."""
    expected = "the model config `stitchrec train` writes (train the run again)"
    config = read_json_object(paths.model_json, expected)
    if not (isinstance(config.get("class_name"), str) and isinstance(config.get("config"), dict)):
        raise UsageError(
            f"{str(paths.model_json)!r} has no class_name and config of a model: "
            f"expected {expected}"
        )
    # built by one eager call on a dummy batch, not by Keras from the config's `build_config`:
    # Keras would call the model in a graph, converting every layer's `call` with AutoGraph
    # first (seconds per process); the variables and their values are the same either way
    model = tf.keras.layers.deserialize({k: v for k, v in config.items() if k != "build_config"})
    model(dummy_batch(list(schema.model_inputs)))
    fused = table_fusion.run_has_fused_tables(paths.checkpoints)  # [fusion] tables = true
    if fused:
        model = fuse(model, FuseSpec(tables=True))
    tf.train.Checkpoint(model=model).read(
        str(prefix)
    ).expect_partial().assert_existing_objects_matched()
    # back to the plain model's per-field tables (the mapping's row blocks)
    return table_fusion.unfuse_tables(model) if fused else model
