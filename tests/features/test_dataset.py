import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.dataset import (
    count_rows,
    iter_batches,
    iter_record_batches,
    list_parquet,
    make_dataset,
    shard_range,
)
from features.read_report import DataError
from features.schema import load_schema
from tests.testdata import make_tiny_table


def _all_rows(schema, files, **kw):
    batches = list(iter_batches(schema, files, **kw))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}, batches


def test_unshuffled_batches_keep_file_order_and_sizes(tiny_data):
    schema = load_schema(tiny_data["schema"])
    files = list_parquet(tiny_data["train"])
    rows, batches = _all_rows(schema, files, batch_size=300, shuffle=False)
    assert [len(b["label"]) for b in batches] == [300] * 13 + [100]
    table = pa.concat_tables([pq.read_table(f) for f in files])
    assert rows["user"].tolist() == table.column("user").to_pylist()
    assert rows["item"].dtype == np.int64
    assert rows["price"].dtype == np.float32


def test_shuffle_is_a_permutation_fixed_by_seed_and_epoch(tiny_data):
    schema = load_schema(tiny_data["schema"])
    files = list_parquet(tiny_data["train"])
    kw = {"batch_size": 256, "shuffle": True, "shuffle_buffer": 1000}
    a, _ = _all_rows(schema, files, seed=1, epoch=0, **kw)
    b, _ = _all_rows(schema, files, seed=1, epoch=0, **kw)
    c, _ = _all_rows(schema, files, seed=1, epoch=1, **kw)
    plain, _ = _all_rows(schema, files, batch_size=256, shuffle=False)
    assert a["price"].tolist() == b["price"].tolist()
    assert a["price"].tolist() != c["price"].tolist()
    assert sorted(a["price"].tolist()) == sorted(plain["price"].tolist())


def test_skip_batches_resumes_at_the_same_batch(tiny_data):
    schema = load_schema(tiny_data["schema"])
    files = list_parquet(tiny_data["train"])
    kw = {"batch_size": 256, "shuffle": True, "seed": 3, "epoch": 2}
    _, full = _all_rows(schema, files, **kw)
    _, rest = _all_rows(schema, files, skip_batches=5, **kw)
    assert len(rest) == len(full) - 5
    for x, y in zip(full[5:], rest, strict=True):
        np.testing.assert_array_equal(x["price"], y["price"])


def test_row_range_reads_only_those_rows_across_files_and_row_groups(tmp_path, tiny_data):
    """Rows [lo, hi) of the concatenated files, checked against slicing the whole table, for
    ranges inside one row group, across row groups and across files."""
    schema = load_schema(tiny_data["schema"])
    t = make_tiny_table(1000)
    files = []
    for i, (a, b) in enumerate([(0, 300), (300, 300), (600, 400)]):  # row groups of 64 rows
        files.append(tmp_path / f"p{i}.parquet")
        pq.write_table(t.slice(a, b), files[-1], row_group_size=64)
    whole = t.column("price").to_pylist()
    for lo, hi in [(0, 1000), (0, 10), (70, 100), (250, 350), (299, 301), (10, 999), (5, 5)]:
        got = [
            v
            for rb in iter_record_batches(schema, files, batch_rows=50, row_range=(lo, hi))
            for v in rb.column("price").to_pylist()
        ]
        assert got == whole[lo:hi], (lo, hi)


