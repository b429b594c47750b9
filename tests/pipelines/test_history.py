"""Tests of ``stitchrec add-history`` (``features.history``): each row's previous items."""

from __future__ import annotations

import csv
import itertools
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from features.history import HistorySpec, add_history
from features.read_report import DataError
from features.schema import load_schema
from pipelines.cli import main
from tests.conftest import ROOT, shared_data_dir

LOG = """userId,movieId,rating,timestamp
u1,a,4.0,10
u2,x,3.0,5
u1,b,5.0,20
u1,c,3.0,20
u1,d,4.0,30
u2,y,5.0,5
u1,e,2.0,40
u2,z,4.0,7
"""
MOVIES = """movieId,title,genres
a,A film,Adv|Bio
b,B film,
c,C film,Com
d,D film,Doc|Epic
x,X film,Xmas
y,Y film,Youth
"""
# by hand: u1 a@10 b@20 c@20 d@30 e@40; u2 x@5 y@5 z@7 (y is later in the file than x)
EXPECTED = ["", "", "a", "a", "c|b|a", "", "d|c|b|a", "y|x"]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _log(tmp_path: Path, text: str = LOG) -> Path:
    path = tmp_path / "ratings.csv"
    path.write_text(text)
    return path


def test_history_is_strictly_earlier_newest_first(tmp_path: Path) -> None:
    out = tmp_path / "out" / "history.csv"
    assert add_history(_log(tmp_path), out, HistorySpec()) == 8
    rows = _rows(out)
    assert [r["hist_movieId"] for r in rows] == EXPECTED
    # the same rows, in the same order, with the same cells
    original = _rows(tmp_path / "ratings.csv")
    assert [{k: r[k] for k in original[0]} for r in rows] == original
    # same-timestamp rows do not see each other: b and c (t=20), x and y (t=5)
    assert rows[2]["hist_movieId"] == rows[3]["hist_movieId"] == "a"
    assert rows[1]["hist_movieId"] == rows[5]["hist_movieId"] == ""


def test_length_keeps_the_newest(tmp_path: Path) -> None:
    out = tmp_path / "h.csv"
    add_history(_log(tmp_path), out, HistorySpec(length=2, column="recent"))
    assert [r["recent"] for r in _rows(out)] == ["", "", "a", "a", "c|b", "", "d|c", "y|x"]


def test_attribute_columns_are_aligned_with_the_history(tmp_path: Path) -> None:
    (tmp_path / "movies.csv").write_text(MOVIES)
    out = tmp_path / "h.csv"
    spec = HistorySpec(attributes=tmp_path / "movies.csv", attribute="genres")
    add_history(_log(tmp_path), out, spec)
    rows = _rows(out)
    assert [r["genres_first"] for r in rows] == [
        "Adv", "Xmas", "(none)", "Com", "Doc", "Youth", "(none)", "(none)"
    ]  # fmt: skip
    assert rows[4]["hist_genres_first"] == "Com|(none)|Adv"
    assert rows[7]["hist_genres_first"] == "Youth|Xmas"
    for r in rows:
        assert len(r["hist_genres_first"].split("|")) == len(r["hist_movieId"].split("|"))


def test_iso_timestamps(tmp_path: Path) -> None:
    text = "user,item,when\nu,a,2024-01-02T00:00:00\nu,b,2024-01-01T12:00:00\nu,c,2024-01-03\n"
    out = tmp_path / "h.csv"
    add_history(_log(tmp_path, text), out, HistorySpec(user="user", item="item", time="when"))
    assert [r["hist_item"] for r in _rows(out)] == ["b", "", "a|b"]


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("userId,movieId,rating\nu,a,4\n", r"ratings.csv: no column 'timestamp' \(the time\)"),
        ("userId,movieId,timestamp\nu,a,1\nu,b,soon\n", r"line 3: column 'timestamp' holds 'soon'"),
        ("userId,movieId,timestamp\nu,a|b,1\n", r"line 2: column 'movieId' holds 'a\|b'"),
        ("userId,movieId,timestamp,hist_movieId\nu,a,1,x\n", r"already has the column"),
        ("userId,movieId,timestamp\n", r"input file '.*ratings.csv' has a header and no rows"),
    ],
)
def test_bad_input_is_a_data_error_and_writes_nothing(
    tmp_path: Path, text: str, pattern: str
) -> None:
    out = tmp_path / "h.csv"
    out.write_text("an earlier output\n")
    with pytest.raises(DataError, match=pattern):
        add_history(_log(tmp_path, text), out, HistorySpec())
    assert out.read_text() == "an earlier output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.csv", "ratings.csv"]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "add-history", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def test_cli_writes_the_history(tmp_path: Path, capsys) -> None:
    log, out = _log(tmp_path), tmp_path / "h.csv"
    assert main(["add-history", "--input", str(log), "--output", str(out), "--length", "3"]) == 0
    assert "wrote 8 rows with ['hist_movieId']" in capsys.readouterr().out
    assert [r["hist_movieId"] for r in _rows(out)][4] == "c|b|a"
    assert main(["add-history", "--input", str(log), "--output", str(log)]) == 2
    assert "is the --input file" in capsys.readouterr().err


