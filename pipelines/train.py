"""``stitchrec train``: data -> statistics -> model -> checkpointed training loop -> report.

A run lives in one folder (``RunPaths``)::

    <output_dir>/
      config.toml        the resolved config of the run
      schema.toml        the schema of the Parquet shards the model reads (fields by name)
      data/              train/, validation/ and test/ Parquet shards (when converted)
      stats/             vocabularies and numeric statistics of the training split;
                         vocab_state/ the vocabularies across windows (docs/continuous.md)
      model.json         the model's Keras config (export rebuilds the model from it)
      checkpoints/       tf.train.CheckpointManager checkpoints; best/ the best validation one
      history.jsonl      every validation evaluation of the run, across resumes
      tensorboard/       scalars: train loss and AUC, validation and test AUC and log loss
      snapshots/         with [train] ensemble = "auto": the snapshots, their validation
                         logits, snapshots.json and the chosen ensemble.json
      train_report.json  rows, steps, time, validation history, selection, test metrics

Model selection reads the validation split only (docs/training.md): it is evaluated at every
epoch end (and every ``eval_every`` steps), the best evaluation's model is kept as
``checkpoints/best/``, early stopping ends the run after ``patience`` evaluations without
improvement, and the test set is scored once, at the end, on the selected checkpoint.

Resume: a killed run started again with the same config restores the latest checkpoint (model,
optimizer, global step, epoch and batch within the epoch) and continues at the next batch. The
data order is a pure function of (seed, epoch), so the resumed run sees exactly the batches the
killed one had not trained on, and with ``deterministic = true`` ends bitwise where an
uninterrupted run ends. Steps after the last checkpoint are retrained, none are lost. The
early-stopping state is part of the checkpoint, so the resumed run stops where the uninterrupted
one stops. The loop itself is ``pipelines.run.loop``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import tensorflow as tf

from features.dataset import count_rows, make_dataset
from features.tfrecord.service import check_reachable
from pipelines import distribute
from pipelines.config import ConfigError, PipelineConfig, TrainConfig, VocabConfig, load_config
from pipelines.engines import open_runner
from pipelines.preranking import run_preranking
from pipelines.run import lbfgs
from pipelines.run.autolrs import AutoLRS, make_autolrs, validation_loss_fn
from pipelines.run.averaging import WeightAverage
from pipelines.run.continuation import ContinueOptions, Previous, continue_model, load_previous
from pipelines.run.data import (
    add_configured_crosses,
    check_continue_from,
    check_same_run,
    prepare_data,
    prepare_stats,
    use_gpus_if_present,
    vocabulary_change,
)
from pipelines.run.fusion import fuse_for_training
from pipelines.run.loop import Run, TrainLoop, restore_state
from pipelines.run.model import (
    build_on_sample,
    build_run_model,
    make_optimizer,
    row_counts,
    warm_start,
)
from pipelines.run.paths import Log, RunPaths
from pipelines.run.schedules import check_lr_schedule, run_learning_rate
from pipelines.run.scoring import make_scorer
from pipelines.run.selection import Selection
from pipelines.run.snapshots import (
    SnapshotTaker,
    check_ensemble,
    ensemble_options,
    run_schedule,
)
from pipelines.run.step import make_train_step
from pipelines.run.train_input import prepare_train_input
from pipelines.run.unseen import UnseenRows


def train(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """Runs (or resumes) the training of ``cfg``; returns the report also written to disk.

    A config with a ``[preranking]`` section trains the pre-ranking model
    (``pipelines.preranking``). In a cluster, the loss of a peer task raises
    ``distribute.PeerLostError``.
    """
    _check_data_service(cfg)
    if cfg.preranking is not None:  # FSCD's three stages or the two-tower anchor
        distribute.require_single_process(cfg.distribute, "[preranking]")
        return run_preranking(cfg, log)
    with distribute.peers_guarded(cfg.distribute, cfg.output_dir):
        return _train(cfg, log)


def _check_data_service(cfg: PipelineConfig) -> None:
    """``[data] data_service`` feeds the training loop of one process."""
    if not cfg.data.data_service:
        return
    distribute.require_single_process(cfg.distribute, "a run with [data] data_service")
    if cfg.preranking is not None:
        raise ConfigError(
            "[data] data_service feeds the training loop, but [preranking] stages read the "
            "Parquet shards themselves: remove one of them"
        )


def _unseen_rows(
    model: tf.keras.Model, schema: Any, stats: Any, tc: TrainConfig, log: Log
) -> UnseenRows:
    """The tables whose OOV row the loop sets (``[train] unseen_row``), said in the log."""
    unseen = UnseenRows.of(model, row_counts(schema, stats), tc.unseen_row)
    if unseen.fields:
        log(
            f"unseen values of {', '.join(unseen.fields)} read their field's mean row (no "
            "training row is out of their vocabulary; [train] unseen_row)"
        )
    return unseen


def _built_model(
    run: Run, dist: Any, stats: Any, lr: Any, log: Log
) -> tuple[tf.keras.Model, tf.keras.optimizers.Optimizer, tf.keras.metrics.Mean, Any]:
    """(model, optimizer, loss and AUC metrics) built in the strategy's scope: the model
    called once, warm-started or continued from a previous run as ``[train]`` asks, the
    optimizer's slots built."""
    cfg, tc = run.cfg, run.cfg.train
    previous = _previous_run(cfg, log)  # outside the strategy's scope: plain variables
    with dist.scope():
        model = build_run_model(cfg, run.schema, stats)
        optimizer = make_optimizer(tc.optimizer, lr)
        model(next(iter(make_dataset(run.schema, run.train_files, batch_size=2))))
        if tc.warm_start:
            warm_start(model, tc.warm_start, log)
        optimizer.build(model.trainable_variables)
        if previous is not None:  # slots need the built optimizer
            continue_model(model, optimizer, previous, stats, ContinueOptions(tc.new_rows), log)
        train_loss = tf.keras.metrics.Mean()
        train_auc = tf.keras.metrics.AUC(num_thresholds=1000)
    return model, optimizer, train_loss, train_auc


