"""``Embedded``: the forms of a collection's field vectors agree, and Keras, ``tf.function`` and
SavedModel signatures pass the typed result through."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from embeddings.forms import Embedded, Form

TABLES = [
    {"name": "a", "num_rows": 10, "dim": 3},
    {"name": "b", "num_rows": 7, "dim": 3},
    {"name": "tags", "num_rows": 9, "dim": 3},
]


def _ids() -> dict[str, tf.Tensor]:
    return {
        "a": tf.constant([1, 2, 9, 0], tf.int64),
        "b": tf.constant([6, 5, 4, 3], tf.int64),
        "tags": tf.ragged.constant([[1, 2], [], [3], [4, 5, 6]], dtype=tf.int64),
    }


def test_the_forms_of_the_same_ids_agree():
    tf.keras.utils.set_random_seed(0)
    coll = EmbeddingCollection(TABLES, name="emb")
    out = coll(_ids())
    assert out.form == Form.FIELDS and coll.output_form == Form.FIELDS
    fields = out.fields()
    assert list(fields) == ["a", "b", "tags"]
    concat = out.concat().numpy()
    stacked = out.stacked().numpy()
    np.testing.assert_array_equal(concat, np.concatenate([v.numpy() for v in fields.values()], 1))
    np.testing.assert_array_equal(stacked, np.stack([v.numpy() for v in fields.values()], 1))
    np.testing.assert_array_equal(stacked.reshape(4, -1), concat)
    # the blocks a fused op returns give the same forms
    as_concat = Embedded(block=tf.constant(concat))
    as_stacked = Embedded(block=tf.constant(stacked))
    assert as_concat.form == Form.CONCAT and as_stacked.form == Form.STACKED
    np.testing.assert_array_equal(as_stacked.concat().numpy(), concat)
    np.testing.assert_array_equal(as_stacked.stacked().numpy(), stacked)
    dense = tf.ones([4, 2])
    np.testing.assert_array_equal(as_concat.concat(dense).numpy(), out.concat(dense).numpy())
    extra = tf.ones([4, 2, 3])
    np.testing.assert_array_equal(as_stacked.stacked(extra).numpy(), out.stacked(extra).numpy())
    sums = [float(tf.add_n(e.field_sums())[0]) for e in (out, as_concat, as_stacked)]
    np.testing.assert_allclose(sums, [concat[0].sum()] * 3, rtol=1e-6)
    with pytest.raises(ValueError, match="does not name its fields"):
        as_concat.fields()
    with pytest.raises(ValueError, match="output_form 'stacked' or 'fields'"):
        as_concat.stacked()
    with pytest.raises(ValueError, match="one dimension"):
        Embedded(vectors={"x": tf.zeros([2, 3]), "y": tf.zeros([2, 4])}).stacked()
    with pytest.raises(ValueError, match="output_form must be one of"):
        Form.of("rows")


def test_keras_tf_function_and_saved_model_pass_the_result_through(tmp_path):
    tf.keras.utils.set_random_seed(1)
    coll = EmbeddingCollection(TABLES, name="emb")
    ids = _ids()
    want = coll(ids).concat().numpy()

    @tf.function
    def traced(ids):
        out = coll(ids)
        return out, out.concat()

    out, concat = traced(ids)
    assert isinstance(out, Embedded) and out.block is None
    np.testing.assert_array_equal(concat.numpy(), want)
    np.testing.assert_array_equal(tf.concat(list(out.fields().values()), 1).numpy(), want)

    class Serve(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.coll = coll

        @tf.function(
            input_signature=[
                {
                    "a": tf.TensorSpec([None], tf.int64),
                    "b": tf.TensorSpec([None], tf.int64),
                    "tags": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
                }
            ]
        )
        def serve(self, ids):
            return {"x": self.coll(ids).concat()}

    tf.saved_model.save(Serve(), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_array_equal(loaded.serve(ids)["x"].numpy(), want)


def test_select_shares_the_layers():
    coll = EmbeddingCollection(TABLES, name="emb")
    sub = coll.select(["tags", "a"])
    assert sub.field_names == ["a", "tags"]  # table order
    assert sub.layers_by_field["a"] is coll.layers_by_field["a"]
    ids = _ids()
    got = sub({k: ids[k] for k in ("a", "tags")}).fields()
    full = coll(ids).fields()
    for k in ("a", "tags"):
        np.testing.assert_array_equal(got[k].numpy(), full[k].numpy())
    with pytest.raises(ValueError, match="names must be some of the fields"):
        coll.select(["nope"])
