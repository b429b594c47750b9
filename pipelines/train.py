"""``stitchrec train``: data -> statistics -> model -> checkpointed training loop -> report.

A run lives in one folder (``RunPaths``)::

    <output_dir>/
      config.toml        the resolved config of the run
      schema.toml        the schema of the Parquet shards the model reads (fields by name)
      data/              train/, validation/ and test/ Parquet shards (when converted)
      stats/             vocabularies and numeric statistics of the training split
      model.json         the model's Keras config (export rebuilds the model from it)
      checkpoints/       tf.train.CheckpointManager checkpoints; best/ the best validation one
      history.jsonl      every validation evaluation of the run, across resumes
      tensorboard/       scalars: train loss and AUC, validation and test AUC and log loss
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
one stops.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import tensorflow as tf

from features.dataset import count_rows, make_dataset
from features.schema import Schema
from pipelines import distribute
from pipelines.config import ConfigError, PipelineConfig, load_config
from pipelines.preranking import run_preranking
from pipelines.run.autolrs import AutoLRS, make_autolrs, validation_loss_fn
from pipelines.run.data import (
    add_configured_crosses,
    check_same_run,
    prepare_data,
    prepare_stats,
    use_gpus_if_present,
)
from pipelines.run.fusion import fuse_for_training
from pipelines.run.model import BEST_DIR, build_run_model, make_optimizer, warm_start
from pipelines.run.paths import Log, RunPaths
from pipelines.run.schedules import check_lr_schedule, run_learning_rate
from pipelines.run.scoring import evaluate_model, make_scorer
from pipelines.run.selection import HISTORY_FILE, History, Selection
from pipelines.run.step import make_train_step
from ranking.blocks import MLP


@dataclasses.dataclass
class _Run:
    """What the training loop of one run works with."""

    cfg: PipelineConfig
    dist: Any  # distribute.Distribution or distribute_ps.PSDistribution
    paths: RunPaths
    schema: Schema
    train_files: list[Path]
    validation_files: list[Path]
    test_files: list[Path]
    log: Log


def train(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """Runs (or resumes) the training of ``cfg``; returns the report also written to disk.

    A config with a ``[preranking]`` section trains the pre-ranking model
    (``pipelines.preranking``). In a cluster, the loss of a peer task raises
    ``distribute.PeerLostError``.
    """
    if cfg.preranking is not None:  # FSCD's three stages or the two-tower anchor
        distribute.require_single_process(cfg.distribute, "[preranking]")
        return run_preranking(cfg, log)
    with distribute.peers_guarded(cfg.distribute, cfg.output_dir):
        return _train(cfg, log)


def _train(cfg: PipelineConfig, log: Log) -> dict[str, Any]:
    dist = distribute.setup(cfg.distribute, log)  # first: it starts the cluster's servers
    if dist.serves_only:  # a parameter_server worker or ps task: serve until the chief is done
        return dist.serve(cfg.output_dir)
    dist.check_supported(cfg.train.warm_start)
    check_lr_schedule(cfg.train.lr_schedule, cfg.train.lr_schedule_options)
    run, stats, gpus = _open_run(cfg, dist, log)
    tc, paths, schema = cfg.train, run.paths, run.schema
    _check_autolrs(run)
    rows = count_rows(run.train_files)
    steps_per_epoch, total_steps = _steps(dist, tc, rows)
    lr = run_learning_rate(tc.lr_schedule, tc.learning_rate, total_steps, tc.lr_schedule_options)
    with dist.scope():
        model = build_run_model(cfg, schema, stats)
        optimizer = make_optimizer(tc.optimizer, lr)
        model(next(iter(make_dataset(schema, run.train_files, batch_size=2))))
        if tc.warm_start:
            warm_start(model, tc.warm_start, log)
        optimizer.build(model.trainable_variables)
        train_loss = tf.keras.metrics.Mean()
        train_auc = tf.keras.metrics.AUC(num_thresholds=1000)
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
    state = _restore(run, model, optimizer, _selection(run), steps_per_epoch, autolrs)
    log(
        f"training {model.name} on {rows:,} rows: {tc.epochs} epoch(s) x {steps_per_epoch} steps "
        f"of {tc.batch_size}, {model.count_params():,} parameters"
        + (
            f"; validation on {count_rows(run.validation_files):,} rows"
            if run.validation_files
            else ""
        )
    )
    scorer = make_scorer(model, schema)
    loop = _Loop(run, state, train_step, (train_loss, train_auc), scorer, autolrs)
    loop.run(steps_per_epoch, total_steps)
    selected = loop.select_and_test(model)
    report = _report(run, model, optimizer, state, loop, rows, gpus, autolrs, fused_step, log)
    report["selected"] = selected
    paths.report.write_text(json.dumps(report, indent=1))
    dist.finish()
    return report


def _report(
    run: _Run,
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    state: Any,
    loop: _Loop,
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
        "train_rows": rows,
        "validation_rows": count_rows(run.validation_files) if run.validation_files else 0,
        "test_rows": count_rows(run.test_files) if run.test_files else 0,
        "steps": int(state.step),
        "steps_this_run": loop.trained_steps,
        "train_seconds": round(loop.train_seconds, 2),
        "examples_per_second": round(loop.examples / max(loop.train_seconds, 1e-9)),
        "eval_seconds": round(loop.eval_seconds, 2),
        "parameters": int(model.count_params()),
        "test": loop.test,
        "selected": None,  # filled in by the caller: the checkpoint the test scored
        "selection": state.selection.describe() if state.selection else None,
        "epochs": state.history.entries(),
        "checkpoint": state.manager.latest_checkpoint,
        "learning_rate": {
            "schedule": tc.lr_schedule,
            "base": tc.learning_rate,
            "options": dict(tc.lr_schedule_options),
            "last": float(tf.convert_to_tensor(optimizer.learning_rate)),  # of the last step
        },
        "autolrs": {**autolrs.report(), "stages": autolrs.history} if autolrs else None,
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
    return report


def _steps(dist: Any, tc: Any, rows: int) -> tuple[int, int]:
    """(steps per epoch, steps of the whole run) for ``rows`` training rows."""
    dist.check_batch_size(tc.batch_size)
    steps_per_epoch = dist.steps_per_epoch(rows, tc.batch_size)
    total_steps = steps_per_epoch * tc.epochs
    return steps_per_epoch, min(total_steps, tc.max_steps) if tc.max_steps else total_steps


def _open_run(cfg: PipelineConfig, dist: Any, log: Log) -> tuple[_Run, Any, list]:
    """The run folder (checked, config written), devices, seeds, data and statistics."""
    paths = RunPaths(dist.run_root(cfg.output_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    check_same_run(cfg, paths)
    _check_same_batch_size(cfg, paths)
    paths.config.write_text(cfg.to_toml())
    gpus = use_gpus_if_present(log)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    schema, train_files, validation_files, test_files = prepare_data(cfg, paths, log)
    schema = add_configured_crosses(cfg, schema, log)
    schema.save(paths.schema)
    stats = prepare_stats(schema, train_files, paths, log)
    if not dist.is_chief:
        validation_files, test_files = [], []  # the chief evaluates and reports
    files = (train_files, validation_files, test_files)
    return _Run(cfg, dist, paths, schema, *files, log), stats, gpus


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


def _check_autolrs(run: _Run) -> None:
    """``lr_schedule = "autolrs"`` needs one process and a validation split."""
    if run.cfg.train.lr_schedule != "autolrs":
        return
    if run.dist.active:
        raise ConfigError(
            "[train] lr_schedule = 'autolrs': not available under a distribution strategy "
            "(its search snapshots and restores one process's variables); choose a step "
            "schedule (constant, step, cosine, one_cycle)"
        )
    if not run.validation_files:
        raise ConfigError(
            "[train] lr_schedule = 'autolrs' needs a validation split (its search reads the "
            "validation loss, never the test set): set [data] validation_fraction > 0 or give "
            "[data] validation files"
        )


def _make_autolrs(run: _Run, model: tf.keras.Model, optimizer: Any, element_spec: Any) -> AutoLRS:
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


def _selection(run: _Run) -> Selection | None:
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
    early = True if tc.early_stopping is None else tc.early_stopping
    return Selection(tc.select_metric, tc.patience, tc.min_delta, early)


@dataclasses.dataclass
class _State:
    """The checkpointed position of the run: global step, epoch, batch within the epoch, the
    selection state; the managers of the checkpoints and of the best one; the history."""

    step: tf.Variable
    epoch: tf.Variable
    batch: tf.Variable
    manager: tf.train.CheckpointManager
    selection: Selection | None
    best: tf.train.CheckpointManager | None
    history: History
    steps_per_epoch: int


#: The folders ``tf.train.Checkpoint`` writes a checkpoint's shards into before it renames
#: them into place (``ckpt-<step>_temp/``); a process killed while saving leaves one behind.
_TEMP_CHECKPOINT = re.compile(r"ckpt-\d+_temp(_[0-9a-f]+)?")


def _remove_stale_temp(folder: Path, log: Log) -> None:
    """Removes the unfinished checkpoint folders a killed save left in ``folder``."""
    if not folder.is_dir():
        return
    for path in sorted(folder.iterdir()):
        if path.is_dir() and _TEMP_CHECKPOINT.fullmatch(path.name):
            shutil.rmtree(path)
            log(f"removed {path}: the unfinished save of a killed run")


def _restore(
    run: _Run,
    model: tf.keras.Model,
    optimizer: Any,
    selection: Selection | None,
    spe: int,
    autolrs: AutoLRS | None = None,
) -> _State:
    """The run's checkpoint managers (unfinished saves removed), the latest checkpoint (the
    chief's) restored."""
    for folder in (run.paths.checkpoints, run.paths.checkpoints / BEST_DIR):
        _remove_stale_temp(folder, run.log)
    step = tf.Variable(0, dtype=tf.int64, name="step")
    epoch = tf.Variable(0, dtype=tf.int64, name="epoch")
    batch = tf.Variable(0, dtype=tf.int64, name="batch_in_epoch")
    extra = selection.variables() if selection else {}
    if autolrs is not None:
        extra["autolrs"] = autolrs.tracked
    counters = [
        m.dropout_calls
        for m in model.submodules
        if isinstance(m, MLP) and m.dropout_calls is not None
    ]
    if counters:  # the MLPs' dropout masks follow them
        extra["dropout_calls"] = counters
    ckpt = tf.train.Checkpoint(
        model=model, optimizer=optimizer, step=step, epoch=epoch, batch=batch, **extra
    )
    manager = tf.train.CheckpointManager(ckpt, run.paths.checkpoints, max_to_keep=3)
    best = None
    if selection is not None:
        best_ckpt = tf.train.Checkpoint(model=model, step=step, epoch=epoch)
        best = tf.train.CheckpointManager(best_ckpt, run.paths.checkpoints / BEST_DIR, 1)
    chief = Path(run.cfg.output_dir) / "checkpoints"
    latest = run.dist.latest_checkpoint(manager.latest_checkpoint, chief)
    history = History(run.paths.root / HISTORY_FILE)
    state = _State(step, epoch, batch, manager, selection, best, history, spe)
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()
        run.log(
            f"resumed from {latest} at step {int(step)} "
            f"(epoch {int(epoch) + 1}, batch {int(batch)})"
        )
        if run.dist.is_chief:
            history.keep_until(int(step))
        _check_best(state, run.log)
    return state


