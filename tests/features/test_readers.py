"""Tests for features.readers: typed streaming reads, bad-row reporting, joins, Parquet output."""

from __future__ import annotations

import dataclasses
import gzip
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features.cells import arrow_schema
from features.convert import convert
from features.read_report import DataError, ReadReport
from features.readers import list_files, read_batches
from features.schema import (
    FeatureSpec,
    JoinSpec,
    Schema,
    SchemaError,
    SourceSpec,
    load_schema,
    schema_from_dict,
)
from features.shards import split_mask, write_parquet_shards

CRITEO = load_schema("criteo")
CRITEO_COLUMNS = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


def shared_data() -> Path:
    """The shared real-data folder ($STITCHREC_SHARED_DATA or ../shared/data); skips if absent."""
    env = os.environ.get("STITCHREC_SHARED_DATA")
    root = Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"
    if not root.is_dir():
        pytest.skip(f"shared data not found at {root}")
    return root


def criteo_line(label: str = "1", i1: str = "5", c1: str = "68fd1e64", **cells: str) -> str:
    """One Criteo-layout TSV line: I2..I13 = 0..11, C2..C26 = "c2".."c26" unless overridden."""
    values = {"label": label, "I1": i1, "C1": c1}
    values.update({f"I{i}": str(i - 2) for i in range(2, 14)})
    values.update({f"C{i}": f"c{i}" for i in range(2, 27)})
    values.update(cells)
    return "\t".join(values[c] for c in CRITEO_COLUMNS)


def write(path: Path, lines: list[str], end: str = "\n") -> Path:
    path.write_text("\n".join(lines) + end)
    return path


def read_table(schema: Schema, paths, **kw) -> pa.Table:
    return pa.Table.from_batches(list(read_batches(schema, paths, **kw)), arrow_schema(schema))


def data_error(schema: Schema, paths, **kw) -> str:
    with pytest.raises(DataError) as e:
        list(read_batches(schema, paths, **kw))
    return str(e.value)


# ---------------------------------------------------------------------------------------------
# Types, values, batching


def test_arrow_schema_types() -> None:
    s = arrow_schema(CRITEO)
    assert s.names == CRITEO_COLUMNS
    assert s.field("label").type == pa.float32()
    assert s.field("I1").type == pa.float32()
    assert s.field("C1").type == pa.string()
    ob = arrow_schema(load_schema("open_bandit"))
    assert ob.field("timestamp").type == pa.int64()
    assert ob.field("propensity_score").type == pa.float32()
    assert ob.field("user_item_affinity_79").type == pa.float32()


def test_criteo_tsv_types_values_and_nulls(tmp_path: Path) -> None:
    f = write(
        tmp_path / "day_0.tsv",
        [
            criteo_line("1", "5", "68fd1e64"),
            criteo_line("0", "", "", I13="-3"),
            criteo_line("1", "1.5e2", "NA"),
            criteo_line("0", "7", "x", C26=""),
            criteo_line("1", " 8 ", "y"),
        ],
    )
    report = ReadReport()
    batches = list(read_batches(CRITEO, f, batch_rows=2, report=report))
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert all(b.schema == arrow_schema(CRITEO) for b in batches)
    t = pa.Table.from_batches(batches)
    assert t["label"].to_pylist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert t["I1"].to_pylist() == [5.0, None, 150.0, 7.0, 8.0]
    assert t["I2"].to_pylist() == [0.0] * 5
    assert t["I13"].to_pylist() == [11.0, -3.0, 11.0, 11.0, 11.0]
    assert t["C1"].to_pylist() == ["68fd1e64", None, "NA", "x", "y"]  # "NA" is text, not null
    assert t["C26"].to_pylist() == ["c26", "c26", "c26", None, "c26"]
    assert report == ReadReport(rows=5, bad_rows=0, examples=[], files=1)


