import itertools

import numpy as np
import pytest
import tensorflow as tf

from embeddings.binary_hash import BinaryHashEmbedding
from embeddings.common import bits_for
from tests.embeddings.roundtrip import assert_saved_model_round_trip


def bh(num_rows: int, dim: int, **kwargs):
    """A BH layer with code_bits = bits(num_rows - 1): the vocabulary ids exactly, no room for
    unseen codes (the hand-worked layouts below assume it)."""
    kwargs.setdefault("code_bits", bits_for(num_rows))
    return BinaryHashEmbedding(num_rows, dim, **kwargs)


def blocks_ref(code_bits: int, block_bits: int, split: str) -> list[list[int]]:
    """Global bit positions per block, written independently of the layer."""
    n = -(-code_bits // block_bits)
    blocks: list[list[int]] = [[] for _ in range(n)]
    for p in range(code_bits):
        blocks[p // block_bits if split == "succession" else p % n].append(p)
    return blocks


def rows_ref(code: int, code_bits: int, block_bits: int, split: str) -> list[int]:
    """Table rows of one code by a plain bit loop: offset_j + sum_k bit(p_jk) * 2**k."""
    code = 0 if code < 0 else code & ((1 << code_bits) - 1)
    rows, offset = [], 0
    for positions in blocks_ref(code_bits, block_bits, split):
        v = 0
        for k, p in enumerate(positions):  # k: the bit's position inside its block
            v += ((code >> p) & 1) << k
        rows.append(offset + v)
        offset += 1 << len(positions)
    return rows


def _layer(num_rows=256, dim=4, block_bits=2, split="skip", fusion="sum", **kw):
    layer = bh(num_rows, dim, block_bits=block_bits, split=split, fusion=fusion, **kw)
    layer.build(None)
    layer.table.assign(
        np.arange(layer.table_rows * layer.block_dim, dtype=np.float32).reshape(
            layer.table_rows, layer.block_dim
        )
    )
    return layer


def test_hand_worked_code_L8_t2():
    code = 0b10110010  # 178: bits b0..b7 = 0 1 0 0 1 1 0 1
    skip = bh(256, 4, block_bits=2, split="skip")
    # skip, 4 blocks {0,4} {1,5} {2,6} {3,7}: v = b_j + 2*b_{j+4} = 2, 3, 0, 2; offsets 0 4 8 12
    assert skip.block_indices(tf.constant([code], tf.int64)).numpy().tolist() == [[2, 7, 8, 14]]
    succ = bh(256, 4, block_bits=2, split="succession")
    # succession {0,1} {2,3} {4,5} {6,7}: v = 2, 0, 3, 2
    assert succ.block_indices(tf.constant([code], tf.int64)).numpy().tolist() == [[2, 4, 11, 14]]


@pytest.mark.parametrize("block_bits", [1, 2, 3])
def test_skip_uses_the_in_block_bit_weight_for_every_code(block_bits):
    """The QunBB bug (global bit weight 2**p in skip blocks) indexes past the table here."""
    layer = bh(256, 4, block_bits=block_bits, split="skip")
    codes = np.arange(256)
    got = layer.block_indices(tf.constant(codes, tf.int64)).numpy()
    offsets = np.array(layer.offsets)
    sizes = np.array([1 << s for s in layer.block_sizes])
    local = got - offsets
    assert (local >= 0).all() and (local < sizes).all() and (local < 2**block_bits).all()
    assert got.max() < layer.table_rows == sizes.sum()
    expected = [rows_ref(c, 8, block_bits, "skip") for c in codes]
    assert got.tolist() == expected


def test_block_layout_by_hand():
    succ = bh(128, 2, block_bits=3, split="succession")  # L = 7
    assert (succ.code_bits, succ.n_blocks, succ.block_sizes) == (7, 3, [3, 3, 1])
    assert (succ.offsets, succ.table_rows) == ([0, 8, 16], 18)  # last block: 2 rows, not 8
    skip = bh(128, 2, block_bits=3, split="skip")  # {0,3,6} {1,4} {2,5}
    assert (skip.n_blocks, skip.block_sizes, skip.offsets, skip.table_rows) == (
        3,
        [3, 2, 2],
        [0, 8, 12],
        16,
    )
    assert skip.block_indices(tf.constant([0b1000001], tf.int64)).numpy().tolist() == [
        [0 + 0b101, 8, 12]
    ]


@pytest.mark.parametrize("split", ["succession", "skip"])
def test_distinct_codes_get_distinct_block_tuples_exhaustively(split):
    for code_bits in range(1, 11):
        codes = np.arange(2**code_bits)
        for block_bits in range(1, code_bits + 1):
            layer = bh(2**code_bits, 2, block_bits=block_bits, split=split)
            got = layer.block_indices(tf.constant(codes, tf.int64)).numpy()
            assert len({tuple(r) for r in got.tolist()}) == len(codes), (code_bits, block_bits)
            assert got.min() >= 0 and got.max() < layer.table_rows
    # and the mapping agrees with the bit-loop reference on a mid-size case
    layer = bh(2**9, 2, block_bits=4, split=split)
    got = layer.block_indices(tf.constant(np.arange(512), tf.int64)).numpy()
    assert got.tolist() == [rows_ref(c, 9, 4, split) for c in range(512)]


@pytest.mark.parametrize(
    ("split", "fusion"), list(itertools.product(["succession", "skip"], ["sum", "concat"]))
)
def test_lookup_matches_the_numpy_reference(split, fusion):
    # L = 8; sum: 3 blocks (3, 3, 2 bits for succession); concat: 4 blocks of 2 columns
    t = 3 if fusion == "sum" else 2
    layer = _layer(num_rows=200, dim=8, block_bits=t, split=split, fusion=fusion)
    table = np.arange(layer.table_rows * layer.block_dim, dtype=np.float32).reshape(
        layer.table_rows, layer.block_dim
    )
    codes = [0, 1, 5, 77, 199, 255, 2**40 + 77, 2**63 - 1]
    out = layer(tf.constant(codes, tf.int64)).numpy()
    for code, row in zip(codes, out, strict=True):
        # unseen codes (>= 200) fold into the 56 codes 200..255 that no known value uses
        folded = code if code < 200 else 200 + (code - 200) % 56
        parts = table[rows_ref(folded, 8, t, split)]
        expected = parts.sum(axis=0) if fusion == "sum" else parts.reshape(-1)
        np.testing.assert_array_equal(row, expected)


def test_codes_are_masked_and_negative_codes_take_the_oov_path():
    layer = _layer(num_rows=256, block_bits=3, split="succession")
    out = layer(tf.constant([0, -1, -(2**62), 256, 5, 256 + 5, 2**62 + 5], tf.int64)).numpy()
    for row in out[1:4]:  # negative codes -> code 0; 256 & 255 = 0
        np.testing.assert_array_equal(row, out[0])
    # unseen values' fingerprints keep their low L bits: no collapse onto the OOV code
    np.testing.assert_array_equal(out[5], out[4])
    np.testing.assert_array_equal(out[6], out[4])
    assert not np.array_equal(out[4], out[0])


def test_unseen_codes_never_share_a_known_value_code():
    layer = BinaryHashEmbedding(1000, 4, block_bits=3)  # default L = bits(999) + 1 = 11
    assert layer.code_bits == 11
    known = layer.block_indices(tf.constant(np.arange(1000), tf.int64)).numpy()
    rng = np.random.default_rng(0)
    unseen_codes = (1 << 62) | rng.integers(0, 2**62, 5000, dtype=np.int64)
    unseen = layer.block_indices(tf.constant(unseen_codes, tf.int64)).numpy()
    assert not {tuple(r) for r in known.tolist()} & {tuple(r) for r in unseen.tolist()}
    # with L = 63 nothing folds: every code is its own
    wide = BinaryHashEmbedding(1000, 4, block_bits=7, code_bits=63)
    rows = wide.block_indices(tf.constant(unseen_codes, tf.int64)).numpy()
    assert len({tuple(r) for r in rows.tolist()}) == len(set(unseen_codes.tolist()))


def test_ragged_pooling_mean_sum_and_empty_rows():
    ids = tf.ragged.constant([[1, 17], [200], []], dtype=tf.int64)
    mean_layer = _layer(combiner="mean")
    dense = mean_layer(tf.constant([1, 17, 200], tf.int64)).numpy()
    mean = mean_layer(ids).numpy()
    np.testing.assert_allclose(mean[0], (dense[0] + dense[1]) / 2)
    np.testing.assert_allclose(mean[1], dense[2])
    np.testing.assert_array_equal(mean[2], np.zeros(4))
    total = _layer(combiner="sum")(ids).numpy()
    np.testing.assert_allclose(total[0], dense[0] + dense[1])
    np.testing.assert_array_equal(total[2], np.zeros(4))


def test_l2_is_taken_on_every_block_row():
    layer = _layer(l2=0.5, block_bits=2, split="skip")
    layer(tf.constant([178, 3], tf.int64))
    table = np.arange(16 * 4, dtype=np.float32).reshape(16, 4)
    rows = rows_ref(178, 8, 2, "skip") + rows_ref(3, 8, 2, "skip")
    assert float(layer.losses[0]) == pytest.approx(0.5 * float(np.sum(table[rows] ** 2)) / 2)


def test_gradient_touches_only_looked_up_rows():
    layer = bh(256, 4, block_bits=4, split="skip")
    ids = tf.constant([178, 3, 3], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(ids))
    grad = tf.convert_to_tensor(tape.gradient(loss, layer.table)).numpy()
    touched = set(rows_ref(178, 8, 4, "skip")) | set(rows_ref(3, 8, 4, "skip"))
    assert set(np.flatnonzero(np.abs(grad).sum(axis=1))) == touched


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rows": 0, "dim": 4, "block_bits": 2}, "num_rows"),
        ({"num_rows": 5, "dim": 0, "block_bits": 2}, "dim"),
        ({"num_rows": 5, "dim": 4, "block_bits": 2, "combiner": "max"}, "combiner"),
        ({"num_rows": 5, "dim": 4, "block_bits": 2, "l2": -1.0}, "l2"),
        ({"num_rows": 5, "dim": 4, "block_bits": 2, "code_bits": 0}, "code_bits"),
        ({"num_rows": 5, "dim": 4, "block_bits": 2, "code_bits": 64}, "code_bits"),
        ({"num_rows": 1000, "dim": 4, "block_bits": 2, "code_bits": 9}, "code_bits"),
        ({"num_rows": 5, "dim": 4, "block_bits": 0}, "block_bits"),
        ({"num_rows": 5, "dim": 4, "block_bits": 5}, "block_bits"),  # > default L = 3 + 1
        ({"num_rows": 5, "dim": 4, "block_bits": 2, "split": "odd"}, "split"),
        ({"num_rows": 5, "dim": 4, "block_bits": 2, "fusion": "max"}, "fusion"),
        ({"num_rows": 256, "dim": 4, "block_bits": 3, "fusion": "concat"}, "dim"),
        ({"num_rows": 5, "dim": 4, "block_bits": 40, "code_bits": 63}, "block_bits"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BinaryHashEmbedding(**kwargs)


def test_memory_bytes_by_hand():
    # V = 1M -> L = 20; t = 9: blocks 9, 9, 2 bits -> 512 + 512 + 4 rows
    layer = bh(1_000_000, 16, block_bits=9)
    assert layer.code_bits == 20
    assert layer.memory_bytes() == {"train": 1028 * 16 * 4, "serve": 1028 * 16 * 4}
    # concat: 4 blocks of 5 bits, 4 columns each
    cat = bh(1_000_000, 16, block_bits=5, fusion="concat")
    assert cat.memory_bytes()["serve"] == 4 * 32 * 4 * 4
    # the floor: t = 1 -> 2 rows per code bit
    assert bh(1_000_000, 16, block_bits=1).memory_bytes()["serve"] == 40 * 16 * 4


def test_config_round_trip():
    layer = bh(
        1000, 8, combiner="sum", l2=0.1, block_bits=3, code_bits=12, split="skip", fusion="concat"
    )
    clone = BinaryHashEmbedding.from_config(layer.get_config())
    for attr in ("num_rows", "dim", "combiner", "l2", "code_bits", "block_bits", "split"):
        assert getattr(clone, attr) == getattr(layer, attr)
    assert (clone.fusion, clone.table_rows, clone.block_dim) == ("concat", 32, 2)


@pytest.mark.parametrize("num_rows", [1_000_000, 9_000])
@pytest.mark.parametrize("ratio", [2, 10, 100, 1000])
def test_options_for_ratio(num_rows, ratio):
    if (num_rows, ratio) == (9_000, 1000):  # L = 14 + 1: at most 2 * 15 rows -> 300x
        with pytest.raises(ValueError, match=r"not reachable.*300x"):
            BinaryHashEmbedding.options_for_ratio(num_rows, 16, ratio)
        return
    opts = BinaryHashEmbedding.options_for_ratio(num_rows, 16, ratio)
    layer = bh(num_rows, 16, **opts)
    achieved = num_rows * 16 * 4 / layer.memory_bytes()["serve"]
    assert ratio / 1.5 <= achieved <= ratio * 1.5


def test_options_for_ratio_skip_concat_and_code_bits():
    # skip balances the blocks: at L = 21 only 0.48x, 326x, 2600x, ... are reachable
    assert BinaryHashEmbedding.options_for_ratio(1_000_000, 16, 400, split="skip") == {
        "code_bits": 21,
        "block_bits": 11,
        "split": "skip",
        "fusion": "sum",
    }
    with pytest.raises(ValueError, match="326x"):
        BinaryHashEmbedding.options_for_ratio(1_000_000, 16, 10, split="skip")
    opts = BinaryHashEmbedding.options_for_ratio(9_000, 16, 640, fusion="concat")
    layer = bh(9_000, 16, **opts)
    assert 16 % layer.n_blocks == 0 and 9_000 * 16 * 4 / layer.memory_bytes()["serve"] > 600
    # code_bits is kept when larger than the vocabulary needs
    assert BinaryHashEmbedding.options_for_ratio(9_000, 16, 10, code_bits=32)["code_bits"] == 32
    with pytest.raises(ValueError, match="ratio"):
        BinaryHashEmbedding.options_for_ratio(9_000, 16, 0)


def test_saved_model_round_trip(tmp_path):
    layer = bh(100, 4, block_bits=2, split="skip", code_bits=10)
    dense = tf.constant([0, 3, 99, 100, -2, 2**62 + 9], tf.int64)
    ragged = tf.ragged.constant([[1, 2], [], [5, 500, 7]], dtype=tf.int64)
    assert_saved_model_round_trip(layer, dense, ragged, tmp_path)
