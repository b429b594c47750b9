"""``features.convert`` as a job of tasks: however the inputs are cut into chunks, the shards,
the counts and the first error are those of reading the inputs front to back."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.convert import convert
from features.read_report import DataError, ReadReport
from features.schema import schema_from_dict
from features.shards import ROW_GROUP_ROWS, write_parquet_file
from tests.testdata import SMALL_CSV_FIELDS, write_small_csv

SCHEMA = schema_from_dict(
    {
        "name": "t",
        "source": {"format": "csv", "delimiter": ",", "header": True},
        "fields": SMALL_CSV_FIELDS,
    }
)
_write = write_small_csv


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.parquet"))
    }


def test_any_chunking_writes_the_same_shards_and_counts(tmp_path):
    a = _write(tmp_path / "a.csv", 30_000, {10: "1,v,x", 20_000: "1,v"})
    b = _write(tmp_path / "b.csv", 5_000, {4_000: "3,v,1"})
    kw = {"test_fraction": 0.2, "validation_fraction": 0.1, "max_bad_rows": 5}
    kw["rows_per_shard"] = 7_000
    reports, digests = [], []
    for i, chunk in enumerate((1 << 30, 50_000, 7_777)):
        report = ReadReport()
        out = convert(SCHEMA, [a, b], tmp_path / f"out{i}", report=report, chunk_bytes=chunk, **kw)
        reports.append(report)
        digests.append(_digests(tmp_path / f"out{i}"))
        assert not list((tmp_path / f"out{i}").glob(".chunks-*"))
    assert reports[0] == reports[1] == reports[2]
    assert reports[0].rows == 34_997 and reports[0].bad_rows == 3 and reports[0].files == 2
    assert digests[0] == digests[1] == digests[2]
    rows = {k: sum(pq.ParquetFile(p).metadata.num_rows for p in v) for k, v in out.items()}
    assert sum(rows.values()) == 34_997 and len(out["train"]) == 4  # 24.5k train rows of 7k
    assert [pq.ParquetFile(p).metadata.num_rows for p in out["train"][:3]] == [7_000] * 3


def test_the_first_error_is_the_one_of_reading_front_to_back(tmp_path):
    a = _write(tmp_path / "a.csv", 20_000, {100: "1,v,x", 15_000: "1,v,y"})
    empty = tmp_path / "b.csv"
    empty.write_bytes(b"")
    for chunk in (1 << 30, 9_000):
        with pytest.raises(DataError) as budget:
            convert(SCHEMA, [a, empty], tmp_path / "o", max_bad_rows=1, chunk_bytes=chunk)
        assert str(budget.value) == (
            "more than max_bad_rows = 1 bad rows (limit exceeded); bad row 2: "
            f"{a}: line 15000, column 'x': bad value 'y'; expected a finite number (float32)"
        )
        with pytest.raises(DataError, match=r"b\.csv' is empty"):
            convert(SCHEMA, [a, empty], tmp_path / "o", max_bad_rows=2, chunk_bytes=chunk)
        assert not list((tmp_path / "o").glob(".chunks-*"))


def test_a_shard_is_written_in_row_groups_of_65536_rows(tmp_path):
    batches = [
        pa.record_batch({"x": list(range(lo, lo + 9_999))}) for lo in range(0, 69_993, 9_999)
    ]
    rows = write_parquet_file(batches, tmp_path / "s.parquet")  # 7 batches, 69,993 rows
    assert rows == 69_993
    meta = pq.ParquetFile(tmp_path / "s.parquet").metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert sizes == [ROW_GROUP_ROWS, 69_993 - ROW_GROUP_ROWS]
    assert pq.read_table(tmp_path / "s.parquet").column("x").to_pylist() == list(range(69_993))


def _x(files: list[Path]) -> list[float]:
    return [v for f in files for v in pq.read_table(f).column("x").to_pylist()]


def test_recent_validation_takes_the_last_training_rows_in_input_order(tmp_path):
    a = _write(tmp_path / "a.csv", 1_000)  # row i has x = i / 2
    kw = {"test_fraction": 0.2, "validation_fraction": 0.25, "seed": 3}
    hashed = convert(SCHEMA, [a], tmp_path / "hash", **kw)
    for i, chunk in enumerate((1 << 30, 2_000)):
        out = convert(
            SCHEMA, [a], tmp_path / f"r{i}", validation_split="recent", chunk_bytes=chunk, **kw
        )
        test = set(_x(out["test"]))
        assert _x(out["test"]) == _x(hashed["test"])  # the test rows are the same either way
        # rows 750 .. 999 (the last quarter of the input) that are not test rows
        assert _x(out["validation"]) == [g / 2 for g in range(750, 1_000) if g / 2 not in test]
        assert _x(out["train"]) == [g / 2 for g in range(750) if g / 2 not in test]
    with pytest.raises(ValueError, match=r"validation_split must be one of \['hash', 'recent'\]"):
        convert(SCHEMA, [a], tmp_path / "bad", validation_split="last", **kw)