def test_directory_sorted_and_batches_span_files(tmp_path: Path) -> None:
    d = tmp_path / "days"
    d.mkdir()
    write(d / "b.tsv", [criteo_line(i1=str(i)) for i in range(3, 6)])
    write(d / "a.tsv", [criteo_line(i1=str(i)) for i in range(0, 3)])
    (d / "_SUCCESS").write_text("")
    (d / ".hidden").write_text("junk")
    assert [p.name for p in list_files(d)] == ["a.tsv", "b.tsv"]
    report = ReadReport()
    batches = list(read_batches(CRITEO, d, batch_rows=4, report=report))
    assert [b.num_rows for b in batches] == [4, 2]
    assert pa.Table.from_batches(batches)["I1"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert report.files == 2
    glob_t = read_table(CRITEO, str(d / "*.tsv"))
    assert glob_t["I1"].to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_int64_categorical_label_threshold_and_timestamps(tmp_path: Path) -> None:
    schema = Schema(
        name="t",
        fields=(
            FeatureSpec(name="item", kind="categorical", dtype="int64"),
            FeatureSpec(name="count", kind="numeric", dtype="int64"),
            FeatureSpec(name="label", kind="label", column="rating", threshold=4.0),
            FeatureSpec(name="ts", kind="timestamp", column="when", time_format="iso"),
            FeatureSpec(name="unix", kind="timestamp"),
            FeatureSpec(name="p", kind="meta", dtype="float32"),
        ),
    )
    f = write(
        tmp_path / "t.csv",
        [
            "item,count,rating,when,unix,p",
            "7,1,4.0,2019-11-24 00:00:34.762830+00:00,964982703,0.5",
            "+8,,3.5,2019-11-24T09:00:00+09:00,0,",
            "9223372036854775807,-2,5,1969-12-31 23:59:59.5,-1,1e-3",
        ],
    )
    t = read_table(schema, f)
    assert t.schema.field("item").type == pa.int64()
    assert t["item"].to_pylist() == [7, 8, 2**63 - 1]
    assert t["count"].to_pylist() == [1, None, -2]
    assert t["label"].to_pylist() == [1.0, 0.0, 1.0]
    assert t["ts"].to_pylist() == [1574553634, 1574553600, -1]
    assert t["unix"].to_pylist() == [964982703, 0, -1]
    assert t["p"].to_pylist() == pytest.approx([0.5, None, 1e-3])


def test_gzip_input(tmp_path: Path) -> None:
    f = tmp_path / "day.tsv.gz"
    f.write_bytes(
        gzip.compress(("\n".join(criteo_line(i1=str(i)) for i in range(4)) + "\n").encode())
    )
    assert read_table(CRITEO, f)["I1"].to_pylist() == [0.0, 1.0, 2.0, 3.0]


def test_blank_lines_skipped_but_counted_in_line_numbers(tmp_path: Path) -> None:
    f = write(tmp_path / "b.tsv", [criteo_line(), "", criteo_line(), "", criteo_line(I3="x")])
    msg = data_error(CRITEO, f)
    assert "line 5" in msg and "'I3'" in msg


# ---------------------------------------------------------------------------------------------
# Bad input: every message names file, line, column and expectation


@pytest.mark.parametrize(
    ("bad_line", "end", "column", "found"),
    [
        (criteo_line() + "\textra", "\n", "'C26'", "found 41"),  # too many
        ("\t".join(criteo_line().split("\t")[:30]), "\n", "'C17'", "found 30"),  # too few
        ("\t".join(criteo_line().split("\t")[:38]), "", "'C25'", "found 38"),  # truncated last
    ],
    ids=["too_many", "too_few", "truncated_last_line"],
)
def test_wrong_column_count(
    tmp_path: Path, bad_line: str, end: str, column: str, found: str
) -> None:
    f = write(tmp_path / "cols.tsv", [criteo_line(), criteo_line(), bad_line], end=end)
    msg = data_error(CRITEO, f)
    assert "cols.tsv" in msg and "line 3" in msg and column in msg
    assert "expected 40 tab-separated columns" in msg and found in msg


@pytest.mark.parametrize(
    ("cells", "column", "expected"),
    [
        ({"I4": "abc"}, "'I4'", "expected a finite number (float32)"),
        ({"I4": "nan"}, "'I4'", "expected a finite number"),
        ({"I7": "-inf"}, "'I7'", "expected a finite number"),
        ({"I2": "1e999"}, "'I2'", "expected a finite number"),
        ({"label": "2"}, "'label'", "expected 0 or 1"),
        ({"label": ""}, "'label'", "expected 0 or 1"),
        ({"label": "yes"}, "'label'", "expected 0 or 1"),
    ],
)
def test_bad_values(tmp_path: Path, cells: dict[str, str], column: str, expected: str) -> None:
    f = write(
        tmp_path / "vals.tsv", [criteo_line(), criteo_line(), criteo_line(), criteo_line(**cells)]
    )
    msg = data_error(CRITEO, f)
    assert "vals.tsv" in msg and "line 4" in msg and column in msg and expected in msg
    value = next(iter(cells.values()))
    assert (repr(value) in msg) if value else ("missing value" in msg)


def test_bad_int_and_timestamp_values(tmp_path: Path) -> None:
    schema = Schema(
        name="t",
        fields=(
            FeatureSpec(name="item", kind="categorical", dtype="int64"),
            FeatureSpec(name="label", kind="label"),
            FeatureSpec(name="ts", kind="timestamp", time_format="iso"),
        ),
    )
    head = "item,label,ts"
    ok = "1,0,2019-11-24 00:00:00"
    msg = data_error(schema, write(tmp_path / "a.csv", [head, ok, "1.5,0,2019-11-24"]))
    assert "a.csv" in msg and "line 3" in msg and "'item'" in msg and "'1.5'" in msg
    assert "expected an integer" in msg
    msg = data_error(schema, write(tmp_path / "b.csv", [head, ok, ok, "2,1,yesterday"]))
    assert "b.csv" in msg and "line 4" in msg and "'ts'" in msg and "'yesterday'" in msg
    assert "ISO-8601" in msg
    msg = data_error(schema, write(tmp_path / "c.csv", [head, "99999999999999999999,1,2019-01-01"]))
    assert "line 2" in msg and "'item'" in msg and "expected an integer (int64)" in msg


def test_header_missing_column(tmp_path: Path) -> None:
    schema = load_schema("movielens")
    f = write(tmp_path / "ratings.csv", ["userId,rating,timestamp", "1,4.0,964982703"])
    write(tmp_path / "movies.csv", ["movieId,title,genres", "1,Toy Story,Comedy"])
    msg = data_error(schema, f)
    assert "ratings.csv" in msg and "'movieId'" in msg
    assert "['userId', 'rating', 'timestamp']" in msg  # the columns the file has


def test_empty_file_and_header_only(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    msg = data_error(CRITEO, empty)
    assert "empty.tsv" in msg and "is empty" in msg and "expected lines of 40 tab-separated" in msg
    schema = load_schema("avazu")
    header = (
        "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
        "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
        + ",".join(f"C{i}" for i in range(14, 22))
    )
    only = write(tmp_path / "h1.csv", [header])
    msg = data_error(schema, only)
    assert "no rows were read" in msg and "h1.csv" in msg
    row = (
        "1000009418151094273,0,14102100,1005,0,"
        + ",".join(["x"] * 9)
        + ",1,2,"
        + ",".join(["15706", "320", "50", "1722", "0", "35", "-1", "79"])
    )
    data = write(tmp_path / "h2.csv", [header, row])
    t = read_table(schema, [only, data])  # a header-only file among others is fine
    assert t.num_rows == 1
    assert t["id"].to_pylist() == ["1000009418151094273"]
    assert t["C21"].to_pylist() == ["79"]


def test_no_matching_files(tmp_path: Path) -> None:
    pattern = str(tmp_path / "nothing-*.tsv")
    with pytest.raises(DataError, match=r"no files match .*nothing-\*\.tsv"):
        read_batches(CRITEO, pattern)
    with pytest.raises(DataError, match="does not exist"):
        read_batches(CRITEO, tmp_path / "missing.tsv")


def test_corrupt_and_truncated_parquet(tmp_path: Path) -> None:
    schema = CRITEO.as_parquet()
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 this is not parquet")
    msg = data_error(schema, junk)
    assert "junk.parquet" in msg and "not a readable Parquet file" in msg
    good = tmp_path / "good.parquet"
    pq.write_table(read_table(CRITEO, write(tmp_path / "x.tsv", [criteo_line()] * 50)), good)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-100])
    msg = data_error(schema, cut)
    assert "cut.parquet" in msg and "Parquet" in msg


