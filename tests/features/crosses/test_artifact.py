"""Cross fields: schema kind, artifact round-trip, add_crosses, and the in-model cross ids."""

from __future__ import annotations

import dataclasses
import json
import tomllib

import numpy as np
import pytest
import tensorflow as tf

from features.crosses.artifact import (
    Cross,
    CrossArtifact,
    CrossArtifactError,
    add_crosses,
    auto_buckets,
    load_crosses,
)
from features.preprocessing import CROSS_SEPARATOR, FeaturePreprocessor, cross_ids, plan_fields
from features.schema import FeatureKind, FeatureSpec, SchemaError, load_schema, schema_from_dict
from features.stats import compute_stats
from tests.testdata import TINY_SCHEMA, make_tiny_table


def tiny_schema():
    return schema_from_dict(tomllib.loads(TINY_SCHEMA))


def artifact() -> CrossArtifact:
    return CrossArtifact(
        method="fives",
        schema="tiny",
        fields=["user", "item", "tags", "price", "age"],
        crosses=[
            Cross(("user", "age"), 0.9, True, 30),
            Cross(("item", "tags", "price"), 0.0, True, 5000, source="screen", effect=0.0125),
            Cross(("user", "item"), 0.1, False, 700),
        ],
        boundaries={"age": [30.0, 50.0], "price": [5.0, 20.0]},
        skipped=[{"field": "x", "reason": "a single value"}],
        search={"seconds": 1.0},
    )


def test_artifact_round_trips_and_is_readable(tmp_path):
    path = artifact().save(tmp_path / "c.json")
    data = json.loads(path.read_text())
    assert data["crosses"][0] == {
        "rank": 1,
        "name": "user_x_age",
        "fields": ["user", "age"],
        "order": 2,
        "strength": 0.9,
        "active": True,
        "distinct": 30,
        "source": "fives",
    }
    assert data["crosses"][1]["source"] == "screen" and data["crosses"][1]["effect"] == 0.0125
    back = load_crosses(path)
    assert back.crosses == artifact().crosses
    assert back.boundaries == artifact().boundaries
    assert back.skipped == artifact().skipped
    assert [c.name for c in back.top(5, order=3)] == ["item_x_tags_x_price"]


def test_artifact_errors_name_the_file_and_entry(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_crosses(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(CrossArtifactError, match="not valid JSON"):
        load_crosses(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(CrossArtifactError, match="expected format"):
        load_crosses(bad)
    data = artifact().to_dict()
    data["crosses"][1]["fields"] = ["item"]
    bad.write_text(json.dumps(data))
    with pytest.raises(CrossArtifactError, match=r"crosses\[1\] needs two or more"):
        load_crosses(bad)


def test_add_crosses_adds_hashed_cross_fields_that_round_trip(tmp_path):
    schema = add_crosses(tiny_schema(), artifact(), top_n=2)
    crosses = schema.crosses
    assert [c.name for c in crosses] == ["user_x_age", "item_x_tags_x_price"]
    assert crosses[0].kind == FeatureKind.CROSS and crosses[0].fields == ("user", "age")
    assert crosses[0].hash_buckets == auto_buckets(artifact().crosses[0]) == 60
    assert crosses[0].boundaries == (("age", (30.0, 50.0)),)
    assert crosses[1].boundaries == (("price", (5.0, 20.0)),)
    # crosses are computed, not read: the raw inputs stay the same
    assert schema.model_inputs == tiny_schema().model_inputs
    schema.save(tmp_path / "s.toml")
    assert load_schema(tmp_path / "s.toml") == schema
    fixed = add_crosses(tiny_schema(), artifact(), top_n=1, hash_buckets=1000)
    assert fixed.crosses[0].hash_buckets == 1000


def test_add_crosses_rejects_unknown_fields_and_name_clashes():
    art = artifact()
    art.crosses[0] = Cross(("user", "nope"), 1.0)
    with pytest.raises(SchemaError, match=r"names fields \['nope'\]"):
        add_crosses(tiny_schema(), art, top_n=1)
    once = add_crosses(tiny_schema(), artifact(), top_n=1)
    with pytest.raises(SchemaError, match="already has a field named 'user_x_age'"):
        add_crosses(once, artifact(), top_n=1)
    with pytest.raises(ValueError, match="top_n must be >= 1"):
        add_crosses(tiny_schema(), artifact(), top_n=0)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"fields": ["user"]}, "two or more distinct"),
        ({"fields": ["user", "user"]}, "two or more distinct"),
        ({"hash_buckets": 1}, "hash_buckets >= 2"),
        ({"boundaries": [["item", [1.0]]]}, "not in its fields"),
        ({"boundaries": [["age", [3.0, 1.0]]]}, "strictly increasing"),
        ({"boundaries": "x"}, "boundaries must be"),
    ],
)
def test_cross_spec_validation(changes, match):
    base = {"name": "c", "kind": "cross", "fields": ["user", "age"], "hash_buckets": 10}
    with pytest.raises(SchemaError, match=match):
        FeatureSpec(**{**base, **changes})


