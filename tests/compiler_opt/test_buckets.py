"""Batch-size buckets for the realized (XLA-cluster) serving function."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt import buckets, realize


def test_ladder_and_bucket_choice_by_hand():
    assert buckets.powers_of_two(8, 512) == (8, 16, 32, 64, 128, 256, 512)
    assert buckets.powers_of_two(4, 4) == (4,)
    ladder = (8, 16, 100)
    assert [buckets.bucket_for(n, ladder) for n in (1, 7, 8, 9, 16, 17, 100)] == [
        8,
        8,
        8,
        16,
        16,
        100,
        100,
    ]
    assert buckets.chunks(250, ladder) == [(0, 100, 100), (100, 200, 100), (200, 250, 100)]
    assert buckets.chunks(205, ladder) == [(0, 100, 100), (100, 200, 100), (200, 205, 8)]
    with pytest.raises(ValueError, match="larger than the top bucket 100"):
        buckets.bucket_for(101, ladder)
    with pytest.raises(ValueError, match="n=0"):
        buckets.bucket_for(0, ladder)


@pytest.mark.parametrize(
    ("ladder", "message"),
    [
        ((), "at least one"),
        ((8, 8, 16), r"ladder\[1\]=8 is not larger than ladder\[0\]=8"),
        ((16, 8), r"ladder\[1\]=8 is not larger"),
        ((0, 8), r"ladder\[0\]=0: expected an int >= 1"),
        ((8, 16.0), r"ladder\[1\]=16.0"),
        ("8,16", "expected a sequence"),
    ],
)
def test_bad_ladder_is_a_clear_error(ladder, message):
    with pytest.raises((ValueError, TypeError), match=message):
        buckets.Bucketed(lambda x: [x], ladder)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="smallest=6: expected a power of two"):
        buckets.powers_of_two(6, 64)
    with pytest.raises(ValueError, match="smallest=64 is larger than largest=8"):
        buckets.powers_of_two(64, 8)
    with pytest.raises(ValueError, match="oversize='pad'"):
        buckets.Bucketed(lambda x: [x], (8,), oversize="pad")
    f = buckets.Bucketed(lambda x, y: [x], (8,), oversize="error")
    with pytest.raises(ValueError, match=r"first dimensions \[3, 4\]"):
        f(tf.zeros([3, 2]), tf.zeros([4, 2]))
    with pytest.raises(ValueError, match="batch size 9 is larger than the top bucket 8"):
        f(tf.zeros([9, 2]), tf.zeros([9, 2]))
    reduced = buckets.Bucketed(lambda x: [tf.reduce_sum(x, axis=0)], (8,))
    with pytest.raises(ValueError, match="expected the batch as its first dimension"):
        reduced(tf.zeros([3, 2]))


@pytest.fixture(scope="module")
def realized():
    """A small serving graph: two pooled lookups, a BatchNorm (inference), a matmul; realized
    as XLA clusters."""
    rng = np.random.default_rng(0)
    t1 = tf.Variable(rng.normal(size=(50, 8)).astype(np.float32))
    t2 = tf.Variable(rng.normal(size=(60, 8)).astype(np.float32))
    w = tf.Variable(rng.normal(size=(17, 4)).astype(np.float32))
    bn = tf.keras.layers.BatchNormalization()
    bn.build((None, 17))
    bn.moving_mean.assign(rng.normal(size=17).astype(np.float32))
    bn.moving_variance.assign(rng.uniform(0.5, 2.0, size=17).astype(np.float32))

    @tf.function
    def model(a, b, mask, dense):
        pa = tf.reduce_sum(tf.gather(t1, a) * mask, axis=1)
        pb = tf.reduce_mean(tf.gather(t2, b), axis=1)
        x = bn(tf.concat([pa, pb, tf.math.log1p(dense)], axis=1), training=False)
        return tf.nn.relu(tf.matmul(x, w)) * 2.0 + 1.0

    specs = (
        tf.TensorSpec([None, 3], tf.int32),
        tf.TensorSpec([None, 2], tf.int32),
        tf.TensorSpec([None, 3, 1], tf.float32),
        tf.TensorSpec([None, 1], tf.float32),
    )
    return realize.xla_clusters(model.get_concrete_function(*specs), _hand(), batch=64)


def _hand():
    from tests.compiler_opt.conftest import HAND

    return HAND


def _batch(rng, n):
    return (
        tf.constant(rng.integers(0, 50, (n, 3)), tf.int32),
        tf.constant(rng.integers(0, 60, (n, 2)), tf.int32),
        tf.constant(rng.random((n, 3, 1)), tf.float32),
        tf.constant(rng.random((n, 1)), tf.float32),
    )


def test_padded_outputs_equal_unpadded_unfused(realized):
    rng = np.random.default_rng(1)
    fused = buckets.Bucketed(realized.fused, (8, 16, 32))
    for n in (1, 5, 8, 9, 16, 32, 70):  # 70 > top bucket: chunks 32 + 32 + 8
        args = _batch(rng, n)
        (expected,) = realized.unfused(*args)
        for _ in range(3):  # auto-clusters compile on a shape's second call
            (got,) = fused(*args)
        assert got.shape == (n, 4)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5)
    assert fused.stats.per_bucket[32] == 3 * 3
    assert fused.stats.buckets_used == 3


def test_compilations_bounded_by_buckets_used(realized):
    rng = np.random.default_rng(2)
    sizes = [int(s) for s in rng.integers(1, 49, 30)]
    jit = tf.function(lambda x: tf.sin(x) * 2.0 + 1.0, jit_compile=True)
    with buckets.count_compilations() as whole:
        for n in sizes:
            jit(tf.ones([n, 3]))
    assert whole.count == len(set(sizes))  # the counter sees one compile per new shape

    fused = buckets.Bucketed(realized.fused, (16, 32, 64))
    with buckets.count_compilations() as c:
        for n in sizes:
            fused(*_batch(rng, n))
    used = fused.stats.buckets_used
    assert used <= 3
    assert 1 <= c.count <= realized.clusters * used, (c.count, realized.clusters, used)
    with buckets.count_compilations() as again:  # every bucket compiled: no more compilations
        for n in sizes[:10]:
            fused(*_batch(rng, n))
    assert again.count == 0