def test_parquet_bad_values_name_row(tmp_path: Path) -> None:
    schema = dataclasses.replace(CRITEO, source=SourceSpec(format="parquet"))
    cols = {c: ["c"] * 3 for c in CRITEO_COLUMNS}
    cols.update({f"I{i}": [1.0, 2.0, 3.0] for i in range(1, 14)})
    cols["label"] = [0, 1, 3]
    pq.write_table(pa.table(cols), tmp_path / "v.parquet")
    msg = data_error(schema, tmp_path / "v.parquet")
    assert "v.parquet" in msg and "row 3" in msg and "'label'" in msg and "expected 0 or 1" in msg
    pq.write_table(pa.table({"label": [1]}), tmp_path / "w.parquet")
    msg = data_error(schema, tmp_path / "w.parquet")
    assert "w.parquet" in msg and "'I1'" in msg and "['label']" in msg


# ---------------------------------------------------------------------------------------------
# max_bad_rows


def _mixed_bad_file(tmp_path: Path) -> Path:
    """10 lines, 3 of them bad (bad label, short line, text in I5), 7 good."""
    lines = [criteo_line(i1=str(i)) for i in range(10)]
    lines[2] = criteo_line(label="2")
    lines[5] = "\t".join(criteo_line().split("\t")[:10])
    lines[8] = criteo_line(I5="oops")
    return write(tmp_path / "mixed.tsv", lines)


