"""Input partitions: text chunks start at line starts and cover the file; a chunk's reads name the
file's own line numbers; Parquet chunks and shard parts are whole row groups."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import partitions
from features.read_report import DataError, ReadReport
from features.readers import read_batches
from features.schema import schema_from_dict
from tests.testdata import SMALL_CSV_FIELDS, write_small_csv

SCHEMA = schema_from_dict(
    {
        "name": "t",
        "source": {"format": "csv", "delimiter": ",", "header": True},
        "fields": SMALL_CSV_FIELDS,
    }
)
_write = write_small_csv


def test_text_chunks_cut_after_a_line_end_and_cover_the_file(tmp_path):
    f = tmp_path / "a.csv"
    f.write_bytes(b"aaaa\nbb\ncccccccc\nd\n")  # line ends at offsets 4, 7, 16, 18
    chunks = partitions.text_chunks(f, chunk_bytes=6)
    assert [(c.start, c.end) for c in chunks] == [(0, 8), (8, 17), (17, 19)]
    assert [partitions.count_line_ends(c) for c in chunks] == [2, 1, 1]
    assert partitions.first_lines(chunks, [2, 1, 1]) == [1, 3, 4]
    assert [(c.start, c.end) for c in partitions.text_chunks(f, chunk_bytes=100)] == [(0, 19)]


def test_a_compressed_file_is_one_chunk_read_whole(tmp_path):
    f = tmp_path / "a.csv.gz"
    f.write_bytes(gzip.compress(b"y,a,x\n" + b"1,v,2\n" * 1000))
    [chunk] = partitions.text_chunks(f, chunk_bytes=10)
    assert chunk.whole and chunk.first_of_file
    batches = [e for e in partitions.chunk_events(SCHEMA, chunk, {}) if not isinstance(e, str)]
    assert sum(b.num_rows for b in batches) == 1000


def test_chunk_reads_name_the_lines_one_read_of_the_file_names(tmp_path):
    bad = {5: "1,v,five", 900: "0,v", 1800: "2,v,1"}  # a bad number, a short line, a bad label
    f = _write(tmp_path / "d.csv", 2000, bad)
    chunks = partitions.text_chunks(f, chunk_bytes=2000)
    assert len(chunks) == 11
    ends = [partitions.count_line_ends(c) for c in chunks]
    first = partitions.first_lines(chunks, ends)
    messages, rows = [], []
    for c, line in zip(chunks, first, strict=True):
        for e in partitions.chunk_events(SCHEMA, c, {}, line):
            if isinstance(e, str):
                messages.append(e)
            else:
                rows.append(e)
    report = ReadReport()
    whole = pa.Table.from_batches(list(read_batches(SCHEMA, f, max_bad_rows=3, report=report)))
    assert pa.Table.from_batches(rows).equals(whole)
    assert messages == report.examples
    assert [m.split(": line ")[1].split(",")[0].split(":")[0] for m in messages] == [
        "5",
        "900",
        "1800",
    ]
    with pytest.raises(DataError) as one:
        list(read_batches(SCHEMA, f))
    assert one.value.args[0] == messages[0]


def test_parquet_chunks_and_shard_parts_are_whole_row_groups(tmp_path):
    t = pa.table({"x": list(range(10))})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=3)  # groups of 3, 3, 3, 1
    pq.write_table(t.slice(0, 4), tmp_path / "b.parquet", row_group_size=4)
    chunks = partitions.parquet_chunks(tmp_path / "a.parquet", chunk_rows=5)
    assert [(c.row_groups, c.first_row, c.rows) for c in chunks] == [((0, 2), 0, 6), ((2, 4), 6, 4)]
    parts = partitions.shard_parts([tmp_path / "a.parquet", tmp_path / "b.parquet"], part_rows=5)
    assert [(Path(p.path).name, p.first_row, p.rows, p.offset) for p in parts] == [
        ("a.parquet", 0, 6, 0),
        ("a.parquet", 6, 4, 6),
        ("b.parquet", 0, 4, 10),
    ]
    (tmp_path / "c.parquet").write_bytes(b"not parquet")
    [broken] = partitions.parquet_chunks(tmp_path / "c.parquet")
    assert broken.error
    with pytest.raises(DataError, match=r"c\.parquet: not a readable Parquet file \(") as e:
        partitions.shard_parts([tmp_path / "c.parquet"])
    assert "--schema" not in str(e.value)
    (tmp_path / "log.csv").write_text("user,item,click\n1,2,0\n")
    with pytest.raises(DataError, match=r"log\.csv: not a readable Parquet file \(.*\); a raw"):
        partitions.shard_parts([tmp_path / "log.csv"])
