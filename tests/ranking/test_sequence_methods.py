"""A sequence that shares its target's table reads it through every embedding method: the
history lookups of DIN go through the same layer (hashing, QR, binary-code hash, AMTL) as the
target, train, and survive a SavedModel round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from features.dataset import input_signature
from features.preprocessing import build_preprocessor
from features.readers import read_batches
from features.schema import load_schema
from features.stats import compute_stats
from pipelines.config import config_from_dict
from pipelines.run.model import build_run_model
from tests.features.test_sequences import ROWS, SCHEMA, write

FEATURES = {
    "item": tf.constant(["i1", "i2", "i3", "zz"]),
    "hist": tf.constant(["i2|i1", "i1|i2|i3|i1|i2", "", "i3|zz"]),
    "hist_cat": tf.constant(["c2|c1", "c1|c2|c3|c1|c2", "", "c3|c9"]),
    "click": tf.constant([1.0, 1.0, 0.0, 0.0]),
    "buy": tf.constant([1.0, 0.0, 0.0, 0.0]),
}


#: explicit sizes for the sized methods (the test vocabulary has 4 rows)
OPTIONS = {"hashing": {"buckets": 3}, "qr": {"collisions": 2}, "bh": {"block_bits": 1}, "amtl": {}}


@pytest.mark.parametrize("method", sorted(OPTIONS))
def test_history_reads_the_shared_table_of_every_method(tmp_path: Path, method: str) -> None:
    (tmp_path / "seq.toml").write_text(SCHEMA)
    schema = load_schema(tmp_path / "seq.toml")
    stats = compute_stats(schema, read_batches(schema, write(tmp_path, ROWS)))
    cfg = config_from_dict(
        {
            "output_dir": str(tmp_path / "run"),
            "data": {"schema": str(tmp_path / "seq.toml"), "train": ["x"]},
            "model": {
                "type": "dnn",
                "embedding_dim": 4,
                "mlp": [16],
                "embedding_method": method,
                "embedding_options": {method: OPTIONS[method]} if OPTIONS[method] else {},
                "compress_min_rows": 1,
                "sequence_pooling": "din",
                "sequence_options": {"hidden": [4]},
            },
        },
        base_dir=tmp_path,
    )
    model = build_run_model(cfg, schema, stats)
    item_layer = model.embedding.layers_by_field["item"]
    assert type(item_layer).__name__ != "FullEmbedding"  # the method under test is in use
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01))
    model.fit(tf.data.Dataset.from_tensors(FEATURES).repeat(3), epochs=1, verbose=0)
    inputs = {k: v for k, v in FEATURES.items() if k not in ("click", "buy")}
    scores = model.score(inputs).numpy()
    changed = dict(inputs, hist=tf.constant(["i3", "i3", "i1|i2", "i1"]))
    assert not np.allclose(model.score(changed).numpy(), scores)  # the history is read

    module = tf.Module()
    module.model = model
    fields = [schema.field(n) for n in inputs]
    module.serve = tf.function(
        lambda f: {"score": model.score(f)}, input_signature=[input_signature(fields)]
    )
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.serve})
    loaded = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    np.testing.assert_allclose(loaded(**inputs)["score"].numpy(), scores, rtol=1e-6, atol=1e-7)
    assert build_preprocessor(schema, stats).sequence_fields["hist"]["table"] == "item"
