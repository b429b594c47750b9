"""TableConfig's stored form, the EmbeddingLayer base and the capability protocols."""

import json

import numpy as np
import pytest
import tensorflow as tf

from embeddings.amtl import AMTLEmbedding
from embeddings.base import EmbeddingLayer
from embeddings.collection import EMBEDDING_METHODS, EmbeddingCollection
from embeddings.full import FullEmbedding
from embeddings.protocols import HasServingForm, LearnsFromCounts, RatioSized, WarmStartable
from embeddings.table_config import TABLE_KEYS, TableConfig

STORED = {
    "name": "user",
    "num_rows": 100,
    "dim": 4,
    "combiner": "sum",
    "method": "qr",
    "l2": 0.01,
    "options": {"collisions": 10, "operation": "add"},
}


def test_stored_form_round_trips_unchanged():
    table = TableConfig.from_dict(STORED)
    assert table.to_dict() == STORED
    assert list(table.to_dict()) == list(TABLE_KEYS)
    assert json.dumps(table.to_dict()) == json.dumps(STORED)  # key order kept too
    assert TableConfig.of(table) is table and TableConfig.of(STORED) == table


def test_left_out_keys_take_their_defaults():
    table = TableConfig.from_dict({"name": "a", "num_rows": 3, "dim": 2, "options": None})
    assert (table.combiner, table.method, table.l2, dict(table.options)) == (
        "mean",
        "full",
        0.0,
        {},
    )


def test_missing_and_unknown_keys_raise():
    with pytest.raises(ValueError, match=r"missing \['dim'\]"):
        TableConfig.from_dict({"name": "a", "num_rows": 3})
    with pytest.raises(ValueError, match=r"unknown \['size'\]"):
        TableConfig.from_dict({"name": "a", "num_rows": 3, "dim": 2, "size": 1})


def test_collection_takes_configs_and_stores_the_dict_form():
    coll = EmbeddingCollection(
        [TableConfig.from_dict(STORED), {"name": "b", "num_rows": 5, "dim": 2}]
    )
    assert all(isinstance(t, TableConfig) for t in coll.tables)
    stored = coll.get_config()["tables"]
    assert stored[0] == STORED and stored[1]["method"] == "full" and stored[1]["options"] == {}
    clone = EmbeddingCollection.from_config(json.loads(json.dumps(coll.get_config())))
    assert clone.tables == coll.tables


def test_every_method_is_an_embedding_layer():
    assert all(issubclass(cls, EmbeddingLayer) for cls in EMBEDDING_METHODS.values())


def test_capabilities():
    sized = {m for m, cls in EMBEDDING_METHODS.items() if isinstance(cls, RatioSized)}
    assert sized == {"hashing", "qr", "bh"}
    counted = {m for m, cls in EMBEDDING_METHODS.items() if issubclass(cls, LearnsFromCounts)}
    assert counted == {"amtl"}
    amtl, full = AMTLEmbedding(5, 3), FullEmbedding(5, 3)
    assert isinstance(amtl, HasServingForm) and isinstance(amtl, WarmStartable)
    assert not isinstance(full, HasServingForm) and not isinstance(full, WarmStartable)
    assert isinstance(EmbeddingCollection([{"name": "a", "num_rows": 3, "dim": 2}]), HasServingForm)
    amtl.warm_start_from(np.ones((5, 3), np.float32))
    np.testing.assert_array_equal(amtl.table.numpy(), np.ones((5, 3)))
    out = amtl.serving_form()(tf.constant([0, 4], tf.int64))
    np.testing.assert_array_equal(out.numpy(), np.ones((2, 3)))
