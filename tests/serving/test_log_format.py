"""The prediction log's file layout: a scored call's rows, atomic files, reading a folder."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from serving import log_format
from serving.calls import ScoredCall
from serving.log_format import (
    META_COLUMNS,
    call_table,
    calls_table,
    features_of,
    file_name,
    log_files,
    outputs_of,
    read_logs,
    write_file,
)


def _call(request_id: str = "r1", version: int = 2, rows: int = 3) -> ScoredCall:
    return ScoredCall(
        request_id=request_id,
        timestamp=1700000000.25,
        protocol="http",
        model="lin",
        version=version,
        signature="serving_default",
        arm="canary",
        shadow=False,
        features={
            "user": np.array([b"u1"] * rows, dtype=object),
            "item": np.arange(rows, dtype=np.int64),
            "price": np.linspace(0, 1, rows, dtype=np.float32),
        },
        outputs={
            "score": np.full((rows, 1), 0.5, np.float32),
            "emb": np.arange(2 * rows, dtype=np.float32).reshape(rows, 2),
        },
    )


def test_call_table_has_one_row_per_scored_row():
    t = call_table(_call())
    assert t.column_names[: len(META_COLUMNS)] == list(META_COLUMNS)
    assert t.num_rows == 3
    assert t.column("row").to_pylist() == [0, 1, 2]
    assert set(t.column("request_id").to_pylist()) == {"r1"}
    assert t.column("feature.user").type == pa.binary()
    assert t.column("feature.item").to_pylist() == [0, 1, 2]
    assert t.column("output.score").type == pa.float32()
    assert t.column("output.emb").to_pylist()[2] == [4.0, 5.0]
    assert sorted(features_of(t)) == ["item", "price", "user"]
    assert sorted(outputs_of(t)) == ["emb", "score"]


def test_call_table_refuses_rows_that_differ():
    call = _call()
    bad = ScoredCall(**{**call.__dict__, "outputs": {"score": np.zeros(5, np.float32)}})
    with pytest.raises(ValueError, match="differ in rows"):
        call_table(bad)


def test_files_are_atomic_and_read_back_in_order(tmp_path):
    assert file_name(1700000000123, 42, 7) == "part-1700000000123-42-000007.parquet"
    write_file(tmp_path / "lin" / file_name(2, 1, 0), call_table(_call("b", rows=2)))
    write_file(tmp_path / "lin" / file_name(1, 1, 0), call_table(_call("a", rows=1)))
    write_file(tmp_path / "other" / file_name(1, 1, 0), call_table(_call("c", rows=1)))
    # a file being written is hidden, and never read
    (tmp_path / "lin" / ".part-3.parquet").write_bytes(b"partial")
    t = read_logs([tmp_path], model="lin")
    assert t.column("request_id").to_pylist() == ["a", "b", "b"]
    assert len(log_files([tmp_path])) == 3
    with pytest.raises(ValueError, match="no prediction log files"):
        read_logs([tmp_path], model="missing")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_logs([tmp_path / "nope"])
    pq.write_table(pa.table({"x": [1]}), tmp_path / "lin" / "part-9.parquet")
    with pytest.raises(ValueError, match="not a prediction log file"):
        read_logs([tmp_path / "lin"])


def test_files_keep_dictionaries_and_statistics_for_the_metadata_only(tmp_path):
    """A log file dictionary-encodes the metadata strings (a call's rows repeat them) and stores
    features and outputs plain, with min/max statistics for the metadata columns only; it
    reads back equal."""
    table = calls_table([_call(f"r{i}", rows=4) for i in range(3)])
    path = write_file(tmp_path / "lin" / file_name(1, 1, 0), table)
    assert pq.read_table(path).equals(table)
    group = pq.ParquetFile(path).metadata.row_group(0)
    chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    for name, chunk in chunks.items():
        dictionary = "RLE_DICTIONARY" in chunk.encodings
        assert dictionary == (name in log_format.DICTIONARY_COLUMNS), (name, chunk.encodings)
        assert chunk.is_stats_set == (name in META_COLUMNS), name
    assert {"feature.user", "output.score", "request_id", "row"} <= set(chunks)


@pytest.mark.parametrize(
    ("compression", "stored"), [("snappy", "SNAPPY"), ("zstd", "ZSTD"), ("none", "UNCOMPRESSED")]
)
def test_files_are_written_with_the_compression_asked_for(tmp_path, compression, stored):
    table = calls_table([_call(f"r{i}", rows=4) for i in range(3)])
    path = write_file(tmp_path / "lin" / file_name(1, 1, 0), table, compression)
    assert pq.read_table(path).equals(table)
    group = pq.ParquetFile(path).metadata.row_group(0)
    assert {group.column(i).compression for i in range(group.num_columns)} == {stored}


def test_an_unknown_compression_is_refused(tmp_path):
    table = calls_table([_call("r0")])
    with pytest.raises(ValueError, match=r"log compression must be one of \('snappy'"):
        write_file(tmp_path / "x.parquet", table, "gzip")
    assert not list(tmp_path.iterdir())


def test_calls_whose_features_differ_in_order_or_kind_convert_as_one_by_one():
    """The features of a call in another order, or as lists rather than arrays, make runs of
    their own; the rows equal those of each call converted alone."""
    a = _call("a")
    b = dataclasses.replace(a, request_id="b", features=dict(reversed(a.features.items())))
    c = dataclasses.replace(a, request_id="c", features={k: list(v) for k, v in a.features.items()})
    calls = [a, b, c, a]
    one_by_one = pa.concat_tables([call_table(k) for k in calls], promote_options="permissive")
    together = calls_table(calls)
    assert together.equals(one_by_one)
    assert (
        together.column("request_id").to_pylist() == ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["a"] * 3
    )
    assert together.column("feature.user").to_pylist() == [b"u1"] * 12


def _varied(i: int) -> ScoredCall:
    """Calls of three layouts and odd values: str, bytes and numpy string features, a 2-D
    feature, a scalar and a wide output, an empty call."""
    rows = i % 4
    kinds = [
        {"user": np.array([b"u", "v", b"w"][:rows] + [b"x"] * (rows - 3), dtype=object)},
        {"user": np.array(["a"] * rows, "U1"), "n": np.arange(rows * 2).reshape(rows, 2)},
        {"user": np.array([b"q"] * rows, "S1"), "f": np.ones(rows, np.float64)},
    ]
    outputs = {"score": np.full((rows, 1), i, np.float32), "emb": np.ones((rows, 3), np.float32)}
    return ScoredCall(
        f"r{i}", 1.5 + i, "grpc", "m", i, "sig", f"arm{i}", i % 2 == 0, kinds[(i // 2) % 3], outputs
    )


def test_many_calls_make_the_rows_of_each_call_in_order():
    calls = [_varied(i) for i in range(14)]
    one_by_one = pa.concat_tables([call_table(c) for c in calls], promote_options="permissive")
    together = calls_table(calls)
    assert together.equals(one_by_one)
    assert together.num_rows == sum(i % 4 for i in range(14))
    assert together.column("request_id").to_pylist()[:3] == ["r1", "r2", "r2"]
    assert together.column("row").to_pylist()[:3] == [0, 0, 1]
    assert together.column("feature.user").to_pylist()[:3] == [b"u", b"a", b"a"]
    assert together.column("feature.n").to_pylist()[:3] == [None, 0, 2]  # a 2-D feature's first
    assert together.column("output.emb").to_pylist()[0] == [1.0, 1.0, 1.0]
    assert together.column("output.score").to_pylist()[:2] == [1.0, 2.0]
    # values that are neither bytes nor str are logged by their str()
    odd = dataclasses.replace(_call(), features={"user": np.array([7, 8, 9], dtype=object)})
    assert calls_table([odd]).column("feature.user").to_pylist() == [b"7", b"8", b"9"]
    with pytest.raises(ValueError, match="no calls"):
        calls_table([])


def test_a_paused_conversion_steps_over_pieces_and_equals_the_whole(monkeypatch):
    """With ``pause``: every column of every piece of at most PIECE_ROWS rows is one step
    between two pauses, and the table equals the one converted in one go."""
    monkeypatch.setattr(log_format, "PIECE_ROWS", 4)
    monkeypatch.setattr(log_format, "PIECE_CALLS", 3)
    calls = [_call(f"r{i}", rows=rows) for i, rows in enumerate([1, 2, 3, 5, 1, 1])]
    pauses: list[int] = []
    paused = calls_table(calls, pause=lambda: pauses.append(1))
    whole = calls_table(calls)
    assert paused.equals(whole) and paused.num_rows == 13
    # pieces by rows: [1, 2] [3] [5] [1, 1]: every column in 4 chunks, a call never split
    for name in paused.column_names:
        assert [len(c) for c in paused.column(name).chunks] == [3, 3, 5, 2]
    columns = len(META_COLUMNS) + 3 + 2  # metadata, the features, the outputs
    assert len(pauses) == 6 // 3 + 4 * columns  # each 3 calls' layouts, each piece's columns
    assert [len(c) for c in whole.column("row").chunks] == [13]  # no pause: one piece
