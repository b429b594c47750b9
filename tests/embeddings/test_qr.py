import numpy as np
import pytest
import tensorflow as tf

from embeddings.qr import QREmbedding
from tests.embeddings.roundtrip import assert_saved_model_round_trip

V, M, D = 23, 5, 4  # quotient table: ceil(23 / 5) = 5 rows


def _tables(operation="mult"):
    d = D // 2 if operation == "concat" else D
    q = np.arange(5 * d, dtype=np.float32).reshape(5, d) + 1
    r = np.arange(M * d, dtype=np.float32).reshape(M, d) / 10 - 0.7
    return q, r


def _layer(operation="mult", **kw):
    layer = QREmbedding(V, D, collisions=M, operation=operation, **kw)
    layer.build(None)
    q, r = _tables(operation)
    layer.quotient.assign(q)
    layer.remainder.assign(r)
    return layer


def _reference(ids, operation="mult"):
    q, r = _tables(operation)
    ids = np.where((ids >= 0) & (ids < V), ids, 0)
    qv, rv = q[ids // M], r[ids % M]
    if operation == "mult":
        return qv * rv
    if operation == "add":
        return qv + rv
    return np.concatenate([qv, rv], axis=-1)


@pytest.mark.parametrize("operation", ["mult", "add", "concat"])
def test_every_id_matches_the_numpy_reference(operation):
    layer = _layer(operation)
    ids = np.arange(V)
    out = layer(tf.constant(ids, tf.int64)).numpy()
    assert out.shape == (V, D)
    np.testing.assert_allclose(out, _reference(ids, operation), rtol=1e-6)


@pytest.mark.parametrize("operation", ["mult", "add", "concat"])
def test_oov_ids_give_the_output_of_id_zero(operation):
    layer = _layer(operation)
    out = layer(tf.constant([0, -1, V, V + 7, 10**12, -(2**62)], tf.int64)).numpy()
    for row in out[1:]:
        np.testing.assert_array_equal(row, out[0])
    np.testing.assert_allclose(out[0], _reference(np.array([0]), operation)[0])


def test_quotient_remainder_pairs_are_unique_and_in_range():
    layer = QREmbedding(1001, 2, collisions=32)
    q, r = layer.indices(tf.constant(np.arange(-3, 1010), tf.int64))
    q, r = q.numpy(), r.numpy()
    assert q.min() >= 0 and q.max() < layer.quotient_rows == 32
    assert r.min() >= 0 and r.max() < 32
    in_range = slice(3, 3 + 1001)
    pairs = set(zip(q[in_range].tolist(), r[in_range].tolist(), strict=True))
    assert len(pairs) == 1001


def test_ragged_pooling_mean_sum_and_empty_rows():
    ids = tf.ragged.constant([[1, 17], [22], []], dtype=tf.int64)
    ref = _reference(np.array([1, 17, 22]))
    mean = _layer(combiner="mean")(ids).numpy()
    np.testing.assert_allclose(mean[0], (ref[0] + ref[1]) / 2, rtol=1e-6)
    np.testing.assert_allclose(mean[1], ref[2], rtol=1e-6)
    np.testing.assert_array_equal(mean[2], np.zeros(D))
    total = _layer(combiner="sum")(ids).numpy()
    np.testing.assert_allclose(total[0], ref[0] + ref[1], rtol=1e-6)
    np.testing.assert_array_equal(total[2], np.zeros(D))


def test_l2_is_taken_on_both_component_rows():
    layer = _layer(l2=0.25)
    layer(tf.constant([7, 13], tf.int64))
    q, r = _tables()
    expected = 0.25 * (np.sum(q[[1, 2]] ** 2) + np.sum(r[[2, 3]] ** 2)) / 2
    assert float(layer.losses[0]) == pytest.approx(float(expected), rel=1e-6)


def test_gradient_touches_only_looked_up_rows():
    layer = QREmbedding(100, 4, collisions=10)
    ids = tf.constant([3, 47, 47, 250], tf.int64)  # 250 -> OOV id 0
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids))
    gq, gr = (
        tf.convert_to_tensor(g).numpy()
        for g in tape.gradient(loss, [layer.quotient, layer.remainder])
    )
    assert set(np.flatnonzero(np.abs(gq).sum(axis=1))) == {0, 4}
    assert set(np.flatnonzero(np.abs(gr).sum(axis=1))) == {3, 7, 0}


