"""The input checks of ``stitchrec crosses fives``, ``crosses pcf-gnn``, ``fuse tune`` and
``fuse explain``: each a one-line ``error:`` with exit status 2, made before the work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines import cli
from tests.testdata import NO_VALIDATION, write_run_config, write_tiny_dataset


def _error(capsys: pytest.CaptureFixture) -> tuple[str, str]:
    """(the one error line of the command's stderr, its stdout)."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0], captured.out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny data (fields user, item, tags, price, age and the label) and two configs over it:
    ``fives`` (a linear model) and ``pcf`` (with a ``[pair_stats]`` section)."""
    root = tmp_path_factory.mktemp("inputs")
    d = write_tiny_dataset(root, rows=1200, train_rows=1000)
    train = {"batch_size": 256, "epochs": 1, "seed": 0, "log_every": 10}
    d["fives"] = write_run_config(
        root / "fives.toml", d, root / "fives", {"type": "lr"}, train, data_extra=NO_VALIDATION
    )
    pair_stats = '\n[pair_stats]\npairs = [["user", "item"], ["user", "tags"]]\nsteps = 5\n'
    model = {"type": "dnn", "embedding_dim": 4, "mlp": [8]}
    d["pcf"] = write_run_config(
        root / "pcf.toml", d, root / "pcf", model, train, extra=pair_stats, data_extra=NO_VALIDATION
    )
    return d


def _fives(data: dict[str, Path], *flags: str) -> int:
    fast = ["--max-rows", "600", "--epochs", "1", "--no-screen"]
    return cli.main(["crosses", "fives", "--config", str(data["fives"]), *fast, *flags])


def test_fives_refuses_fields_a_cross_cannot_take_before_reading_data(data, capsys):
    assert _fives(data, "--fields", "label,user") == 2
    line, out = _error(capsys)
    assert "--fields: 'label' is a label field of schema" in line
    assert "['user', 'item', 'tags', 'price', 'age']" in line and out == ""
    assert _fives(data, "--fields", "user") == 2
    assert "a cross needs two or more fields" in _error(capsys)[0]
    assert _fives(data, "--fields", "user,item,user") == 2
    assert "['user'] given more than once" in _error(capsys)[0]


def test_fives_refuses_a_max_order_above_the_fields_searched(data, capsys):
    assert _fives(data, "--max-order", "4", "--fields", "user,item,tags") == 2
    line, out = _error(capsys)
    assert "--max-order 4 is above the 3 fields searched (--fields 'user,item,tags')" in line
    assert "expected a max order from 2 to 3" in line and out == ""
    assert _fives(data, "--set", "max_order=6") == 2  # the schema's 5 searchable fields
    assert "--set max_order=6 is above the 5 fields searched" in _error(capsys)[0]


def test_fives_connects_to_the_cluster_before_the_search(data, capsys, tmp_path):
    config = tmp_path / "fives.toml"  # nothing listens there: the command waits 0.5 s
    config.write_text(data["fives"].read_text() + "\n[engine]\nconnect_seconds = 0.5\n")
    assert _fives({**data, "fives": config}, "--cluster", "tcp://127.0.0.1:1") == 2
    line, out = _error(capsys)
    assert "'tcp://127.0.0.1:1': no Dask scheduler answered in 0.5 s" in line
    assert "[engine] connect_seconds" in line
    assert (
        "fives: epoch" not in out and not (data["root"] / "fives" / "crosses_fives.json").exists()
    )


def _pcf(data: dict[str, Path], *sets: str) -> int:
    flags = [f for s in sets for f in ("--set", s)]
    return cli.main(["crosses", "pcf-gnn", "--config", str(data["pcf"]), *flags])


def test_pcf_gnn_says_which_setting_leaves_no_edges(data, capsys):
    assert _pcf(data, "pair_stats.min_impressions=1000000") == 2
    line, out = _error(capsys)
    assert "[pair_stats] min_impressions = 1,000,000 drops all" in line
    assert "expected a lower min_impressions" in line and "pcf-gnn step" not in out


def test_pcf_gnn_writes_into_no_folder_but_its_own(data, capsys, tmp_path):
    mine = tmp_path / "notmine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    assert _pcf(data, f'pair_stats.artifact="{mine}"') == 2
    line, out = _error(capsys)
    assert f"[pair_stats] artifact {str(mine)!r} holds files that are not" in line
    assert "no pcf_gnn.json" in line and out == ""
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "the user's"
    # an empty folder, and then the command's own earlier artifact, are written
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    assert _pcf(data, f'pair_stats.artifact="{artifact}"') == 0
    assert _pcf(data, f'pair_stats.artifact="{artifact}"') == 0
    assert json.loads((artifact / "report.json").read_text())["edges"] > 0


def test_fuse_tune_refuses_a_path_that_is_not_a_saved_model(data, capsys, tmp_path):
    empty = tmp_path / "emptydir"
    empty.mkdir()
    cases = [
        (tmp_path / "nope", "is not a folder (it does not exist)"),
        (empty, "is not a SavedModel: it has no saved_model.pb"),
        (data["train"], "is not a SavedModel: it has no saved_model.pb"),
        (data["schema"], "is not a folder (it is a file)"),
    ]
    for path, words in cases:
        assert cli.main(["fuse", "tune", str(path)]) == 2
        line, _ = _error(capsys)
        assert words in line and str(path) in line


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained DCN-v2 over the tiny dataset, exported by ``stitchrec export``'s code."""
    from pipelines.export import export_saved_model
    from tests.compiler_opt.conftest import tiny_dcn_v2

    d = tmp_path_factory.mktemp("export")
    model, schema, _ = tiny_dcn_v2(d, rows=300, train_rows=250)
    return export_saved_model(model, schema, d / "saved_model")


def test_fuse_checks_data_before_planning(saved_model, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHREC_CACHE", str(tmp_path / "cache"))  # nothing calibrated there
    nope = str(tmp_path / "nope")
    explain = ["fuse", "explain", str(saved_model)]
    assert cli.main([*explain, "--data", nope, "--floor"]) == 2
    line, out = _error(capsys)
    assert f"--data {nope!r}" in line and out == ""  # no plan printed first
    assert cli.main([*explain, "--data", str(tmp_path)]) == 2
    line, out = _error(capsys)
    assert "only --floor reads --data" in line and out == ""
    assert cli.main(["fuse", "tune", str(saved_model), "--data", str(tmp_path)]) == 2
    line, out = _error(capsys)
    assert f"--data {str(tmp_path)!r}: no Parquet files found" in line and out == ""
    assert not (tmp_path / "cache").exists()
