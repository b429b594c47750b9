"""An exponential moving average of a model's weights (``[train] weight_average = "ema"``).

A copy ``s`` of every trainable variable ``w`` follows the training steps::

    d_n = min(decay, (1 + n) / (10 + n))     n: the updates made before this one
    s  <- d_n * s + (1 - d_n) * w

(the warm-up ``(1 + n) / (10 + n)`` is ``tf.train.ExponentialMovingAverage``'s ``num_updates``
rule: early on the average forgets the first, still random, weights quickly; after about
``10 / (1 - decay)`` updates the decay is ``decay`` itself). Averaging the last few hundred
steps' weights (Polyak & Juditsky 1992; used as "EMA" or "SWA" by most large training setups)
smooths the noise of the last steps of SGD: the average sits nearer the middle of the region the
optimizer moves around in.

The training loop updates the average after every step (``update``), evaluates the validation
split on the averaged weights and keeps them as the best checkpoint (``swapped``): the exported
and served model is the average. The regular checkpoint holds the trained weights and the average
(``tracked``), so a resumed run continues both where they were.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf


class WeightAverage:
    """The exponential moving average of ``model``'s trainable variables.

    Args:
      model: a built model; the average starts at its current weights.
      decay: the long-run decay, in (0, 1).
    """

    def __init__(self, model: tf.keras.Model, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = float(decay)
        self.weights = list(model.trainable_variables)
        self.averages = [
            tf.Variable(w.read_value(), trainable=False, name=f"average_{i}")
            for i, w in enumerate(self.weights)
        ]
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="average_updates")

    @property
    def tracked(self) -> tf.Module:
        """What the run's checkpoint keeps of the average: its values and update count."""
        module = tf.Module()
        module.averages = self.averages
        module.updates = self.updates
        return module

    @tf.function(autograph=False)
    def update(self) -> None:
        """One step of the average toward the current weights."""
        n = tf.cast(self.updates, tf.float32)
        d = tf.minimum(self.decay, (1.0 + n) / (10.0 + n))
        for w, s in zip(self.weights, self.averages, strict=True):
            s.assign(d * s + (1.0 - d) * tf.cast(w, s.dtype))
        self.updates.assign_add(1)

    @tf.function(autograph=False)
    def _swap(self) -> None:
        for w, s in zip(self.weights, self.averages, strict=True):
            trained = tf.identity(w)
            w.assign(s)
            s.assign(trained)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block and its trained weights again
        after it (the two are exchanged in place, twice)."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    def describe(self) -> dict[str, Any]:
        """The report's entry: method, decay, updates made."""
        return {"method": "ema", "decay": self.decay, "updates": int(self.updates)}
