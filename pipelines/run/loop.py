"""The training loop of ``stitchrec train`` (``pipelines.train``): the run's checkpointed state,
its restore after a kill, and the epochs (steps, windowed train metrics, checkpoints, validation
evaluations, early stopping, AutoLRS stages, ensemble snapshots; the test of the selected
checkpoint at the end)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tensorflow as tf

from features.dataset import make_dataset
from features.schema import Schema
from features.tfrecord.service import served, within_deadline
from pipelines.config import PipelineConfig
from pipelines.run.autolrs import AutoLRS
from pipelines.run.averaging import WeightAverage
from pipelines.run.model import BEST_DIR
from pipelines.run.paths import Log, RunPaths
from pipelines.run.scoring import evaluate_model, evaluate_tasks
from pipelines.run.selection import HISTORY_FILE, History, Selection
from pipelines.run.snapshots import SnapshotTaker
from pipelines.run.train_input import TrainInput
from pipelines.run.unseen import UnseenRows
from ranking.blocks import MLP
from ranking.multitask import MultiTaskModel


@dataclasses.dataclass
class Run:
    """What the training loop of one run works with."""

    cfg: PipelineConfig
    dist: Any  # distribute.Distribution or distribute_ps.PSDistribution
    paths: RunPaths
    schema: Schema
    train_files: list[Path]
    validation_files: list[Path]
    test_files: list[Path]
    log: Log
    #: what the loop reads the training split from (``[data] input_format``); None: the
    #: Parquet ``train_files``
    train_input: TrainInput | None = None
    #: the learning-rate schedule trained under and its options (``run_schedule``)
    schedule: tuple[str, dict[str, Any]] = ("constant", {})

    def train_reader(self) -> Any:
        """``make(batch_size=..., ...)`` over the training split, in the run's input format."""
        if self.train_input is None:
            return functools.partial(make_dataset, self.schema, self.train_files)
        return self.train_input.reader(self.schema)


@dataclasses.dataclass
class RunState:
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


def restore_state(
    run: Run,
    model: tf.keras.Model,
    optimizer: Any,
    selection: Selection | None,
    spe: int,
    autolrs: AutoLRS | None = None,
    average: WeightAverage | None = None,
) -> RunState:
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
    if average is not None:
        extra["weight_average"] = average.tracked
    counters = [
        m.dropout_calls
        for m in model.submodules
        if isinstance(m, MLP) and m.dropout_calls is not None
    ]
    if counters:  # the MLPs' dropout masks follow them
        extra["dropout_calls"] = counters
    if optimizer is not None:  # None: a run without a Keras optimizer (``run.lbfgs``)
        extra["optimizer"] = optimizer
    ckpt = tf.train.Checkpoint(model=model, step=step, epoch=epoch, batch=batch, **extra)
    manager = tf.train.CheckpointManager(ckpt, run.paths.checkpoints, max_to_keep=3)
    best = None
    if selection is not None:
        best_ckpt = tf.train.Checkpoint(model=model, step=step, epoch=epoch)
        best = tf.train.CheckpointManager(best_ckpt, run.paths.checkpoints / BEST_DIR, 1)
    chief = Path(run.cfg.output_dir) / "checkpoints"
    latest = run.dist.latest_checkpoint(manager.latest_checkpoint, chief)
    history = History(run.paths.root / HISTORY_FILE)
    state = RunState(step, epoch, batch, manager, selection, best, history, spe)
    if latest:
        ckpt.restore(latest).assert_existing_objects_matched()
        run.log(
            f"resumed from {latest} at step {int(step)} "
            f"(epoch {int(epoch) + 1}, batch {int(batch)})"
        )
        if run.dist.is_chief:
            history.keep_until(int(step))
        _check_best(state, run.log, average)
    return state


def _checkpoint_step(path: str | None) -> int:
    return int(path.rsplit("-", 1)[1]) if path else 0


def _averaged(average: WeightAverage | None) -> Any:
    """A block in which the model holds the averaged weights (without an average: the trained
    ones)."""
    return average.swapped() if average is not None else contextlib.nullcontext()


def _check_best(state: RunState, log: Log, average: WeightAverage | None = None) -> None:
    """After a resume: the best checkpoint on disk is the one the restored state names.

    The best checkpoint is saved right after the regular one; a run killed between the two
    restores a state whose best step is the restored step itself, so its model (its weight
    average, with one) is saved now."""
    sel, best = state.selection, state.best
    if sel is None or not sel.has_best:
        return
    if _checkpoint_step(best.latest_checkpoint) != int(sel.best_step):
        if int(state.step) == int(sel.best_step):
            with _averaged(average):
                best.save(checkpoint_number=int(state.step))
        else:
            log(
                f"warning: {best.directory} does not hold the best step {int(sel.best_step)}; "
                "the best checkpoint is saved again at the next improvement"
            )


