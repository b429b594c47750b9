"""Sequence blocks against hand computations: masked mean, DIN, Dice and the BST encoder."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from ranking.sequence import (
    Dice,
    DINAttention,
    MaskedMeanPooling,
    SelfAttentionEncoder,
    din_features,
    din_first_layer,
    masked_softmax,
    ragged_to_padded,
    sequence_block,
)

RNG = np.random.default_rng(0)
HISTORY = RNG.normal(size=(3, 4, 4)).astype(np.float32)
MASK = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
TARGET = RNG.normal(size=(3, 4)).astype(np.float32)


def _call(block, history=HISTORY, mask=MASK, target=TARGET, training=None) -> np.ndarray:
    return block(
        tf.constant(history), tf.constant(mask), tf.constant(target), training=training
    ).numpy()


def _repadded(history: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``history`` with other values at its padded positions."""
    return np.where(mask[:, :, None], history, 7.0 + history**2).astype(np.float32)


def test_ragged_to_padded_truncates_pads_and_masks():
    ids = tf.ragged.constant([[3, 4, 5], [], [7]], tf.int32)
    dense, mask = ragged_to_padded(ids, 2)
    assert dense.dtype == tf.int64 and dense.shape == (3, 2)
    np.testing.assert_array_equal(dense.numpy(), [[3, 4], [0, 0], [7, 0]])
    np.testing.assert_array_equal(mask.numpy(), [[True, True], [False, False], [True, False]])
    dense, mask = ragged_to_padded(ids, 4)
    np.testing.assert_array_equal(dense.numpy(), [[3, 4, 5, 0], [0, 0, 0, 0], [7, 0, 0, 0]])
    spec = tf.RaggedTensorSpec([None, None], tf.int64)
    graph = tf.function(lambda r: ragged_to_padded(r, 2), input_signature=[spec])
    dense, mask = graph(tf.cast(ids, tf.int64))
    np.testing.assert_array_equal(dense.numpy(), [[3, 4], [0, 0], [7, 0]])
    with pytest.raises(ValueError, match="max_len must be an int >= 1, got 0"):
        ragged_to_padded(ids, 0)
    with pytest.raises(ValueError, match="ids must be a RaggedTensor"):
        ragged_to_padded(tf.constant([[1]]), 2)


def test_masked_mean_by_hand_and_empty_rows():
    history = np.array([[[1, 2], [3, 4], [100, 100]], [[5, 5], [6, 6], [7, 7]]], np.float32)
    mask = np.array([[1, 1, 0], [0, 0, 0]], bool)
    out = _call(MaskedMeanPooling(), history, mask, np.zeros((2, 2), np.float32))
    np.testing.assert_allclose(out, [[2, 3], [0, 0]])


def test_masked_softmax_masks_padding_and_empty_rows():
    scores = tf.constant([[1.0, 2.0, 50.0], [3.0, 4.0, 5.0]])
    mask = tf.constant([[True, True, False], [False, False, False]])
    with tf.GradientTape() as tape:
        tape.watch(scores)
        p = masked_softmax(scores, mask)
        total = tf.reduce_sum(p * scores)
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(p.numpy(), [[*(e / e.sum()), 0.0], [0, 0, 0]], rtol=1e-6)
    assert np.isfinite(tape.gradient(total, scores).numpy()).all()


def _unit(v: np.ndarray) -> np.ndarray:
    """``v / |v|`` along the last axis, 0 for a zero vector."""
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return np.divide(v, n, out=np.zeros_like(v), where=n > 0)


def _din_reference(din: DINAttention, history, mask, target) -> np.ndarray:
    """DIN's output from its weights, in numpy (sigmoid activation unit)."""
    h, t = (_unit(history), _unit(target)) if din.normalize else (history, target)
    t = np.broadcast_to(t[:, None], h.shape)
    x = np.concatenate([h, t, h - t, h * t], axis=-1)
    for dense in din.dense_layers[:-1]:
        x = 1.0 / (1.0 + np.exp(-(x @ dense.kernel.numpy() + dense.bias.numpy())))
    score = din.dense_layers[-1]
    w = (x @ score.kernel.numpy() + score.bias.numpy())[:, :, 0]
    if din.softmax:
        e = np.where(mask, np.exp(w - w.max(axis=1, keepdims=True)), 0.0)
        w = np.divide(
            e, e.sum(axis=1, keepdims=True), out=np.zeros_like(e), where=e.sum(1, keepdims=True) > 0
        )
    return np.sum((w * mask)[:, :, None] * history, axis=1)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("softmax", [False, True])
