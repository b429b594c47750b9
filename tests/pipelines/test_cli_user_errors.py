"""Inputs a new user gets wrong: each is one ``error:`` line naming what, where and what was
expected, with exit status 2 (argparse's usage line and error for a flag value), never a
traceback."""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import build_parser, main
from pipelines.config import ConfigError, load_config
from pipelines.errors import UsageError
from pipelines.serve import _reserve_port
from serving.testing import write_linear_model
from serving.version_files import MARKER
from tests.testdata import write_run_config, write_small_csv, write_tiny_dataset

SCHEMA = """name = "small"
[source]
format = "csv"
delimiter = ","
header = true
[[fields]]
name = "y"
kind = "label"
[[fields]]
name = "a"
kind = "categorical"
[[fields]]
name = "x"
kind = "numeric"
"""


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().err


def _data(capsys, command: str, schema: Path, csv: Path, out: Path) -> tuple[int, str]:
    """``stitchrec COMMAND --schema S --input CSV --output OUT``: (status, stderr)."""
    return _run(capsys, command, "--schema", str(schema), "--input", str(csv), "--output", str(out))


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def _flag_error(capsys, *argv: str) -> str:
    """The parser refused a flag value: exit status 2, its error line returned. (Parsed only:
    a value it accepted would otherwise run the command, e.g. start a server.)"""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(list(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stitchrec "), err
    return lines[0]


@pytest.fixture
def small(tmp_path: Path) -> tuple[Path, Path]:
    schema = tmp_path / "small.toml"
    schema.write_text(SCHEMA)
    return schema, write_small_csv(tmp_path / "small.csv", 20)


@pytest.mark.parametrize("command", ["convert", "stats"])
def test_a_header_naming_a_column_twice(tmp_path, capsys, small, command):
    schema, csv = small
    csv.write_text(csv.read_text().replace("y,a,x", "y,a,a", 1))
    rc, err = _data(capsys, command, schema, csv, tmp_path / "o")
    assert rc == 2
    line = _one_error(err)
    assert "column 'a' appears 2 times in the header line" in line and "small.csv" in line


@pytest.mark.parametrize("command", ["convert", "stats", "generate"])
def test_an_output_under_a_file(tmp_path, capsys, small, command):
    schema, csv = small
    afile = tmp_path / "afile"
    afile.write_text("x")
    args = ["--schema", str(schema), "--input", str(csv)] if command != "generate" else []
    rc, err = _run(capsys, command, *args, "--output", str(afile / "sub"))
    assert rc == 2
    assert f"{str(afile)!r} is a file, so nothing can be written under it" in _one_error(err)
    assert afile.read_text() == "x"


@pytest.mark.parametrize("command", ["stats", "generate"])
def test_an_output_that_is_a_file(tmp_path, capsys, small, command):
    schema, csv = small
    afile = tmp_path / "afile"
    afile.write_text("x")
    args = ["--schema", str(schema), "--input", str(csv)] if command != "generate" else []
    rc, err = _run(capsys, command, *args, "--output", str(afile))
    assert rc == 2
    assert f"--output {str(afile)!r} is a file: expected a folder" in _one_error(err)


def test_train_output_that_is_a_file(tmp_path, capsys):
    data = write_tiny_dataset(tmp_path, rows=64, train_rows=48)
    afile = tmp_path / "afile"
    afile.write_text("x")
    config = write_run_config(
        tmp_path / "c.toml", data, tmp_path / "run", {"type": "lr"}, {"epochs": 1}
    )
    rc, err = _run(capsys, "train", "--config", str(config), "--output", str(afile))
    assert rc == 2
    assert f"--output {str(afile.resolve())!r} is a file: expected a folder" in _one_error(err)
    config.write_text(config.read_text().replace(str(tmp_path / "run"), str(afile)))
    rc, err = _run(capsys, "train", "--config", str(config))
    assert rc == 2
    assert "output_dir" in _one_error(err)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["convert", "--test-fraction", "1"], "expected a number in [0, 1), got '1'"),
        (["convert", "--test-fraction", "-0.1"], "expected a number in [0, 1), got '-0.1'"),
        (["convert", "--max-bad-rows", "-1"], "expected an integer >= 0, got '-1'"),
        (["stats", "--max-bad-rows", "-3"], "expected an integer >= 0, got '-3'"),
        (["generate", "--rows", "0"], "expected an integer >= 1, got '0'"),
        (["generate", "--test-fraction", "2"], "expected a number in [0, 1), got '2'"),
    ],
)
def test_flag_values_out_of_range(tmp_path, capsys, small, argv, expected):
    schema, csv = small
    command, rest = argv[0], argv[1:]
    inputs = ["--schema", str(schema), "--input", str(csv)] if command != "generate" else []
    line = _flag_error(capsys, command, *inputs, "--output", str(tmp_path / "o"), *rest)
    assert line.startswith(f"error: stitchrec {command}: argument ") and expected in line
    assert not (tmp_path / "o").exists()