def _train(cfg: PipelineConfig, log: Log) -> dict[str, Any]:
    cfg = dataclasses.replace(cfg, train=cfg.train.run_epochs())
    dist = distribute.setup(cfg.distribute, log)  # first: it starts the cluster's servers
    if dist.serves_only:  # a parameter_server worker or ps task: serve until the chief is done
        return dist.serve(cfg.output_dir)
    dist.check_supported(cfg.train.warm_start)  # continue_from: any strategy
    check_ensemble(cfg.train)
    if cfg.train.ensemble == "none":
        check_lr_schedule(cfg.train.lr_schedule, cfg.train.lr_schedule_options)
    if cfg.train.continue_from:  # before any data is read or copied
        check_continue_from(cfg.train.continue_from)
    run, stats, gpus = _open_run(cfg, dist, log)
    dist.use_input(run.train_input.worker_side)
    tc, paths, schema = cfg.train, run.paths, run.schema
    _check_needs_validation(run)
    rows = count_rows(run.train_files)
    if tc.optimizer == "auto":
        tc = _choose_optimizer(run, rows)
    if tc.optimizer == "lbfgs":
        return _train_lbfgs(run, stats, gpus, rows)
    cfg = run.cfg
    steps_per_epoch, total_steps = _steps(dist, tc, rows)
    run.schedule = run_schedule(tc, steps_per_epoch, total_steps)
    lr = run_learning_rate(run.schedule[0], tc.learning_rate, total_steps, run.schedule[1])
    model, optimizer, train_loss, train_auc = _built_model(run, dist, stats, lr, log)
    paths.model_json.write_text(json.dumps(tf.keras.layers.serialize(model)))
    element_spec = make_dataset(schema, run.train_files, batch_size=tc.batch_size).element_spec

    def build_step(model: tf.keras.Model, opt: tf.keras.optimizers.Optimizer) -> Any:
        if dist.active:  # the same step, one slice of the batch per worker, gradients all-reduced
            return dist.train_step(model, opt, train_loss, train_auc)
        return make_train_step(
            model, opt, element_spec=element_spec, loss_metric=train_loss, auc_metric=train_auc
        )

    model, optimizer, train_step, fused_step = fuse_for_training(
        cfg, model, optimizer, paths, build_step, distributed=dist.active, log=log
    )
    autolrs = None
    if tc.lr_schedule == "autolrs":
        autolrs = _make_autolrs(run, model, optimizer, element_spec)
    average = WeightAverage(model, tc.ema_decay) if tc.weight_average == "ema" else None
    state = restore_state(run, model, optimizer, _selection(run), steps_per_epoch, autolrs, average)
    unseen = _unseen_rows(model, schema, stats, tc, log)
    snapshots = None
    if tc.ensemble == "auto":
        snapshots = SnapshotTaker(
            paths.root, model, schema, run.validation_files, lr, ensemble_options(tc), log, unseen
        )
        snapshots.resume(int(state.step))
    validation = run.validation_files
    log(
        f"training {model.name} on {rows:,} rows: {tc.epochs} epoch(s) x {steps_per_epoch} steps "
        f"of {tc.batch_size}, {model.count_params():,} parameters"
        + (f"; validation on {count_rows(validation):,} rows" if validation else "")
    )
    scorer = make_scorer(model, schema)
    loop = TrainLoop(
        run, state, train_step, (train_loss, train_auc), scorer, autolrs, snapshots, average, unseen
    )
    loop.run(steps_per_epoch, total_steps)
    selected = loop.select_and_test(model)
    report = _report(run, model, optimizer, state, loop, rows, gpus, autolrs, fused_step, log)
    report["selected"] = selected
    report["weight_average"] = average.describe() if average is not None else None
    report["unseen_row"] = {"setting": tc.unseen_row, **unseen.describe()}
    if snapshots is not None:  # after the single model's test: it reads the members in turn
        report["ensemble"] = snapshots.finish(run.test_files)
    paths.report.write_text(json.dumps(report, indent=1))
    dist.finish()
    return report


