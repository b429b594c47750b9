"""Tests of ``stitchrec windows`` (``features.windows``): a CSV log cut into time windows."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.read_report import DataError
from features.window_files import PartWriters, csv_header, read_blocks
from features.windows import (
    REPORT,
    WindowSpec,
    cut_windows,
    merge_small,
    period_keys,
    period_name,
)
from pipelines.cli import main
from tests.conftest import shared_data_dir

JAN_1_2024 = 1704067200  # Monday 2024-01-01 00:00:00 UTC
DAY = 86400


def _write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text(header + "\n" + "".join(r + "\n" for r in rows))
    return path


def _rows(folder: Path) -> list[list[str]]:
    """The header and rows of a window's CSV part."""
    with (folder / "part-00000.csv").open(newline="") as f:
        return list(csv.reader(f))


def _windows(out: Path) -> list[dict]:
    return json.loads((out / REPORT).read_text())["windows"]


def test_day_boundaries_in_time_order_rows_in_input_order(tmp_path: Path) -> None:
    log = _write(
        tmp_path / "log.csv",
        "user,item,timestamp",
        [
            f"u1,a,{JAN_1_2024 + DAY}",  # 2024-01-02 00:00:00
            f"u2,b,{JAN_1_2024 + DAY - 1}",  # 2024-01-01 23:59:59
            f'u3,"c,d",{JAN_1_2024}',
            f"u4,e,{JAN_1_2024 + 3 * DAY + 5}",  # 2024-01-04: no row on the 3rd
            f"u5,f,{JAN_1_2024 + DAY + 7}",
        ],
    )
    report = cut_windows(log, tmp_path / "out", WindowSpec(by="day"))
    assert [w["name"] for w in report["windows"]] == ["2024-01-01", "2024-01-02", "2024-01-04"]
    assert [w["folder"] for w in report["windows"]] == ["window-000", "window-001", "window-002"]
    assert [w["rows"] for w in report["windows"]] == [2, 2, 1]
    assert report["rows"] == 5
    w0 = report["windows"][0]
    assert (w0["first"], w0["last"]) == (JAN_1_2024, JAN_1_2024 + DAY - 1)
    assert (w0["first_utc"], w0["last_utc"]) == ("2024-01-01T00:00:00Z", "2024-01-01T23:59:59Z")
    out = tmp_path / "out"
    assert _rows(out / "window-000") == [
        ["user", "item", "timestamp"],
        ["u2", "b", str(JAN_1_2024 + DAY - 1)],
        ["u3", "c,d", str(JAN_1_2024)],
    ]
    assert [r[0] for r in _rows(out / "window-001")[1:]] == ["u1", "u5"]
    assert (out / "window-000" / "part-00000.csv").read_text().splitlines()[2] == (
        f'u3,"c,d",{JAN_1_2024}'
    )
    assert _windows(out) == report["windows"]


def test_weeks_start_monday_utc(tmp_path: Path) -> None:
    sunday_last = JAN_1_2024 + 7 * DAY - 1  # Sunday 2024-01-07 23:59:59
    log = _write(
        tmp_path / "log.csv",
        "item,ts",
        [f"a,{JAN_1_2024}", f"b,{sunday_last}", f"c,{sunday_last + 1}", f"d,{JAN_1_2024 - 1}"],
    )
    report = cut_windows(log, tmp_path / "out", WindowSpec(time="ts", by="week"))
    assert [(w["name"], w["rows"]) for w in report["windows"]] == [
        ("2023-W52", 1),
        ("2024-W01", 2),
        ("2024-W02", 1),
    ]
    assert [r[0] for r in _rows(tmp_path / "out" / "window-001")[1:]] == ["a", "b"]


def test_weeks_around_the_epoch() -> None:
    # 1970-01-01 was a Thursday: its week started on Monday 1969-12-29 (ISO week 1970-W01).
    spec = WindowSpec(by="week")
    times = np.array([-3 * DAY - 1, -3 * DAY, 0, 4 * DAY - 1, 4 * DAY], dtype=np.int64)
    keys = period_keys(times, spec)
    assert keys.tolist() == [-1, 0, 0, 0, 1]
    assert [period_name(k, spec, 5) for k in (-1, 0, 1)] == ["1969-W52", "1970-W01", "1970-W02"]