def test_din_with_known_weights(softmax: bool, normalize: bool):
    din = DINAttention(hidden=(3,), softmax=softmax, normalize=normalize)
    _call(din)
    dense, score = din.dense_layers
    dense.kernel.assign(np.linspace(-1, 1, 16 * 3, dtype=np.float32).reshape(16, 3))
    dense.bias.assign([0.1, -0.2, 0.3])
    score.kernel.assign([[1.5], [-2.0], [0.5]])
    score.bias.assign([0.25])
    out = _call(din)
    np.testing.assert_allclose(out, _din_reference(din, HISTORY, MASK, TARGET), rtol=1e-5)
    np.testing.assert_array_equal(out[1], np.zeros(4))  # the empty history
    w = din.scores(tf.constant(HISTORY), tf.constant(MASK), tf.constant(TARGET)).numpy()
    assert (w[~MASK] == 0).all()
    if softmax:
        np.testing.assert_allclose(w.sum(axis=1), [1, 0, 1], rtol=1e-6)
    np.testing.assert_allclose(_call(din, _repadded(HISTORY, MASK)), out, rtol=1e-6)


def test_normalized_din_weights_do_not_depend_on_the_embeddings_scale():
    din, raw = DINAttention(hidden=(3,)), DINAttention(hidden=(3,), normalize=False)
    _call(din), _call(raw)
    raw.set_weights(din.get_weights())

    def weights(block, scale: float) -> np.ndarray:
        h, t = tf.constant(scale * HISTORY), tf.constant(scale * TARGET)
        return block.scores(h, tf.constant(MASK), t).numpy()

    np.testing.assert_allclose(weights(din, 0.01), weights(din, 1.0), rtol=1e-5)
    assert not np.allclose(weights(raw, 0.01), weights(raw, 1.0), rtol=1e-3)
    # the output still sums the raw history vectors
    np.testing.assert_allclose(
        _call(din, 0.01 * HISTORY, MASK, 0.01 * TARGET), 0.01 * _call(din), rtol=1e-4
    )
    zeros = tf.zeros_like(HISTORY)  # an empty history: zero vectors at every position
    with tf.GradientTape() as tape:
        tape.watch(zeros)
        out = din(zeros, tf.zeros_like(MASK), tf.constant(TARGET))
    np.testing.assert_array_equal(out.numpy(), 0.0)
    assert np.isfinite(tape.gradient(out, zeros).numpy()).all()


def test_dice_by_hand_with_masked_batch_statistics():
    x = np.array([[[1.0, 2.0], [3.0, -2.0], [50.0, 50.0]]], np.float32)  # [1, 3, 2]
    valid = np.array([[True, True, False]])
    dice = Dice(momentum=0.5)
    dice(tf.constant(x))
    dice.alpha.assign([0.5, -1.0])
    out = dice(tf.constant(x), valid=tf.constant(valid), training=True).numpy()
    mean, var = np.array([2.0, 0.0]), np.array([1.0, 4.0])  # over the two valid positions
    p = 1 / (1 + np.exp(-(x - mean) / np.sqrt(var + 1e-8)))
    np.testing.assert_allclose(out, p * x + (1 - p) * np.array([0.5, -1.0]) * x, rtol=1e-5)
    np.testing.assert_allclose(dice.moving_mean.numpy(), 0.5 * mean, rtol=1e-6)
    np.testing.assert_allclose(dice.moving_variance.numpy(), 0.5 + 0.5 * var, rtol=1e-6)
    moving_mean, moving_var = dice.moving_mean.numpy(), dice.moving_variance.numpy()
    out = dice(tf.constant(x)).numpy()  # inference: the moving averages, unchanged
    p = 1 / (1 + np.exp(-(x - moving_mean) / np.sqrt(moving_var + 1e-8)))
    np.testing.assert_allclose(out, p * x + (1 - p) * np.array([0.5, -1.0]) * x, rtol=1e-5)
    np.testing.assert_allclose(dice.moving_mean.numpy(), moving_mean)
    with pytest.raises(ValueError, match="momentum must be in"):
        Dice(momentum=1.0)


@pytest.mark.parametrize("activation", ["prelu", "dice"])
def test_din_activations_ignore_padding_in_training(activation: str):
    din = DINAttention(hidden=(5, 3), activation=activation)
    out = _call(din, training=True)
    again = _call(din, _repadded(HISTORY, MASK), training=True)
    np.testing.assert_allclose(again, out, rtol=1e-5, atol=1e-6)
    assert np.isfinite(out).all() and (out[1] == 0).all()


def test_bst_shape_padding_invariance_and_empty_history():
    bst = SelfAttentionEncoder(max_len=4, num_heads=2)
    out = _call(bst)
    assert out.shape == (3, 4) and np.isfinite(out).all()
    np.testing.assert_allclose(_call(bst, _repadded(HISTORY, MASK)), out, rtol=1e-5, atol=1e-6)
    # the empty history's output is the target's own transform: history values do not matter
    np.testing.assert_allclose(_call(bst, HISTORY * 3.0)[1], out[1], rtol=1e-5, atol=1e-6)
    changed = HISTORY.copy()
    changed[0, 0] += 1.0  # a real item
    assert not np.allclose(_call(bst, changed)[0], out[0])
    assert np.allclose(_call(bst, changed)[2], out[2])
    # shorter histories than max_len read the first position vectors
    assert _call(bst, HISTORY[:, :2], MASK[:, :2]).shape == (3, 4)