def _choose_optimizer(run: Run, rows: int) -> TrainConfig:
    """``[train] optimizer = "auto"``: the run's optimizer chosen (``lbfgs.choose_optimizer``)
    and logged; the run's config holds it from here on (its config.toml keeps ``auto``)."""
    name, why = lbfgs.choose_optimizer(
        run.cfg, rows, distributed=run.dist.active, validation=bool(run.validation_files)
    )
    fit = "the exact fit" if name == "lbfgs" else "stochastic"
    run.log(f"optimizer auto: {name} ({fit}: {why})")
    run.cfg = dataclasses.replace(run.cfg, train=dataclasses.replace(run.cfg.train, optimizer=name))
    return run.cfg.train


def _train_lbfgs(run: Run, stats: Any, gpus: list, rows: int) -> dict[str, Any]:
    """``[train] optimizer = "lbfgs"``: the regularization path of ``pipelines.run.lbfgs`` as
    the run's epochs, the selected fit tested and reported like any run."""
    cfg, paths, dist, log = run.cfg, run.paths, run.dist, run.log
    if dist.active:
        raise ConfigError(
            "[train] optimizer = 'lbfgs': not available under a distribution strategy (it fits "
            "over every training row in one process)"
        )
    if cfg.fusion is not None:
        raise ConfigError("[train] optimizer = 'lbfgs' trains no fused step; remove [fusion]")
    if len(cfg.train.lbfgs_c) > 1 and not run.validation_files:
        raise ConfigError(
            f"[train] lbfgs_c = {list(cfg.train.lbfgs_c)} is chosen on a validation split: set "
            "[data] validation_fraction > 0, give [data] validation files, or give one value"
        )
    model = build_run_model(cfg, run.schema, stats)
    build_on_sample(model, run.schema, run.train_files)
    try:
        lbfgs.check_linear(model)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    paths.model_json.write_text(json.dumps(tf.keras.layers.serialize(model)))
    state = restore_state(run, model, None, _selection(run), 1)
    batches = lbfgs.preprocess(model, run.train_reader())
    objective = lbfgs.make_objective(model, batches)
    log(
        f"training {model.name} by L-BFGS on {rows:,} rows: C in {list(cfg.train.lbfgs_c)}, "
        f"{model.count_params():,} parameters, {objective.FORM} form"
    )
    loop = lbfgs.LbfgsLoop(run, state, make_scorer(model, run.schema), objective)
    loop.run()
    selected = loop.select_and_test(model)
    report = _report(run, model, None, state, loop, rows, gpus, None, None, log)
    report.update(selected=selected, weight_average=None, lbfgs=loop.describe())
    paths.report.write_text(json.dumps(report, indent=1))
    return report


def _previous_run(cfg: PipelineConfig, log: Log) -> Previous | None:
    """The ``[train] continue_from`` run restored (``load_previous``), or None: without it, or
    when this run resumes its own checkpoint (the continuation is in that checkpoint).

    The random seed is set again afterwards, so the new model starts as it would without it."""
    tc = cfg.train
    if not tc.continue_from:
        return None
    if cfg.fusion is not None and cfg.fusion.tables:
        raise ConfigError(
            f"[train] continue_from = {tc.continue_from!r} is not available with [fusion] tables "
            "= true (the fused tables' optimizer starts fresh, its slots would be lost)"
        )
    if tf.train.latest_checkpoint(str(RunPaths(Path(cfg.output_dir)).checkpoints)) is not None:
        log(f"continue_from {tc.continue_from}: resuming this run's own checkpoint instead")
        return None
    previous = load_previous(tc.continue_from, log)
    tf.keras.utils.set_random_seed(tc.seed)
    return previous


