"""A SavedModel round trip shared by the embedding layer tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf


def assert_saved_model_round_trip(
    layer: tf.keras.layers.Layer, dense: tf.Tensor, ragged: tf.RaggedTensor, tmp_path: Path
) -> None:
    """Saves ``layer`` inside a tf.Module with dense and ragged signatures, loads it back, and
    checks that both give the outputs they gave before saving."""
    before = (layer(dense).numpy(), layer(ragged).numpy())

    class Wrapper(tf.Module):
        def __init__(self, layer: tf.keras.layers.Layer):
            self.layer = layer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)] * 3)
        def f(self, ids: tf.Tensor, values: tf.Tensor, lengths: tf.Tensor):
            return self.layer(ids), self.layer(tf.RaggedTensor.from_row_lengths(values, lengths))

    tf.saved_model.save(Wrapper(layer), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    after = loaded.f(dense, ragged.flat_values, ragged.row_lengths())
    for b, a in zip(before, after, strict=True):
        np.testing.assert_allclose(b, a.numpy())
