"""``stitchrec refit``: a finished run continued over its own (most recent) validation rows, its
vocabulary grown by the values first seen there, scored once on the run's test rows; the run
itself unchanged; clear errors for what cannot be refit."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.read_report import DataError
from features.stats import DatasetStats
from pipelines.cli import main
from pipelines.config import load_config
from pipelines.run.model import trained_optimizer
from pipelines.run.paths import RunPaths
from pipelines.train import train
from tests.testdata import NO_VALIDATION, TINY_SCHEMA, make_tiny_table, write_run_config

MODEL = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [16], "cross_layers": 1}
ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
KEYS = {"batch_size": 100, "epochs": 2, "learning_rate": 0.01, "log_every": 1}


def _log(root: Path) -> dict[str, Path]:
    """1,000 training rows in time order whose last 200 bring 10 new users (n0..n9), and 200 test
    rows."""
    t = make_tiny_table(1200, seed=3)
    users = t["user"].to_pylist()
    users[800:1000] = [f"n{i % 10}" for i in range(200)]
    t = t.set_column(0, "user", pa.array(users))
    (root / "train").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "schema.toml").write_text(TINY_SCHEMA)
    pq.write_table(t.slice(0, 1000), root / "train" / "part-00000.parquet")
    pq.write_table(t.slice(1000), root / "test" / "part-00000.parquet")
    return {"schema": root / "schema.toml", "train": root / "train", "test": root / "test"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished run validated on the most recent fifth of its training rows (2 epochs of 8
    steps)."""
    root = tmp_path_factory.mktemp("refit")
    data = _log(root / "data")
    recent = 'validation_fraction = 0.2\nvalidation_split = "recent"'
    config = write_run_config(root / "run.toml", data, root / "run", MODEL, KEYS, "", recent)
    train(load_config(config), lambda _: None)
    return root / "run"


def test_refit_continues_the_run_over_its_validation_rows(run, capsys):
    before = RunPaths(run).report.read_text()
    assert main(["refit", "--run", str(run)]) == 0
    out = run.with_name("run-refit")
    assert f"run: {out}" in capsys.readouterr().out
    first = json.loads(before)
    report = json.loads(RunPaths(out).report.read_text())
    assert first["validation_rows"] == 200 and report["train_rows"] == 200
    assert report["validation_rows"] == 0 and report["test_rows"] == first["test_rows"] == 200
    assert report["steps_this_run"] == 2  # one epoch of the 200 validation rows, batch 100
    # the optimizer continues the run's: its step count goes on from the run's 16
    assert tf.train.load_variable(report["checkpoint"], ITERATIONS) == first["steps"] + 2 == 18
    # the users first seen in the validation rows get rows of their own; the run's are kept
    users = DatasetStats.load(RunPaths(out).stats)["user"].vocab
    old = DatasetStats.load(RunPaths(run).stats)["user"].vocab
    assert not any(u.startswith("n") for u in old)
    assert {f"n{i}" for i in range(10)} <= set(users) and set(old) <= set(users)
    assert RunPaths(run).report.read_text() == before  # the run is not changed
    # the same command again finds the refit finished and trains no more
    assert main(["refit", "--run", str(run), "--epochs", "1"]) == 0
    again = json.loads(RunPaths(out).report.read_text())
    assert again["checkpoint"] == report["checkpoint"] and again["test"] == report["test"]


def test_refit_epochs_and_output(run, tmp_path):
    out = tmp_path / "two"
    out.mkdir()  # an empty folder is a new output
    assert main(["refit", "--run", str(run), "--output", str(out), "--epochs", "2"]) == 0
    report = json.loads(RunPaths(out).report.read_text())
    assert report["steps_this_run"] == 4 and report["seed"] == 0
    assert load_config(RunPaths(out).config).train.continue_from == str(run.resolve())


def test_a_run_on_raw_files_refits_on_its_converted_validation_rows(tmp_path):
    """A CSV log converted by the run: the refit reads the run's validation and test shards with
    the schema they were written with."""
    table = make_tiny_table(1000, seed=4)
    pcsv.write_csv(table, tmp_path / "log.csv")
    (tmp_path / "schema.toml").write_text(
        TINY_SCHEMA.replace('format = "parquet"', 'format = "csv"')
    )
    config = tmp_path / "raw.toml"
    config.write_text(
        f'output_dir = "{tmp_path / "run"}"\n[data]\nschema = "{tmp_path / "schema.toml"}"\n'
        f'raw = ["{tmp_path / "log.csv"}"]\ntest_fraction = 0.2\nvalidation_fraction = 0.25\n'
        f'validation_split = "recent"\n[model]\ntype = "fm"\nembedding_dim = 4\n'
        f"[train]\nbatch_size = 100\nepochs = 1\n"
    )
    first = train(load_config(config), lambda _: None)
    assert main(["refit", "--run", str(tmp_path / "run")]) == 0
    report = json.loads(RunPaths(tmp_path / "run-refit").report.read_text())
    assert report["train_rows"] == first["validation_rows"] > 0
    assert report["test_rows"] == first["test_rows"] > 0


