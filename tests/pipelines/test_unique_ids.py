"""The row-id check of `stitchrec predict --row-id`: bucketed tasks give the answer and the error
of counting every id in one process (here on one process's runner; on a Dask cluster in
tests/pipelines/test_engines.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features.tasks import LocalRunner
from pipelines import unique_ids
from pipelines.errors import UsageError


def _write(folder: Path, parts: list[list]) -> list:
    folder.mkdir()
    for k, ids in enumerate(parts):
        pq.write_table(
            pa.table({"row_id": ids, "score": np.zeros(len(ids))}), folder / f"part-{k:05d}.parquet"
        )
    return [v for ids in parts for v in ids]


def _one_process_error(ids: list, field: str) -> str:
    """The error of counting every id at once (value_counts keeps first appearance order)."""
    counts = pc.value_counts(pa.array(ids))
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))[0]
    return (
        f"--row-id {field!r}: {len(counts):,} distinct values in {len(ids):,} rows "
        f"({repeated['values'].as_py()!r} on {repeated['counts'].as_py():,} rows)"
    )


@pytest.mark.parametrize("kind", ["int", "str"])
@pytest.mark.parametrize("bucket_rows", [10_000, 37])
def test_repeats_across_files_and_buckets_give_the_one_process_error(
    tmp_path, monkeypatch, kind, bucket_rows
):
    monkeypatch.setattr(unique_ids, "BUCKET_ROWS", bucket_rows)  # 1 bucket, or 28 of them
    rng = np.random.default_rng(3)
    values = rng.permutation(5_000)[:1_000]
    parts = [list(values[k * 250 : (k + 1) * 250]) for k in range(4)]
    parts[3][200] = parts[1][10]  # repeats of two ids, the first of them to appear in file 0
    parts[3][201] = parts[0][100]
    parts[2][5] = parts[0][100]
    if kind == "str":
        parts = [[f"user-{v}" for v in p] for p in parts]
    else:
        parts = [[int(v) for v in p] for p in parts]
    ids = _write(tmp_path / "scores", parts)
    with pytest.raises(UsageError) as e:
        unique_ids.check_unique_ids(tmp_path / "scores", "user", LocalRunner())
    assert str(e.value).startswith(_one_process_error(ids, "user") + "; expected a field")
    first = parts[0][100]
    assert f"({first!r} on 3 rows)" in str(e.value) and "997 distinct values in 1,000 rows" in str(
        e.value
    )
    assert sorted(p.name for p in (tmp_path / "scores").iterdir())[0] == "part-00000.parquet"


@pytest.mark.parametrize("bucket_rows", [10_000, 7])
def test_unique_ids_pass_and_leave_no_work_files(tmp_path, monkeypatch, bucket_rows):
    monkeypatch.setattr(unique_ids, "BUCKET_ROWS", bucket_rows)
    _write(tmp_path / "scores", [[f"a{i}" for i in range(60)], [f"b{i}" for i in range(40)], []])
    unique_ids.check_unique_ids(tmp_path / "scores", "user", LocalRunner())
    assert sorted(p.name for p in (tmp_path / "scores").iterdir()) == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"
    ]  # fmt: skip


def test_a_bucket_task_holds_its_share_of_the_rows_only(tmp_path, monkeypatch):
    monkeypatch.setattr(unique_ids, "BUCKET_ROWS", 100)
    ids = [[1000 * (k * 500 + i) for i in range(500)] for k in range(4)]  # multiples of 20 too
    _write(tmp_path / "scores", ids)
    work = tmp_path / "work"
    work.mkdir()
    tasks = [
        unique_ids._File(
            str(tmp_path / "scores" / f"part-{k:05d}.parquet"),
            500 * k,
            str(work / f"{k}.arrow"),
            20,
        )
        for k in range(4)
    ]
    starts = [unique_ids.bucket_ids(t) for t in tasks]
    sizes = [sum(s[b + 1] - s[b] for s in starts) for b in range(20)]
    assert sum(sizes) == 2_000 and max(sizes) < 2 * 100  # spread over the 20 buckets
    for b in range(20):
        slices = [(t.out, s[b], s[b + 1]) for t, s in zip(tasks, starts, strict=True)]
        assert unique_ids.count_bucket((b, slices)) == (sizes[b], None)