def test_month_and_year_boundaries_with_iso_text(tmp_path: Path) -> None:
    log = _write(
        tmp_path / "log.csv",
        "id,when",
        [
            "1,2024-01-31T23:59:59Z",
            "2,2024-02-01T00:00:00",
            "3,2024-02-01T00:30:00+01:00",  # 2024-01-31 23:30 UTC
            "4,2023-12-31 23:00:00",
            "5,2024-02-29T12:00:00Z",
        ],
    )
    spec = WindowSpec(time="when", by="month", time_format="iso")
    report = cut_windows(log, tmp_path / "m", spec)
    assert [(w["name"], w["rows"]) for w in report["windows"]] == [
        ("2023-12", 1),
        ("2024-01", 2),
        ("2024-02", 2),
    ]
    assert [r[0] for r in _rows(tmp_path / "m" / "window-001")[1:]] == ["1", "3"]
    assert _rows(tmp_path / "m" / "window-001")[2] == ["3", "2024-02-01T00:30:00+01:00"]
    years = cut_windows(log, tmp_path / "y", WindowSpec(time="when", by="year", time_format="iso"))
    assert [(w["name"], w["rows"]) for w in years["windows"]] == [("2023", 1), ("2024", 4)]


def test_rows_windows_follow_time_order_ties_in_input_order(tmp_path: Path) -> None:
    log = _write(tmp_path / "log.csv", "r,t", ["r0,5", "r1,1", "r2,3", "r3,2", "r4,4", "r5,3"])
    report = cut_windows(log, tmp_path / "out", WindowSpec(time="t", by="rows:2"))
    # time order: r1 (1), r3 (2), r2 (3), r5 (3), r4 (4), r0 (5)
    assert [w["name"] for w in report["windows"]] == ["rows-0-1", "rows-2-3", "rows-4-5"]
    got = [[r[0] for r in _rows(tmp_path / "out" / w["folder"])[1:]] for w in report["windows"]]
    assert got == [["r1", "r3"], ["r2", "r5"], ["r0", "r4"]]
    four = cut_windows(log, tmp_path / "four", WindowSpec(time="t", by="rows:4"))
    assert [(w["name"], w["rows"]) for w in four["windows"]] == [("rows-0-3", 4), ("rows-4-5", 2)]


def test_merge_small() -> None:
    assert merge_small(np.array([1, 3, 1, 1]), 2) == [[0, 1], [2, 3]]
    assert merge_small(np.array([3, 3, 1]), 2) == [[0], [1, 2]]  # the last joins the one before
    assert merge_small(np.array([1, 1]), 5) == [[0, 1]]
    assert merge_small(np.array([1, 2]), 0) == [[0], [1]]


def test_min_rows_merges_small_days_into_the_next(tmp_path: Path) -> None:
    days = [0, 1, 1, 1, 2, 4, 5]  # rows a day: 1, 3, 1, (none on 3), 1, 1
    log = _write(
        tmp_path / "log.csv",
        "i,t",
        [f"{i},{JAN_1_2024 + d * DAY + i}" for i, d in enumerate(days)],
    )
    report = cut_windows(log, tmp_path / "out", WindowSpec(time="t", by="day", min_rows=2))
    assert [(w["name"], w["periods"], w["rows"]) for w in report["windows"]] == [
        ("2024-01-01..2024-01-02", 2, 4),
        ("2024-01-03..2024-01-06", 3, 3),
    ]
    assert [r[0] for r in _rows(tmp_path / "out" / "window-001")[1:]] == ["4", "5", "6"]
    merged = cut_windows(log, tmp_path / "rows", WindowSpec(time="t", by="rows:3", min_rows=2))
    assert [(w["name"], w["rows"]) for w in merged["windows"]] == [
        ("rows-0-2", 3),
        ("rows-3-6", 4),
    ]


def test_count_distinct_and_new_values_by_hand(tmp_path: Path) -> None:
    log = _write(
        tmp_path / "log.csv",
        "user,item,t",
        [
            "u1,a,0",
            f"u1,c,{DAY}",
            "u2,b,5",
            f"u2,a,{DAY + 1}",
            f"u1,c,{2 * DAY}",
            f"u3,,{2 * DAY}",
            f"u3,d,{2 * DAY + 9}",
            f"u1,d,{2 * DAY + 9}",
        ],
    )
    spec = WindowSpec(time="t", by="day", count=("item", "user"))
    report = cut_windows(log, tmp_path / "out", spec)
    # day 0: items {a, b}, users {u1, u2}; day 1: {c, a}, {u1, u2}; day 2: {c, d} (and an
    # empty cell), {u1, u3}
    assert [w["count"] for w in report["windows"]] == [
        {"item": {"distinct": 2, "new": 2}, "user": {"distinct": 2, "new": 2}},
        {"item": {"distinct": 2, "new": 1}, "user": {"distinct": 2, "new": 0}},
        {"item": {"distinct": 2, "new": 1}, "user": {"distinct": 2, "new": 1}},
    ]
    assert report["count"] == ["item", "user"]


