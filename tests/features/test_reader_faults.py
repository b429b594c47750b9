"""Faults of real input files: a cut gzip, bytes that are not UTF-8, nested and wrong-typed
Parquet columns. Each is a DataError naming the file, line/row and column; a one-row fault is
skipped and counted under max_bad_rows, a whole-file fault is one error."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.read_report import ReadReport
from features.schema import SourceSpec, load_schema
from tests.features.test_readers import (
    CRITEO,
    CRITEO_COLUMNS,
    criteo_line,
    data_error,
    read_table,
)

MOVIELENS = load_schema("movielens")


@pytest.mark.parametrize("rows", [50, 200_000])
def test_a_cut_gzip_file_is_one_error_naming_it(tmp_path: Path, rows: int) -> None:
    text = "\n".join(criteo_line(c1=f"v{i}") for i in range(rows)) + "\n"
    data = gzip.compress(text.encode(), compresslevel=1)
    cut = tmp_path / "day.tsv.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    for bad in (0, 10**9):
        msg = data_error(CRITEO, cut, max_bad_rows=bad)
        assert "day.tsv.gz" in msg and "truncated or corrupt" in msg, msg
        assert "expected a complete .gz file" in msg
    if rows > 50:  # past the first parsed block: the message says how far the read got
        assert "after line " in msg
    # a cut file with a header line
    ratings = "userId,movieId,rating,timestamp\n" + "1,2,4.0,964982703\n" * 20
    (tmp_path / "r.csv.gz").write_bytes(gzip.compress(ratings.encode())[:30])
    msg = data_error(MOVIELENS, tmp_path / "r.csv.gz")
    assert "r.csv.gz" in msg and "truncated or corrupt" in msg


def test_bytes_that_are_not_utf8_are_a_bad_row_of_their_line_and_column(tmp_path: Path) -> None:
    lines = [criteo_line(i1=str(i)).encode() for i in range(5)]
    lines[2] = lines[2].replace(b"c18", b"c\xff18")
    f = tmp_path / "u.tsv"
    f.write_bytes(b"\n".join(lines) + b"\n")
    msg = data_error(CRITEO, f)
    assert msg.startswith(f"{f}: line 3, column 'C18': bad value b'c\\xff18' is not UTF-8"), msg
    assert "expected UTF-8 encoded text" in msg
    report = ReadReport()
    t = read_table(CRITEO, f, max_bad_rows=1, report=report)
    assert t["I1"].to_pylist() == [0.0, 1.0, 3.0, 4.0]
    assert report.bad_rows == 1 and "line 3, column 'C18'" in report.examples[0]


def _parquet_table(n: int) -> dict[str, list]:
    cols: dict[str, list] = {c: [f"c{i}" for i in range(n)] for c in CRITEO_COLUMNS}
    cols.update({f"I{i}": [1.0] * n for i in range(1, 14)})
    cols["label"] = [i % 2 for i in range(n)]
    return cols


def test_a_parquet_list_column_is_one_error_naming_file_and_column(tmp_path: Path) -> None:
    schema = dataclasses.replace(CRITEO, source=SourceSpec(format="parquet"))
    cols = _parquet_table(3)
    cols["C3"] = [["a", "b"], ["c"], []]
    pq.write_table(pa.table(cols), tmp_path / "l.parquet")
    for bad in (0, 100):
        msg = data_error(schema, tmp_path / "l.parquet", max_bad_rows=bad)
        assert "l.parquet" in msg and "column 'C3' is a Parquet list<" in msg, msg
        assert "expected one scalar value" in msg


def test_a_wrong_typed_parquet_cell_is_a_bad_row(tmp_path: Path) -> None:
    schema = dataclasses.replace(CRITEO, source=SourceSpec(format="parquet"))
    cols = _parquet_table(4)
    cols["I2"] = ["1", "2", "many", "4"]
    pq.write_table(pa.table(cols), tmp_path / "w.parquet")
    msg = data_error(schema, tmp_path / "w.parquet")
    assert "w.parquet: row 3, column 'I2'" in msg and "'many'" in msg and "expected a finite" in msg
    report = ReadReport()
    t = read_table(schema, tmp_path / "w.parquet", max_bad_rows=1, report=report)
    assert t["I2"].to_pylist() == [1.0, 2.0, 4.0] and report.bad_rows == 1