def test_what_cannot_be_refit_is_one_error_line(run, tmp_path, capsys):
    data = _log(tmp_path / "data")
    plain = tmp_path / "plain"
    keys = KEYS | {"epochs": 1}
    config = write_run_config(tmp_path / "p.toml", data, plain, MODEL, keys, "", NO_VALIDATION)
    train(load_config(config), lambda _: None)
    capsys.readouterr()
    cases = [
        (["--run", str(plain)], "the run has no validation rows to refit on"),
        (["--run", str(tmp_path / "data")], "not a finished training run"),
        (["--run", str(run), "--learning-rate", "0"], "--learning-rate must be > 0, got 0.0"),
    ]
    for flags, message in cases:
        assert main(["refit", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    with pytest.raises(SystemExit) as e:
        main(["refit", "--run", str(run), "--epochs", "0"])
    assert e.value.code == 2
    assert "argument --epochs: expected an integer >= 1, got '0'" in capsys.readouterr().err
    assert not (tmp_path / "plain-refit").exists()


def test_a_damaged_report_is_one_error_naming_it(tmp_path):
    """A run trained with ``optimizer = "auto"`` is refit (or continued) with the optimizer
    its report records: a report that is not JSON is one error naming it."""
    data = _log(tmp_path / "data")
    out = tmp_path / "run"
    config = write_run_config(tmp_path / "c.toml", data, out, {"type": "lr"}, {"optimizer": "auto"})
    paths = RunPaths(out)
    paths.root.mkdir()
    paths.report.write_text('{"optimizer": ')
    with pytest.raises(DataError) as err:
        trained_optimizer(load_config(config), paths)
    assert str(err.value).startswith(f"{str(paths.report)!r} is not valid JSON")
    assert str(err.value).endswith("expected the report `stitchrec train` writes")
    paths.report.write_text('{"optimizer": "lbfgs"}')
    assert trained_optimizer(load_config(config), paths) == "lbfgs"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _make_output(kind: str, run: Path, tmp: Path) -> Path:
    """An --output that cannot be RUN's refit, of the kind named."""
    if kind == "data":  # a data folder, like `stitchrec generate`'s
        _log(tmp / "data")
        return tmp / "data"
    if kind == "notmine":
        (tmp / "notmine").mkdir()
        (tmp / "notmine" / "notes.txt").write_text("the user's")
        return tmp / "notmine"
    if kind in ("afile", "under-a-file"):
        (tmp / "afile").write_text("x")
        return tmp / "afile" if kind == "afile" else tmp / "afile" / "sub"
    if kind == "another-runs-refit":
        (tmp / "other").mkdir()
        (tmp / "other" / "refit.json").write_text(json.dumps({"run": str(tmp / "elsewhere")}))
        return tmp / "other"
    return run if kind == "the-run" else run / "sub"


@pytest.mark.parametrize(
    "kind, message",
    [
        ("data", "holds files that are not a `stitchrec refit` output (no refit.json)"),
        ("notmine", "holds files that are not a `stitchrec refit` output (no refit.json)"),
        ("afile", "is a file: expected a folder"),
        ("under-a-file", "is a file, so nothing can be written under it"),
        ("another-runs-refit", "is the refit of another run (refit.json names"),
        ("the-run", "is the run being refit or a folder inside it"),
        ("inside-the-run", "is the run being refit or a folder inside it"),
    ],
)
def test_an_output_that_is_not_the_runs_refit_is_refused_untouched(
    run, tmp_path, capsys, kind, message
):
    """--output may be new, empty or RUN's own refit; anything else is one error line, and
    nothing is written (into it, or into RUN)."""
    output = _make_output(kind, run, tmp_path)
    before = {p: _files(p) for p in (tmp_path, run)}
    capsys.readouterr()
    assert main(["refit", "--run", str(run), "--output", str(output)]) == 2
    assert {p: _files(p) for p in before} == before
    assert not (run / "sub").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --output") and message in err[0], err


def test_a_relative_run_refits_resumes_and_its_refit_is_refused(run, monkeypatch, capsys):
    """A relative --run: the refit's config names its shards by absolute path, so the same
    command again finds the refit finished, and the refit itself reads as a run (refused for
    having no validation rows, not for missing files)."""
    monkeypatch.chdir(run.parent)
    flags = ["refit", "--run", "run", "--output", "rel"]
    assert main(flags) == 0
    out = run.parent / "rel"
    cfg = load_config(RunPaths(out).config)
    report = json.loads(RunPaths(out).report.read_text())
    assert main(flags) == 0  # the same command again: finished, nothing more trained
    again = json.loads(RunPaths(out).report.read_text())
    assert again["checkpoint"] == report["checkpoint"] and again["test"] == report["test"]
    assert all(Path(f).is_absolute() for f in (*cfg.data.train, *cfg.data.test, cfg.data.schema))
    assert json.loads((out / "refit.json").read_text()) == {"run": str(run.resolve())}
    capsys.readouterr()
    assert main(["refit", "--run", "rel", "--output", "rel2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the run has no validation rows to refit on" in err[0], err
    assert not (run.parent / "rel2").exists()
