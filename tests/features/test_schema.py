import tomllib

import pytest

from features.readers import read_batches
from features.schema import (
    FeatureKind,
    FeatureSpec,
    SchemaError,
    expand_names,
    load_schema,
    schema_from_dict,
    shipped_schemas,
)

MINIMAL = {
    "name": "m",
    "fields": [{"name": "c", "kind": "categorical"}, {"name": "y", "kind": "label"}],
}


def test_expand_names():
    assert expand_names("C{1..3}") == ["C1", "C2", "C3"]
    assert expand_names(["label", "I{1..2}", "x_{0..1}_y"]) == [
        "label",
        "I1",
        "I2",
        "x_0_y",
        "x_1_y",
    ]
    assert expand_names("plain") == ["plain"]
    with pytest.raises(SchemaError, match="upper bound"):
        expand_names("C{3..1}")


def test_defaults_by_kind():
    s = schema_from_dict(MINIMAL)
    assert s.field("c").dtype == "string" and s.field("c").column == "c"
    assert s.label.name == "y" and s.label.dtype == "float32"
    assert [f.name for f in s.model_inputs] == ["c"]
    assert FeatureSpec("t", "timestamp").dtype == "int64"
    assert FeatureSpec("n", "numeric", num_buckets=4).is_embedded


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"fields": [{"name": "c", "kind": "categorical", "vocab_size": 3}]},
            r"unknown keys \['vocab_size'\]",
        ),
        ({"fields": [{"name": "c", "kind": "category"}]}, "kind 'category' is not one of"),
        ({"fields": [{"name": "c", "kind": "categorical"}]}, "at least one field of kind 'label'"),
        (
            {"fields": [{"name": "c", "kind": "categorical"}, {"name": "c", "kind": "label"}]},
            r"duplicate field names \['c'\]",
        ),
        (
            {
                "fields": [
                    {"name": "c", "kind": "categorical", "vocab": "hash"},
                    {"name": "y", "kind": "label"},
                ]
            },
            "hash_buckets >= 1",
        ),
        (
            {
                "fields": [
                    {"name": "n", "kind": "numeric", "num_buckets": 1},
                    {"name": "y", "kind": "label"},
                ]
            },
            "num_buckets must be 0",
        ),
        (
            {
                "fields": [
                    {"name": "n", "kind": "numeric", "dtype": "string"},
                    {"name": "y", "kind": "label"},
                ]
            },
            "numeric needs dtype",
        ),
        (
            {
                "fields": [
                    {"name": "c", "kind": "categorical", "cost": -1.0},
                    {"name": "y", "kind": "label"},
                ]
            },
            "cost must be >= 0",
        ),
        ({"fields": [{"name": "y", "kind": "label"}]}, "no categorical or numeric field"),
        ({"source": {"format": "xlsx"}}, "format = 'xlsx'"),
        ({"source": {"header": False}}, "needs `columns`"),
        ({"fields": [{"kind": "label"}]}, "exactly one of 'name' or 'names'"),
        ({"extra": 1}, r"unknown keys \['extra'\]"),
    ],
)
def test_errors_name_the_entry_and_key(change, match):
    with pytest.raises(SchemaError, match=match):
        schema_from_dict({**MINIMAL, **change}, where="my.toml")


def test_load_toml_and_yaml_files(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "name: y\nfields:\n  - {names: 'C{1..2}', kind: categorical, cost: 2.5}\n"
        "  - {name: label, kind: label, column: rating, threshold: 4.0}\n"
    )
    s = load_schema(tmp_path / "s.yaml")
    assert s.names == ["C1", "C2", "label"] and s.field("C2").cost == 2.5
    assert s.label.threshold == 4.0 and s.label.column == "rating"
    (tmp_path / "bad.toml").write_text("name = [\n")
    with pytest.raises(SchemaError, match=r"bad\.toml.*not valid toml"):
        load_schema(tmp_path / "bad.toml")
    with pytest.raises(SchemaError, match="does not exist"):
        load_schema(tmp_path / "nope.toml")
    with pytest.raises(SchemaError, match=r"expected a \.toml, \.yaml or \.yml"):
        (tmp_path / "s.json").write_text("{}")
        load_schema(tmp_path / "s.json")


@pytest.mark.parametrize("name", sorted(shipped_schemas()))
def test_shipped_schemas_round_trip_through_toml(name):
    s = load_schema(name)
    assert schema_from_dict(tomllib.loads(s.to_toml())) == s
    assert s.as_parquet().source.format == "parquet"
    assert all(f.column == f.name and f.threshold is None for f in s.as_parquet().fields)


def test_select_and_replace_field():
    s = load_schema("movielens")
    sub = s.select(["userId"])
    assert sub.names == ["userId", "label"]
    assert s.replace_field("userId", min_count=5).field("userId").min_count == 5
    with pytest.raises(SchemaError, match="unknown fields"):
        s.select(["nope"])
    with pytest.raises(SchemaError, match="no field 'nope'"):
        s.replace_field("nope", cost=2.0)


def test_avazu_schema_reads_an_avazu_csv(tmp_path):
    header = (
        "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
        "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
        "C14,C15,C16,C17,C18,C19,C20,C21"
    )
    row = (
        "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,"
        "07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79"
    )
    (tmp_path / "train.csv").write_text(
        f"{header}\n{row}\n{row.replace(',0,1410', ',1,1410', 1)}\n"
    )
    schema = load_schema("avazu")
    (batch,) = list(read_batches(schema, tmp_path / "train.csv"))
    assert batch.column("click").to_pylist() == [0.0, 1.0]
    assert batch.column("device_ip").to_pylist() == ["ddd2926e"] * 2
    assert batch.column("C20").to_pylist() == ["-1"] * 2
    assert {f.kind for f in schema.fields} == {
        FeatureKind.META,
        FeatureKind.LABEL,
        FeatureKind.CATEGORICAL,
    }


def test_a_folder_named_like_a_shipped_schema_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "movielens").mkdir()
    assert load_schema("movielens") == load_schema(shipped_schemas()["movielens"])
    with pytest.raises(SchemaError, match=r"schema '\./movielens' is a directory: expected a"):
        load_schema("./movielens")
    (tmp_path / "s.toml").mkdir()
    with pytest.raises(SchemaError, match=r"schema file 's\.toml' is a directory"):
        load_schema("s.toml")
    with pytest.raises(SchemaError, match=r"'nope' does not exist.*shipped schema \["):
        load_schema("nope")
    (tmp_path / "plain").write_text((shipped_schemas()["movielens"]).read_text())
    with pytest.raises(SchemaError, match=r"expected a \.toml, \.yaml or \.yml"):
        load_schema("plain")  # a file is read as a file, whatever its name
