"""bench.rss: a fresh process's growth by a SavedModel's load, with and without its variables,
differs by the variables' bytes."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from bench.rss import load_rss_kb


def test_the_load_without_variables_leaves_out_their_bytes(tmp_path):
    module = tf.Module()
    module.table = tf.Variable(np.ones((1 << 20, 16), np.float32))  # 64 MiB
    module.f = tf.function(
        lambda i: tf.gather(module.table, i), input_signature=[tf.TensorSpec([None], tf.int32)]
    )
    tf.saved_model.save(module, str(tmp_path / "sm"))
    full = load_rss_kb(tmp_path / "sm") / 1024
    graph = load_rss_kb(tmp_path / "sm", variables=False) / 1024
    assert 60 <= full - graph <= 72, (full, graph)
    assert graph < 32
