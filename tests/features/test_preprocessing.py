import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.preprocessing import FeaturePreprocessor, build_preprocessor
from features.schema import load_schema
from features.stats import compute_stats
from tests.keras_tracking import tracked_leaves


@pytest.fixture()
def setup(tiny_data):
    schema = load_schema(tiny_data["schema"])
    table = pq.read_table(tiny_data["train"])
    stats = compute_stats(schema, table.to_batches())
    return schema, stats


def test_ids_by_hand(setup):
    schema, stats = setup
    pre = build_preprocessor(schema, stats)
    vocab_user = stats["user"].vocab
    feats = {
        "user": tf.constant([vocab_user[0], vocab_user[5], "never-seen", ""]),
        "item": tf.constant([int(stats["item"].vocab[0]), 999, -1, 3], tf.int64),
        "tags": tf.constant(["a|b", "", "zzz", "d"]),
        "price": tf.constant([0.0, 1.0, np.nan, np.inf], tf.float32),
        "age": tf.constant([0.0, 1000.0, 40.0, 40.0], tf.float32),
    }
    ids, dense = pre(feats)
    assert ids["user"].numpy().tolist() == [1, 6, 0, 0]  # 0 = OOV/missing row
    assert ids["item"].numpy().tolist()[:3] == [1, 0, 0]
    tag_vocab = stats["tags"].vocab
    assert ids["tags"].to_list()[0] == [tag_vocab.index("a") + 1, tag_vocab.index("b") + 1]
    assert ids["tags"].to_list()[2] == [0]
    b = stats["age"].boundaries
    assert ids["age"].numpy().tolist()[:2] == [0, len(b)]
    assert pre.embedded_fields == {
        "user": len(vocab_user) + 1,
        "item": len(stats["item"].vocab) + 1,
        "tags": len(tag_vocab) + 1,
        "age": len(b) + 1,
    }
    # price: log1p then standardized; NaN and Inf take the default (0) first
    p = stats["price"]
    expected = (np.log1p([0.0, 1.0, 0.0, 0.0]) - p.mean) / p.std
    np.testing.assert_allclose(dense.numpy()[:, 0], expected, rtol=1e-5)


def test_hash_mode(setup):
    schema, stats = setup
    schema = schema.replace_field("user", vocab="hash", hash_buckets=7)
    pre = build_preprocessor(schema, stats)
    ids, _ = pre(
        {
            "user": tf.constant(["u1", "u2", "anything"]),
            "item": tf.constant([1, 2, 3], tf.int64),
            "tags": tf.constant(["a", "b", "c"]),
            "price": tf.constant([1.0, 2.0, 3.0]),
            "age": tf.constant([1.0, 2.0, 3.0]),
        }
    )
    u = ids["user"].numpy()
    assert ((u >= 0) & (u < 7)).all()
    assert pre.embedded_fields["user"] == 7


def test_config_round_trip(setup):
    schema, stats = setup
    pre = build_preprocessor(schema, stats)
    clone = FeaturePreprocessor.from_config(pre.get_config())
    feats = {
        "user": tf.constant(["u1", "u7"]),
        "item": tf.constant([1, 3], tf.int64),
        "tags": tf.constant(["a|c", "b"]),
        "price": tf.constant([5.0, 9.0]),
        "age": tf.constant([20.0, 60.0]),
    }
    a_ids, a_dense = pre(feats)
    b_ids, b_dense = clone(feats)
    for k in a_ids:
        assert tf.reduce_all(tf.equal(a_ids[k], b_ids[k]))
    np.testing.assert_array_equal(a_dense.numpy(), b_dense.numpy())


def test_keras_tracks_no_vocabulary_word(setup):
    """The plans and the lookups' vocabularies stay plain data: Keras walked every tracked
    word on each ``trainable_variables`` call (0.3 s a call on a 39-field model)."""
    schema, stats = setup
    pre = build_preprocessor(schema, stats)
    words = {w for p in pre.plans for w in p.get("vocabulary") or ()}
    assert len(words) >= 5
    leaves = {x for x in tracked_leaves(pre) if isinstance(x, str)}
    assert not words & leaves
    assert pre.get_config()["plans"] == pre.plans
    clone = FeaturePreprocessor.from_config(pre.get_config())
    assert not words & {x for x in tracked_leaves(clone) if isinstance(x, str)}


def test_rejects_unknown_op():
    with pytest.raises(ValueError, match="unknown op"):
        FeaturePreprocessor([{"name": "x", "op": "magic"}])


def test_codes_are_unique_for_known_unseen_and_missing_values(setup):
    schema, stats = setup
    pre = build_preprocessor(schema, stats, codes={"user": "vocabulary", "tags": "fingerprint"})
    vocab = stats["user"].vocab
    feats = {
        "user": tf.constant([vocab[0], vocab[3], "never-seen-1", "never-seen-2", ""]),
        "item": tf.constant([1, 2, 3, 4, 5], tf.int64),
        "tags": tf.constant(["a|b", "a", "zzz", "", "b"]),
        "price": tf.constant([1.0] * 5),
        "age": tf.constant([30.0] * 5),
    }
    ids, _ = pre(feats)
    user = ids["user"].numpy().tolist()
    assert user[:2] == [1, 4]  # known values keep their vocabulary id
    unseen = 1 << 62
    assert user[2] >= unseen and user[3] >= unseen and user[2] != user[3]
    assert user[4] == 0  # missing
    tags = ids["tags"].to_list()
    assert tags[0][0] == tags[1][0] and tags[0][0] != tags[0][1]  # "a" gets one code everywhere
    assert all(0 < c < 2**63 for row in tags for c in row if row != [0])
    assert tags[3] == [0]
    assert pre.embedded_fields["user"] == len(vocab) + 1
    # the same value gets the same code in another process-independent way: a fingerprint
    again, _ = FeaturePreprocessor.from_config(pre.get_config())(feats)
    assert again["user"].numpy().tolist() == user
    with pytest.raises(ValueError, match="code mode"):
        build_preprocessor(schema, stats, codes={"user": "md5"})
    with pytest.raises(ValueError, match="categorical"):
        build_preprocessor(schema, stats, codes={"price": "vocabulary"})


def test_a_field_with_an_empty_vocabulary_maps_every_value_to_oov(setup):
    # every training value rarer than min_count: the field has no vocabulary word
    schema, stats = setup
    fields = {
        **stats.fields,
        **{n: dataclasses.replace(stats[n], vocab=[]) for n in ("user", "tags")},
    }
    stats = dataclasses.replace(stats, fields=fields)
    feats = {
        "user": tf.constant(["u1", "", "never-seen"]),
        "item": tf.constant([1, 2, 3], tf.int64),
        "tags": tf.constant(["a|b", "", "c"]),
        "price": tf.constant([1.0] * 3),
        "age": tf.constant([30.0] * 3),
    }
    pre = build_preprocessor(schema, stats)
    ids, _ = pre(feats)
    assert ids["user"].numpy().tolist() == [0, 0, 0]
    assert ids["tags"].to_list() == [[0, 0], [0], [0]]
    assert pre.embedded_fields["user"] == 1 and pre.embedded_fields["tags"] == 1
    again, _ = FeaturePreprocessor.from_config(pre.get_config())(feats)
    assert again["user"].numpy().tolist() == [0, 0, 0]
    codes, _ = build_preprocessor(schema, stats, codes={"user": "vocabulary"})(feats)
    user = codes["user"].numpy().tolist()
    assert user[1] == 0 and user[0] >= 1 << 62 and user[2] >= 1 << 62 and user[0] != user[2]