def _checkpoint_step(path: str | None) -> int:
    return int(path.rsplit("-", 1)[1]) if path else 0


def _check_best(state: _State, log: Log) -> None:
    """After a resume: the best checkpoint on disk is the one the restored state names.

    The best checkpoint is saved right after the regular one; a run killed between the two
    restores a state whose best step is the restored step itself, so its model is saved now."""
    sel, best = state.selection, state.best
    if sel is None or not sel.has_best:
        return
    if _checkpoint_step(best.latest_checkpoint) != int(sel.best_step):
        if int(state.step) == int(sel.best_step):
            best.save(checkpoint_number=int(state.step))
        else:
            log(
                f"warning: {best.directory} does not hold the best step {int(sel.best_step)}; "
                "the best checkpoint is saved again at the next improvement"
            )


class _Loop:
    """The epochs of a run: steps, windowed train metrics, checkpoints, validation evaluations
    and early stopping; at the end, the test metrics of the selected checkpoint."""

    def __init__(
        self,
        run: _Run,
        state: _State,
        train_step: Any,
        window: tuple,
        scorer: Any,
        autolrs: AutoLRS | None = None,
    ) -> None:
        self.run_, self.state, self.train_step = run, state, train_step
        self.autolrs = autolrs
        self.train_loss, self.train_auc = window
        self.scorer = scorer
        self.writer = tf.summary.create_file_writer(str(run.paths.tensorboard))
        self.eval_seconds, self.train_seconds = 0.0, 0.0
        self.examples, self.trained_steps = 0, 0
        done = state.history.entries()  # a resumed run does not evaluate a step twice
        self.last_eval = done[-1]["step"] if done else -1  # the last evaluated global step
        self.test: dict[str, Any] | None = None
        self.t_window, self.examples_window = time.time(), 0

    @property
    def stopped(self) -> bool:
        sel = self.state.selection
        return sel is not None and bool(sel.stopped)

    def run(self, steps_per_epoch: int, total_steps: int) -> None:
        r, s, tc = self.run_, self.state, self.run_.cfg.train
        t_start = time.time()
        done = int(s.step) >= total_steps or self.stopped
        while not done and int(s.epoch) < tc.epochs:
            epoch = int(s.epoch)
            done = self._epoch(epoch, total_steps)
            r.dist.sync()
            if int(s.batch) >= steps_per_epoch or not done:
                s.epoch.assign_add(1)
                s.batch.assign(0)
            if r.validation_files and self.last_eval != int(s.step):
                done = self._validate(epoch) or done
            else:
                s.manager.save(checkpoint_number=int(s.step))
        if self.stopped:
            sel = s.selection
            r.log(
                f"early stopping at step {int(s.step)}: {sel.patience} validation evaluation(s) "
                f"without improving {sel.metric} by more than {sel.min_delta}"
            )
        self.writer.flush()
        self.train_seconds = time.time() - t_start - self.eval_seconds

    def _epoch(self, epoch: int, total_steps: int) -> bool:
        """Trains the rest of epoch ``epoch``; True once ``total_steps`` are done or early
        stopping stopped the run."""
        r, s, tc = self.run_, self.state, self.run_.cfg.train
        label = r.schema.label.name
        make = functools.partial(
            make_dataset,
            r.schema,
            r.train_files,
            shuffle=True,
            seed=tc.seed,
            epoch=epoch,
            skip_batches=int(s.batch),
            shuffle_buffer=tc.shuffle_buffer,
        )
        batches = iter(r.dist.batches(make, label, tc.batch_size))
        while True:
            if self.autolrs is not None and self.autolrs.stage_due(int(s.step)):
                batches = self._search(batches)
            features = next(batches, None)
            if features is None:
                break
            self.train_step(features)
            s.step.assign_add(1)
            s.batch.assign_add(1)
            self.trained_steps += 1
            n = r.dist.rows(features, label)
            self.examples_window += n
            self.examples += n
            step = int(s.step)
            if step % tc.log_every == 0 or step == total_steps:
                self._log_window(epoch, step, total_steps)
            evaluate = bool(tc.eval_every) and step % tc.eval_every == 0
            if evaluate or step % tc.checkpoint_every == 0:  # every worker saves at these steps
                r.dist.sync()  # the checkpoint holds exactly the first `step` steps
                if evaluate and r.validation_files:
                    if self._validate(epoch):  # it saves the checkpoint too
                        return True
                else:
                    s.manager.save(checkpoint_number=step)
            if step >= total_steps:
                return True
        return False

    def _search(self, batches: Any) -> Any:
        """AutoLRS: the next stage's learning rate searched at this step (on the stage's first
        batches, returned with the rest); logged with its candidates."""
        ctl, step = self.autolrs, int(self.state.step)
        stages = len(ctl.history)
        batches = ctl.begin_stage(batches, step)
        if len(ctl.history) > stages:
            h = ctl.history[-1]
            tried = ", ".join(f"{c['lr']:.3g}" for c in h["candidates"])
            self.run_.log(
                f"autolrs stage {h['stage'] + 1} at step {step}: lr {h['chosen_lr']:.4g} for "
                f"{h['tau']} steps ({len(h['candidates'])} candidates [{tried}], "
                f"{h['search_steps']} search steps, {h['search_seconds']:.1f}s)"
            )
        self.t_window = time.time()
        return batches

    def _log_window(self, epoch: int, step: int, total_steps: int) -> None:
        r, tc = self.run_, self.run_.cfg.train
        r.dist.sync()  # parameter_server: wait for the scheduled steps
        rate = self.examples_window / max(time.time() - self.t_window, 1e-9)
        loss_v, auc_v = float(self.train_loss.result()), float(self.train_auc.result())
        r.log(
            f"epoch {epoch + 1}/{tc.epochs} step {step}/{total_steps} "
            f"loss {loss_v:.4f} auc {auc_v:.4f} {rate:,.0f} examples/s"
        )
        with self.writer.as_default(step=step):
            tf.summary.scalar("train/loss", loss_v)
            tf.summary.scalar("train/auc", auc_v)
            tf.summary.scalar("train/examples_per_second", rate)
        self.train_loss.reset_state()
        self.train_auc.reset_state()
        self.t_window, self.examples_window = time.time(), 0

    def _validate(self, epoch: int) -> bool:
        """Evaluates the validation split at this step, records it (selection state, history)
        and saves the checkpoint, then the best one; True when early stopping stops the run.

        The order keeps a killed run consistent: the history line is written before the
        checkpoint (a resume drops lines after its step), the best checkpoint after it."""
        r, s = self.run_, self.state
        step = int(s.step)
        t_eval = time.time()
        m = evaluate_model(self.scorer, r.schema, r.validation_files)
        self.eval_seconds += time.time() - t_eval
        self.t_window, self.last_eval = time.time(), step
        improved = s.selection.update(m, step, epoch + 1) if s.selection else False
        s.history.append({"epoch": epoch + 1, "step": step, **m, "best": improved})
        r.log(
            f"epoch {epoch + 1} step {step} validation auc {m['auc']:.4f} "
            f"logloss {m['logloss']:.4f}" + (" (best so far)" if improved else "")
        )
        with self.writer.as_default(step=step):
            tf.summary.scalar("validation/auc", m["auc"])
            tf.summary.scalar("validation/logloss", m["logloss"])
        s.manager.save(checkpoint_number=step)
        if improved:
            s.best.save(checkpoint_number=step)
        return self.stopped

    def select_and_test(self, model: tf.keras.Model) -> dict[str, Any]:
        """Restores the selected checkpoint (the best validation one, else the last) into
        ``model``, scores the test set on it once, and returns what was selected and why."""
        r, s = self.run_, self.state
        sel = s.selection
        if sel is not None and sel.has_best:
            path = s.best.latest_checkpoint
            tf.train.Checkpoint(model=model).restore(path).expect_partial()
            step, epoch, reason = int(sel.best_step), int(sel.best_epoch), sel.reason()
        else:
            path, step = s.manager.latest_checkpoint, int(s.step)
            epoch = (step - 1) // max(s.steps_per_epoch, 1) + 1 if step else 0
            reason = _last_reason(r)
        selected = {"checkpoint": path, "step": step, "epoch": epoch, "reason": reason}
        if not r.test_files:
            if r.dist.is_chief:
                r.log(f"no test set; selected the checkpoint of step {step}: {reason}")
            return selected
        t_eval = time.time()
        self.test = evaluate_model(self.scorer, r.schema, r.test_files)
        self.eval_seconds += time.time() - t_eval
        with self.writer.as_default(step=step):
            tf.summary.scalar("test/auc", self.test["auc"])
            tf.summary.scalar("test/logloss", self.test["logloss"])
        self.writer.flush()
        r.log(
            f"test auc {self.test['auc']:.4f} logloss {self.test['logloss']:.4f} "
            f"({self.test['rows']:,} rows) on the checkpoint of step {step} (epoch {epoch}): "
            f"{reason}"
        )
        return selected


def _last_reason(run: _Run) -> str:
    if run.dist.active and run.validation_files:
        return (
            "last checkpoint: selection by validation is not available under a distribution "
            "strategy (the validation metrics are in the history)"
        )
    return "last checkpoint because no validation split (the test set was not used for selection)"
