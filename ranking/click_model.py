"""The base of every click model: ``ClickModel`` (logits, labels, the loss of each task) and
the tensorflow-recommenders ``Ranking`` task that owns the loss and the primary task's metrics.

``ranking.models.RankingModel`` (one task) and ``ranking.multitask.MultiTaskModel`` (several)
derive from it; the training step (``pipelines.run.step``) only uses its API: ``labels_of``,
``task_loss`` and ``primary``.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_recommenders as tfrs


def ranking_task() -> tfrs.tasks.Ranking:
    """Binary cross-entropy on logits, with AUC and log loss metrics.

    For labels and logits of shape ``[batch]`` the loss is their mean binary cross-entropy (the
    loss function averages over the last axis), so it needs no reduction of its own:
    ``Reduction.NONE`` gives the same value as a batch mean and keeps the task usable inside a
    ``tf.distribute`` strategy, where the training step scales each replica's mean to the
    global batch (``pipelines.run.step``).
    """
    return tfrs.tasks.Ranking(
        loss=tf.keras.losses.BinaryCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE
        ),
        metrics=[
            tf.keras.metrics.AUC(from_logits=True, name="auc", num_thresholds=1000),
            tf.keras.metrics.BinaryCrossentropy(from_logits=True, name="logloss"),
        ],
    )


class ClickModel(tfrs.models.Model):
    """Base of the click models: ``call`` gives logits, ``[batch]`` for one task or
    ``[batch, T]`` for ``T`` tasks (``ranking.multitask``); the loss is ``task_loss`` on
    ``labels_of(features)``, and the tfrs task in ``self.task`` keeps the metrics of the primary
    task (``primary``).

    A single-task model has one task, named after its label ``self.label``.
    """

    label: str
    task: tfrs.tasks.Ranking

    @property
    def task_names(self) -> list[str]:
        """The tasks' names, in the order of the logits' columns (one task: its label)."""
        return [self.label]

    def labels_of(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """The labels of a batch, in the shape of the logits: ``features[self.label]``."""
        return features[self.label]

    @staticmethod
    def primary(x: tf.Tensor) -> tf.Tensor:
        """The primary task's column: ``x[:, 0]`` of ``[batch, T]`` values, ``x`` of ``[batch]``."""
        return x[:, 0] if x.shape.rank == 2 else x

    def task_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """The task's loss of ``logits`` ``[batch]`` against ``labels`` ``[batch]``: the mean
        binary cross-entropy, a scalar (metrics not updated). The training step and
        ``compute_loss`` both take the loss from here."""
        return self.task(labels=labels, predictions=logits, compute_metrics=False)

    def compute_loss(self, features: dict[str, tf.Tensor], training: bool = False) -> tf.Tensor:
        """The tfrs ``Model`` contract (Keras ``fit``/``evaluate``): the task loss of the batch;
        outside training the task's metrics are updated too, on the primary task."""
        logits = self(features, training=training)
        labels = self.labels_of(features)
        if training:
            return self.task_loss(labels, logits)
        primary = self.task(
            labels=self.primary(labels), predictions=self.primary(logits), compute_metrics=True
        )
        return primary if logits.shape.rank == 1 else self.task_loss(labels, logits)

    def score(self, features: dict[str, tf.Tensor]) -> tf.Tensor:
        """Click probabilities, in the shape of the logits."""
        return tf.sigmoid(self(features, training=False))