def test_train_max_bad_rows_flag_is_checked(tmp_path, capsys):
    line = _flag_error(capsys, "train", "--config", "c.toml", "--max-bad-rows", "-2")
    assert "--max-bad-rows: expected an integer >= 0, got '-2'" in line


def test_a_config_that_is_a_folder_or_not_utf8(tmp_path, capsys):
    rc, err = _run(capsys, "train", "--config", str(tmp_path))
    assert rc == 2
    assert f"config file {str(tmp_path)!r} is a folder: expected a TOML file" in _one_error(err)
    binary = tmp_path / "c.toml"
    binary.write_bytes(b'output_dir = "r"\n# \xff\xfe\n')
    rc, err = _run(capsys, "train", "--config", str(binary))
    assert rc == 2
    assert "is not UTF-8 text (byte 19): expected a TOML file" in _one_error(err)


def test_a_schema_that_is_not_utf8(tmp_path, capsys, small):
    _, csv = small
    schema = tmp_path / "bad.toml"
    schema.write_bytes(SCHEMA.encode() + b"# \xff\n")
    rc, err = _data(capsys, "stats", schema, csv, tmp_path / "o")
    assert rc == 2
    assert "bad.toml' is not UTF-8 text" in _one_error(err)


@pytest.mark.parametrize(
    ("section", "text", "expected"),
    [
        ("model", "mlp = [-8]", "mlp sizes must be >= 1, got [-8]"),
        ("model", "mlp = [64, 0]", "mlp sizes must be >= 1, got [64, 0]"),
        ("train", "learning_rate = inf", "learning_rate must be a finite number, got inf"),
        ("train", "learning_rate = nan", "learning_rate must be a finite number, got nan"),
        ("model", "l2 = inf", "l2 must be a finite number, got inf"),
    ],
)
def test_config_values_checked_before_training(tmp_path, section, text, expected):
    data = write_tiny_dataset(tmp_path, rows=64, train_rows=48)
    config = write_run_config(tmp_path / "c.toml", data, tmp_path / "run", {}, {})
    config.write_text(config.read_text().replace(f"[{section}]\n", f"[{section}]\n{text}\n", 1))
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        load_config(config)


def test_a_row_longer_than_a_block_names_its_line(tmp_path, capsys, small):
    schema, csv = small
    lines = csv.read_text().splitlines()
    lines[5] = "1,v" + "z" * (2 << 20) + ",3.0"
    csv.write_text("\n".join(lines) + "\n")
    rc, err = _data(capsys, "stats", schema, csv, tmp_path / "o")
    assert rc == 2
    line = _one_error(err)
    assert "is longer than 1 MiB, the most one row may hold" in line and "straddl" not in line


def test_scores_that_are_not_numbers(tmp_path, capsys):
    ids = np.arange(4)
    labels = tmp_path / "logs.parquet"
    pq.write_table(pa.table({"row_id": ids, "y": [0, 1, 0, 1], "a": list("abab")}), labels)
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({"row_id": ids, "score": [0.1, 0.9, 0.2, 0.8]}), good)
    text = tmp_path / "b.parquet"
    pq.write_table(pa.table({"row_id": ids, "score": ["0.1", "abc", "0.2", "0.8"]}), text)
    schema = tmp_path / "s.toml"
    schema.write_text(
        'name = "s"\n[source]\nformat = "parquet"\n[[fields]]\nname = "row_id"\nkind = "meta"\n'
        '[[fields]]\nname = "y"\nkind = "label"\n[[fields]]\nname = "a"\nkind = "categorical"\n'
    )
    rc, err = _run(
        capsys,
        "ab",
        "--control",
        str(good),
        "--treatment",
        str(text),
        "--data",
        str(labels),
        "--schema",
        str(schema),
        "--no-html",
        "--output",
        str(tmp_path / "ab"),
    )
    assert rc == 2
    line = _one_error(err)
    assert "b.parquet: column 'score' holds" in line and "expected numbers" in line


