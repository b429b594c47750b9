import numpy as np
import pytest
import tensorflow as tf

from embeddings.hashing import HashingEmbedding
from tests.embeddings.roundtrip import assert_saved_model_round_trip

U64 = (1 << 64) - 1


def splitmix64_ref(x: int, seed: int = 0) -> int:
    """Plain-Python splitmix64, the reference the layer's hash must match bit for bit."""
    z = (x + (seed + 1) * 0x9E3779B97F4A7C15) & U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def bucket_ref(i: int, buckets: int, seed: int = 0) -> int:
    if buckets == 1 or i <= 0:
        return 0
    return 1 + (splitmix64_ref(i, seed) >> 1) % (buckets - 1)


def _layer(num_rows=100, dim=3, buckets=7, **kw):
    layer = HashingEmbedding(num_rows, dim, buckets=buckets, **kw)
    layer.build(None)
    layer.table.assign(np.arange(buckets * dim, dtype=np.float32).reshape(buckets, dim))
    return layer


IDS = [0, 1, 2, 3, 6, 7, 99, 100, 12345, 2**40 + 3, 2**62 + 1, 2**63 - 1]


@pytest.mark.parametrize(("buckets", "seed"), [(7, 0), (2, 0), (1000, 0), (7, 5)])
def test_buckets_match_the_python_reference(buckets, seed):
    layer = HashingEmbedding(100, 2, buckets=buckets, seed=seed)
    got = layer.bucket(tf.constant(IDS, tf.int64)).numpy().tolist()
    assert got == [bucket_ref(i, buckets, seed) for i in IDS]
    assert all(0 <= b < buckets for b in got)
    # the OOV id keeps its own bucket; real ids never land there
    assert got[0] == 0 and (buckets <= 1 or all(b >= 1 for b in got[1:]))


def test_lookup_reads_the_hashed_row_and_oov_reads_bucket_zero():
    layer = _layer()
    table = np.arange(21, dtype=np.float32).reshape(7, 3)
    ids = [1, 5, 42, 99, 0, -1, -(2**40)]
    out = layer(tf.constant(ids, tf.int64)).numpy()
    np.testing.assert_array_equal(out[:4], table[[bucket_ref(i, 7) for i in ids[:4]]])
    # id 0 and negative ids: the OOV path, bucket 0
    np.testing.assert_array_equal(out[4:], table[[0, 0, 0]])


def test_open_vocabulary_hashes_unseen_ids_closed_sends_them_to_oov():
    ids = tf.constant([0, 100, 5000, 2**62 + 7], tf.int64)
    open_ = _layer(num_rows=100).bucket(ids).numpy()
    assert open_.tolist() == [bucket_ref(i, 7) for i in [0, 100, 5000, 2**62 + 7]]
    closed = _layer(num_rows=100, open_vocabulary=False)
    out = closed(ids).numpy()
    for row in out[1:]:
        np.testing.assert_array_equal(row, out[0])


def test_one_bucket_shares_everything():
    layer = _layer(buckets=1)
    out = layer(tf.constant([0, 1, 77, -3], tf.int64)).numpy()
    np.testing.assert_array_equal(out, np.tile(np.arange(3, dtype=np.float32), (4, 1)))


def test_hash_is_not_plain_modulo_and_spreads_evenly():
    layer = HashingEmbedding(200_001, 2, buckets=11)
    ids = np.arange(1, 200_001)
    got = layer.bucket(tf.constant(ids, tf.int64)).numpy()
    assert np.mean(got == 1 + (ids % 10)) < 0.2  # not (a shift of) id mod (B - 1)
    counts = np.bincount(got, minlength=11)
    assert counts[0] == 0
    assert counts[1:].min() > 0.95 * counts[1:].mean()
    assert counts[1:].max() < 1.05 * counts[1:].mean()
    # frequency ranks 1..10 (the most frequent ids) do not simply take buckets 1..10
    assert sorted(got[:10].tolist()) != list(range(1, 11))
    # another seed, another hash
    other = HashingEmbedding(200_001, 2, buckets=11, seed=1).bucket(tf.constant(ids, tf.int64))
    assert np.mean(other.numpy() == got) < 0.2


