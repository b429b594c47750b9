"""The command line: user errors print one clear line and exit 2; commands write what they say."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[2]

CRITEO_ROWS = [
    "1\t5\t\t3\t0\t1\t2\t3\t4\t5\t6\t7\t8\t9" + "\tab" * 26,
    "0\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13" + "\tcd" * 26,
]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _convert(capsys, tsv, out, *extra: str) -> tuple[int, str, str]:
    return _run(
        capsys, "convert", "--schema", "criteo", "--input", str(tsv), "--output", str(out), *extra
    )


def test_convert_and_stats_on_criteo_tsv(tmp_path, capsys):
    tsv = tmp_path / "day.tsv"
    tsv.write_text("\n".join(CRITEO_ROWS * 10) + "\n")
    rc, out, _ = _convert(capsys, tsv, tmp_path / "pq")
    assert rc == 0 and "rows: 20" in out
    assert (tmp_path / "pq" / "schema.toml").exists()
    rc, out, _ = _run(
        capsys,
        "stats",
        "--schema",
        "criteo",
        "--input",
        str(tsv),
        "--output",
        str(tmp_path / "stats"),
    )
    assert rc == 0 and "label mean: 0.5000" in out
    stats = json.loads((tmp_path / "stats" / "stats.json").read_text())
    assert stats["fields"]["I2"]["missing"] == 10


def test_bad_row_is_an_error_naming_file_line_and_column(tmp_path, capsys):
    tsv = tmp_path / "day.tsv"
    bad = CRITEO_ROWS[1].replace("\t4\t", "\tfour\t", 1)
    tsv.write_text("\n".join([CRITEO_ROWS[0], bad, CRITEO_ROWS[0]]) + "\n")
    rc, _, err = _convert(capsys, tsv, tmp_path / "pq")
    assert rc == 2
    assert err.startswith("error: ") and "day.tsv" in err and "line 2" in err and "I4" in err
    rc, out, _ = _convert(capsys, tsv, tmp_path / "pq", "--max-bad-rows", "1")
    assert rc == 0 and "rows: 2; bad rows skipped: 1" in out


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ('output_dir = "x"\n[data]\nschema = "nope.toml"\ntrain = ["t"]\n', "does not exist"),
        (
            'output_dir = "x"\n[data]\nschema = "criteo"\ntrain = ["t"]\n[train]\nbatch = 3\n',
            "unknown keys ['batch']",
        ),
        ('output_dir = "x"\n[data]\nschema = "criteo"\n', "either `raw` files or `train`"),
    ],
)
def test_train_config_errors(tmp_path, capsys, config, match):
    (tmp_path / "c.toml").write_text(config)
    rc, _, err = _run(capsys, "train", "--config", str(tmp_path / "c.toml"))
    assert rc == 2 and match in err


def test_export_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    rc, _, err = _run(capsys, "export", "--run", str(tmp_path))
    assert rc == 2 and "not a training run" in err


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "stitchrec"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("demo", "generate", "convert", "stats", "train", "export", "evaluate"):
        assert command in out
    for command in ("crosses fives", "crosses pcf-gnn", "serve", "ab", "fuse explain"):
        assert command in " ".join(out.split()), command


def test_a_reader_that_closes_standard_output_stops_the_command_quietly(tmp_path):
    """``stitchrec generate ... | head -1``: the closed pipe ends the command with the status
    of a broken pipe (128 + SIGPIPE) and no traceback."""
    exe = Path(sys.executable).parent / "stitchrec"
    argv = [str(exe), "generate", "--output", str(tmp_path / "d"), "--rows", "100"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command prints anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_serve_on_a_port_in_use_prints_one_line_with_the_reason(tmp_path):
    """The console command's whole standard error: gRPC's own log of the failed bind is left
    out, and the error line says why (the operating system's reason)."""
    exe = Path(sys.executable).parent / "stitchrec"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [str(exe), "serve", "--repo", str(tmp_path), "--host", "127.0.0.1"]
        r = subprocess.run([*argv, "--port", str(port)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == (
        f"error: cannot bind the gRPC address '127.0.0.1:{port}': Address already in use\n"
    )


COMMANDS = [
    ("demo",),
    ("generate",),
    ("convert",),
    ("stats",),
    ("windows",),
    ("train",),
    ("export",),
    ("evaluate",),
    ("crosses", "fives"),
    ("crosses", "pcf-gnn"),
    ("serve",),
    ("ab",),
    ("skew",),
    ("fuse", "explain"),
    ("tune",),
    ("daily",),
    ("data-service", "dispatcher"),
    ("data-service", "worker"),
]


def _subparser(*names: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    for name in names:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_every_command_is_described_in_the_help_and_the_package_docstring():
    import pipelines

    top = " ".join(cli.build_parser().format_help().split())
    doc = " ".join(pipelines.__doc__.split())
    for names in COMMANDS:
        command = " ".join(names)
        assert command in top and f"``{command}``" in doc, command
        assert _subparser(*names).format_help()  # each command parses on its own


@pytest.mark.parametrize("names", COMMANDS, ids=" ".join)
def test_every_option_has_a_help_text(names):
    parser = _subparser(*names)
    bare = [
        a.option_strings[0] if a.option_strings else a.dest
        for a in parser._actions
        if not a.help and not isinstance(a, argparse._SubParsersAction)
    ]
    assert not bare, f"stitchrec {' '.join(names)}: options without help: {bare}"


def test_every_handler_and_named_error_resolves():
    parsers = [_subparser(*names) for names in COMMANDS]
    for parser in parsers:
        module, _, name = parser.get_default("handler").partition(":")
        assert callable(getattr(importlib.import_module(module), name)), module
    for module, name in [*cli.LOADED_USER_ERRORS, cli.LOST_PEER, cli.INPUT_STALLED]:
        assert issubclass(getattr(importlib.import_module(module), name), Exception), name
        assert cli._loaded((module, name)) == (getattr(sys.modules[module], name),)


def _last_line_printed(code: str) -> str:
    """The last line ``code`` prints, run in a fresh interpreter with this checkout's packages."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=ROOT
    ).stdout
    return out.splitlines()[-1]


def test_help_does_not_import_tensorflow():
    code = (
        "import sys\n"
        "from pipelines import cli\n"
        "for argv in (['--help'], ['train', '--help'], ['crosses', 'fives', '--help']):\n"
        "    try:\n"
        "        cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('tensorflow', 'pandas') if m in sys.modules))\n"
    )
    assert _last_line_printed(code) == "[]"


def test_command_modules_load_without_full_collections_and_without_unused_packages():
    """As the ``stitchrec`` script loads them: no full garbage collection while they load (each
    walks every object TensorFlow created), what they created frozen afterwards, and neither
    scikit-learn nor scipy.stats (0.4 to 0.7 s of imports the train, serve and data commands
    have no use for)."""
    code = (
        "import gc, sys\n"
        "from pipelines import cli\n"
        "from pipelines.loading import loading_modules, pause_collector_when_loading\n"
        "pause_collector_when_loading()\n"
        "full = gc.get_stats()[2]['collections']\n"
        "for argv in (['train', '--config', 'c.toml'], ['generate', '--output', 'out']):\n"
        "    cli.handler(cli.build_parser().parse_args(argv))\n"
        "with loading_modules():  # as `stitchrec serve` loads the server\n"
        "    import serving.server\n"
        "loaded = sorted(m for m in ('sklearn', 'scipy.stats') if m in sys.modules)\n"
        "full = gc.get_stats()[2]['collections'] - full\n"
        "print(loaded, full, gc.get_freeze_count() > 100_000, gc.isenabled())\n"
    )
    assert _last_line_printed(code) == "[] 0 True True"


def test_an_internal_value_error_is_a_traceback_not_a_user_error(tmp_path, monkeypatch, capsys):
    """Only the user-error types print `error:` and exit 2; a ValueError from a bug propagates."""
    from features import synthetic

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(synthetic, "write_dataset", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["generate", "--output", str(tmp_path), "--rows", "10"])
    assert "error:" not in capsys.readouterr().err


def test_usage_errors_exit_2_and_a_lost_peer_exits_3(monkeypatch, capsys):
    from features import synthetic
    from pipelines.distribute import PeerLostError
    from pipelines.errors import UsageError

    for error, status in ((UsageError("--rows: bad"), 2), (PeerLostError("peer a:1 lost"), 3)):

        def raising(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(synthetic, "write_dataset", raising)
        assert main(["generate", "--output", "x"]) == status
        assert capsys.readouterr().err == f"error: {error}\n"


def _csv_run_config(folder: Path, rows: int, head: str, train: str) -> list[str]:
    """A tiny CSV log (``log.csv``), its schema and a config ``c.toml`` (``head`` before its
    ``[data]``, ``train`` its ``[train]`` keys) of an ``lr`` run in ``folder``; the log's lines."""
    from tests.testdata import TINY_SCHEMA, make_tiny_table

    make_tiny_table(rows).to_pandas().to_csv(folder / "log.csv", index=False)
    (folder / "schema.toml").write_text(TINY_SCHEMA.replace('format = "parquet"', 'format = "csv"'))
    (folder / "c.toml").write_text(
        f'{head}[data]\nschema = "schema.toml"\nraw = ["log.csv"]\n'
        f'[model]\ntype = "lr"\n[train]\n{train}'
    )
    return (folder / "log.csv").read_text().splitlines()


def test_train_output_flag_stands_in_for_a_missing_output_dir(tmp_path, capsys, monkeypatch):
    _csv_run_config(tmp_path, 300, "", 'optimizer = "ftrl"\nbatch_size = 64\nmax_steps = 2\n')
    rc, _, err = _run(capsys, "train", "--config", str(tmp_path / "c.toml"))
    assert rc == 2 and "missing `output_dir`" in err
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # --output is relative to the working directory
    rc, out, _ = _run(capsys, "train", "--config", "../c.toml", "--output", "run")
    assert rc == 0 and "test auc" in out
    assert (tmp_path / "work" / "run" / "train_report.json").is_file()


def test_train_from_raw_csv_skips_counted_bad_rows(tmp_path, capsys):
    lines = _csv_run_config(
        tmp_path, 600, 'output_dir = "run"\n', "batch_size = 64\nmax_steps = 3\n"
    )
    lines[3] = lines[3].rsplit(",", 1)[0] + ",7"  # label 7 on line 4
    (tmp_path / "log.csv").write_text("\n".join(lines) + "\n")
    rc, _, err = _run(capsys, "train", "--config", str(tmp_path / "c.toml"))
    assert rc == 2 and "log.csv" in err and "line 4" in err and "label" in err
    rc, out, _ = _run(capsys, "train", "--config", str(tmp_path / "c.toml"), "--max-bad-rows", "1")
    assert rc == 0 and "skipped 1 bad rows" in out and "test auc" in out
    run = tmp_path / "run"
    assert run.is_dir()
    rc, _, err = _run(capsys, "export", "--run", str(run), "--fuse", "--fuse-ladder", "64,8")
    assert rc == 2 and "ladder[1]=8 is not larger than ladder[0]=64" in err
    assert not (run / "export").exists() or not any((run / "export").iterdir())
    rc, out, _ = _run(capsys, "export", "--run", str(run), "--fuse", "--fuse-ladder", "8,64")
    assert rc == 0 and "fusion:" in out
    spec = json.loads(next(run.glob("export/*/assets.extra/fusion.json")).read_text())
    assert spec["ladder"] == [8, 64] and spec["realization"] == "xla_clusters"
    saved = next(run.glob("export/*/saved_model.pb")).parent
    raw = ["--data", str(tmp_path / "log.csv"), "--schema", str(tmp_path / "schema.toml")]
    rc, out, _ = _run(capsys, "evaluate", "--model", str(saved), *raw, "--max-bad-rows", "1")
    result = json.loads(out)
    assert rc == 0 and result["rows"] == 599 and result["bad_rows_skipped"] == 1
