"""Scoring a model: its scorer over raw inputs, predictions over files, test metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from features.dataset import input_signature, iter_batches
from features.schema import Schema
from ranking import metrics
from ranking.click_model import ClickModel


def make_scorer(model: ClickModel, schema: Schema) -> Callable[[dict], tf.Tensor]:
    """``model.score`` of the primary task (``model.primary``), ``[batch]``, as one tf.function
    over the schema's raw inputs (traced once)."""
    return tf.function(
        lambda features: model.primary(model.score(features)),
        input_signature=[input_signature(schema.model_inputs)],
    )


def make_logit_scorer(model: ClickModel, schema: Schema) -> Callable[[dict], tf.Tensor]:
    """``model``'s logits of the primary task (inference mode), ``[batch]``, as one
    tf.function over the schema's raw inputs."""
    return tf.function(
        lambda features: model.primary(model(features, training=False)),
        input_signature=[input_signature(schema.model_inputs)],
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