def _report(
    run: Run,
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    state: Any,
    loop: TrainLoop,
    rows: int,
    gpus: list,
    autolrs: Any,
    fused_step: Any,
    log: Log,
) -> dict[str, Any]:
    """``train_report.json``: rows, steps, time, the test result and what was selected."""
    tc = run.cfg.train
    report = {
        "model": model.name,
        "optimizer": tc.optimizer,  # what trained the run (``auto``: its choice)
        "train_rows": rows,
        "validation_rows": count_rows(run.validation_files) if run.validation_files else 0,
        "test_rows": count_rows(run.test_files) if run.test_files else 0,
        "test_files": [str(f) for f in run.test_files],
        "steps": int(state.step),
        "steps_this_run": loop.trained_steps,
        "train_seconds": round(loop.train_seconds, 2),
        "examples_per_second": round(loop.examples / max(loop.train_seconds, 1e-9)),
        "eval_seconds": round(loop.eval_seconds, 2),
        "parameters": int(model.count_params()),
        "test": loop.test,
        "test_tasks": loop.test_tasks,  # a multi-task model's test metrics per task
        "selected": None,  # filled in by the caller: the checkpoint the test scored
        "selection": state.selection.describe() if state.selection else None,
        "epochs": state.history.entries(),
        "checkpoint": state.manager.latest_checkpoint,
        "learning_rate": None
        if optimizer is None  # L-BFGS: no learning rate
        else {
            "schedule": run.schedule[0],
            "base": tc.learning_rate,
            "options": dict(run.schedule[1]),
            "last": float(tf.convert_to_tensor(optimizer.learning_rate)),  # of the last step
        },
        "autolrs": {**autolrs.report(), "stages": autolrs.history} if autolrs else None,
        "ensemble": None,  # filled in by the caller for ensemble = "auto"
        "seed": tc.seed,
        "devices": [g.name for g in gpus] or ["CPU"],
        "vocabulary": vocabulary_change(run.paths),  # continue_from: the VocabChange
    }
    if fused_step is not None:
        report["fused_training_step"] = {
            "clusters": fused_step.clusters,
            "choice": fused_step.choice or "undecided (too few steps)",
            "trial_ms": {k: round(v, 3) for k, v in fused_step.timings_ms.items()},
        }
        log(f"fusion: training step ran {report['fused_training_step']}")
    return report


def _steps(dist: Any, tc: Any, rows: int) -> tuple[int, int]:
    """(steps per epoch, steps of the whole run) for ``rows`` training rows."""
    dist.check_batch_size(tc.batch_size)
    steps_per_epoch = dist.steps_per_epoch(rows, tc.batch_size)
    total_steps = steps_per_epoch * tc.epochs
    return steps_per_epoch, min(total_steps, tc.max_steps) if tc.max_steps else total_steps


def _open_run(cfg: PipelineConfig, dist: Any, log: Log) -> tuple[Run, Any, list]:
    """The run folder (checked, config written), devices, seeds, data and statistics. A run
    folder this call creates is removed again when preparing it fails (bad data, a bad
    ``continue_from``): a failed start leaves no folder a later run would take for its own."""
    paths = RunPaths(dist.run_root(cfg.output_dir))
    created = not paths.root.exists()
    try:
        return _prepare_run(cfg, dist, paths, log)
    except BaseException:
        if created and not dist.active:  # a cluster's processes share the folder
            shutil.rmtree(paths.root, ignore_errors=True)
        raise


def _prepare_run(
    cfg: PipelineConfig, dist: Any, paths: RunPaths, log: Log
) -> tuple[Run, Any, list]:
    paths.root.mkdir(parents=True, exist_ok=True)
    check_same_run(cfg, paths)
    _check_same_batch_size(cfg, paths)
    paths.config.write_text(cfg.to_toml())
    gpus = use_gpus_if_present(log)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    with open_runner(cfg.engine, log) as runner:
        schema, train_files, validation_files, test_files = prepare_data(cfg, paths, log, runner)
        schema = add_configured_crosses(cfg, schema, log)
        schema.save(paths.schema)
        vocab = (cfg.vocab or VocabConfig()).to_options()
        stats = prepare_stats(
            schema,
            train_files,
            paths,
            log,
            cfg.data.cap_hash_buckets,
            vocab,
            cfg.train.continue_from,
            runner,
        )
        train_input = prepare_train_input(
            cfg.data.input_format, schema, train_files, paths, log, runner
        )
    if cfg.data.data_service:
        try:
            check_reachable(cfg.data.data_service)
        except ConnectionError as e:
            raise ConfigError(f"[data] data_service: {e}") from None
        log(f"training input: batches made by the tf.data service at {cfg.data.data_service}")
    if not dist.is_chief:
        validation_files, test_files = [], []  # the chief evaluates and reports
    files = (train_files, validation_files, test_files)
    return Run(cfg, dist, paths, schema, *files, log, train_input), stats, gpus