def test_shards_are_equal_disjoint_shares_of_the_epoch(tiny_data):
    """W workers' shards of one epoch: equal sizes, disjoint, together the epoch's rows but
    for at most W - 1; each shuffled by its own seed, and fixed by (seed, epoch)."""
    assert shard_range(10, 0, 3) == (0, 3) and shard_range(10, 2, 3) == (6, 9)
    with pytest.raises(ValueError, match="shard index 3"):
        shard_range(10, 3, 3)
    schema = load_schema(tiny_data["schema"])
    files = list_parquet(tiny_data["train"])
    kw = {"batch_size": 128, "shuffle": True, "seed": 1, "epoch": 0, "shuffle_buffer": 500}
    for workers in (1, 2, 3):
        parts = [
            _all_rows(schema, files, shard=(w, workers), drop_remainder=True, **kw)[1]
            for w in range(workers)
        ]
        steps = {len(p) for p in parts}
        assert steps == {4000 // workers // 128}  # the same number of full batches everywhere
        _, unsharded = _all_rows(schema, files, shard=(0, 1), **kw)
        prices = [np.concatenate([b["price"] for b in p]) for p in parts]
        seen = np.concatenate(prices)
        assert len(np.unique(seen)) == len(seen)  # disjoint (prices are distinct floats)
        assert set(seen.tolist()) <= set(np.concatenate([b["price"] for b in unsharded]).tolist())
    one = _all_rows(schema, files, shard=(1, 2), drop_remainder=True, **kw)[0]["price"]
    again = _all_rows(schema, files, shard=(1, 2), drop_remainder=True, **kw)[0]["price"]
    other_epoch = _all_rows(schema, files, shard=(1, 2), drop_remainder=True, **{**kw, "epoch": 1})
    assert one.tolist() == again.tolist()
    assert one.tolist() != other_epoch[0]["price"].tolist()


def test_missing_cells_are_filled_not_nan(tmp_path, tiny_data):
    schema = load_schema(tiny_data["schema"])
    t = pa.table(
        {
            "user": pa.array(["u1", None]),
            "item": pa.array([3, None], pa.int64()),
            "tags": pa.array([None, "a"]),
            "price": pa.array([None, 2.0], pa.float32()),
            "age": pa.array([30.0, None], pa.float32()),
            "label": pa.array([1.0, 0.0], pa.float32()),
        }
    )
    pq.write_table(t, tmp_path / "m.parquet")
    (b,) = list(iter_batches(schema, [tmp_path / "m.parquet"], batch_size=8, shuffle=False))
    assert b["user"].tolist() == ["u1", ""]
    assert b["item"].tolist() == [3, -1]
    assert b["tags"].tolist() == ["", "a"]
    assert b["price"].tolist() == [0.0, 2.0]
    assert np.isfinite(b["age"]).all()


def test_make_dataset_element_spec_and_errors(tiny_data, tmp_path):
    schema = load_schema(tiny_data["schema"])
    ds = make_dataset(schema, tiny_data["train"], batch_size=512)
    spec = ds.element_spec
    assert spec["user"].dtype == tf.string and spec["item"].dtype == tf.int64
    assert spec["label"].dtype == tf.float32
    assert sum(int(b["label"].shape[0]) for b in ds) == count_rows(tiny_data["train"]) == 4000
    assert ds.options().autotune.enabled is False  # dropping an iterator never waits on it
    with pytest.raises(FileNotFoundError, match="no Parquet files"):
        make_dataset(schema, tmp_path / "nope", batch_size=4)
    pq.write_table(pa.table({"user": ["a"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="lacks columns"):
        list(iter_batches(schema, [tmp_path / "bad.parquet"], batch_size=4, shuffle=False))


@pytest.mark.parametrize(
    ("column", "values", "match"),
    [
        ("label", [1.0, 2.0], r"row 2, column 'label': value 2.0, expected 0 or 1"),
        ("label", [None, 1.0], r"row 1, column 'label': value None, expected 0 or 1"),
        ("price", [1.0, float("nan")], r"row 2, column 'price': value nan, expected a finite"),
        ("age", [float("inf"), 1.0], r"row 1, column 'age': value inf, expected a finite"),
    ],
)
def test_parquet_values_that_would_poison_training_are_errors(
    tmp_path, tiny_data, column, values, match
):
    schema = load_schema(tiny_data["schema"])
    t = make_tiny_table(2)
    t = t.set_column(t.column_names.index(column), column, pa.array(values, pa.float32()))
    pq.write_table(t, tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=match) as e:
        list(iter_batches(schema, [tmp_path / "bad.parquet"], batch_size=8, shuffle=False))
    assert "bad.parquet" in str(e.value)


def test_corrupt_parquet_names_the_file(tmp_path, tiny_data):
    schema = load_schema(tiny_data["schema"])
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"broken\.parquet: not a readable Parquet file"):
        list(iter_batches(schema, [tmp_path / "broken.parquet"], batch_size=8, shuffle=False))
    (tmp_path / "log.csv.gz").write_bytes(b"\x1f\x8b not parquet")
    with pytest.raises(DataError, match=r"read through its schema \(--schema NAME\)"):
        list(iter_batches(schema, [tmp_path / "log.csv.gz"], batch_size=8, shuffle=False))


@pytest.mark.parametrize(
    ("column", "values", "match"),
    [
        ("price", ["1.5", "many"], r"row 2, column 'price': value 'many', expected a finite"),
        ("item", [1.0, 2.5], r"row 2, column 'item': value 2.5, expected an integer \(int64\)"),
        ("label", ["1", "yes"], r"row 2, column 'label': value 'yes', expected 0 or 1"),
    ],
)
def test_parquet_cells_of_the_wrong_type_name_file_row_and_column(
    tmp_path, tiny_data, column, values, match
):
    schema = load_schema(tiny_data["schema"])
    t = make_tiny_table(2)
    t = t.set_column(t.column_names.index(column), column, pa.array(values))
    pq.write_table(t, tmp_path / "typed.parquet")
    with pytest.raises(DataError, match=match) as e:
        list(iter_batches(schema, [tmp_path / "typed.parquet"], batch_size=8, shuffle=False))
    assert "typed.parquet" in str(e.value)


def test_a_parquet_list_column_names_file_and_column(tmp_path, tiny_data):
    schema = load_schema(tiny_data["schema"])
    t = make_tiny_table(2)
    t = t.set_column(t.column_names.index("tags"), "tags", pa.array([["a", "b"], []]))
    pq.write_table(t, tmp_path / "nested.parquet")
    with pytest.raises(DataError, match=r"nested\.parquet'?: column 'tags' is a Parquet list<"):
        list(iter_batches(schema, [tmp_path / "nested.parquet"], batch_size=8, shuffle=False))


def test_shards_of_an_unfinished_conversion_are_refused(tmp_path, tiny_data):
    out = tiny_data["root"]
    (out / "convert.json").write_text("{}")
    for paths in (tiny_data["train"], str(tiny_data["train"] / "*.parquet")):
        with pytest.raises(DataError, match=r"unfinished conversion: .* has convert\.json but no"):
            list_parquet(paths)
    (out / "_SUCCESS").write_text("{}")
    assert len(list_parquet(tiny_data["train"])) == 2