def test_small_blocks_and_parquet_output(tmp_path: Path) -> None:
    rows = [f"u{i % 3},x{i},{(i * 7919) % 5 * DAY + i}" for i in range(40)]
    log = _write(tmp_path / "log.csv", "user,item,t", rows)
    spec = WindowSpec(time="t", by="day", block_size=64)
    assert len(list(read_blocks(log, csv_header(log), None, 64))) > 3
    csv_report = cut_windows(log, tmp_path / "c", spec)
    pq_spec = WindowSpec(time="t", by="day", block_size=64, output_format="parquet")
    pq_report = cut_windows(log, tmp_path / "p", pq_spec)
    assert [w["rows"] for w in pq_report["windows"]] == [w["rows"] for w in csv_report["windows"]]
    for w in csv_report["windows"]:
        from_csv = _rows(tmp_path / "c" / w["folder"])
        table = pq.read_table(tmp_path / "p" / w["folder"] / "part-00000.parquet")
        assert table.column_names == from_csv[0] == ["user", "item", "t"]
        assert [list(r.values()) for r in table.to_pylist()] == from_csv[1:]
        assert [int(r[2]) // DAY for r in from_csv[1:]] == [w["first"] // DAY] * w["rows"]
        items = [int(r[1][1:]) for r in from_csv[1:]]
        assert items == sorted(items)  # input order


def test_part_writers_reopen_append_csv_and_continue_parquet(tmp_path: Path) -> None:
    names = ["a", "b"]
    batch = pa.record_batch([pa.array(["1", None]), pa.array(["x", "y,z"])], names=names)
    for fmt in ("csv", "parquet"):
        folders = [tmp_path / fmt / "w0", tmp_path / fmt / "w1"]
        writers = PartWriters(folders, names, fmt, max_open=1)
        for w in (0, 1, 0):
            writers.write(w, batch)
        writers.close()
        if fmt == "csv":
            assert (folders[0] / "part-00000.csv").read_text() == 'a,b\n1,x\n,"y,z"\n1,x\n,"y,z"\n'
        else:
            assert sorted(p.name for p in folders[0].iterdir()) == [
                "part-00000.parquet",
                "part-00001.parquet",
            ]
    with pytest.raises(ValueError, match="output_format"):
        PartWriters([], names, "tsv")


def test_missing_columns_and_bad_timestamps(tmp_path: Path) -> None:
    log = _write(tmp_path / "log.csv", "user,t", ["u1,10", "u2,11", "u3,12.5"])
    with pytest.raises(DataError, match=r"no column 'timestamp' \(the time\)"):
        cut_windows(log, tmp_path / "out", WindowSpec(by="day"))
    with pytest.raises(DataError, match=r"no column 'item' \(a --count column\)"):
        cut_windows(log, tmp_path / "out", WindowSpec(time="t", by="day", count=("item",)))
    with pytest.raises(DataError, match=r"data row 3 .*column 't' holds '12.5': expected integer"):
        cut_windows(log, tmp_path / "out", WindowSpec(time="t", by="day", block_size=16))
    empty = _write(tmp_path / "empty.csv", "user,t", ["u1,10", "u2,"])
    with pytest.raises(DataError, match=r"data row 2 .*holds an empty cell"):
        cut_windows(empty, tmp_path / "out", WindowSpec(time="t", by="day"))
    iso = _write(tmp_path / "iso.csv", "user,t", ["u1,2024-01-01", "u2,yesterday"])
    with pytest.raises(DataError, match=r"data row 2 .*'yesterday': expected an ISO-8601"):
        cut_windows(iso, tmp_path / "out", WindowSpec(time="t", by="day", time_format="iso"))
    millis = _write(tmp_path / "ms.csv", "user,t", ["u1,1704067200", "u2,1704067200000"])
    with pytest.raises(DataError, match=r"data row 2 .*'1704067200000'.*milliseconds"):
        cut_windows(millis, tmp_path / "out", WindowSpec(time="t", by="day"))
    header_only = _write(tmp_path / "h.csv", "user,t", [])
    with pytest.raises(DataError, match="no data rows"):
        cut_windows(header_only, tmp_path / "out", WindowSpec(time="t", by="day"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"by": "hour"}, "by must be one of"),
        ({"by": "rows:0"}, "by must be one of"),
        ({"by": "rows:x"}, "by must be one of"),
        ({"time_format": "excel"}, "time_format must be one of"),
        ({"min_rows": -1}, "min_rows must be"),
        ({"output_format": "tsv"}, "format must be one of"),
    ],
)
def test_spec_validates(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        WindowSpec(**{"by": "day", **kwargs})


def test_failing_run_leaves_no_output_and_keeps_an_earlier_one(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.csv", "name,t", ["a,0", f"b,{DAY}"])
    out = tmp_path / "out"
    cut_windows(good, out, WindowSpec(time="t", by="day"))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    # Only the second pass reads the name column: its bytes that are not UTF-8 fail there,
    # with the window folders half written.
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"name,t\nc,0\n\xff\xfe,5\nd,90000\n")
    with pytest.raises(DataError, match="could not parse CSV"):
        cut_windows(bad, out, WindowSpec(time="t", by="day"))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    with pytest.raises(DataError, match="could not parse CSV"):
        cut_windows(bad, tmp_path / "new", WindowSpec(time="t", by="day"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "good.csv", "out"]
    # An earlier output is replaced; any other folder is refused.
    cut_windows(good, out, WindowSpec(time="t", by="rows:1"))
    assert [w["name"] for w in _windows(out)] == ["rows-0-0", "rows-1-1"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match=r"not an earlier windows output .*notes\.txt"):
        cut_windows(good, tmp_path / "other", WindowSpec(time="t", by="day"))
    assert (tmp_path / "other" / "notes.txt").read_text() == "keep me"


def test_cli_writes_windows_and_reports_user_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write(tmp_path / "log.csv", "user,item,t", ["u1,a,0", f"u2,b,{DAY}", f"u1,b,{DAY}"])
    out = tmp_path / "out"
    args = ["windows", "--input", str(log), "--output", str(out), "--time", "t"]
    assert main([*args, "--by", "day", "--count", "item", "--count", "user"]) == 0
    printed = capsys.readouterr().out
    assert "window-001 1970-01-02: 2 rows, item 1 distinct (1 new), user 2 distinct (1 new)" in (
        printed
    )
    assert [w["rows"] for w in _windows(out)] == [1, 2]
    for extra, message in [
        (["--by", "hour"], "error: windows --by must be one of"),
        (["--by", "day", "--min-rows", "-2"], "error: windows --min-rows must be"),
        (["--by", "day", "--format", "tsv"], "error: windows --format must be one of"),
        (["--by", "day", "--count", "genre"], "error: "),
    ]:
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(message), err


def test_movielens_ratings_by_year(tmp_path: Path) -> None:
    ratings = shared_data_dir() / "movielens-latest-small" / "ratings.csv"
    if not ratings.exists():
        pytest.skip(f"MovieLens ratings not found at {ratings}")
    with ratings.open(newline="") as f:
        total = sum(1 for _ in f) - 1
    spec = WindowSpec(by="year", count=("movieId", "userId"))
    report = cut_windows(ratings, tmp_path / "ml", spec)
    windows = report["windows"]
    assert report["rows"] == total == sum(w["rows"] for w in windows)
    assert [w["name"] for w in windows] == sorted(w["name"] for w in windows)
    for a, b in itertools.pairwise(windows):
        assert a["last"] < b["first"]
    seen = 0
    for w in windows:
        rows = _rows(tmp_path / "ml" / w["folder"])
        assert rows[0] == ["userId", "movieId", "rating", "timestamp"]
        years = {str(np.datetime64(int(r[3]), "s").astype("datetime64[Y]")) for r in rows[1:]}
        assert years == {w["name"]}
        assert len(rows) - 1 == w["rows"]
        seen += w["count"]["movieId"]["new"]
        assert w["count"]["movieId"]["new"] <= w["count"]["movieId"]["distinct"]
    assert seen == len(set(csv_values(ratings, "movieId")))
    assert windows[0]["count"]["userId"]["new"] == windows[0]["count"]["userId"]["distinct"]


def csv_values(path: Path, column: str) -> list[str]:
    with path.open(newline="") as f:
        return [r[column] for r in csv.DictReader(f)]
