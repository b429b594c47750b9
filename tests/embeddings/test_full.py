import numpy as np
import pytest
import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from embeddings.full import FullEmbedding


def _layer(**kw):
    layer = FullEmbedding(5, 3, **kw)
    layer.build(None)
    layer.table.assign(np.arange(15, dtype=np.float32).reshape(5, 3))
    return layer


def test_lookup_and_oov_path():
    layer = _layer()
    out = layer(tf.constant([1, 4, -3, 5, 100], tf.int64)).numpy()
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(out[:2], table[[1, 4]])
    # negative and out-of-range ids read the OOV row 0, never out of bounds
    np.testing.assert_array_equal(out[2:], table[[0, 0, 0]])


def test_a_batch_of_ids_is_one_gather_and_deeper_ids_keep_their_shape():
    layer = _layer()
    graph = tf.function(layer).get_concrete_function(tf.TensorSpec([None], tf.int64)).graph
    assert "Reshape" not in [op.type for op in graph.get_operations()]
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    out = layer(tf.constant([[1, 4, 7], [2, 0, 3]], tf.int64)).numpy()
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out, table[[[1, 4, 0], [2, 0, 3]]])


def test_ragged_pooling_mean_sum_and_empty_rows():
    ids = tf.ragged.constant([[1, 2], [4], []], dtype=tf.int64)
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    mean = _layer(combiner="mean")(ids).numpy()
    np.testing.assert_allclose(mean[0], (table[1] + table[2]) / 2)
    np.testing.assert_allclose(mean[1], table[4])
    np.testing.assert_array_equal(mean[2], np.zeros(3))
    total = _layer(combiner="sum")(ids).numpy()
    np.testing.assert_allclose(total[0], table[1] + table[2])


def test_l2_adds_a_loss_on_looked_up_rows():
    layer = _layer(l2=0.5)
    layer(tf.constant([1], tf.int64))
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    assert float(layer.losses[0]) == pytest.approx(0.5 * float(np.sum(table[1] ** 2)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rows": 0, "dim": 3}, "num_rows"),
        ({"num_rows": 5, "dim": 0}, "dim"),
        ({"num_rows": 5, "dim": 3, "combiner": "max"}, "combiner"),
        ({"num_rows": 5, "dim": 3, "l2": -1.0}, "l2"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FullEmbedding(**kwargs)


def test_memory_bytes_and_config_round_trip():
    layer = FullEmbedding(1000, 8, combiner="sum")
    assert layer.memory_bytes() == {"train": 32_000, "serve": 32_000}
    clone = FullEmbedding.from_config(layer.get_config())
    assert (clone.num_rows, clone.dim, clone.combiner) == (1000, 8, "sum")


def test_collection_saved_model_round_trip(tmp_path):
    coll = EmbeddingCollection(
        [
            {"name": "a", "num_rows": 10, "dim": 4},
            {"name": "b", "num_rows": 6, "dim": 2, "combiner": "sum"},
        ]
    )
    ids = {
        "a": tf.constant([1, 9, 11], tf.int64),
        "b": tf.ragged.constant([[1, 2], [], [5]], dtype=tf.int64),
    }
    before = coll(ids).fields()
    assert before["a"].shape == (3, 4) and before["b"].shape == (3, 2)
    assert coll.memory_bytes()["serve"] == (10 * 4 + 6 * 2) * 4

    class M(tf.Module):
        def __init__(self, layer):
            self.layer = layer

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.int64),
            ]
        )
        def f(self, a, b_values, b_lengths):
            b = tf.RaggedTensor.from_row_lengths(b_values, b_lengths)
            return self.layer({"a": a, "b": b}).fields()

    tf.saved_model.save(M(coll), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    after = loaded.f(ids["a"], ids["b"].flat_values, ids["b"].row_lengths())
    for k in before:
        np.testing.assert_allclose(before[k].numpy(), after[k].numpy())
    clone = EmbeddingCollection.from_config(coll.get_config())
    assert clone.field_names == ["a", "b"] and clone.dims == [4, 2]
    with pytest.raises(ValueError, match="method"):
        EmbeddingCollection([{"name": "a", "num_rows": 3, "dim": 2, "method": "nope"}])