def test_argument_errors_name_argument_and_value():
    with pytest.raises(ValueError, match=r"activation must be one of .* got 'relu'"):
        DINAttention(activation="relu")
    with pytest.raises(ValueError, match="hidden must be"):
        DINAttention(hidden=())
    with pytest.raises(ValueError, match="normalize must be True or False, got 'yes'"):
        DINAttention(normalize="yes")
    with pytest.raises(ValueError, match="max_len must be an int >= 1, got 0"):
        SelfAttentionEncoder(0)
    with pytest.raises(ValueError, match="dropout must be in"):
        SelfAttentionEncoder(4, dropout=1.0)
    with pytest.raises(ValueError, match="d=4 must be divisible by num_heads=3"):
        _call(SelfAttentionEncoder(4, num_heads=3))
    with pytest.raises(ValueError, match="length 4 exceeds max_len=3"):
        _call(SelfAttentionEncoder(3))
    with pytest.raises(
        ValueError, match=r"kind must be one of \('mean', 'din', 'bst'\), got 'gru'"
    ):
        sequence_block("gru")


def test_sequence_block_factory():
    assert isinstance(sequence_block("mean"), MaskedMeanPooling)
    din = sequence_block("din", hidden=(8,), activation="dice")
    assert isinstance(din, DINAttention) and din.hidden == (8,) and din.activation == "dice"
    bst = sequence_block("bst", max_len=6, num_heads=1)
    assert isinstance(bst, SelfAttentionEncoder) and bst.max_len == 6


class _Module(tf.Module):
    def __init__(self, block: tf.keras.layers.Layer):
        super().__init__()
        self.block = block

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, None, 4], tf.float32),
            tf.TensorSpec([None, None], tf.bool),
            tf.TensorSpec([None, 4], tf.float32),
        ]
    )
    def f(self, history, mask, target):
        return self.block(history, mask, target)


@pytest.mark.parametrize(
    "block",
    [
        MaskedMeanPooling(),
        DINAttention(hidden=(6, 3)),
        DINAttention(hidden=(5,), activation="prelu", softmax=True),
        DINAttention(hidden=(5,), activation="dice"),
        SelfAttentionEncoder(max_len=4, num_heads=2, ff_dim=8),
    ],
    ids=lambda b: f"{type(b).__name__}-{getattr(b, 'activation', '')}",
)
def test_config_and_saved_model_round_trip(block, tmp_path: Path):
    _call(block, training=True)  # builds, and moves Dice's statistics off their start
    before = _call(block)
    clone = type(block).from_config(block.get_config())
    assert clone.get_config() == block.get_config()
    _call(clone)
    clone.set_weights(block.get_weights())
    np.testing.assert_allclose(_call(clone), before, rtol=1e-6)
    tf.saved_model.save(_Module(block), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    after = loaded.f(tf.constant(HISTORY), tf.constant(MASK), tf.constant(TARGET)).numpy()
    # the loaded graph runs other float32 kernels than eager calls (grappler's rewrites, the
    # reduction order of the process's thread pools): equal to rounding, not bit for bit
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


def test_dice_config_round_trip():
    dice = Dice(momentum=0.9, epsilon=1e-6)
    assert Dice.from_config(dice.get_config()).get_config() == dice.get_config()


def test_din_first_layer_equals_the_concatenated_form():
    rng = np.random.default_rng(3)
    history = rng.normal(size=(4, 5, 6)).astype(np.float32)
    target = rng.normal(size=(4, 6)).astype(np.float32)
    kernel = rng.normal(size=(24, 7)).astype(np.float32)
    bias = rng.normal(size=(7,)).astype(np.float32)
    want = din_features(tf.constant(history), tf.constant(target)).numpy() @ kernel + bias
    got = din_first_layer(*(tf.constant(v) for v in (history, target, kernel, bias)))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_din_position_bias_adds_a_vector_per_position():
    din = DINAttention(hidden=(3,), positions=True, max_len=4)
    _call(din)
    bias = np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0
    din.position_bias.assign(bias)
    dense, score = din.dense_layers
    features = din_features(tf.constant(_unit(HISTORY)), tf.constant(_unit(TARGET))).numpy()
    x = 1.0 / (1.0 + np.exp(-(features @ dense.kernel.numpy() + dense.bias.numpy() + bias[None])))
    w = (x @ score.kernel.numpy())[..., 0] + score.bias.numpy()[0]
    got = din.scores(tf.constant(HISTORY), tf.constant(MASK), tf.constant(TARGET)).numpy()
    np.testing.assert_allclose(got, w * MASK, rtol=1e-5, atol=1e-6)
    again = DINAttention.from_config(din.get_config())
    assert again.positions and again.max_len == 4
    with pytest.raises(ValueError, match="positions needs max_len >= 1"):
        DINAttention(positions=True)
    with pytest.raises(ValueError, match="exceeds max_len=2"):
        DINAttention(positions=True, max_len=2)(
            tf.constant(HISTORY), tf.constant(MASK), tf.constant(TARGET)
        )
