"""SavedModel helpers shared by the embedding layer tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf


def layer_module(layer: tf.keras.layers.Layer) -> tf.Module:
    """A tf.Module whose ``f(ids, values, lengths)`` returns ``{"dense": layer(ids),
    "ragged": layer(RaggedTensor.from_row_lengths(values, lengths))}``, ready to save."""

    class Wrapper(tf.Module):
        def __init__(self, layer: tf.keras.layers.Layer):
            super().__init__()
            self.layer = layer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)] * 3)
        def f(self, ids: tf.Tensor, values: tf.Tensor, lengths: tf.Tensor):
            ragged = tf.RaggedTensor.from_row_lengths(values, lengths)
            return {"dense": self.layer(ids), "ragged": self.layer(ragged)}

    return Wrapper(layer)


def assert_saved_model_round_trip(
    layer: tf.keras.layers.Layer, dense: tf.Tensor, ragged: tf.RaggedTensor, tmp_path: Path
) -> None:
    """Saves ``layer`` with dense and ragged signatures, loads it back, and checks that both
    give the outputs they gave before saving."""
    before = {"dense": layer(dense).numpy(), "ragged": layer(ragged).numpy()}
    tf.saved_model.save(layer_module(layer), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    after = loaded.f(dense, ragged.flat_values, ragged.row_lengths())
    for key, value in before.items():
        np.testing.assert_allclose(value, after[key].numpy())
