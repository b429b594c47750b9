"""What Keras walks on every ``trainable_variables``: the items of the lists and dicts it tracks."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def tracked_leaves(layer: tf.Module) -> list[Any]:
    """The plain values (not layers, not variables) inside the lists and dicts Keras tracks
    under ``layer`` and its sublayers; each ``trainable_variables``, ``variables`` or ``losses``
    call walks them one by one."""
    out: list[Any] = []
    for module in layer._flatten_modules():
        for item in getattr(module, "_self_tracked_trackables", []):
            if isinstance(item, tf.__internal__.tracking.TrackableDataStructure):
                leaves = tf.nest.flatten(item)
                out += [x for x in leaves if not isinstance(x, tf.Module | tf.Variable)]
    return out