def test_cli_refuses_a_missing_column_with_one_error_line(tmp_path: Path) -> None:
    log = _log(tmp_path)
    bad = _cli("--input", str(log), "--output", str(tmp_path / "g.csv"), "--user", "uid")
    assert bad.returncode == 2
    errors = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ")
    assert "no column 'uid' (the user)" in errors[0]
    assert not (tmp_path / "g.csv").exists()


def test_movielens_rows_see_only_earlier_ratings(tmp_path: Path) -> None:
    ratings = shared_data_dir() / "movielens-latest-small" / "ratings.csv"
    if not ratings.exists():
        pytest.skip(f"MovieLens ratings not found at {ratings}")
    with ratings.open() as f:
        head = "".join(itertools.islice(f, 3_001))
    out = tmp_path / "h.csv"
    add_history(_log(tmp_path, head), out, HistorySpec(length=5))
    rows = _rows(out)
    assert len(rows) == 3_000
    seen: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        seen.setdefault((r["userId"], r["movieId"]), []).append(int(r["timestamp"]))
    for r in rows:
        t, hist = int(r["timestamp"]), [h for h in r["hist_movieId"].split("|") if h]
        earlier_times = [[s for s in seen[(r["userId"], m)] if s < t] for m in hist]
        assert all(earlier_times), (r, hist)  # every history item was rated strictly earlier
        times = [max(ts) for ts in earlier_times]
        assert times == sorted(times, reverse=True)  # newest first
        earlier = sum(s < t for (u, _), ss in seen.items() if u == r["userId"] for s in ss)
        assert len(hist) == min(5, earlier)


def test_shipped_schema_names_the_written_columns(tmp_path: Path) -> None:
    path = ROOT / "features" / "schemas" / "movielens_history.toml"
    fields = {f["name"]: f for f in tomllib.loads(path.read_text())["fields"]}
    assert fields["hist_movieId"]["kind"] == "sequence"
    assert fields["hist_movieId"]["shares_embedding_with"] == "movieId"
    assert fields["hist_genres_first"]["aligned_with"] == "hist_movieId"
    assert fields["click"] == {"name": "click", "kind": "label", "column": "rating", "threshold": 4}
    assert fields["love"]["defined_on"] == "click" and fields["love"]["threshold"] == 5
    (tmp_path / "movies.csv").write_text(MOVIES)
    out = tmp_path / "h.csv"
    add_history(
        _log(tmp_path), out, HistorySpec(attributes=tmp_path / "movies.csv", attribute="genres")
    )
    header = set(_rows(out)[0])
    assert {f.get("column", name) for name, f in fields.items()} <= header


def test_shipped_schema_loads() -> None:
    schema = load_schema("movielens_history")
    assert [f.name for f in schema.labels] == ["click", "love"]
    assert schema.label.name == "click" and schema.field("love").defined_on == "click"
    assert schema.field("hist_movieId").max_len == 20


def test_missing_files_and_an_attribute_table_with_repeated_items_are_refused(
    tmp_path: Path,
) -> None:
    log, out = _log(tmp_path), tmp_path / "h.csv"
    with pytest.raises(DataError, match=r"^input file '.*nope.csv' does not exist: expected a CSV"):
        add_history(tmp_path / "nope.csv", out, HistorySpec())
    spec = HistorySpec(attributes=tmp_path / "nope.csv", attribute="genres")
    with pytest.raises(DataError, match=r"^attributes file '.*nope.csv' does not exist"):
        add_history(log, out, spec)
    tags = tmp_path / "tags.csv"  # one row per (item, tag), as MovieLens tags.csv
    tags.write_text("movieId,tag\na,funny\nb,dark\na,long\n")
    spec = HistorySpec(attributes=tags, attribute="tag")
    with pytest.raises(
        DataError, match=r"item 'a' of column 'movieId' is on lines 2 and 4: expected"
    ):
        add_history(log, out, spec)
    assert not out.exists()
