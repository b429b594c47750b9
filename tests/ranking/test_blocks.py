import itertools

import numpy as np
import pytest
import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from embeddings.forms import Embedded
from ranking.blocks import MLP, ConcatInteraction, CrossInteraction, FMInteraction, LinearTerm


def _fields(*vectors) -> Embedded:
    """The field vectors as an embedding collection returns them (the ``fields`` form)."""
    return Embedded(vectors={f"f{i}": tf.constant(v) for i, v in enumerate(vectors)})


def test_fm_pairwise_term_equals_brute_force():
    rng = np.random.default_rng(0)
    vs = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(3)]
    dense = rng.normal(size=(4, 2)).astype(np.float32)
    fm = FMInteraction(num_dense=2, dim=3)
    out = fm(_fields(*vs), tf.constant(dense)).numpy()[:, 0]
    dense_vecs = fm.dense_vectors.numpy()
    fields = [*vs, dense[:, 0:1] * dense_vecs[0], dense[:, 1:2] * dense_vecs[1]]
    brute = sum(np.sum(a * b, axis=1) for a, b in itertools.combinations(fields, 2))
    np.testing.assert_allclose(out, brute, rtol=1e-4, atol=1e-5)


def test_fm_rejects_mixed_dimensions():
    with pytest.raises(ValueError, match="one dimension"):
        FMInteraction(0, 3)(_fields(tf.zeros((2, 3)), tf.zeros((2, 4))))


def test_cross_layer_formula():
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(5, 4)).astype(np.float32)
    cross = CrossInteraction(num_layers=2)
    out = cross(_fields(x0[:, :2], x0[:, 2:])).numpy()
    x = x0
    for layer in cross._cross:
        w, b = layer._dense.kernel.numpy(), layer._dense.bias.numpy()
        x = x0 * (x @ w + b) + x
    np.testing.assert_allclose(out, x, rtol=1e-4, atol=1e-5)


def test_concat_and_mlp_shapes_and_validation():
    z = ConcatInteraction()(_fields(tf.zeros((2, 3)), tf.zeros((2, 5))), tf.zeros((2, 1)))
    assert z.shape == (2, 9)
    assert MLP([8, 4])(z).shape == (2, 4)
    with pytest.raises(ValueError, match="units"):
        MLP([])
    with pytest.raises(ValueError, match="dropout"):
        MLP([4], dropout=1.0)
    with pytest.raises(ValueError, match="num_layers"):
        CrossInteraction(0)


def test_linear_term_is_sum_of_weights():
    weights = EmbeddingCollection(
        [{"name": "a", "num_rows": 3, "dim": 1}, {"name": "b", "num_rows": 2, "dim": 1}]
    )
    lin = LinearTerm(weights, num_dense=1)
    ids = {"a": tf.constant([0, 2], tf.int64), "b": tf.constant([1, 1], tf.int64)}
    lin(ids, tf.zeros((2, 1)))
    weights.layers_by_field["a"].table.assign([[1.0], [2.0], [3.0]])
    weights.layers_by_field["b"].table.assign([[10.0], [20.0]])
    lin._dense.kernel.assign([[0.5]])
    out = lin(ids, tf.constant([[2.0], [4.0]])).numpy()
    np.testing.assert_allclose(out, [1 + 20 + 1, 3 + 20 + 2])
    with pytest.raises(ValueError, match="dimension 1"):
        LinearTerm(EmbeddingCollection([{"name": "a", "num_rows": 3, "dim": 2}]), 0)


@pytest.mark.parametrize(
    "layer",
    [
        MLP([4, 2], dropout=0.1),
        FMInteraction(2, 3),
        CrossInteraction(2, projection_dim=2),
        LinearTerm(EmbeddingCollection([{"name": "a", "num_rows": 3, "dim": 1}]), 2),
        ConcatInteraction(),
    ],
    ids=lambda layer: type(layer).__name__,
)
def test_config_round_trip(layer):
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