def test_add_history_inputs(tmp_path, capsys):
    def history(inp: Path, out: Path) -> str:
        rc, err = _run(capsys, "add-history", "--input", str(inp), "--output", str(out))
        assert rc == 2
        return _one_error(err)

    out = tmp_path / "out.csv"
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "is empty or starts with a blank line" in history(empty, out)
    dup = tmp_path / "dup.csv"
    dup.write_text("userId,movieId,rating,rating,timestamp\nu1,a,4,4,10\n")
    assert "column 'rating' appears 2 times in the header line" in history(dup, out)
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"userId,movieId,timestamp\nu1,a,10\nu\xff,b,20\n")
    assert "latin.csv line 3 is not UTF-8 text" in history(latin, out)
    assert f"input file {str(tmp_path)!r} is a folder: expected a CSV file" in history(
        tmp_path, out
    )
    good = tmp_path / "good.csv"
    good.write_text("userId,movieId,timestamp\nu1,a,10\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    assert f"--output {str(folder)!r} is a folder: expected a file path" in history(good, folder)
    assert not out.exists() and list(folder.iterdir()) == []


def test_an_unloadable_saved_model(tmp_path, capsys):
    model = tmp_path / "model"
    (model / "assets.extra").mkdir(parents=True)
    (model / "assets.extra" / "schema.toml").write_text(SCHEMA)
    (model / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff")
    data = write_small_csv(tmp_path / "small.csv", 10)
    schema = tmp_path / "small.toml"
    schema.write_text(SCHEMA)
    for command in ("evaluate", "predict"):
        extra = ["--output", str(tmp_path / "scores")] if command == "predict" else []
        rc, err = _run(
            capsys,
            command,
            "--model",
            str(model),
            "--data",
            str(data),
            "--schema",
            str(schema),
            *extra,
        )
        assert rc == 2, err
        line = _one_error(err)
        assert f"{model} is not a complete SavedModel (" in line
        assert "expected the folder `stitchrec export` writes" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"tasks": [', "is not valid JSON (Expecting value"),
        ('"tasks"', "holds a JSON string, not an object"),
        ('{"tasks": {"name": "click"}}', "tasks {'name': 'click'} are not task records"),
        ('{"tasks": [{"name": "click"}]}', "are not task records: expected a list of objects"),
    ],
)
def test_a_saved_model_with_corrupt_metadata(tmp_path, capsys, text, expected):
    model = tmp_path / "model"
    (model / "assets.extra").mkdir(parents=True)
    (model / "assets.extra" / "schema.toml").write_text(SCHEMA)
    (model / "assets.extra" / "stitchrec.json").write_text(text)
    (model / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff")
    data = write_small_csv(tmp_path / "small.csv", 10)
    schema = tmp_path / "small.toml"
    schema.write_text(SCHEMA)
    meta = repr(str(model / "assets.extra" / "stitchrec.json"))
    for command in ("evaluate", "predict"):
        extra = ["--output", str(tmp_path / "scores")] if command == "predict" else []
        argv = ["--model", str(model), "--data", str(data), "--schema", str(schema), *extra]
        rc, err = _run(capsys, command, *argv)
        assert rc == 2, err
        line = _one_error(err)
        assert meta in line and expected in line, line
        assert "the model metadata `stitchrec export` writes" in line


def test_export_never_replaces_a_folder_that_is_not_an_export(tmp_path, capsys):
    repo = tmp_path / "models"
    (repo / "ml" / "1").mkdir(parents=True)
    (repo / "ml" / "1" / "saved_model.pb").write_bytes(b"v1")
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))
    rc, err = _run(capsys, "export", "--run", str(tmp_path / "run"), "--output", str(repo))
    assert rc == 2
    line = _one_error(err)
    assert f"--output {str(repo)!r} is a folder that is not an earlier export" in line
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, err = _run(capsys, "export", "--run", str(tmp_path / "run"), "--output", str(afile))
    assert rc == 2 and "is a file: expected a folder" in _one_error(err)
    assert afile.read_text() == "x"
    earlier = tmp_path / "earlier"  # an earlier export (its marker) passes: the run is next
    (earlier / MARKER).parent.mkdir(parents=True)
    (earlier / MARKER).write_text("{}")
    rc, err = _run(capsys, "export", "--run", str(tmp_path / "run"), "--output", str(earlier))
    line = _one_error(err)
    assert rc == 2 and "not an earlier export" not in line and "is not a training run" in line


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--intra-op-threads", "-1"], "--intra-op-threads: expected an integer >= 0, got '-1'"),
        (["--inter-op-threads", "-2"], "--inter-op-threads: expected an integer >= 0, got '-2'"),
        (["--port", "70000"], "--port: expected a port in [0, 65535], got '70000'"),
        (["--port", "-1"], "--port: expected a port in [0, 65535], got '-1'"),
        (["--metrics-port", "99999"], "--metrics-port: expected a port in [0, 65535]"),
        (["--http-port", "65536"], "--http-port: expected a port in [0, 65535]"),
        (["--max-message-mb", "100000000"], "--max-message-mb: expected at most 2047 MiB"),
        (["--poll-seconds", "-1"], "--poll-seconds: expected a finite number >= 0, got '-1'"),
        (["--poll-seconds", "nan"], "--poll-seconds: expected a finite number >= 0, got 'nan'"),
        (["--grace-seconds", "-1"], "--grace-seconds: expected a finite number >= 0"),
        (["--log-level", "bogus"], "--log-level: invalid choice: 'BOGUS'"),
    ],
)
def test_serve_flag_values(tmp_path, capsys, flags, expected):
    assert expected in _flag_error(capsys, "serve", "--repo", str(tmp_path), *flags)