def test_max_bad_rows_skips_and_counts(tmp_path: Path) -> None:
    f = _mixed_bad_file(tmp_path)
    report = ReadReport()
    t = read_table(CRITEO, f, max_bad_rows=3, report=report, batch_rows=3)
    assert report.bad_rows == 3 and report.rows == 7 == t.num_rows
    assert t["I1"].to_pylist() == [0.0, 1.0, 3.0, 4.0, 6.0, 7.0, 9.0]
    assert len(report.examples) == 3
    assert "line 3" in report.examples[0] and "'label'" in report.examples[0]
    assert "line 6" in report.examples[1] and "found 10" in report.examples[1]
    assert "line 9" in report.examples[2] and "'I5'" in report.examples[2]


def test_max_bad_rows_too_small_raises(tmp_path: Path) -> None:
    msg = data_error(CRITEO, _mixed_bad_file(tmp_path), max_bad_rows=2)
    assert "max_bad_rows = 2" in msg and "mixed.tsv" in msg and "line 9" in msg and "'I5'" in msg


def test_all_rows_bad_raises(tmp_path: Path) -> None:
    f = write(tmp_path / "bad.tsv", [criteo_line(label="7")] * 2)
    msg = data_error(CRITEO, f, max_bad_rows=5)
    assert "no rows were read" in msg and "2 bad rows were skipped" in msg


def test_line_numbers_exact_across_parser_blocks(tmp_path: Path) -> None:
    """~1.8 MB: several pyarrow blocks; skipped and blank lines keep later numbers exact."""
    lines = [criteo_line(i1=str(i)) for i in range(12_000)]
    lines[1_999] = ""  # line 2000
    lines[8_999] = "\t".join(lines[8_999].split("\t")[:20])  # line 9000
    lines[10_999] = criteo_line(I3="zz")  # line 11000
    f = write(tmp_path / "big.tsv", lines)
    msg = data_error(CRITEO, f, max_bad_rows=1)
    assert "max_bad_rows = 1" in msg and "line 11000" in msg and "'I3'" in msg and "'zz'" in msg
    report = ReadReport()
    assert read_table(CRITEO, f, max_bad_rows=2, report=report).num_rows == 11_997
    assert "line 9000" in report.examples[0] and "found 20" in report.examples[0]


# ---------------------------------------------------------------------------------------------
# Joins


def _movies(tmp_path: Path) -> None:
    write(
        tmp_path / "movies.csv",
        ["movieId,title,genres", '1,"Toy Story (1995)",Animation|Comedy', "2,Heat (1995),Crime"],
    )


