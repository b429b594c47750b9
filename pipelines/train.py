"""``stitchrec train``: data -> statistics -> model -> checkpointed training loop -> report.

A run lives in one folder (``RunPaths``)::

    <output_dir>/
      config.toml        the resolved config of the run
      schema.toml        the schema of the Parquet shards the model reads (fields by name)
      data/              train/ and test/ Parquet shards (when the config names raw files)
      stats/             vocabularies and numeric statistics of the training split
      model.json         the model's Keras config (export rebuilds the model from it)
      checkpoints/       tf.train.CheckpointManager checkpoints
      tensorboard/       scalars: train loss and AUC, test AUC and log loss
      train_report.json  rows, steps, time, test metrics

Resume: a killed run started again with the same config restores the latest checkpoint (model,
optimizer, global step, epoch and batch within the epoch) and continues at the next batch. The
data order is a pure function of (seed, epoch), so the resumed run sees exactly the batches the
killed one had not trained on, and with ``deterministic = true`` ends bitwise where an
uninterrupted run ends. Steps after the last checkpoint are retrained, none are lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from embeddings.protocols import WarmStartable
from features import readers
from features.dataset import (
    count_rows,
    input_signature,
    iter_batches,
    iter_record_batches,
    list_parquet,
    make_dataset,
)
from features.preprocessing import build_preprocessor
from features.schema import FeatureKind, Schema, load_schema
from features.stats import DatasetStats, compute_stats
from pipelines import distribute, metrics
from pipelines.config import ConfigError, PipelineConfig, load_config
from ranking.models import RankingModel, build_model, planned_method

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def schema(self) -> Path:
        return self.root / "schema.toml"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def stats(self) -> Path:
        return self.root / "stats"

    @property
    def model_json(self) -> Path:
        return self.root / "model.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def report(self) -> Path:
        return self.root / "train_report.json"

    @property
    def exports(self) -> Path:
        return self.root / "export"


def _direct_parquet(schema: Schema) -> bool:
    """True when Parquet shards can be read as they are: columns named by field, no label
    threshold, unix timestamps."""
    return schema.source.format == "parquet" and all(
        f.column == f.name
        and f.threshold is None
        and not (f.kind == FeatureKind.TIMESTAMP and f.time_format != "unix")
        for f in schema.fields
    )


def prepare_data(cfg: PipelineConfig, paths: RunPaths, log: Log) -> tuple[Schema, list, list]:
    """Returns (schema of the shards, train shards, test shards), converting raw files once."""
    schema = load_schema(cfg.data.schema)
    d = cfg.data
    if d.train and _direct_parquet(schema):
        train = list_parquet(list(d.train))
        test = list_parquet(list(d.test)) if d.test else []
        return schema.as_parquet(), train, test
    marker = paths.data / "_SUCCESS"
    if not marker.exists():
        report = readers.ReadReport()
        t0 = time.time()
        if d.raw:
            log(
                f"converting {len(d.raw)} raw input(s) to Parquet (test_fraction={d.test_fraction})"
            )
            readers.convert(
                schema,
                list(d.raw),
                paths.data,
                test_fraction=d.test_fraction,
                seed=d.split_seed,
                max_bad_rows=d.max_bad_rows,
                report=report,
            )
        else:
            log("converting Parquet inputs to the schema's fields")
            readers.convert(
                schema, list(d.train), paths.data, max_bad_rows=d.max_bad_rows, report=report
            )
            if d.test:
                readers.convert(
                    schema,
                    list(d.test),
                    paths.data / "_test",
                    max_bad_rows=d.max_bad_rows,
                    report=report,
                )
                (paths.data / "_test" / "train").rename(paths.data / "test")
        summary = {"rows": report.rows, "bad_rows": report.bad_rows, "examples": report.examples}
        marker.write_text(json.dumps(summary, indent=1))
        log(
            f"converted {report.rows:,} rows in {time.time() - t0:.1f}s"
            + (f", skipped {report.bad_rows} bad rows" if report.bad_rows else "")
        )
    train = list_parquet(paths.data / "train")
    test_dir = paths.data / "test"
    test = list_parquet(test_dir) if test_dir.exists() and any(test_dir.glob("*.parquet")) else []
    return schema.as_parquet(), train, test


def add_configured_crosses(cfg: PipelineConfig, schema: Schema, log: Log) -> Schema:
    """The schema plus the top crosses of the artifact ``[data] crosses`` names (if any)."""
    if not cfg.data.crosses:
        return schema
    from features.crosses import add_crosses, load_crosses

    artifact = load_crosses(cfg.data.crosses)
    schema = add_crosses(schema, artifact, cfg.data.cross_top_n, cfg.data.cross_hash_buckets)
    names = ", ".join(f"{c.name} ({c.hash_buckets} rows)" for c in schema.crosses)
    log(f"crosses from {cfg.data.crosses}: {names}")
    return schema


def prepare_stats(schema: Schema, train: list[Path], paths: RunPaths, log: Log) -> DatasetStats:
    if (paths.stats / "stats.json").exists():
        return DatasetStats.load(paths.stats)
    t0 = time.time()
    stats = compute_stats(schema, iter_record_batches(schema, train))
    stats.save(paths.stats)
    sizes = ", ".join(f"{n}={s.vocab_size}" for n, s in stats.fields.items() if s.vocab_size)
    log(f"statistics of {stats.rows:,} training rows in {time.time() - t0:.1f}s; vocab {sizes}")
    return stats


def build_run_model(cfg: PipelineConfig, schema: Schema, stats: DatasetStats) -> RankingModel:
    p = min(max(stats.label_mean, 1e-6), 1 - 1e-6)
    categorical = [
        f.name
        for f in schema.model_inputs
        if f.kind in (FeatureKind.CATEGORICAL, FeatureKind.MULTI_CATEGORICAL)
    ]
    dims = {f.name: f.embedding_dim or cfg.model.embedding_dim for f in schema.model_inputs}
    codes = {
        n: cfg.model.bh_codes()
        for n in categorical
        if planned_method(cfg.model, n, stats[n].vocab_size + 1, dims[n], True) == "bh"
    }
    # count per id: row 0 gathers the OOV and missing cells, rows 1.. the vocabulary
    counts = {
        n: [stats[n].oov_count + stats[n].missing, *stats[n].vocab_counts] for n in categorical
    }
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
        initial_bias=math.log(p / (1 - p)),
        dense_blocks=pair_stats_blocks(cfg),
    )


def pair_stats_blocks(cfg: PipelineConfig) -> list[tf.keras.layers.Layer]:
    """The ``[pair_stats]`` input block (PCF-GNN or the explicit table), or none."""
    if cfg.pair_stats is None:
        return []
    from pipelines.crosses_pcf import pair_stats_layer

    return [pair_stats_layer(cfg.pair_stats, cfg.output_dir)]


def warm_start(model: RankingModel, run_dir: str, log: Log) -> None:
    """Copies a trained run's weights into ``model`` (built, same fields and architecture).

    Embedding layers of the same class copy all their weights; an AMTL layer replacing a full
    table takes the trained table (``warm_start_from``) and starts at full length, so training
    continues from the trained model's behaviour (AMTL's warm start).
    """
    from pipelines.export import load_trained_model

    source, _, ckpt = load_trained_model(run_dir)
    for part in ("interaction", "tower", "head", "wide"):
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
    if model.wide is not None:
        _copy_embeddings(model.wide.field_weights, source.wide.field_weights, run_dir)
    if model.embedding is not None:
        _copy_embeddings(model.embedding, source.embedding, run_dir)
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


def make_optimizer(name: str, lr: float) -> tf.keras.optimizers.Optimizer:
    if name == "adam":
        return tf.keras.optimizers.Adam(lr)
    if name == "adagrad":
        return tf.keras.optimizers.Adagrad(lr)
    return tf.keras.optimizers.SGD(lr)


def make_scorer(model: RankingModel, schema: Schema) -> Callable[[dict], tf.Tensor]:
    """``model.score`` as one tf.function over the schema's raw inputs (traced once)."""
    return tf.function(model.score, input_signature=[input_signature(schema.model_inputs)])


