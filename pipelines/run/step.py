"""The one training step: the model's task loss (``ClickModel.task_loss`` of
``model.labels_of(features)``: mean binary cross-entropy on logits, a multi-task model's
weighted sum over its tasks) plus its added losses (embedding L2, FSCD's penalty), one
optimizer update. ``stitchrec train`` (one process, multi-worker mirrored, parameter servers), the
pre-ranking stages and the benchmarks all train with it.

Under a ``tf.distribute`` strategy:

* multi-worker mirrored (an element is ``(features, global batch rows)``): each replica's loss
  is its rows' mean task loss times ``rows / global rows`` plus the added losses divided by the
  replicas, so the all-reduced (summed) gradients are the gradient of the whole batch's mean
  loss; the step returns the batch's mean loss (the replicas' sum);
* parameter servers (an element is one whole batch): each scheduled step is the single-process
  step on its worker, returning the per-worker loss for ``ClusterCoordinator.schedule``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

Forward = Callable[[], tf.Tensor]


def optimizer_step(
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    labels: tf.Tensor,
    forward: Forward,
    *,
    rows_scale: tf.Tensor | None = None,
    replicas: int = 1,
    gates: Sequence[tf.Variable] = (),
    gate_optimizer: tf.keras.optimizers.Optimizer | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """One update of ``model``'s trainable variables; returns ``(loss, logits)``.

    ``forward()`` computes the logits (``model(features, training=True)`` or a part of the
    model); the loss is the task loss, times ``rows_scale`` when given (a replica's share of
    the global batch), and the gradient is that of the loss plus ``model.losses / replicas``.
    ``gates`` (FSCD's selection variables) are updated by ``gate_optimizer``, the others by
    ``optimizer``.
    """
    gate_ids = {id(v) for v in gates}
    weights = [v for v in model.trainable_variables if id(v) not in gate_ids]
    gates = list(gates)
    with tf.GradientTape() as tape:
        logits = forward()
        loss = model.task_loss(labels, logits)
        if rows_scale is not None:  # an empty slice of a short batch contributes nothing
            loss = tf.where(rows_scale > 0, loss, tf.zeros_like(loss)) * rows_scale
        added = None
        if model.losses:
            added = tf.add_n(model.losses)
            if replicas != 1:
                added = added / float(replicas)
        total = loss + added if added is not None else loss
    grads = tape.gradient(total, weights + gates)
    optimizer.apply_gradients(zip(grads[: len(weights)], weights, strict=True))
    if gates:
        gate_optimizer.apply_gradients(zip(grads[len(weights) :], gates, strict=True))
    return loss, logits


def make_train_step(
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    strategy: tf.distribute.Strategy | None = None,
    *,
    element_spec: Any = None,
    loss_metric: tf.keras.metrics.Mean | None = None,
    auc_metric: tf.keras.metrics.AUC | None = None,
    gates: Sequence[tf.Variable] = (),
    gate_optimizer: tf.keras.optimizers.Optimizer | None = None,
) -> Callable[[Any], Any]:
    """One training step of ``model`` on a batch ``{field: [batch]}`` (labels
    ``model.labels_of(batch)``, ``[batch]`` or ``[batch, T]`` for a multi-task model) as a
    tf.function; returns the batch's mean task loss (the added losses enter the gradient, not
    the result).

    ``element_spec`` (one process): the batch's ``tf.TensorSpec``s, traced once.
    ``loss_metric`` and ``auc_metric``, when given, are updated with the loss and the
    probabilities of the primary task (``model.primary``). ``strategy``: see the module docstring. ``gates``/``gate_optimizer``: see
    ``optimizer_step``.
    """

    def update_metrics(loss: tf.Tensor, labels: tf.Tensor, logits: tf.Tensor, **weight) -> None:
        if loss_metric is not None:
            loss_metric.update_state(loss, **weight)
        if auc_metric is not None:
            auc_metric.update_state(model.primary(labels), tf.sigmoid(model.primary(logits)))

    def whole_batch(features: dict[str, tf.Tensor]) -> tf.Tensor:
        y = model.labels_of(features)
        loss, logits = optimizer_step(
            model,
            optimizer,
            y,
            lambda: model(features, training=True),
            gates=gates,
            gate_optimizer=gate_optimizer,
        )
        update_metrics(loss, y, logits)
        return loss

    if strategy is None:
        signature = None if element_spec is None else [element_spec]
        return tf.function(whole_batch, input_signature=signature, autograph=False)
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):

        @tf.function(reduce_retracing=True, autograph=False)
        def worker_step(features: dict[str, tf.Tensor]) -> Any:
            return strategy.run(whole_batch, args=(features,))

        return worker_step
    replicas = strategy.num_replicas_in_sync

    def replica_step(features: dict[str, tf.Tensor], rows: tf.Tensor) -> tf.Tensor:
        y = model.labels_of(features)
        n = tf.cast(tf.shape(y)[0], tf.float32)
        share = n / tf.cast(rows, tf.float32)
        loss, logits = optimizer_step(
            model,
            optimizer,
            y,
            lambda: model(features, training=True),
            rows_scale=share,
            replicas=replicas,
        )
        update_metrics(tf.math.divide_no_nan(loss, share), y, logits, sample_weight=n)
        return loss

    @tf.function(autograph=False)
    def step(element: tuple[dict[str, tf.Tensor], tf.Tensor]) -> tf.Tensor:
        per_replica = strategy.run(replica_step, args=element)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return step
