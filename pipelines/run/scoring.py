"""Scoring a model: its scorer over raw inputs, predictions over files, test metrics (of the
primary task, and of every task of a multi-task model)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from features.dataset import input_signature, iter_batches
from features.schema import Schema
from pipelines.evaluation.tasks import (
    needed_labels,
    needed_outputs,
    task_logits,
    task_metrics,
    tasks_of_model,
)
from ranking import metrics
from ranking.click_model import ClickModel
from ranking.multitask import MultiTaskModel


def make_scorer(model: ClickModel, schema: Schema) -> Callable[[dict], tf.Tensor]:
    """``model.score`` of the primary task (``model.primary``), ``[batch]``, as one tf.function
    over the schema's raw inputs (traced once)."""
    return tf.function(
        lambda features: model.primary(model.score(features)),
        input_signature=[input_signature(schema.model_inputs)],
        autograph=False,
    )


def make_logit_scorer(model: ClickModel, schema: Schema) -> Callable[[dict], tf.Tensor]:
    """``model``'s logits of the primary task (inference mode), ``[batch]``, as one
    tf.function over the schema's raw inputs."""
    return tf.function(
        lambda features: model.primary(model(features, training=False)),
        input_signature=[input_signature(schema.model_inputs)],
        autograph=False,
    )


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
    """Rows, AUC and log loss of ``scorer`` on every row of ``files``."""
    y, p = predict(scorer, schema, files)
    return {"rows": int(y.size), "auc": metrics.auc(y, p), "logloss": metrics.logloss(y, p)}


def make_task_scorer(model: MultiTaskModel, schema: Schema) -> Callable[[dict], dict]:
    """The probabilities ``{output: [batch]}`` of the outputs an export of ``model`` gives
    (``pipelines.evaluation.tasks.task_logits``, ``score_`` prefixed), one tf.function over the
    schema's raw inputs."""

    def score(features: dict) -> dict[str, tf.Tensor]:
        return {f"score_{k}": tf.sigmoid(v) for k, v in task_logits(model, features).items()}

    return tf.function(
        score, input_signature=[input_signature(schema.model_inputs)], autograph=False
    )


def evaluate_tasks(
    model: MultiTaskModel, schema: Schema, files: list[Path], batch_size: int = 8192
) -> dict[str, dict[str, Any]]:
    """``{task: metrics}`` of every task of ``model`` on every row of ``files``
    (``pipelines.evaluation.tasks.task_metrics``: rows, positives, AUC, log loss, mean score;
    a ``defined_on`` task also ``given_<parent label>``, on the parent-positive rows, scored
    by P(label | parent))."""
    tasks = tasks_of_model(model)
    scorer = make_task_scorer(model, schema)
    inputs = [f.name for f in schema.model_inputs]
    labels: dict[str, list[np.ndarray]] = {k: [] for k in needed_labels(tasks)}
    scores: dict[str, list[np.ndarray]] = {k: [] for k in needed_outputs(tasks)}
    for batch in iter_batches(schema, files, batch_size=batch_size, shuffle=False):
        out = scorer({k: tf.constant(batch[k]) for k in inputs})
        for k, parts in labels.items():
            parts.append(np.asarray(batch[k]))
        for k, parts in scores.items():
            parts.append(out[k].numpy())
    y = {k: np.concatenate(v) for k, v in labels.items()}
    p = {k: np.concatenate(v) for k, v in scores.items()}
    return {t.name: task_metrics(t, y, p) for t in tasks}