def predict(
    scorer: Callable[[dict], tf.Tensor], schema: Schema, files: list[Path], batch_size: int = 8192
) -> tuple[np.ndarray, np.ndarray]:
    """(labels, scores) of every row of ``files``, in file order."""
    inputs = [f.name for f in schema.model_inputs]
    labels, scores = [], []
    for batch in iter_batches(schema, files, batch_size=batch_size, shuffle=False):
        labels.append(batch[schema.label.name])
        scores.append(scorer({k: tf.constant(batch[k]) for k in inputs}).numpy())
    return np.concatenate(labels), np.concatenate(scores)


def evaluate_model(
    scorer: Callable[[dict], tf.Tensor], schema: Schema, files: list[Path]
) -> dict[str, float]:
    y, p = predict(scorer, schema, files)
    return {"rows": int(y.size), "auc": metrics.auc(y, p), "logloss": metrics.logloss(y, p)}


def _check_same_run(cfg: PipelineConfig, paths: RunPaths) -> None:
    """A run folder with checkpoints resumes only the run it holds: its [data] (but for
    ``max_bad_rows``) and [model] must not change; [train] may, e.g. more epochs."""
    if not paths.config.exists() or tf.train.latest_checkpoint(str(paths.checkpoints)) is None:
        return
    previous = load_config(paths.config)
    same_data = dataclasses.replace(previous.data, max_bad_rows=cfg.data.max_bad_rows)
    changed = [
        name
        for name, before, now in (
            ("data", same_data, cfg.data),
            ("model", previous.model, cfg.model),
        )
        if before != now
    ]
    if changed:
        raise ConfigError(
            f"{paths.root} holds a run whose {' and '.join(f'[{s}]' for s in changed)} differ "
            f"from this config's; resume it with the same settings, or train into a new "
            f"output_dir"
        )