def test_schema_checks_crossed_fields():
    schema = tiny_schema()
    cross = FeatureSpec(name="c", kind="cross", fields=["user", "label"], hash_buckets=10)
    with pytest.raises(SchemaError, match=r"crosses \['label'\]"):
        dataclasses.replace(schema, fields=(*schema.fields, cross))
    cross = FeatureSpec(
        name="c", kind="cross", fields=["user", "item"], hash_buckets=10, boundaries=[["item", [1]]]
    )
    with pytest.raises(SchemaError, match="not numeric"):
        dataclasses.replace(schema, fields=(*schema.fields, cross))
    with pytest.raises(SchemaError, match="for kind 'cross' only"):
        FeatureSpec(name="u", kind="categorical", fields=["a", "b"])


def _crossed_preprocessor(top_n: int = 2, buckets: int = 0):
    schema = add_crosses(tiny_schema(), artifact(), top_n=top_n, hash_buckets=buckets)
    table = make_tiny_table(300)
    stats = compute_stats(schema, table.to_batches())
    return schema, FeaturePreprocessor(plan_fields(schema, stats)), table


def test_cross_ids_by_hand():
    _, pre, _ = _crossed_preprocessor(top_n=2, buckets=97)
    assert pre.cross_fields == ["user_x_age", "item_x_tags_x_price"]
    assert "user_x_age" not in pre.input_names
    assert pre.embedded_fields["user_x_age"] == 97
    features = {
        "user": tf.constant(["u1", "u1", "", "u2"]),
        "item": tf.constant([7, 7, 7, -1], tf.int64),
        "tags": tf.constant(["a|b", "a|b", "b", "c"]),
        "price": tf.constant([1.0, 25.0, np.nan, 3.0]),
        "age": tf.constant([29.0, 30.0, 60.0, np.nan]),
    }
    ids, _ = pre(features)

    def h(text: str) -> int:
        return int(tf.strings.to_hash_bucket_fast([text], 96).numpy()[0]) + 1

    sep = CROSS_SEPARATOR
    # age 29 -> bucket 0 (below 30), 30 -> bucket 1 (boundaries [30, 50], bucket = #b <= x)
    assert ids["user_x_age"].numpy().tolist() == [h(f"u1{sep}0"), h(f"u1{sep}1"), 0, 0]
    # price 1 -> 0, 25 -> 2 under [5, 20]; a NaN price or a missing item (-1) gives row 0
    expected = [h(f"7{sep}a|b{sep}0"), h(f"7{sep}a|b{sep}2"), 0, 0]
    assert ids["item_x_tags_x_price"].numpy().tolist() == expected
    assert expected[0] != expected[1]


def test_numpy_reference_matches_the_layer():
    _, pre, table = _crossed_preprocessor(top_n=3)
    cols = {n: table.column(n).to_numpy() for n in ("user", "item", "tags", "price", "age")}
    ids, _ = pre({n: tf.constant(v) for n, v in cols.items()})
    for plan in pre.plans:
        if plan["op"] == "cross":
            ref = cross_ids(plan, cols)
            np.testing.assert_array_equal(ids[plan["name"]].numpy(), ref)
            assert ref.min() >= 0 and ref.max() < plan["num_rows"]
    # the tiny table misses only tags (""): exactly those rows get row 0 in the tags cross
    np.testing.assert_array_equal(ids["item_x_tags_x_price"].numpy() == 0, cols["tags"] == "")
    assert (ids["user_x_age"].numpy() > 0).all()
    # the layer (with its cross plans) rebuilds from its config
    again = FeaturePreprocessor.from_config(pre.get_config())
    np.testing.assert_array_equal(
        again({n: tf.constant(v) for n, v in cols.items()})[0]["user_x_item"].numpy(),
        ids["user_x_item"].numpy(),
    )