class TrainLoop:
    """The epochs of a run: steps, windowed train metrics, checkpoints, validation evaluations
    and early stopping; at the end, the test metrics of the selected checkpoint."""

    def __init__(
        self,
        run: Run,
        state: RunState,
        train_step: Any,
        window: tuple,
        scorer: Any,
        autolrs: AutoLRS | None = None,
        snapshots: SnapshotTaker | None = None,
        average: WeightAverage | None = None,
        unseen: UnseenRows | None = None,
    ) -> None:
        self.run_, self.state, self.train_step = run, state, train_step
        self.autolrs, self.snapshots, self.average = autolrs, snapshots, average
        self.unseen = unseen
        self.train_loss, self.train_auc = window
        self.scorer = scorer
        self.writer = tf.summary.create_file_writer(str(run.paths.tensorboard))
        self.eval_seconds, self.train_seconds = 0.0, 0.0
        self.examples, self.trained_steps = 0, 0
        done = state.history.entries()  # a resumed run does not evaluate a step twice
        self.last_eval = done[-1]["step"] if done else -1  # the last evaluated global step
        self.test: dict[str, Any] | None = None
        #: a multi-task model's test metrics per task (``scoring.evaluate_tasks``)
        self.test_tasks: dict[str, dict[str, Any]] | None = None
        self.t_window, self.examples_window = time.time(), 0

    @property
    def stopped(self) -> bool:
        """Early stopping, or the ensemble's saturation, has ended the run."""
        sel = self.state.selection
        if self.snapshots is not None and self.snapshots.stops_run:
            return True
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
                self._save()
        if self.snapshots is not None and self.snapshots.stops_run:
            r.log(f"ensemble: snapshots saturated; training ends at step {int(s.step)}")
        elif self.stopped:
            sel = s.selection
            r.log(
                f"early stopping at step {int(s.step)}: {sel.patience} validation evaluation(s) "
                f"without improving {sel.metric} by more than {sel.min_delta}"
            )
        self.writer.flush()
        snapshot_seconds = self.snapshots.seconds if self.snapshots is not None else 0.0
        self.train_seconds = time.time() - t_start - self.eval_seconds - snapshot_seconds

    def _epoch(self, epoch: int, total_steps: int) -> bool:
        """Trains the rest of epoch ``epoch``; True once ``total_steps`` are done or early
        stopping stopped the run."""
        r, s, tc = self.run_, self.state, self.run_.cfg.train
        label = r.schema.label.name
        make = functools.partial(
            r.train_reader(),
            shuffle=True,
            seed=tc.seed,
            epoch=epoch,
            shuffle_buffer=tc.shuffle_buffer,
        )
        if r.cfg.data.data_service:  # the epoch's batches made by tf.data service workers
            make = served(make, r.cfg.data.data_service)
        done = int(s.batch)
        batches = self._start_input(
            r.dist.batches(make, label, tc.batch_size, done, s.steps_per_epoch)
        )
        if r.cfg.data.data_service:
            batches = within_deadline(
                batches, r.cfg.data.data_service_timeout, r.cfg.data.data_service
            )
        while True:
            if self.autolrs is not None and self.autolrs.stage_due(int(s.step)):
                batches = self._search(batches)
            features = next(batches, None)
            if features is None:
                break
            self.train_step(features)
            if self.average is not None:
                self.average.update()
            s.step.assign_add(1)
            s.batch.assign_add(1)
            self.trained_steps += 1
            n = r.dist.rows(features, label)
            self.examples_window += n
            self.examples += n
            step = int(s.step)
            if self.snapshots is not None and self.snapshots.after_step(step - 1):
                self.t_window = time.time()  # the snapshot's time is not the window's
            if step % tc.log_every == 0 or step == total_steps:
                self._log_window(epoch, step, total_steps)
            evaluate = bool(tc.eval_every) and step % tc.eval_every == 0
            if evaluate or step % tc.checkpoint_every == 0:  # every worker saves at these steps
                r.dist.sync()  # the checkpoint holds exactly the first `step` steps
                if evaluate and r.validation_files:
                    if self._validate(epoch):  # it saves the checkpoint too
                        return True
                else:
                    self._save()
            if step >= total_steps or (self.snapshots is not None and self.snapshots.stops_run):
                return True
        return False

    def _start_input(self, dataset: Any) -> Iterator[Any]:
        """The epoch's iterator over ``dataset``, created on a thread while this one traces a
        training step that has an input signature (a cached trace after the first epoch):
        creating a tf.data iterator runs in TensorFlow's runtime without the GIL, and from
        its creation the input reads its first window on TensorFlow's threads."""
        if getattr(self.train_step, "input_signature", None) is None:
            return iter(dataset)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="input") as pool:
            iterator = pool.submit(iter, dataset)
            self.train_step.get_concrete_function()
            return iterator.result()

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

    def _validate(self, epoch: int, extra: dict[str, Any] | None = None) -> bool:
        """Evaluates the validation split at this step, records it (selection state, history,
        with ``extra``'s keys) and saves the checkpoint, then the best one; True when early
        stopping stops the run.

        The order keeps a killed run consistent: the history line is written before the
        checkpoint (a resume drops lines after its step), the best checkpoint after it. With a
        weight average, the validation split and the best checkpoint read the averaged weights;
        the regular checkpoint keeps the trained ones and the average."""
        r, s = self.run_, self.state
        step = int(s.step)
        t_eval = time.time()
        with self._at_rest():
            m = evaluate_model(self.scorer, r.schema, r.validation_files)
        self.eval_seconds += time.time() - t_eval
        self.t_window, self.last_eval = time.time(), step
        improved = s.selection.update(m, step, epoch + 1) if s.selection else False
        s.history.append({"epoch": epoch + 1, "step": step, **(extra or {}), **m, "best": improved})
        r.log(
            f"epoch {epoch + 1} step {step} validation auc {m['auc']:.4f} "
            f"logloss {m['logloss']:.4f}" + (" (best so far)" if improved else "")
        )
        with self.writer.as_default(step=step):
            tf.summary.scalar("validation/auc", m["auc"])
            tf.summary.scalar("validation/logloss", m["logloss"])
        self._save()
        if improved:  # the weights evaluated above, their unseen rows set then (no step since)
            with _averaged(self.average):
                s.best.save(checkpoint_number=step)
        return self.stopped

    def _save(self) -> None:
        """The regular checkpoint of this step (the unseen rows set first)."""
        if self.unseen is not None:
            self.unseen.fill()
        self.state.manager.save(checkpoint_number=int(self.state.step))

    @contextlib.contextmanager
    def _at_rest(self) -> Iterator[None]:
        """A block in which the model holds the weights validation and the best checkpoint
        read: the averaged ones with a weight average, their unseen rows set."""
        with _averaged(self.average):
            if self.unseen is not None:
                self.unseen.fill()
            yield

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
        if isinstance(model, MultiTaskModel):
            self._test_tasks(model, step)
        return selected

    def _test_tasks(self, model: MultiTaskModel, step: int) -> None:
        """The test metrics of every task of ``model`` (``self.test_tasks``), logged and
        written as ``test/<task>/auc`` scalars; the selection stays on the primary task."""
        r = self.run_
        t_eval = time.time()
        self.test_tasks = evaluate_tasks(model, r.schema, r.test_files)
        self.eval_seconds += time.time() - t_eval
        with self.writer.as_default(step=step):
            for name, m in self.test_tasks.items():
                if m["auc"] is not None:
                    tf.summary.scalar(f"test/{name}/auc", m["auc"])
        self.writer.flush()
        for name, m in self.test_tasks.items():
            r.log(f"test task {name}: {_task_line(m)}")


def _task_line(m: dict[str, Any]) -> str:
    """``auc A logloss L (R rows, P positives)`` of ``m``, then its ``given_<parent>``
    metrics (a task's metrics on its parent's positive rows)."""

    def one(x: dict[str, Any]) -> str:
        auc = "n/a (one class)" if x["auc"] is None else f"{x['auc']:.4f}"
        loss = "n/a" if x["logloss"] is None else f"{x['logloss']:.4f}"
        return f"auc {auc} logloss {loss} ({x['rows']:,} rows, {x['positives']:,} positives)"

    parts = [one(m)]
    for key, sub in m.items():
        if key.startswith("given_"):
            parts.append(f"{key.replace('_', ' ', 1)}: {one(sub)}")
    return "; ".join(parts)


def _last_reason(run: Run) -> str:
    if run.dist.active and run.validation_files:
        return (
            "last checkpoint: selection by validation is not available under a distribution "
            "strategy (the validation metrics are in the history)"
        )
    return "last checkpoint because no validation split (the test set was not used for selection)"