def make_train_step(
    model: RankingModel,
    optimizer: tf.keras.optimizers.Optimizer,
    label: str,
    loss_metric: tf.keras.metrics.Mean,
    auc_metric: tf.keras.metrics.AUC,
    element_spec: dict[str, tf.TensorSpec],
) -> Callable[[dict[str, tf.Tensor]], tf.Tensor]:
    """One optimizer step on a batch ``{field: [batch]}`` as a tf.function (traced once);
    returns the batch's mean loss (the L2 penalty is added to the gradient, not the result)."""

    @tf.function(input_signature=[element_spec])
    def train_step(features: dict[str, tf.Tensor]) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = model.task(labels=features[label], predictions=logits, compute_metrics=False)
            total = loss + tf.add_n(model.losses) if model.losses else loss
        grads = tape.gradient(total, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        loss_metric.update_state(loss)
        auc_metric.update_state(features[label], tf.sigmoid(logits))
        return loss

    return train_step


def use_gpus_if_present(log: Log) -> list:
    """GPUs TensorFlow sees, with memory growth on (so a server or a second job can share them).

    TensorFlow places the model's ops on the first GPU when there is one and on the CPU
    otherwise; the same code runs on both.
    """
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        # RuntimeError: already initialized in this process; keep its setting
        with contextlib.suppress(RuntimeError):
            tf.config.experimental.set_memory_growth(gpu, True)
    log(
        f"devices: {len(gpus)} GPU(s), training on {gpus[0].name}"
        if gpus
        else "devices: CPU only (no GPU found)"
    )
    return gpus


def train(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """Runs (or resumes) the training of ``cfg``; returns the report also written to disk.

    In a cluster, the loss of a peer task raises ``distribute.PeerLostError``.
    """
    if cfg.preranking is not None:  # FSCD's three stages or the two-tower anchor
        from pipelines.preranking import run_preranking

        distribute.require_single_process(cfg.distribute, "[preranking]")
        return run_preranking(cfg, log)
    with distribute.peers_guarded(cfg.distribute, cfg.output_dir):
        return _train(cfg, log)


def _train(cfg: PipelineConfig, log: Log) -> dict[str, Any]:
    dist = distribute.setup(cfg.distribute, log)  # first: it starts the cluster's servers
    if dist.serves_only:  # a parameter_server worker or ps task: serve until the chief is done
        return dist.serve(cfg.output_dir)
    dist.check_supported(cfg.train.warm_start)
    paths = RunPaths(dist.run_root(cfg.output_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    _check_same_run(cfg, paths)
    paths.config.write_text(cfg.to_toml())
    tc = cfg.train
    gpus = use_gpus_if_present(log)
    tf.keras.utils.set_random_seed(tc.seed)
    if tc.deterministic:
        tf.config.experimental.enable_op_determinism()

    schema, train_files, test_files = prepare_data(cfg, paths, log)
    schema = add_configured_crosses(cfg, schema, log)
    schema.save(paths.schema)
    stats = prepare_stats(schema, train_files, paths, log)
    if not dist.is_chief:
        test_files = []  # the chief evaluates and reports
    with dist.scope():
        model = build_run_model(cfg, schema, stats)
        optimizer = make_optimizer(tc.optimizer, tc.learning_rate)
        sample = next(iter(make_dataset(schema, train_files, batch_size=2)))
        model(sample)
        if tc.warm_start:
            warm_start(model, tc.warm_start, log)
        optimizer.build(model.trainable_variables)
    paths.model_json.write_text(json.dumps(tf.keras.layers.serialize(model)))
    if cfg.fusion is not None and cfg.fusion.kernels:
        # after model.json: export rebuilds the plain model (same variables and checkpoint)
        from compiler_opt import codegen

        codegen.fuse_embeddings(model)
        log("fusion: the embedding block runs as one generated kernel (compiler_opt.codegen)")
    tables = cfg.fusion is not None and cfg.fusion.tables
    if tables and dist.active:
        raise ConfigError("[fusion] tables = true: not supported with a distribution strategy yet")
    from compiler_opt import table_fusion

    # after model.json (export maps the fused tables back to it); a fresh optimizer: the
    # plain tables it was built on are gone. Refuses to resume a run fused the other way.
    fused_tables = table_fusion.fuse_for_training(model, paths.checkpoints, enabled=tables)
    if fused_tables is not None:
        optimizer = make_optimizer(tc.optimizer, tc.learning_rate)
        optimizer.build(model.trainable_variables)
        log(
            f"fusion: {len(fused_tables.fused_fields)} tables as {len(fused_tables.group_tables)} "
            f"(compiler_opt.table_fusion); unfused: {fused_tables.uncovered or 'none'}"
        )

    step = tf.Variable(0, dtype=tf.int64, name="step")
    epoch_var = tf.Variable(0, dtype=tf.int64, name="epoch")
    batch_var = tf.Variable(0, dtype=tf.int64, name="batch_in_epoch")
    ckpt = tf.train.Checkpoint(
        model=model, optimizer=optimizer, step=step, epoch=epoch_var, batch=batch_var
    )
    manager = tf.train.CheckpointManager(ckpt, paths.checkpoints, max_to_keep=3)
    latest = dist.latest_checkpoint(manager.latest_checkpoint, Path(cfg.output_dir) / "checkpoints")
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()
        log(
            f"resumed from {latest} at step {int(step)} "
            f"(epoch {int(epoch_var) + 1}, batch {int(batch_var)})"
        )

    rows = count_rows(train_files)
    dist.check_batch_size(tc.batch_size)
    steps_per_epoch = dist.steps_per_epoch(rows, tc.batch_size)
    total_steps = steps_per_epoch * tc.epochs
    if tc.max_steps:
        total_steps = min(total_steps, tc.max_steps)
    log(
        f"training {model.name} on {rows:,} rows: {tc.epochs} epoch(s) x {steps_per_epoch} steps "
        f"of {tc.batch_size}, {model.count_params():,} parameters"
    )

    with dist.scope():
        train_loss = tf.keras.metrics.Mean()
        train_auc = tf.keras.metrics.AUC(num_thresholds=1000)
    label = schema.label.name
    element_spec = make_dataset(schema, train_files, batch_size=tc.batch_size).element_spec

    train_step = make_train_step(model, optimizer, label, train_loss, train_auc, element_spec)
    if dist.active:  # the same step, one slice of the batch per worker, gradients all-reduced
        train_step = dist.train_step(model, optimizer, label, train_loss, train_auc)
    fused_step = None
    if cfg.fusion is not None and cfg.fusion.clusters:
        if dist.active:
            raise ConfigError(
                "[fusion] clusters = true: not supported with a distribution strategy"
            )
        from compiler_opt import cost, realize

        fused_step = realize.TrainingStep(train_step, cost.load_or_calibrate(), tc.batch_size)
        log(
            f"fusion: the training step's planned groups as {fused_step.clusters} XLA clusters "
            "(compiler_opt.realize.TrainingStep; the first steps time them against the step "
            "without clusters and keep the faster)"
        )
        train_step = fused_step
    scorer = make_scorer(model, schema)
    writer = tf.summary.create_file_writer(str(paths.tensorboard))
    t_start = time.time()
    eval_seconds = 0.0
    examples_trained = 0
    t_window, examples_window = time.time(), 0
    trained_steps = 0
    epoch_metrics: list[dict[str, Any]] = []
    done = int(step) >= total_steps
    while not done and int(epoch_var) < tc.epochs:
        epoch = int(epoch_var)
        make = functools.partial(
            make_dataset,
            schema,
            train_files,
            shuffle=True,
            seed=tc.seed,
            epoch=epoch,
            skip_batches=int(batch_var),
            shuffle_buffer=tc.shuffle_buffer,
        )
        ds = dist.batches(make, label, tc.batch_size)
        for features in ds:
            train_step(features)
            step.assign_add(1)
            batch_var.assign_add(1)
            trained_steps += 1
            n = dist.rows(features, label)
            examples_window += n
            examples_trained += n
            s = int(step)
            if s % tc.log_every == 0 or s == total_steps:
                dist.sync()  # parameter_server: wait for the scheduled steps
                rate = examples_window / max(time.time() - t_window, 1e-9)
                loss_v, auc_v = float(train_loss.result()), float(train_auc.result())
                log(
                    f"epoch {epoch + 1}/{tc.epochs} step {s}/{total_steps} "
                    f"loss {loss_v:.4f} auc {auc_v:.4f} {rate:,.0f} examples/s"
                )
                with writer.as_default(step=s):
                    tf.summary.scalar("train/loss", loss_v)
                    tf.summary.scalar("train/auc", auc_v)
                    tf.summary.scalar("train/examples_per_second", rate)
                train_loss.reset_state()
                train_auc.reset_state()
                t_window, examples_window = time.time(), 0
            if s % tc.checkpoint_every == 0:
                dist.sync()  # the checkpoint holds exactly the first s steps
                manager.save(checkpoint_number=s)
            if s >= total_steps:
                done = True
                break
        dist.sync()
        if int(batch_var) >= steps_per_epoch or not done:
            epoch_var.assign_add(1)
            batch_var.assign(0)
        manager.save(checkpoint_number=int(step))
        if test_files:
            t_eval = time.time()
            m = evaluate_model(scorer, schema, test_files)
            eval_seconds += time.time() - t_eval
            t_window = time.time()
            epoch_metrics.append({"epoch": epoch + 1, **m})
            log(f"epoch {epoch + 1} test auc {m['auc']:.4f} logloss {m['logloss']:.4f}")
            with writer.as_default(step=int(step)):
                tf.summary.scalar("test/auc", m["auc"])
                tf.summary.scalar("test/logloss", m["logloss"])
    writer.flush()
    train_seconds = time.time() - t_start - eval_seconds

    test = evaluate_model(scorer, schema, test_files) if test_files and not epoch_metrics else None
    if epoch_metrics:
        test = {k: v for k, v in epoch_metrics[-1].items() if k != "epoch"}
    report = {
        "model": model.name,
        "train_rows": rows,
        "test_rows": count_rows(test_files) if test_files else 0,
        "steps": int(step),
        "steps_this_run": trained_steps,
        "train_seconds": round(train_seconds, 2),
        "examples_per_second": round(examples_trained / max(train_seconds, 1e-9)),
        "eval_seconds": round(eval_seconds, 2),
        "parameters": int(model.count_params()),
        "test": test,
        "epochs": epoch_metrics,
        "checkpoint": manager.latest_checkpoint,
        "seed": tc.seed,
        "devices": [g.name for g in gpus] or ["CPU"],
    }
    if fused_step is not None:
        report["fused_training_step"] = {
            "clusters": fused_step.clusters,
            "choice": fused_step.choice or "undecided (too few steps)",
            "trial_ms": {k: round(v, 3) for k, v in fused_step.timings_ms.items()},
        }
        log(f"fusion: training step ran {report['fused_training_step']}")
    paths.report.write_text(json.dumps(report, indent=1))
    dist.finish()
    return report