def test_ragged_pooling_mean_sum_and_empty_rows():
    ids = tf.ragged.constant([[1, 2], [42], []], dtype=tf.int64)
    table = np.arange(21, dtype=np.float32).reshape(7, 3)
    r1, r2, r42 = (table[bucket_ref(i, 7)] for i in (1, 2, 42))
    mean = _layer(combiner="mean")(ids).numpy()
    np.testing.assert_allclose(mean[0], (r1 + r2) / 2)
    np.testing.assert_allclose(mean[1], r42)
    np.testing.assert_array_equal(mean[2], np.zeros(3))
    assert np.isfinite(mean).all()
    total = _layer(combiner="sum")(ids).numpy()
    np.testing.assert_allclose(total[0], r1 + r2)
    np.testing.assert_array_equal(total[2], np.zeros(3))


def test_l2_adds_a_loss_on_looked_up_rows():
    layer = _layer(l2=0.5)
    layer(tf.constant([1, 42], tf.int64))
    table = np.arange(21, dtype=np.float32).reshape(7, 3)
    rows = table[[bucket_ref(1, 7), bucket_ref(42, 7)]]
    assert float(layer.losses[0]) == pytest.approx(0.5 * float(np.sum(rows**2)) / 2)


def test_gradient_touches_only_looked_up_buckets():
    layer = HashingEmbedding(100, 4, buckets=50)
    ids = tf.constant([3, 8, 8, 0], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids))
    grad = tf.convert_to_tensor(tape.gradient(loss, layer.table)).numpy()
    touched = {bucket_ref(i, 50) for i in (3, 8, 0)}
    assert set(np.flatnonzero(np.abs(grad).sum(axis=1))) == touched


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rows": 0, "dim": 3, "buckets": 4}, "num_rows"),
        ({"num_rows": 5, "dim": 0, "buckets": 4}, "dim"),
        ({"num_rows": 5, "dim": 3, "buckets": 4, "combiner": "max"}, "combiner"),
        ({"num_rows": 5, "dim": 3, "buckets": 4, "l2": -1.0}, "l2"),
        ({"num_rows": 5, "dim": 3, "buckets": 0}, "buckets"),
        ({"num_rows": 5, "dim": 3, "buckets": 2.5}, "buckets"),
        ({"num_rows": 5, "dim": 3, "buckets": 4, "seed": -1}, "seed"),
        ({"num_rows": 5, "dim": 3, "buckets": 4, "open_vocabulary": "yes"}, "open_vocabulary"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HashingEmbedding(**kwargs)


def test_memory_bytes_and_config_round_trip():
    layer = HashingEmbedding(1000, 8, combiner="sum", buckets=100, seed=3, open_vocabulary=False)
    assert layer.memory_bytes() == {"train": 3200, "serve": 3200}
    clone = HashingEmbedding.from_config(layer.get_config())
    assert (clone.num_rows, clone.dim, clone.combiner, clone.buckets) == (1000, 8, "sum", 100)
    assert (clone.seed, clone.open_vocabulary) == (3, False)
    ids = tf.constant(IDS, tf.int64)
    np.testing.assert_array_equal(clone.bucket(ids).numpy(), layer.bucket(ids).numpy())


@pytest.mark.parametrize("num_rows", [1_000_000, 9_000])
@pytest.mark.parametrize("ratio", [2, 10, 100, 1000])
def test_options_for_ratio(num_rows, ratio):
    opts = HashingEmbedding.options_for_ratio(num_rows, 16, ratio)
    achieved = num_rows * 16 * 4 / HashingEmbedding(num_rows, 16, **opts).memory_bytes()["serve"]
    assert ratio / 2 <= achieved <= ratio * 2


def test_options_for_ratio_beyond_one_bucket_raises():
    with pytest.raises(ValueError, match="not reachable"):
        HashingEmbedding.options_for_ratio(100, 16, 1000)
    with pytest.raises(ValueError, match="ratio"):
        HashingEmbedding.options_for_ratio(100, 16, 0)


def test_saved_model_round_trip(tmp_path):
    layer = HashingEmbedding(100, 4, buckets=13)
    dense = tf.constant([0, 3, 99, 100, -2, 2**62], tf.int64)
    ragged = tf.ragged.constant([[1, 2], [], [5, 500, 7]], dtype=tf.int64)
    assert_saved_model_round_trip(layer, dense, ragged, tmp_path)
