"""Sequence fields and several labels through the data path: schema checks, reading (CSV and
Parquet lists), the bad rows of the rules across fields, statistics, tf.data input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.cells import arrow_schema
from features.convert import convert
from features.dataset import input_fields, iter_batches, make_dataset
from features.read_report import DataError, ReadReport
from features.readers import read_batches
from features.schema import FeatureKind, FeatureSpec, SchemaError, load_schema, schema_from_dict
from features.stats import DatasetStats, compute_stats

SCHEMA = """
name = "seq"

[source]
format = "csv"

[[fields]]
name = "click"
kind = "label"

[[fields]]
name = "buy"
kind = "label"
defined_on = "click"

[[fields]]
name = "item"
kind = "categorical"

[[fields]]
name = "hist"
kind = "sequence"
max_len = 3
shares_embedding_with = "item"

[[fields]]
name = "hist_cat"
kind = "sequence"
max_len = 3
aligned_with = "hist"
"""

HEADER = "click,buy,item,hist,hist_cat"
ROWS = [
    "1,1,i1,i2|i1,c2|c1",
    "1,0,i2,i1|i2|i3|i1|i2,c1|c2|c3|c1|c2",
    "0,,i3,,",
    "0,0,i1,i3,c3",
]


def write(tmp_path: Path, rows: list[str], name: str = "d.csv") -> Path:
    f = tmp_path / name
    f.write_text("\n".join([HEADER, *rows]) + "\n")
    return f


@pytest.fixture()
def schema(tmp_path: Path):
    (tmp_path / "seq.toml").write_text(SCHEMA)
    return load_schema(tmp_path / "seq.toml")


def read(schema, path, **kw) -> pa.Table:
    return pa.Table.from_batches(list(read_batches(schema, path, **kw)), arrow_schema(schema))


def error(schema, path, **kw) -> str:
    with pytest.raises(DataError) as e:
        list(read_batches(schema, path, **kw))
    return str(e.value)


# --------------------------------------------------------------------------------------------
# Schema


def test_schema_labels_sequences_and_round_trip(schema, tmp_path: Path) -> None:
    assert [f.name for f in schema.labels] == ["click", "buy"]
    assert schema.label.name == "click"
    assert schema.field("buy").defined_on == "click"
    hist = schema.field("hist")
    assert hist.kind == FeatureKind.SEQUENCE and hist.dtype == "string" and hist.is_model_input
    assert [f.name for f in schema.model_inputs] == ["item", "hist", "hist_cat"]
    assert [f.name for f in input_fields(schema)] == ["item", "hist", "hist_cat", "click", "buy"]
    # select keeps every label and what a kept sequence refers to
    assert schema.select(["hist_cat"]).names == ["click", "buy", "item", "hist", "hist_cat"]
    assert schema.select(["item"]).names == ["click", "buy", "item"]
    schema.save(tmp_path / "back.toml")
    assert load_schema(tmp_path / "back.toml") == schema
    assert schema_from_dict(schema.to_dict()) == schema
    assert schema.field("hist").to_dict() == {
        "name": "hist",
        "kind": "sequence",
        "max_len": 3,
        "shares_embedding_with": "item",
    }


def _with(*fields: dict) -> dict:
    return {
        "name": "s",
        "fields": [
            {"name": "y", "kind": "label"},
            {"name": "item", "kind": "categorical"},
            {"name": "x", "kind": "numeric"},
            *fields,
        ],
    }


@pytest.mark.parametrize(
    "fields, match",
    [
        ([{"name": "h", "kind": "sequence"}], r"field 'h': max_len must be an integer >= 1, got 0"),
        ([{"name": "h", "kind": "sequence", "max_len": 2, "dtype": "int64"}], "needs dtype"),
        ([{"name": "c", "kind": "categorical", "max_len": 3}], "max_len is a key of kind"),
        (
            [{"name": "c", "kind": "categorical", "aligned_with": "item"}],
            "aligned_with is a key of kind 'sequence' only, not 'categorical'",
        ),
        ([{"name": "c", "kind": "numeric", "defined_on": "y"}], "defined_on is a key of kind"),
        (
            [{"name": "h", "kind": "sequence", "max_len": 2, "shares_embedding_with": "x"}],
            "shares_embedding_with = 'x', which is a numeric field; expected a categorical",
        ),
        (
            [{"name": "h", "kind": "sequence", "max_len": 2, "shares_embedding_with": "nope"}],
            "which is no field; expected a categorical field",
        ),
        (
            [
                {
                    "name": "h",
                    "kind": "sequence",
                    "max_len": 2,
                    "shares_embedding_with": "item",
                    "min_count": 3,
                }
            ],
            r"takes the vocabulary and table of that field, so \['min_count'\]",
        ),
        (
            [{"name": "h", "kind": "sequence", "max_len": 2, "aligned_with": "item"}],
            "aligned_with = 'item', which is a categorical field; expected another sequence",
        ),
        (
            [
                {"name": "a", "kind": "sequence", "max_len": 2, "aligned_with": "b"},
                {"name": "b", "kind": "sequence", "max_len": 2, "aligned_with": "a"},
            ],
            "aligned_with forms a cycle: a -> b -> a",
        ),
        (
            [
                {"name": "a", "kind": "sequence", "max_len": 2, "aligned_with": "b"},
                {"name": "b", "kind": "sequence", "max_len": 3},
            ],
            "expected the same max_len",
        ),
        ([{"name": "z", "kind": "label", "defined_on": "x"}], "defined_on = 'x', which is not"),
        ([{"name": "z", "kind": "label", "defined_on": "z"}], "names the label itself"),
        (
            [
                {"name": "z", "kind": "label", "defined_on": "w"},
                {"name": "w", "kind": "label", "defined_on": "z"},
            ],
            "defined_on forms a cycle: z -> w -> z",
        ),
        (
            [
                {"name": "h", "kind": "sequence", "max_len": 2},
                {"name": "k", "kind": "cross", "fields": ["item", "h"], "hash_buckets": 8},
            ],
            r"crosses \['h'\], which are not categorical",
        ),
    ],
)
def test_schema_errors(fields: list[dict], match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        schema_from_dict(_with(*fields))


def test_a_schema_needs_a_label() -> None:
    with pytest.raises(SchemaError, match="at least one field of kind 'label'"):
        schema_from_dict({"name": "s", "fields": [{"name": "c", "kind": "categorical"}]})
    assert FeatureSpec("h", "sequence", max_len=1).separator == "|"


# --------------------------------------------------------------------------------------------
# Reading


def test_read_sequences_and_labels(schema, tmp_path: Path) -> None:
    t = read(schema, write(tmp_path, ROWS))
    assert t.column("hist").to_pylist() == ["i2|i1", "i1|i2|i3|i1|i2", None, "i3"]
    assert t.column("click").to_pylist() == [1.0, 1.0, 0.0, 0.0]
    assert t.column("buy").to_pylist() == [1.0, 0.0, 0.0, 0.0]  # empty where click = 0: 0


@pytest.mark.parametrize(
    "row, expected",
    [
        ("1,0,i1,i1|i2,c1", "fields 'hist_cat' and 'hist' (aligned_with): 1 and 2 values"),
        ("1,0,i1,,c1", "fields 'hist_cat' and 'hist' (aligned_with): 1 and 0 values"),
        ("2,0,i1,i1,c1", "column 'click': bad value '2'; expected 0 or 1"),
        ("1,2,i1,i1,c1", "column 'buy': bad value '2'; expected 0 or 1"),
        (",0,i1,i1,c1", "column 'click': missing value; expected 0 or 1"),
        ("0,1,i1,i1,c1", "field 'buy': 1 where 'click' is 0; expected 0 or an empty cell"),
        ("1,,i1,i1,c1", "field 'buy': missing value where 'click' is 1; expected 0 or 1"),
    ],
)
def test_bad_rows_name_the_fields(schema, tmp_path: Path, row: str, expected: str) -> None:
    f = write(tmp_path, [ROWS[0], row, ROWS[3]])
    msg = error(schema, f)
    assert msg.startswith(f"{f}: line 3, ") and expected in msg, msg
    report = ReadReport()
    t = read(schema, f, max_bad_rows=1, report=report)
    assert t.num_rows == 2 and report.bad_rows == 1 and expected in report.examples[0]


def test_parquet_list_columns_read_as_text(schema, tmp_path: Path) -> None:
    pschema = schema.as_parquet()
    table = pa.table(
        {
            "click": [1.0, 0.0, 1.0],
            "buy": [1.0, None, 0.0],
            "item": ["i1", "i2", "i3"],
            "hist": pa.array([["i2", "i1"], None, []], pa.list_(pa.string())),
            "hist_cat": pa.array([["c2", "c1"], [], None], pa.large_list(pa.string())),
        }
    )
    pq.write_table(table, tmp_path / "p.parquet")
    t = read(pschema, tmp_path / "p.parquet")
    assert t.column("hist").to_pylist() == ["i2|i1", None, ""]
    assert t.column("hist_cat").to_pylist() == ["c2|c1", "", None]
    assert t.column("buy").to_pylist() == [1.0, 0.0, 0.0]
    # a value holding the separator has no text form: a bad row naming the column
    bad = table.set_column(3, "hist", pa.array([["i2", "i1"], ["x|y"], []]))
    pq.write_table(bad, tmp_path / "bad.parquet")
    msg = error(pschema, tmp_path / "bad.parquet")
    assert "row 2, column 'hist': bad value ['x|y']; expected a list of non-empty texts" in msg
    # tf.data over the list file: the text form, every label
    batch = next(iter_batches(pschema, [tmp_path / "p.parquet"], batch_size=3, shuffle=False))
    assert batch["hist"].tolist() == ["i2|i1", "", ""]
    assert batch["buy"].tolist() == [1.0, 0.0, 0.0]


def test_tf_data_checks_the_rules_across_fields(schema, tmp_path: Path) -> None:
    pschema = schema.as_parquet()
    good = read(schema, write(tmp_path, ROWS))
    pq.write_table(good, tmp_path / "good.parquet")
    batch = next(iter_batches(pschema, [tmp_path / "good.parquet"], batch_size=4, shuffle=False))
    assert batch["hist"].tolist() == ["i2|i1", "i1|i2|i3|i1|i2", "", "i3"]
    assert batch["click"].tolist() == [1.0, 1.0, 0.0, 0.0]
    stray = good.set_column(1, "buy", pa.array([1.0, 0.0, 1.0, 0.0], pa.float32()))
    pq.write_table(stray, tmp_path / "stray.parquet")
    with pytest.raises(DataError, match="row 3, field 'buy': 1 where 'click' is 0"):
        list(iter_batches(pschema, [tmp_path / "stray.parquet"], batch_size=4, shuffle=False))
    # a missing conversion label is fine on a non-click row (row 3), an error on a click row
    missing = good.set_column(1, "buy", pa.array([None, 0.0, None, 0.0], pa.float32()))
    pq.write_table(missing, tmp_path / "missing.parquet")
    match = (
        r"row 1, column 'buy': value None, expected 0 or 1, missing only where 'click' is 0 "
        r"\(label 'buy' is defined_on 'click'\)"
    )
    with pytest.raises(DataError, match=match):
        list(iter_batches(pschema, [tmp_path / "missing.parquet"], batch_size=4, shuffle=False))


def test_convert_then_tf_data(schema, tmp_path: Path) -> None:
    shards = convert(
        schema, write(tmp_path, [*ROWS, "0,1,i1,i1,c1"]), tmp_path / "out", max_bad_rows=1
    )
    ds = make_dataset(schema.as_parquet(), shards["train"], batch_size=8)
    batch = next(iter(ds))
    assert sorted(batch) == ["buy", "click", "hist", "hist_cat", "item"]
    assert batch["hist"].dtype.name == "string"
    assert [v.decode() for v in batch["hist_cat"].numpy()] == ["c2|c1", "c1|c2|c3|c1|c2", "", "c3"]
    assert batch["buy"].numpy().tolist() == [1.0, 0.0, 0.0, 0.0]


# --------------------------------------------------------------------------------------------
# Statistics


def test_stats_by_hand(schema, tmp_path: Path) -> None:
    stats = compute_stats(schema, read_batches(schema, write(tmp_path, ROWS)))
    assert stats.label_mean == 0.5
    assert stats.label_means == {"click": 0.5, "buy": 0.25}
    assert stats.label_means_on_parent == {"buy": 0.5}
    hist, cat = stats["hist"], stats["hist_cat"]
    # lengths 2, 5, 0, 1 with max_len 3
    assert (hist.mean_length, hist.max_length) == (2.0, 5)
    assert (hist.frac_truncated, hist.frac_empty) == (0.25, 0.25)
    assert hist.vocab == []  # shared: the values use item's vocabulary
    assert stats["item"].vocab == ["i1", "i2", "i3"]
    assert cat.vocab == ["c1", "c2", "c3"] and cat.vocab_counts == [3, 3, 2]
    assert cat.count == 8 and cat.missing == 1
    stats.save(tmp_path / "stats")
    back = DatasetStats.load(tmp_path / "stats")
    assert back.label_means == stats.label_means and back["hist_cat"].vocab == cat.vocab
    assert back["hist"].frac_truncated == 0.25
    # statistics saved without the sequence and per-label keys still load
    raw = json.loads((tmp_path / "stats" / "stats.json").read_text())
    for key in ("label_positives", "parent_positives"):
        raw.pop(key)
    for fs in raw["fields"].values():
        for key in ("mean_length", "max_length", "frac_truncated", "frac_empty"):
            fs.pop(key)
    (tmp_path / "stats" / "stats.json").write_text(json.dumps(raw))
    old = DatasetStats.load(tmp_path / "stats")
    assert old.label_mean == 0.5 and old.label_means == {} and old["hist"].max_length == 0
