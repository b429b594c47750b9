import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.read_report import DataError
from features.schema import FeatureSpec, Schema, SourceSpec
from features.stats import (
    MIN_PENDING,
    DatasetStats,
    StatsAccumulator,
    cap_hash_tables,
    compute_stats,
    hash_rows,
)


def _schema(**overrides):
    fields = [
        FeatureSpec("c", "categorical", **overrides.get("c", {})),
        FeatureSpec("m", "multi_categorical"),
        FeatureSpec("x", "numeric", num_buckets=4, **overrides.get("x", {})),
        FeatureSpec("label", "label"),
    ]
    return Schema("s", tuple(fields), SourceSpec(format="parquet"))


def _batches():
    b1 = pa.record_batch(
        {
            "c": pa.array(["a", "b", "a", None, "c"]),
            "m": pa.array(["x|y", "y", "", None, "y|z|y"]),
            "x": pa.array([1.0, 2.0, None, 4.0, 5.0], pa.float32()),
            "label": pa.array([1.0, 0.0, 1.0, 0.0, 0.0], pa.float32()),
        }
    )
    b2 = pa.record_batch(
        {
            "c": pa.array(["a", "b", "d"]),
            "m": pa.array(["z", "x", "x"]),
            "x": pa.array([3.0, 6.0, 7.0], pa.float32()),
            "label": pa.array([1.0, 1.0, 0.0], pa.float32()),
        }
    )
    return [b1, b2]


def test_counts_ranks_and_label_by_hand():
    stats = compute_stats(_schema(), _batches())
    assert stats.rows == 8
    assert stats.positives == 4.0
    c = stats["c"]
    # a:3, b:2, c:1, d:1 (ties by value), one missing
    assert c.vocab == ["a", "b", "c", "d"]
    assert c.vocab_counts == [3, 2, 1, 1]
    assert (c.count, c.missing, c.num_distinct, c.oov_count) == (7, 1, 4, 0)
    m = stats["m"]
    # tokens: x,y | y | (empty) | null | y,z,y | z | x | x -> y:4 x:3 z:2
    assert m.vocab == ["y", "x", "z"]
    assert m.vocab_counts == [4, 3, 2]
    assert m.missing == 2
    x = stats["x"]
    values = np.array([1, 2, 4, 5, 3, 6, 7], dtype=np.float64)
    assert x.count == 7 and x.missing == 1
    assert x.mean == pytest.approx(values.mean())
    assert x.std == pytest.approx(values.std())
    assert (x.min, x.max) == (1.0, 7.0)
    assert x.boundaries == pytest.approx(np.quantile(values, [0.25, 0.5, 0.75]).tolist())


def test_min_count_and_max_vocab_send_values_to_oov():
    stats = compute_stats(_schema(c={"min_count": 2}), _batches())
    assert stats["c"].vocab == ["a", "b"]
    assert stats["c"].oov_count == 2
    stats = compute_stats(_schema(c={"max_vocab": 1}), _batches())
    assert stats["c"].vocab == ["a"]
    assert stats["c"].oov_count == 4


def test_log1p_transform_moments():
    stats = compute_stats(_schema(x={"transform": "log1p"}), _batches())
    values = np.log1p(np.array([1, 2, 4, 5, 3, 6, 7], dtype=np.float64))
    assert stats["x"].mean == pytest.approx(values.mean())


def test_save_load_round_trip(tmp_path):
    stats = compute_stats(_schema(), _batches())
    stats.save(tmp_path / "stats")
    back = DatasetStats.load(tmp_path / "stats")
    assert back.rows == stats.rows
    for name in stats.fields:
        a, b = stats[name], back[name]
        assert a.vocab == b.vocab and a.vocab_counts == b.vocab_counts
        assert a.boundaries == b.boundaries
        assert (math.isnan(a.min) and math.isnan(b.min)) or a.min == b.min


def _edit_summary(path, edit) -> None:
    summary = json.loads(path.read_text())
    edit(summary)
    path.write_text(json.dumps(summary))


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: s["fields"].update(c=[1]), "field 'c': [1] is not an object"),
        (lambda s: s["fields"]["c"].update(colour=1), "field 'c': unknown keys ['colour']"),
        (lambda s: s["fields"]["c"].pop("kind"), "field 'c': no name or kind"),
        (lambda s: s.update(rows="7"), "'rows' is '7', not int"),
        (lambda s: s.update(positives=True), "'positives' is True, not int or float"),
    ],
)
def test_load_names_the_file_and_what_is_wrong(tmp_path, edit, expected):
    path = compute_stats(_schema(), _batches()).save(tmp_path) / "stats.json"
    _edit_summary(path, edit)
    with pytest.raises(DataError) as err:
        DatasetStats.load(tmp_path)
    assert str(err.value).startswith(f"{str(path)!r}") and expected in str(err.value)
    assert str(err.value).endswith(
        "expected the statistics `stitchrec stats` or `stitchrec train` writes"
    )


