"""``fit``: training one model of a pre-ranking run (an FSCD stage or the two-tower model) for
a number of epochs, with early stopping on validation rows and the best epoch's weights
restored (``pipelines.preranking``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from features.dataset import make_dataset
from features.schema import Schema
from pipelines.config import PipelineConfig, TrainConfig
from pipelines.run.model import make_optimizer
from pipelines.run.paths import Log
from pipelines.run.scoring import evaluate_model, make_scorer
from pipelines.run.step import make_train_step
from ranking.config import PrerankConfig
from ranking.fscd import FSCDRankingModel


def _epoch(
    step: Any, schema: Schema, files: list[Path], tc: TrainConfig, epoch: int, steps: int
) -> tuple[float, int]:
    """One shuffled epoch of ``step`` over ``files``, ended early at ``[train] max_steps``
    (``steps`` already taken): (its mean loss, its steps)."""
    total, n = tf.constant(0.0), 0
    ds = make_dataset(
        schema,
        files,
        batch_size=tc.batch_size,
        shuffle=True,
        seed=tc.seed,
        epoch=epoch,
        shuffle_buffer=tc.shuffle_buffer,
    )
    for features in ds:
        total += step(features)
        n += 1
        if tc.max_steps and steps + n >= tc.max_steps:
            break
    return float(total) / max(n, 1), n


def _auc(model: tf.keras.Model, schema: Schema, files: list[Path]) -> float:
    return float(evaluate_model(make_scorer(model, schema), schema, files)["auc"])


def fit(
    model: tf.keras.Model,
    schema: Schema,
    files: list[Path],
    cfg: PipelineConfig,
    epochs: int,
    log: Log,
    stage: str,
    *,
    valid_files: list[Path] | None = None,
    patience: int = 1,
    learning_rate: float | None = None,
) -> dict[str, Any]:
    """Trains ``model`` for ``epochs`` (``[train]`` batch size, optimizer, seed, max_steps).

    The loss is the task's mean binary cross-entropy plus the model's added losses (FSCD's
    penalty, embedding L2). Returns steps, epochs run, seconds and the last epoch's mean loss.

    Early stopping: with ``valid_files`` (rows held out of ``files``), ``epochs`` is the most
    epochs; the model's AUC on ``valid_files`` is measured before training and after each
    epoch, training stops once ``patience`` epochs in a row did not beat the best, and the
    weights of the best epoch are restored (``best_epoch``, 0 for the starting weights, and
    ``valid_auc`` per epoch in the summary). ``learning_rate`` overrides ``[train]
    learning_rate`` for this model.
    """
    if valid_files is not None and patience < 1:
        raise ValueError(f"patience must be >= 1 with valid_files, got {patience}")
    tc = cfg.train
    pr = cfg.preranking or PrerankConfig()
    name = "ftrl" if tc.optimizer == "auto" else tc.optimizer  # the stages train in steps
    optimizer = make_optimizer(name, tc.learning_rate if learning_rate is None else learning_rate)
    gate_optimizer = tf.keras.optimizers.Adam(pr.selection_learning_rate)
    spec = make_dataset(schema, files, batch_size=tc.batch_size).element_spec
    gates = model.selection.trainable_variables if isinstance(model, FSCDRankingModel) else []
    step = make_train_step(
        model, optimizer, element_spec=spec, gates=gates, gate_optimizer=gate_optimizer
    )

    t0, steps, last, epochs_run = time.time(), 0, float("nan"), 0
    valid_auc: list[float] = []
    best: tuple[float, int, list[np.ndarray]] | None = None
    if valid_files is not None:  # epoch 0: a warm-started model (stage 3) may need no epoch
        auc = _auc(model, schema, valid_files)
        best = (auc, -1, [w.numpy() for w in model.weights])
        start_auc = auc
        log(f"{stage}: before training, validation AUC {auc:.4f}")
    for epoch in range(epochs):
        last, n = _epoch(step, schema, files, tc, epoch, steps)
        steps += n
        epochs_run = epoch + 1
        note = ""
        if valid_files is not None:
            auc = _auc(model, schema, valid_files)
            valid_auc.append(auc)
            note = f", validation AUC {auc:.4f}"
            if best is None or auc > best[0]:
                best = (auc, epoch, [w.numpy() for w in model.weights])
        log(f"{stage}: epoch {epoch + 1}/{epochs} {n} steps, mean loss {last:.4f}{note}")
        if tc.max_steps and steps >= tc.max_steps:
            break
        if best is not None and epoch - best[1] >= patience:
            break
    summary = {
        "steps": steps,
        "epochs": epochs_run,
        "seconds": round(time.time() - t0, 2),
        "loss": last,
    }
    if best is not None:
        for w, value in zip(model.weights, best[2], strict=True):
            w.assign(value)
        summary.update(
            {"valid_auc": valid_auc, "valid_auc_start": start_auc, "best_epoch": best[1] + 1}
        )
        log(f"{stage}: restored epoch {best[1] + 1} (validation AUC {best[0]:.4f})")
    return summary


# ---- FSCD stages -------------------------------------------------------------------------------
