"""Statistics as tasks over parts of the data: the same statistics however the data is cut,
and the same as one pass (moments to float rounding); quantile samples keyed by row."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.read_report import DataError, ReadReport
from features.readers import read_batches
from features.schema import schema_from_dict
from features.shard_reader import iter_record_batches
from features.stats import StatsAccumulator, compute_stats
from features.stats_job import raw_stats, shard_stats

FIELDS = [
    {"name": "y", "kind": "label"},
    {"name": "a", "kind": "categorical", "min_count": 2},
    {"name": "x", "kind": "numeric", "num_buckets": 8},
]
PARQUET = schema_from_dict({"name": "p", "source": {"format": "parquet"}, "fields": FIELDS})
CSV = schema_from_dict(
    {"name": "c", "source": {"format": "csv", "delimiter": ",", "header": True}, "fields": FIELDS}
)


def _shards(root: Path, rows: int = 12_000) -> list[Path]:
    rng = np.random.default_rng(3)
    files = []
    for k in range(3):
        t = pa.table(
            {
                "y": pa.array(rng.integers(0, 2, rows // 3).astype(np.float32)),
                "a": pa.array([f"v{i}" for i in rng.zipf(1.5, rows // 3) % 500]),
                "x": pa.array(rng.lognormal(size=rows // 3).astype(np.float32)),
            }
        )
        files.append(root / f"part-{k:05d}.parquet")
        pq.write_table(t, files[-1], row_group_size=1_000)
    return files


def _saved(stats, folder: Path) -> dict[str, bytes]:
    stats.save(folder)
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_shard_stats_do_not_depend_on_the_parts_and_equal_one_pass(tmp_path):
    files = _shards(tmp_path)
    whole = shard_stats(PARQUET, files, sample_size=500)
    cut = shard_stats(PARQUET, files, sample_size=500, part_rows=1)  # a part per row group
    assert _saved(whole, tmp_path / "w") == _saved(cut, tmp_path / "c")
    one = compute_stats(PARQUET, iter_record_batches(PARQUET, files), sample_size=500)
    a, b = one["a"], cut["a"]
    assert (a.vocab, a.vocab_counts, a.num_distinct, a.oov_count) == (
        b.vocab,
        b.vocab_counts,
        b.num_distinct,
        b.oov_count,
    )
    assert one["x"].boundaries == cut["x"].boundaries  # the same bottom-k sample of rows
    assert len(one["x"].boundaries) == 7
    assert math.isclose(one["x"].mean, cut["x"].mean, rel_tol=1e-12)
    assert math.isclose(one["x"].std, cut["x"].std, rel_tol=1e-12)
    assert (one.rows, one.positives) == (cut.rows, cut.positives) == (12_000, one.positives)


def test_merged_statistics_do_not_depend_on_how_the_merges_are_grouped():
    """Float sums merged in another grouping round differently ((0.1 + 0.2) + 0.3 is not
    0.1 + (0.2 + 0.3)); the statistics add them exactly, so a fold in this process and a tree
    on a cluster's workers give the same mean, std and positives, bit for bit."""

    def part(x: float, y: float) -> StatsAccumulator:
        acc = StatsAccumulator(PARQUET, sample_size=4)
        batch = pa.record_batch(
            {"y": pa.array([y], pa.float64()), "a": ["v"], "x": pa.array([x], pa.float64())}
        )
        acc.update(batch)
        return acc

    values = [(0.1, 0.1), (0.2, 0.2), (0.3, 0.3)]
    left = [part(*v) for v in values]
    left[0].merge(left[1])  # (0 1) 2
    left[0].merge(left[2])
    right = [part(*v) for v in values]
    right[1].merge(right[2])  # 0 (1 2)
    right[0].merge(right[1])
    a, b = left[0].finish(), right[0].finish()
    assert (a["x"].mean, a["x"].std, a.positives) == (b["x"].mean, b["x"].std, b.positives)
    assert a["x"].mean == 0.6 / 3 and a.positives == 0.6  # the correctly rounded sum


def test_raw_stats_of_chunks_count_like_one_read_and_fail_like_it(tmp_path):
    rng = np.random.default_rng(4)
    lines = ["y,a,x"] + [
        f"{rng.integers(0, 2)},v{rng.integers(0, 40)},{rng.random():.4f}" for _ in range(8_000)
    ]
    lines[77] = "1,v1,seven"
    lines[6_000] = "5,v1,0.5"
    f = tmp_path / "d.csv"
    f.write_text("\n".join(lines) + "\n")
    one = compute_stats(CSV, read_batches(CSV, f, max_bad_rows=2))
    reports = []
    for chunk in (1 << 30, 4_096):
        report = ReadReport()
        got = raw_stats(CSV, f, max_bad_rows=2, report=report, chunk_bytes=chunk)
        reports.append(report)
        assert (got["a"].vocab, got["a"].vocab_counts) == (one["a"].vocab, one["a"].vocab_counts)
        assert got.rows == one.rows == 7_998 and got.positives == one.positives
        assert math.isclose(got["x"].mean, one["x"].mean, rel_tol=1e-12)
        with pytest.raises(DataError) as err:
            raw_stats(CSV, f, max_bad_rows=1, chunk_bytes=chunk)
        assert f"{f}: line 6001, column 'y': bad value '5'; expected 0 or 1" in str(err.value)
    assert reports[0] == reports[1] and reports[0].bad_rows == 2
