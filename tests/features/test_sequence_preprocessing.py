"""The preprocessor's sequence plans: ragged ids newest first, truncated to max_len, in the
shared target's table or the sequence's own; config and SavedModel round-trips; a single-task
model over a schema with a sequence and two labels still builds and trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from features.preprocessing import FeaturePreprocessor, build_preprocessor
from features.readers import read_batches
from features.schema import load_schema
from features.stats import compute_stats
from ranking.config import ModelConfig
from ranking.models import build_model
from tests.features.test_sequences import ROWS, SCHEMA, write

FEATURES = {
    "item": tf.constant(["i1", "i2", "i3", "zz"]),
    "hist": tf.constant(["i2|i1", "i1|i2|i3|i1|i2", "", "i3|zz"]),
    "hist_cat": tf.constant(["c2|c1", "c1|c2|c3|c1|c2", "", "c3|c9"]),
}


@pytest.fixture()
def setup(tmp_path: Path):
    (tmp_path / "seq.toml").write_text(SCHEMA)
    schema = load_schema(tmp_path / "seq.toml")
    stats = compute_stats(schema, read_batches(schema, write(tmp_path, ROWS)))
    return schema, stats


def test_sequence_ids_by_hand(setup) -> None:
    schema, stats = setup
    pre = build_preprocessor(schema, stats)
    ids, dense = pre(FEATURES)
    assert dense is None
    # item vocabulary i1, i2, i3 (ids 1..3; 0 = OOV); hist reads item's table, newest first,
    # the first max_len = 3 values kept
    assert ids["item"].numpy().tolist() == [1, 2, 3, 0]
    assert isinstance(ids["hist"], tf.RaggedTensor) and ids["hist"].dtype == tf.int64
    assert ids["hist"].to_list() == [[2, 1], [1, 2, 3], [], [3, 0]]
    # hist_cat: its own vocabulary c1, c2, c3 over all values
    assert ids["hist_cat"].to_list() == [[2, 1], [1, 2, 3], [], [3, 0]]
    assert pre.sequence_fields == {
        "hist": {"table": "item", "max_len": 3, "aligned_with": None, "num_rows": 4},
        "hist_cat": {"table": "hist_cat", "max_len": 3, "aligned_with": "hist", "num_rows": 4},
    }
    assert pre.embedded_fields == {"item": 4}
    assert pre.categorical_fields == ["item"] and pre.multi_valued_fields == []
    assert pre.input_names == ["item", "hist", "hist_cat"]
    # a sequence far longer than max_len keeps its newest max_len values
    long = {**FEATURES, "hist": tf.constant(["|".join(["i3"] * 500 + ["i1"])] * 4)}
    assert pre(long)[0]["hist"].to_list() == [[3, 3, 3]] * 4


def test_hashed_target_and_hashed_sequence(setup) -> None:
    schema, stats = setup
    schema = schema.replace_field("item", vocab="hash", hash_buckets=11)
    schema = schema.replace_field("hist_cat", vocab="hash", hash_buckets=5)
    pre = build_preprocessor(schema, stats)
    ids, _ = pre(FEATURES)
    item = ids["item"].numpy().tolist()
    assert ids["hist"].to_list()[3] == [item[2], item[3]]  # i3, zz hash as the target does
    assert ids["hist"].to_list()[0] == [item[1], item[0]]
    assert pre.sequence_fields["hist"]["num_rows"] == 11
    assert pre.sequence_fields["hist_cat"]["num_rows"] == 5
    assert all(0 <= v < 5 for row in ids["hist_cat"].to_list() for v in row)


def test_a_shared_sequence_needs_its_target_plan(setup) -> None:
    schema, stats = setup
    plans = [p for p in build_preprocessor(schema, stats).plans if p["name"] != "item"]
    with pytest.raises(ValueError, match="sequence 'hist' shares the table of 'item'"):
        FeaturePreprocessor(plans)


def test_config_and_saved_model_round_trip(setup, tmp_path: Path) -> None:
    schema, stats = setup
    pre = build_preprocessor(schema, stats)
    want, _ = pre(FEATURES)
    again = FeaturePreprocessor.from_config(pre.get_config())
    got, _ = again(FEATURES)
    for name in ("hist", "hist_cat"):
        assert got[name].to_list() == want[name].to_list()

    class Wrapped(tf.Module):
        def __init__(self, layer: FeaturePreprocessor):
            super().__init__()
            self.layer = layer

        @tf.function(input_signature=[{n: tf.TensorSpec([None], tf.string) for n in FEATURES}])
        def serve(self, features):
            ids, _ = self.layer(features)
            return {
                "hist_values": ids["hist"].flat_values,
                "hist_lengths": ids["hist"].row_lengths(),
                "cat_values": ids["hist_cat"].flat_values,
            }

    tf.saved_model.save(Wrapped(pre), str(tmp_path / "sm"))
    out = tf.saved_model.load(str(tmp_path / "sm")).serve(FEATURES)
    assert out["hist_values"].numpy().tolist() == want["hist"].flat_values.numpy().tolist()
    assert out["hist_lengths"].numpy().tolist() == [2, 3, 0, 2]
    assert out["cat_values"].numpy().tolist() == want["hist_cat"].flat_values.numpy().tolist()


def test_single_task_model_ignores_the_sequence(setup) -> None:
    schema, stats = setup
    model = build_model(
        ModelConfig(type="dnn", embedding_dim=4, mlp=(8,)),
        build_preprocessor(schema, stats),
        "click",
    )
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01))
    batch = {**FEATURES, "click": tf.constant([1.0, 0.0, 1.0, 0.0]), "buy": tf.zeros([4])}
    history = model.fit(tf.data.Dataset.from_tensors(batch).repeat(2), epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1
    assert model(FEATURES).shape[0] == 4