def test_join_preserves_order_and_missing_key_gives_null(tmp_path: Path) -> None:
    _movies(tmp_path)
    f = write(
        tmp_path / "ratings.csv",
        [
            "userId,movieId,rating,timestamp",
            "1,2,4.5,100",
            "1,99,3.0,101",
            "2,1,1.0,102",
            "3,2,4.0,103",
            "3,1,5,104",
        ],
    )
    schema = load_schema("movielens")
    t = read_table(schema, tmp_path, batch_rows=2)  # the directory: movies.csv is left out
    assert t.column_names == ["userId", "movieId", "genres", "label", "timestamp", "rating_time"]
    assert t["movieId"].to_pylist() == ["2", "99", "1", "2", "1"]
    assert t["genres"].to_pylist() == [
        "Crime",
        None,
        "Animation|Comedy",
        "Crime",
        "Animation|Comedy",
    ]
    assert t["label"].to_pylist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert t["timestamp"].to_pylist() == [100, 101, 102, 103, 104]
    assert t["rating_time"].to_pylist() == [100.0, 101.0, 102.0, 103.0, 104.0]  # same column
    assert list_files(tmp_path, schema) == [f]


def test_join_side_table_errors(tmp_path: Path) -> None:
    write(tmp_path / "ratings.csv", ["userId,movieId,rating,timestamp", "1,2,4.5,100"])
    schema = load_schema("movielens")
    msg = data_error(schema, tmp_path / "ratings.csv")
    assert "movies.csv" in msg and "does not exist" in msg
    write(tmp_path / "movies.csv", ["id,title,genres", "2,Heat,Crime"])
    msg = data_error(schema, tmp_path / "ratings.csv")
    assert "movies.csv" in msg and "'movieId'" in msg and "['id', 'title', 'genres']" in msg
    no_list = dataclasses.replace(
        schema, source=dataclasses.replace(schema.source, joins=(JoinSpec("movies.csv", on="id"),))
    )
    msg = data_error(no_list, tmp_path / "ratings.csv")
    assert "ratings.csv" in msg and "'id'" in msg  # the data file lacks the join key


# ---------------------------------------------------------------------------------------------
# Parquet output and convert


def _criteo_rows(tmp_path: Path, n: int) -> Path:
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, n)
    lines = [criteo_line(str(labels[i]), str(i), f"u{i % 97}") for i in range(n)]
    return write(tmp_path / "big.tsv", lines)


def test_write_parquet_shards(tmp_path: Path) -> None:
    f = write(tmp_path / "x.tsv", [criteo_line(i1=str(i)) for i in range(10)])
    out = tmp_path / "out"
    (out).mkdir()
    (out / "part-00007.parquet").write_bytes(b"stale")
    paths = write_parquet_shards(read_batches(CRITEO, f, batch_rows=3), out, rows_per_shard=4)
    assert [p.name for p in paths] == [f"part-0000{i}.parquet" for i in range(3)]
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in paths]
    assert [pq.ParquetFile(p).metadata.num_rows for p in paths] == [4, 4, 2]
    back = read_table(CRITEO.as_parquet(), out)
    assert back.equals(read_table(CRITEO, f))


def test_convert_split_deterministic_and_round_trip(tmp_path: Path) -> None:
    f = _criteo_rows(tmp_path, 20_000)
    a = convert(CRITEO, f, tmp_path / "a", test_fraction=0.2, seed=7, rows_per_shard=6000)
    b = convert(CRITEO, f, tmp_path / "b", test_fraction=0.2, seed=7, batch_rows=777)
    pq_schema = dataclasses.replace(CRITEO, source=SourceSpec(format="parquet"))
    test_a = read_table(pq_schema, a["test"])
    train_a = read_table(pq_schema, a["train"])
    assert test_a.num_rows + train_a.num_rows == 20_000
    assert 0.18 < test_a.num_rows / 20_000 < 0.22
    assert len(a["train"]) == 3 and all(p.parent == tmp_path / "a" / "train" for p in a["train"])
    assert test_a.equals(read_table(pq_schema, b["test"]))  # independent of batch_rows
    assert train_a.equals(read_table(pq_schema, b["train"]))
    ids = np.array(test_a["I1"].to_pylist(), dtype=np.int64)
    assert np.array_equal(np.flatnonzero(split_mask(7, 0, 20_000, 0.2)), ids)
    original = read_table(CRITEO, f)
    assert pa.concat_tables([train_a, test_a]).sort_by("I1").equals(original)
    c = convert(CRITEO, f, tmp_path / "c", test_fraction=0.2, seed=8)
    assert not read_table(pq_schema, c["test"]).equals(test_a)  # another seed, another split