def test_load_checks_the_vocabulary_columns(tmp_path):
    compute_stats(_schema(), _batches()).save(tmp_path)
    vocab = sorted((tmp_path / "vocab").glob("*.parquet"))[0]
    assert DatasetStats.check(tmp_path) == tmp_path / "stats.json"
    pq.write_table(pa.table({"value": ["a"]}), vocab)
    for read in (DatasetStats.load, DatasetStats.check):  # check: the footer only
        with pytest.raises(DataError, match=r"has columns \['value'\], not value and count"):
            read(tmp_path)


def test_large_vocabulary_is_merged_across_batches():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 50_000, 300_000)
    schema = Schema(
        "s",
        (FeatureSpec("c", "categorical"), FeatureSpec("label", "label")),
        SourceSpec(format="parquet"),
    )
    batches = [
        pa.record_batch(
            {
                "c": pa.array([str(v) for v in values[i : i + 50_000]]),
                "label": pa.array(np.zeros(50_000, np.float32)),
            }
        )
        for i in range(0, values.size, 50_000)
    ]
    stats = compute_stats(schema, batches)
    uniq, counts = np.unique(values, return_counts=True)
    assert stats["c"].num_distinct == uniq.size
    expected = dict(zip(uniq.astype(str), counts, strict=True))
    got = dict(zip(stats["c"].vocab, stats["c"].vocab_counts, strict=True))
    assert got == expected
    assert stats["c"].vocab_counts == sorted(stats["c"].vocab_counts, reverse=True)


def _distinct_values(distinct: int) -> tuple[Schema, pa.RecordBatch]:
    """A schema of one categorical field ``c`` and a batch of ``distinct`` different values."""
    schema = Schema(
        "s",
        (FeatureSpec("c", "categorical"), FeatureSpec("label", "label")),
        SourceSpec(format="parquet"),
    )
    batch = pa.record_batch(
        {
            "c": pa.array([f"v{i}" for i in range(distinct)]),
            "label": pa.array(np.zeros(distinct, np.float32)),
        }
    )
    return schema, batch


def test_value_counts_held_stay_near_the_distinct_values():
    """40 batches and 40 merged accumulators of the same 20,000 values: a field holds at most
    about twice its distinct values plus MIN_PENDING entries, however many rows it has seen,
    and the counts are exact."""
    distinct = 20_000
    schema, batch = _distinct_values(distinct)
    bound = 2 * distinct + MIN_PENDING
    acc = StatsAccumulator(schema)
    for _ in range(40):
        acc.update(batch)
        assert acc.counters["c"].held <= bound
    merged = StatsAccumulator(schema)
    for _ in range(40):
        part = StatsAccumulator(schema)
        part.update(batch)
        merged.merge(part)
        assert merged.counters["c"].held <= bound
    for stats in (acc.finish(), merged.finish()):
        assert stats["c"].num_distinct == distinct
        assert set(stats["c"].vocab_counts) == {40}


def test_a_pickled_accumulator_carries_each_value_once():
    """Ten batches of the same 5,000 values stay pending (below MIN_PENDING); pickled, as a
    task's result is sent to a merge, the counts are compacted to one entry per value, and
    the statistics are those of the unpickled copy."""
    import pickle

    distinct = 5_000
    schema, batch = _distinct_values(distinct)
    acc = StatsAccumulator(schema)
    for _ in range(10):
        acc.update(batch)
    assert acc.counters["c"].held == 10 * distinct  # pending: 10 parts of 5,000 entries
    copy = pickle.loads(pickle.dumps(acc))
    assert copy.counters["c"].held == distinct and len(copy.counters["c"].parts) == 1
    got, expected = copy.finish(), acc.finish()
    assert got["c"].vocab == expected["c"].vocab and set(got["c"].vocab_counts) == {10}


def test_missing_field_and_empty_input_are_errors():
    with pytest.raises(ValueError, match="lacks fields"):
        compute_stats(_schema(), [pa.record_batch({"c": pa.array(["a"])})])
    with pytest.raises(ValueError, match="no rows"):
        compute_stats(_schema(), [])


def test_hash_rows_rule():
    assert hash_rows(1_000_000, 6_000) == 24_000  # 4 rows per distinct training value
    assert hash_rows(1_000_000, 10) == 1024  # never under the floor
    assert hash_rows(500, 10) == 500  # never over the schema's hash_buckets
    assert hash_rows(1_000_000, 400_000) == 1_000_000


def test_cap_hash_tables_records_rows_that_survive_save_and_load(tmp_path):
    schema = _schema(c={"vocab": "hash", "hash_buckets": 1_000_000})
    stats = compute_stats(schema, _batches())
    assert stats["c"].num_distinct == 4
    assert cap_hash_tables(stats, schema) == {"c": 1024}
    stats.save(tmp_path)
    back = DatasetStats.load(tmp_path)
    assert back["c"].hash_buckets == 1024 and back["m"].hash_buckets == 0
    back["c"].hash_buckets = 2048  # recorded rows stay: a resumed run builds the same tables
    assert cap_hash_tables(back, schema) == {"c": 2048}
    assert cap_hash_tables(back, schema, cap=False) == {} and back["c"].hash_buckets == 0
