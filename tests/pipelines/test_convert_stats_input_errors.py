"""`stitchrec convert` and `stitchrec stats` on input they cannot use: files that are not the
schema's text, a line that is neither the right width nor UTF-8, a --cluster that is not an
address, a folder of subfolders. Each is one `error:` line and exit status 2, never a
traceback or Python's "Exception ignored" report; and stats.json is strict JSON."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.read_report import DataError
from features.readers import read_batches
from features.schema import load_schema
from features.stats import DatasetStats
from pipelines.cli import main
from pipelines.errors import UsageError
from tests.features.test_readers import criteo_line

ROOT = Path(__file__).resolve().parents[2]
RATINGS_HEADER = "userId,movieId,rating,timestamp\n"


def _stitchrec(*args: str) -> subprocess.CompletedProcess:
    """The console script's entry (``pipelines.cli.entry``) in a process of its own, so
    standard error holds all that Python prints, "Exception ignored" reports included."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import sys; from pipelines.cli import entry; sys.exit(entry())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120
    )


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert lines[0].isascii() and lines[0].isprintable(), lines[0]
    return lines[0]


def _ratings(folder: Path, body: bytes) -> Path:
    """A MovieLens ratings file with its movies.csv side table next to it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "movies.csv").write_text("movieId,title,genres\n2,x,Comedy\n")
    path = folder / "ratings.csv"
    path.write_bytes(RATINGS_HEADER.encode() + body)
    return path


@pytest.mark.parametrize(
    "command, schema, delimiter",
    [("convert", "movielens", "comma"), ("convert", "criteo", "tab"), ("stats", "criteo", "tab")],
)
def test_parquet_files_given_to_a_csv_schema_are_one_error_line(
    tmp_path, command, schema, delimiter
):
    folder = tmp_path / "train"
    folder.mkdir()
    pq.write_table(pa.table({"a": list(range(100)), "b": [1.5] * 100}), folder / "p.parquet")
    out = str(tmp_path / "out")
    p = _stitchrec(command, "--schema", schema, "--input", str(folder), "--output", out)
    line = _one_error_line(p)
    assert line.startswith(
        f"error: file '{folder / 'p.parquet'}' could not be read as {delimiter}-separated CSV "
        f"text: it starts with 'PAR1', the mark of a Parquet file; expected a {delimiter}-"
        f"separated CSV text file (a Parquet file is read with a schema whose [source] format "
        f'is "parquet")'
    ), line


def test_a_binary_file_and_a_header_with_a_carriage_return_are_data_errors(tmp_path):
    binary = tmp_path / "day.tsv"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    with pytest.raises(DataError) as e:
        list(read_batches(load_schema("criteo"), binary))
    assert str(e.value) == (
        f"file '{binary}' could not be read as tab-separated CSV text: its byte at offset 7 is "
        f"NUL, so it looks like a binary file; expected a tab-separated CSV text file"
    )
    mac = _ratings(tmp_path / "mac", b"")
    mac.write_bytes(b"userId,movieId,rating,timestamp\r1,2,4.0,964982703\r")
    with pytest.raises(DataError, match=r"its first line .* could not be read as a comma-"):
        list(read_batches(load_schema("movielens"), mac))


@pytest.mark.parametrize("chunk_mb", ["64", "0.00003"])  # one chunk; a chunk of ~31 bytes
def test_a_short_line_that_is_not_utf8_is_one_error_line_with_its_number(tmp_path, chunk_mb):
    good = b"1,2,4.0,964982703\n"
    path = _ratings(tmp_path, good * 4 + b"\xff\xfe\x01,7\n" + good)
    p = _stitchrec(
        "convert", "--schema", "movielens", "--input", str(path), "--output",
        str(tmp_path / "out"), "--chunk-mb", chunk_mb,
    )  # fmt: skip
    line = _one_error_line(p)
    assert line == (
        f"error: {path}: line 6: expected 4 comma-separated columns, found 2, and the line is "
        "not UTF-8 text: '\\ufffd\\ufffd\\x01,7' (\\ufffd: bytes that are not UTF-8); expected "
        "UTF-8 text"
    )


@pytest.mark.parametrize("command", ["stats", "convert"])
@pytest.mark.parametrize(
    "address, problem",
    [("bogus", "no port"), ("tcp://h:x", "port 'x' is not a number"), ("ftp://h:1", "unknown")],
)
def test_a_cluster_that_is_not_an_address_is_one_error_line_at_once(
    tmp_path, capsys, command, address, problem
):
    path = _ratings(tmp_path, b"1,2,4.0,964982703\n")
    argv = [command, "--schema", "movielens", "--input", str(path)]
    t0 = time.monotonic()
    rc = main([*argv, "--output", str(tmp_path / "out"), "--cluster", address])
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 5
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: --cluster {address!r}: {problem}"), err
    assert "expected HOST:PORT or SCHEME://HOST:PORT" in err and "tcp://HOST:8786" in err


def test_check_address_takes_the_forms_dask_connects_to():
    from pipelines.engines import check_address

    for ok in ("tcp://10.0.0.1:8786", "localhost:8786", "[::1]:8786", "tls://[fe80::1]:1"):
        check_address(ok, "--cluster")
    for bad, problem in [
        ("tcp://", "no HOST:PORT"),
        ("tcp://:8786", "no host"),
        ("::1", "an IPv6 host needs brackets"),
        ("h:0", "port 0 is out of range"),
        ("h:65536", "port 65536 is out of range"),
    ]:
        with pytest.raises(UsageError, match=rf"^--cluster '{bad}': {problem}; expected "):
            check_address(bad, "--cluster")


def test_stats_json_writes_null_for_the_min_and_max_of_a_field_without_values(tmp_path, capsys):
    tsv = tmp_path / "day.tsv"
    tsv.write_text("".join(criteo_line(i1="", label=str(i % 2)) + "\n" for i in range(20)))
    out = tmp_path / "stats"
    assert main(["stats", "--schema", "criteo", "--input", str(tsv), "--output", str(out)]) == 0
    capsys.readouterr()

    def refuse(constant: str) -> None:
        raise AssertionError(f"stats.json holds {constant}, which is not JSON")

    i1 = json.loads((out / "stats.json").read_text(), parse_constant=refuse)["fields"]["I1"]
    assert i1["count"] == 0 and i1["missing"] == 20
    assert i1["min"] is None and i1["max"] is None
    loaded = DatasetStats.load(out)["I1"]
    assert math.isnan(loaded.min) and math.isnan(loaded.max)
    assert loaded.count == 0 and DatasetStats.load(out)["I2"].max == 0.0
    assert DatasetStats.check(out) == out / "stats.json"


def test_a_folder_of_subfolders_says_subfolders_are_not_searched(tmp_path, capsys):
    folder = tmp_path / "days"
    (folder / "2024-01-01").mkdir(parents=True)
    (folder / "2024-01-02").mkdir()
    (folder / "_SUCCESS").write_text("")
    rc = main(
        ["convert", "--schema", "criteo", "--input", str(folder), "--output", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err == (
        f"error: directory {str(folder)!r} has no data files directly inside it, and its "
        f"subfolders ['2024-01-01', '2024-01-02'] are not searched: expected data files in it; "
        f"name the subfolders, or a glob pattern such as {str(folder / '**' / '*')!r}\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = main(
        ["convert", "--schema", "criteo", "--input", str(empty), "--output", str(tmp_path / "o")]
    )
    assert (
        rc == 2
        and capsys.readouterr().err == f"error: directory {str(empty)!r} has no data files\n"
    )