def test_convert_without_test_split(tmp_path: Path) -> None:
    f = write(tmp_path / "x.tsv", [criteo_line(i1=str(i)) for i in range(5)])
    report = ReadReport()
    out = convert(CRITEO, f, tmp_path / "o", report=report)
    assert out["test"] == [] and [p.name for p in out["train"]] == ["part-00000.parquet"]
    assert report.rows == 5
    assert read_table(CRITEO.as_parquet(), out["train"]).equals(read_table(CRITEO, f))


def test_convert_rejects_bad_fraction(tmp_path: Path) -> None:
    f = write(tmp_path / "x.tsv", [criteo_line()])
    with pytest.raises(ValueError, match="test_fraction"):
        convert(CRITEO, f, tmp_path / "o", test_fraction=1.0)


def test_split_mask_independent_of_chunking() -> None:
    whole = split_mask(3, 0, 1000, 0.3)
    parts = np.concatenate([split_mask(3, s, 100, 0.3) for s in range(0, 1000, 100)])
    assert np.array_equal(whole, parts)
    assert not split_mask(3, 0, 1000, 0.0).any()


def test_as_parquet_of_thresholded_label(tmp_path: Path) -> None:
    _movies(tmp_path)
    write(tmp_path / "ratings.csv", ["userId,movieId,rating,timestamp", "1,1,4.5,9", "2,2,2,10"])
    schema = load_schema("movielens")
    out = convert(schema, tmp_path / "ratings.csv", tmp_path / "o")
    back = read_table(schema.as_parquet(), out["train"])
    assert back.equals(read_table(schema, tmp_path / "ratings.csv"))


# ---------------------------------------------------------------------------------------------
# Shipped schemas and real data


def test_shipped_schemas_load() -> None:
    ob = load_schema("open_bandit")
    assert ob.field("user_item_affinity_7").column == "user-item_affinity_7"
    assert ob.field("item_feature_0").kind.value == "numeric"
    assert len([f for f in ob.fields if f.name.startswith("user_item_affinity_")]) == 80
    assert "title" not in load_schema("movielens").names
    avazu = load_schema("avazu")
    assert avazu.label.name == "click" and avazu.field("device_ip").vocab == "hash"


def test_column_range_expands_with_names() -> None:
    base = {"name": "t", "fields": [{"name": "y", "kind": "label"}]}
    entry = {"names": "a_{1..3}", "column": "a-{1..3}", "kind": "numeric"}
    s = schema_from_dict({**base, "fields": [*base["fields"], entry]})
    assert [f.column for f in s.fields[1:]] == ["a-1", "a-2", "a-3"]
    shared = {"names": "b_{1..2}", "column": "b", "kind": "numeric"}
    s = schema_from_dict({**base, "fields": [*base["fields"], shared]})
    assert [f.column for f in s.fields[1:]] == ["b", "b"]
    with pytest.raises(SchemaError, match="expands to 2 columns"):
        schema_from_dict({**base, "fields": [*base["fields"], {**entry, "column": "a-{1..2}"}]})


def test_movielens_real_data() -> None:
    ratings = shared_data() / "movielens-latest-small" / "ratings.csv"
    if not ratings.exists():
        pytest.skip(f"{ratings} not found")
    t = read_table(load_schema("movielens"), ratings)
    assert t.num_rows == 100_836
    assert pc.mean(t["label"]).as_py() == pytest.approx(0.482, abs=0.001)
    assert t["genres"].null_count == 0


def test_open_bandit_real_data() -> None:
    csv_path = shared_data() / "open-bandit-small" / "random" / "all" / "all.csv"
    if not csv_path.exists():
        pytest.skip(f"{csv_path} not found")
    header = csv_path.read_text().splitlines()
    click_col = header[0].split(",").index("click")
    clicks = sum(int(line.split(",")[click_col]) for line in header[1:])
    t = read_table(load_schema("open_bandit"), csv_path)
    assert t.num_rows == 10_000
    assert pc.sum(t["click"]).as_py() == clicks
    assert t["item_feature_0"].null_count == 0
    assert t["timestamp"][0].as_py() == 1574553634  # 2019-11-24 00:00:34.762830+00:00