def test_serve_refuses_before_starting(tmp_path, capsys):
    rc, err = _run(capsys, "serve", "--repo", str(tmp_path), "--token", "")
    assert rc == 2 and "--token is empty" in _one_error(err)
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, err = _run(capsys, "serve", "--repo", str(tmp_path), "--log-dir", str(afile))
    assert rc == 2 and f"--log-dir {str(afile)!r} is a file" in _one_error(err)


def test_serve_on_a_port_in_use_is_one_error_line(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--repo", str(tmp_path), "--host", "127.0.0.1"]
        for workers in ("1", "2"):
            rc, err = _run(capsys, *argv, "--port", str(port), "--workers", workers)
            assert rc == 2, err
            assert f"cannot bind the gRPC address '127.0.0.1:{port}'" in _one_error(err)
        rc, err = _run(capsys, *argv, "--port", "0", "--http-port", str(port), "--workers", "2")
        assert rc == 2, err
        assert f"cannot bind the HTTP address '127.0.0.1:{port}'" in _one_error(err)


def _time_wait_on(port: int) -> None:
    """Leaves a closed connection of a server on ``port`` in TIME_WAIT (the server closed it
    first), the listener itself closed, as a stopped server leaves its port."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's listeners
        server.bind(("127.0.0.1", port))
        server.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = server.accept()
            conn.close()
            client.recv(1)  # the server's FIN: the server's side goes to TIME_WAIT


def _worker_listener(port: int) -> socket.socket:
    """A listener bound as a worker's gRPC server binds (SO_REUSEADDR and SO_REUSEPORT)."""
    worker = socket.socket()
    worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    worker.bind(("127.0.0.1", port))
    worker.listen()
    return worker


def test_serve_workers_do_not_join_the_port_of_a_running_supervisor_or_worker():
    address = "cannot bind the gRPC address '127.0.0.1:{}'"
    held = _reserve_port("127.0.0.1", 0)  # what a running `serve --workers` holds
    port = held.getsockname()[1]
    try:
        with pytest.raises(UsageError, match=re.escape(address.format(port))):
            _reserve_port("127.0.0.1", port)
    finally:
        held.close()
    with _worker_listener(0) as worker:
        port = worker.getsockname()[1]
        with pytest.raises(UsageError, match=re.escape(address.format(port))):
            _reserve_port("127.0.0.1", port, "gRPC")
    _time_wait_on(port)  # the port a stopped `serve` (no SO_REUSEPORT) left is free again
    reserved = _reserve_port("127.0.0.1", port)
    try:  # and the workers' listeners bind it beside the reservation
        _worker_listener(port).close()
    finally:
        reserved.close()


def test_serve_workers_of_a_missing_repository_or_tls_file_is_one_error_line(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    rc = main(["serve", "--repo", missing, "--port", "0", "--workers", "2"])
    out, err = capsys.readouterr()
    assert rc == 2 and f"model repository {missing!r} is not a directory" in _one_error(err)
    assert out == ""  # no worker started, no "serving" line
    tls = ["--tls-cert", missing, "--tls-key", missing]
    for workers in ("1", "2"):
        rc = main(["serve", "--repo", str(tmp_path), "--port", "0", *tls, "--workers", workers])
        out, err = capsys.readouterr()
        assert rc == 2 and f"TLS file {missing!r} does not exist" in _one_error(err)
        assert out == ""


def test_serve_on_a_probe_port_in_use_is_one_error_line(tmp_path, capsys):
    write_linear_model(tmp_path / "lin" / "1", bias=0.0)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for workers in ("1", "2"):
            argv = ["--repo", str(tmp_path), "--host", "127.0.0.1", "--port", "0"]
            rc, err = _run(capsys, "serve", *argv, "--probe-port", str(port), "--workers", workers)
            assert rc == 2, err
            line = _one_error(err)
            assert f"{port}" in line and "the probe listener did not start" in line, line


def test_seeds_and_demo_sizes(tmp_path, capsys):
    line = _flag_error(capsys, "refit", "--run", str(tmp_path), "--seed", "-1", "--output", "o")
    assert "--seed: expected an integer in [0, 2**32), got '-1'" in line
    line = _flag_error(capsys, "demo", "--rows", "0", "--output", str(tmp_path / "d"))
    assert "--rows: expected an integer >= 1, got '0'" in line
    line = _flag_error(capsys, "demo", "--epochs", "0", "--output", str(tmp_path / "d"))
    assert "--epochs: expected an integer >= 1, got '0'" in line
    assert not (tmp_path / "d").exists()
    data = write_tiny_dataset(tmp_path, rows=64, train_rows=48)
    config = write_run_config(tmp_path / "c.toml", data, tmp_path / "run", {}, {"seed": -1})
    with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\*\*32\), got -1"):
        load_config(config)


def test_fuse_crosses_skew_and_tune_inputs(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "saved_model.pb").write_bytes(b"junk")
    rc, err = _run(capsys, "fuse", "explain", str(model))
    assert rc == 2 and "its saved_model.pb does not parse" in _one_error(err)
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, err = _run(capsys, "fuse", "explain", str(model), "--json", str(afile / "x.json"))
    assert rc == 2 and f"{str(afile)!r} is a file, so nothing can be written" in _one_error(err)
    data = write_tiny_dataset(tmp_path, rows=64, train_rows=48)
    config = write_run_config(tmp_path / "c.toml", data, tmp_path / "run", {}, {})
    rc, err = _run(capsys, "crosses", "fives", "--config", str(config), "--set", "sparsity=abc")
    assert rc == 2 and "--set: FIVES setting sparsity must be a finite number" in _one_error(err)
    rc, err = _run(capsys, "crosses", "fives", "--config", str(config), "--out", str(tmp_path))
    assert rc == 2 and f"--out {str(tmp_path)!r} is a folder" in _one_error(err)
    run = tmp_path / "run"
    rc, err = _run(capsys, "skew", "--run", str(run), "--data", "d", "--output", str(afile))
    assert rc == 2 and f"--output {str(afile)!r} is a file" in _one_error(err)
    line = _flag_error(capsys, "tune", "--config", str(config), "--trials", "2", "--timeout", "0")
    assert "--timeout: expected a number > 0, got '0'" in line


def test_a_dispatcher_work_dir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    rc, err = _run(capsys, "data-service", "dispatcher", "--port", "0", "--work-dir", str(afile))
    assert rc == 2 and f"--work-dir {str(afile)!r} is a file: expected a folder" in _one_error(err)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A finished linear run of the tiny dataset (its model.json, checkpoints and stats)."""
    root = tmp_path_factory.mktemp("trained")
    data = write_tiny_dataset(root, rows=300, train_rows=240)
    config = write_run_config(root / "c.toml", data, root / "run", {"type": "lr"}, {"epochs": 1})
    assert main(["train", "--config", str(config)]) == 0
    return root / "run"


@pytest.mark.parametrize(
    ("file", "text", "expected"),
    [
        ("model.json", '{"class_name": "Ranki', "is not valid JSON (Unterminated string"),
        ("model.json", "[1, 2]", "holds a JSON array, not an object"),
        ("model.json", '{"a": 1}', "has no class_name and config of a model"),
        ("snapshots/ensemble.json", '{"combine": "logi', "is not valid JSON"),
        ("snapshots/ensemble.json", '{"combine": "max", "members": []}', "holds {"),
    ],
)
def test_export_of_a_run_with_a_corrupt_json_file(
    tmp_path, capsys, trained_run, file, text, expected
):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / file).parent.mkdir(exist_ok=True)
    (run / file).write_text(text)
    rc, err = _run(capsys, "export", "--run", str(run), "--output", str(tmp_path / "out"))
    assert rc == 2
    line = _one_error(err)
    assert f"{str(run / file)!r} {expected}" in line and ": expected the " in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"rows": 3', "is not valid JSON (Expecting"),
        ("[]", "holds a JSON array, not an object"),
        ('{"rows": 1, "positives": 0}', ": 'fields' is None, not dict"),
        (None, "its vocabulary"),  # a vocabulary file that is not Parquet
    ],
)
def test_export_and_train_of_a_run_with_corrupt_statistics(
    tmp_path, capsys, trained_run, text, expected
):
    """Statistics that cannot be read stop an export (never copied into it) and a training
    run that would continue from them, with one line naming the file."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    stats = run / "stats" / "stats.json"
    if text is None:
        vocab = sorted((run / "stats" / "vocab").glob("*.parquet"))[0]
        vocab.write_bytes(b"not parquet")
    else:
        stats.write_text(text)
    rc, err = _run(capsys, "export", "--run", str(run), "--output", str(tmp_path / "out"))
    assert rc == 2
    line = _one_error(err)
    assert f"{str(stats)!r}" in line and expected in line, line
    assert "expected the statistics `stitchrec stats` or `stitchrec train` writes" in line
    assert not (tmp_path / "out").exists()
    config = tmp_path / "c.toml"  # the run's config, its output the copy
    config.write_text((run / "config.toml").read_text().replace(str(trained_run), str(run)))
    rc, err = _run(capsys, "train", "--config", str(config))
    assert rc == 2 and expected in _one_error(err)


def test_export_keep_only_with_a_cascade(tmp_path, capsys, trained_run):
    out = tmp_path / "out"
    rc, err = _run(
        capsys, "export", "--run", str(trained_run), "--keep", "10", "--output", str(out)
    )
    assert rc == 2
    assert "export --keep 10: only with --cascade-rank" in _one_error(err)
    assert not out.exists()
    line = _flag_error(capsys, "export", "--run", str(trained_run), "--keep", "0")
    assert "--keep: expected an integer >= 1, got '0'" in line
    assert _run(capsys, "export", "--run", str(trained_run), "--output", str(out))[0] == 0


def test_a_pair_stats_artifact_that_is_a_file(tmp_path, capsys):
    data = write_tiny_dataset(tmp_path, rows=300, train_rows=240)
    afile = tmp_path / "afile"
    afile.write_text("x")
    pair_stats = f'[pair_stats]\npairs = [["user", "item"]]\nartifact = "{afile}"\nsteps = 2\n'
    model = {"type": "dnn", "embedding_dim": 4, "mlp": [8]}
    config = write_run_config(tmp_path / "c.toml", data, tmp_path / "run", model, {}, pair_stats)
    rc, err = _run(capsys, "crosses", "pcf-gnn", "--config", str(config))
    assert rc == 2
    assert f"[pair_stats] artifact {str(afile)!r} is a file: expected a folder" in _one_error(err)
    rc, err = _run(capsys, "train", "--config", str(config))
    assert rc == 2
    line = _one_error(err)
    assert f"[pair_stats] artifact {str(afile)!r} is a file: expected the folder" in line
    assert afile.read_text() == "x"