def test_mult_remainder_starts_near_one_others_use_initializer():
    mult = QREmbedding(1000, 8, collisions=30)
    mult.build(None)
    assert abs(float(tf.reduce_mean(mult.remainder)) - 1.0) < 0.05
    add = QREmbedding(1000, 8, collisions=30, operation="add", initializer="zeros")
    add.build(None)
    assert float(tf.reduce_max(tf.abs(add.remainder))) == 0.0
    # same shapes, default initializer: the two tables must not start identical
    square = QREmbedding(100, 4, collisions=10, operation="add")
    square.build(None)
    assert not np.array_equal(square.quotient.numpy(), square.remainder.numpy())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rows": 0, "dim": 4, "collisions": 2}, "num_rows"),
        ({"num_rows": 5, "dim": 0, "collisions": 2}, "dim"),
        ({"num_rows": 5, "dim": 4, "collisions": 2, "combiner": "max"}, "combiner"),
        ({"num_rows": 5, "dim": 4, "collisions": 2, "l2": -1.0}, "l2"),
        ({"num_rows": 5, "dim": 4, "collisions": 0}, "collisions"),
        ({"num_rows": 5, "dim": 4, "collisions": 2, "operation": "max"}, "operation"),
        ({"num_rows": 5, "dim": 5, "collisions": 2, "operation": "concat"}, "dim"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QREmbedding(**kwargs)


def test_memory_bytes_by_hand():
    assert QREmbedding(1000, 8, collisions=10).memory_bytes()["serve"] == (100 + 10) * 8 * 4
    assert QREmbedding(1001, 8, collisions=10).memory_bytes()["serve"] == (101 + 10) * 8 * 4
    cat = QREmbedding(1000, 8, collisions=10, operation="concat")
    assert cat.memory_bytes() == {"train": (100 + 10) * 4 * 4, "serve": (100 + 10) * 4 * 4}


def test_config_round_trip():
    layer = QREmbedding(1000, 8, combiner="sum", l2=0.1, collisions=7, operation="concat")
    clone = QREmbedding.from_config(layer.get_config())
    assert (clone.num_rows, clone.dim, clone.combiner, clone.l2) == (1000, 8, "sum", 0.1)
    assert (clone.collisions, clone.operation, clone.quotient_rows) == (7, "concat", 143)
    custom = QREmbedding(10, 2, collisions=3, remainder_initializer="ones")
    clone = QREmbedding.from_config(custom.get_config())
    clone.build(None)
    np.testing.assert_array_equal(clone.remainder.numpy(), np.ones((3, 2)))


@pytest.mark.parametrize("operation", ["mult", "concat"])
@pytest.mark.parametrize("num_rows", [1_000_000, 9_000])
@pytest.mark.parametrize("ratio", [2, 10, 100, 1000])
def test_options_for_ratio(num_rows, ratio, operation):
    # QR reaches ~sqrt(V)/2 (mult) and ~sqrt(V) (concat): 500x / 1000x at 1M, 47x / 95x at 9k
    ceiling = (num_rows**0.5) / 2 * (2 if operation == "concat" else 1)
    if ratio > 1.5 * ceiling:
        with pytest.raises(ValueError, match="not reachable"):
            QREmbedding.options_for_ratio(num_rows, 16, ratio, operation=operation)
        return
    opts = QREmbedding.options_for_ratio(num_rows, 16, ratio, operation=operation)
    assert opts["operation"] == operation
    layer = QREmbedding(num_rows, 16, **opts)
    achieved = num_rows * 16 * 4 / layer.memory_bytes()["serve"]
    assert ratio / 1.5 <= achieved <= ratio * 1.5
    assert layer.collisions <= layer.quotient_rows  # remainder is the smaller table


def test_options_for_ratio_argument_errors():
    with pytest.raises(ValueError, match="ratio"):
        QREmbedding.options_for_ratio(1000, 16, -2)
    with pytest.raises(ValueError, match="dim"):
        QREmbedding.options_for_ratio(1000, 15, 2, operation="concat")


def test_saved_model_round_trip(tmp_path):
    layer = QREmbedding(100, 4, collisions=9, operation="add")
    dense = tf.constant([0, 3, 99, 100, -2], tf.int64)
    ragged = tf.ragged.constant([[1, 2], [], [5, 500, 7]], dtype=tf.int64)
    assert_saved_model_round_trip(layer, dense, ragged, tmp_path)