def _check_same_batch_size(cfg: PipelineConfig, paths: RunPaths) -> None:
    """Raises ConfigError when the run folder's checkpoints were trained with another
    ``[train] batch_size``: their position in the epoch counts batches of that size."""
    if not paths.config.exists() or tf.train.latest_checkpoint(str(paths.checkpoints)) is None:
        return
    before = load_config(paths.config).train.batch_size
    if before != cfg.train.batch_size:
        raise ConfigError(
            f"[train] batch_size = {cfg.train.batch_size}: {paths.root} holds a run "
            f"checkpointed with batch_size = {before} (its step and position in the epoch "
            f"count batches of {before} rows); resume it with batch_size = {before}, or train "
            "into a new output_dir"
        )


#: ``[train]`` settings that need one process and a validation split: (key, value, why one
#: process, what reads the validation split).
_NEEDS_VALIDATION = (
    (
        "lr_schedule",
        "autolrs",
        "its search snapshots and restores one process's variables; choose a step schedule "
        "(constant, step, cosine, one_cycle)",
        "its search reads the validation loss",
    ),
    (
        "ensemble",
        "auto",
        "its snapshots are chosen by one process's validation predictions; set ensemble = 'none'",
        "snapshots are collected and chosen on it",
    ),
    (
        "weight_average",
        "ema",
        "the average is one process's copy of the weights; set weight_average = 'none'",
        "the averaged weights are evaluated and kept as the best checkpoint on it",
    ),
)


def _check_needs_validation(run: Run) -> None:
    """``lr_schedule = "autolrs"``, ``ensemble = "auto"`` and ``weight_average = "ema"`` need
    one process and a validation split."""
    for key, value, one_process, reads in _NEEDS_VALIDATION:
        if getattr(run.cfg.train, key) != value:
            continue
        if run.dist.active:
            raise ConfigError(
                f"[train] {key} = {value!r}: not available under a distribution strategy "
                f"({one_process})"
            )
        if not run.validation_files:
            raise ConfigError(
                f"[train] {key} = {value!r} needs a validation split ({reads}, never the test "
                "set): set [data] validation_fraction > 0 or give [data] validation files"
            )


def _make_autolrs(run: Run, model: tf.keras.Model, optimizer: Any, element_spec: Any) -> AutoLRS:
    """The AutoLRS controller of the run: its candidates train with a step that updates no
    loop metric and are judged by the mean loss on the validation split."""
    tc = run.cfg.train
    batches = list(make_dataset(run.schema, run.validation_files, batch_size=tc.batch_size))
    val_loss = validation_loss_fn(model, batches, run.schema.label.name)
    search_step = make_train_step(model, optimizer, element_spec=element_spec)
    return make_autolrs(
        model,
        optimizer,
        search_step,
        val_loss,
        base_lr=tc.learning_rate,
        seed=tc.seed,
        **tc.lr_schedule_options,
    )


def _selection(run: Run) -> Selection | None:
    """The run's early-stopping and best-checkpoint state; None without validation selection
    (no validation split, or a distribution strategy, whose workers all train every step)."""
    tc, dist = run.cfg.train, run.dist
    if tc.early_stopping and dist.active:
        raise ConfigError(
            "[train] early_stopping = true: not available under a distribution strategy "
            "(every worker must run every step); set it to false"
        )
    if tc.early_stopping and not run.validation_files and dist.is_chief:
        raise ConfigError(
            "[train] early_stopping = true needs a validation split: set [data] "
            "validation_fraction > 0 or give [data] validation files"
        )
    if dist.active or not run.validation_files:
        return None
    # by default, an ensemble run ends when its snapshots saturate, not by early stopping
    early = (tc.ensemble == "none") if tc.early_stopping is None else tc.early_stopping
    return Selection(tc.select_metric, tc.patience, tc.min_delta, early)
