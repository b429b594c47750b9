"""The output folders and early checks of `stitchrec tune`, `daily`, `demo` and `skew`: a file,
a path under a file, or a folder holding something else (a user's files, a data folder) is one
`error:` line (exit status 2) and stays as it was; arguments the command cannot use are refused
before anything is written. Every check here fails before any training."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import tune
from pipelines.cli import main
from pipelines.daily import check_repo
from pipelines.errors import UsageError
from tests.pipelines.test_skew import _make_run, _write_logs
from tests.testdata import make_tiny_table, write_run_config, write_tiny_dataset

DAILY = """\
output_dir = "runs"

[model]
type = "lr"
embedding_dim = 4

[train]
optimizer = "ftrl"
batch_size = 128
epochs = 1
"""

SPACE = "learning_rate = {low = 1e-3, high = 0.1, log = true}\n"


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _error(capsys, argv: list[str], *expected: str) -> str:
    """Runs the CLI, which must print one `error:` line holding ``expected`` and exit with 2."""
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err, err
    return err


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A file, a folder of the user's, a `generate` data folder and `generate --days 3`."""
    root = tmp_path_factory.mktemp("outputs")
    (root / "afile").write_text("mine\n")
    (root / "notmine").mkdir()
    (root / "notmine" / "important.txt").write_text("keep me\n")
    assert main(["generate", "--rows", "300", "--output", str(root / "synth")]) == 0
    days = ["generate", "--rows", "300", "--days", "3", "--output", str(root / "days")]
    assert main(days) == 0
    (root / "daily.toml").write_text(DAILY)
    return root


def _unchanged_after(capsys, places: Path, cases: list[tuple[list[str], tuple[str, ...]]]) -> None:
    """Each case is one error line; the file, the user's folder and the data folder stay."""
    before = {n: _tree(places / n) for n in ("notmine", "synth")}
    for argv, expected in cases:
        _error(capsys, argv, *expected)
    assert (places / "afile").read_text() == "mine\n"
    assert {n: _tree(places / n) for n in ("notmine", "synth")} == before
    assert not [p.name for p in places.iterdir() if p.name.startswith(".")]


# tune ---------------------------------------------------------------------------------------


def _tune_config(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "data").mkdir()
    data = write_tiny_dataset(tmp_path / "data", rows=600, train_rows=500)
    config = write_run_config(
        tmp_path / "tiny.toml",
        data,
        tmp_path / "runs" / "tiny",
        model={"type": "dcn_v2", "embedding_dim": 4, "mlp": [8], "cross_layers": 1},
        train={"batch_size": 128, "epochs": 1, "log_every": 1000},
    )
    (tmp_path / "space.toml").write_text(SPACE)
    return config, tmp_path / "space.toml"


def test_tune_refuses_a_file_and_folders_that_are_not_a_study(tmp_path, places, capsys):
    config, space = _tune_config(tmp_path)
    base = ["tune", "--config", str(config), "--trials", "1", "--space", str(space)]
    cases = [
        ([*base, "--output", str(places / "afile")], ("afile' is a file: expected a folder",)),
        ([*base, "--output", str(places / "afile" / "x")], ("is a file, so nothing can be",)),
        (
            [*base, "--output", str(places / "notmine")],
            ("'important.txt'", "not a `stitchrec tune` folder", "no study.journal"),
        ),
        ([*base, "--output", str(places / "synth")], ("not a `stitchrec tune` folder",)),
    ]
    _unchanged_after(capsys, places, cases)
    # the default tune folder <output_dir>-tune is checked the same way
    (tmp_path / "runs" / "tiny-tune").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-tune" / "notes.txt").write_text("mine\n")
    _error(capsys, base, "the tune folder (output_dir + '-tune' of config file", "'notes.txt'")
    assert [p.name for p in (tmp_path / "runs" / "tiny-tune").iterdir()] == ["notes.txt"]


def test_tune_continues_a_study_only_with_its_base_config(tmp_path, capsys):
    config, space = _tune_config(tmp_path)
    out = tmp_path / "tk"
    tune.open_study(tune.load_tuning(config, space_file=space, output=out))  # records the base
    argv = ["tune", "--config", str(config), "--trials", "5", "--space", str(space)]
    argv += ["--output", str(out)]
    _error(
        capsys,
        [*argv, "--set", 'model.type="fm"'],
        f"{out / tune.JOURNAL}: the study was created with another base config",
        'model.type was "dcn_v2", now "fm"',
    )
    config.write_text(config.read_text().replace("epochs = 1", "epochs = 2"))
    _error(capsys, argv, "train.epochs was 1, now 2")
    assert sorted(p.name for p in out.iterdir()) == [tune.JOURNAL]  # no trial ran
    # the same base config continues; a value the space sets is each trial's own
    config.write_text(config.read_text().replace("epochs = 2", "epochs = 1"))
    over = ["train.learning_rate=0.5"]
    tune.open_study(tune.load_tuning(config, over, space_file=space, output=out))


# daily --------------------------------------------------------------------------------------


def test_daily_refuses_outputs_that_are_not_its_own(places, capsys):
    window = str(places / "days" / "day-000")
    base = ["daily", "--config", str(places / "daily.toml"), "--window", window]
    repo, runs = str(places / "models" / "ctr"), str(places / "runs")
    cases = [
        (
            [*base, "--repo", repo, "--runs", str(places / "afile")],
            ("--runs", "afile' is a file: expected a folder"),
        ),
        (
            [*base, "--repo", str(places / "afile" / "ctr"), "--runs", runs],
            ("--repo", "is a file, so nothing can be written under it"),
        ),
        (
            [*base, "--repo", str(places / "synth"), "--runs", runs],
            ("--repo", "'ground_truth.json'", "numbered version folders 1/, 2/, ... and its"),
        ),
        (
            [*base, "--repo", str(places / "notmine"), "--runs", runs],
            ("--repo", "'important.txt'"),
        ),
        (
            [*base, "--repo", repo, "--runs", str(places / "synth")],
            ("--runs", "'ground_truth.json'", "not day runs of `stitchrec daily`"),
        ),
        (
            [*base, "--repo", repo, "--runs", str(places / "notmine")],
            ("--runs", "'important.txt'"),
        ),
    ]
    _unchanged_after(capsys, places, cases)
    assert not (places / "models").exists() and not (places / "runs").exists()


def test_daily_says_a_folder_of_windows_is_not_one_window(places, capsys):
    days = places / "days"
    argv = ["daily", "--config", str(places / "daily.toml"), "--window", str(days)]
    argv += ["--repo", str(places / "models" / "ctr"), "--runs", str(places / "runs")]
    _error(
        capsys,
        argv,
        f"--window '{days}' is a folder of windows, not one window",
        "its sub-folders day-000, day-001, day-002 look like windows",
        f"--window {days / 'day-000'}",
    )
    assert not (places / "runs").exists()


# demo ---------------------------------------------------------------------------------------


def test_demo_refuses_outputs_that_are_not_its_own(places, capsys):
    base = ["demo", "--rows", "5000", "--model", "lr", "--output"]
    cases = [
        ([*base, str(places / "afile")], ("afile' is a file: expected a folder",)),
        ([*base, str(places / "notmine")], ("'important.txt'", "not a `stitchrec demo` output")),
        ([*base, str(places / "synth")], ("'ground_truth.json'", "not a `stitchrec demo`")),
    ]
    _unchanged_after(capsys, places, cases)


def test_demo_refuses_too_few_rows_before_writing(tmp_path, capsys):
    out = tmp_path / "dm"
    argv = ["demo", "--rows", "10", "--output", str(out), "--model", "lr", "--epochs", "1"]
    _error(capsys, argv, "demo --rows 10: expected at least 1,000 rows")
    assert not out.exists() and list(tmp_path.iterdir()) == []


# skew ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def skew_inputs(tmp_path_factory):
    """A run with schema.toml and training statistics, and a prediction log folder."""
    root = tmp_path_factory.mktemp("skew")
    run = _make_run(root, shards=False)
    logs = _write_logs(root / "logs", make_tiny_table(400, seed=3))
    return run, logs


def test_skew_refuses_outputs_that_are_not_its_own(places, skew_inputs, capsys):
    run, logs = skew_inputs
    base = ["skew", "--run", str(run), "--data", str(logs), "--output"]
    cases = [
        ([*base, str(places / "afile")], ("afile' is a file: expected a folder",)),
        ([*base, str(places / "notmine")], ("--output '", "not a `stitchrec skew` output")),
        ([*base, str(places / "synth")], ("not a `stitchrec skew` output",)),
    ]
    _unchanged_after(capsys, places, cases)


def test_skew_output_is_replaced_whole_by_a_later_call(tmp_path, skew_inputs, capsys):
    run, logs = skew_inputs
    out = tmp_path / "report"
    argv = ["skew", "--run", str(run), "--data", str(logs), "--output", str(out)]
    assert main(argv) == 0 and main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["skew.html", "skew.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    capsys.readouterr()


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--watch-psi", "0.5", "--threshold-psi", "0.2"],
            "--watch-psi 0.5 is above --threshold-psi 0.2",
        ),
        (["--threshold-oov", "2"], "--threshold-oov must be in (0, 1], got 2.0"),
        (["--threshold-oov", "0"], "--threshold-oov must be in (0, 1], got 0.0"),
    ],
)
def test_skew_thresholds_out_of_range_are_refused(tmp_path, skew_inputs, capsys, flags, expected):
    run, logs = skew_inputs
    out = tmp_path / "report"
    argv = ["skew", "--run", str(run), "--data", str(logs), "--output", str(out), *flags]
    _error(capsys, argv, expected)
    assert not out.exists()


def test_skew_says_a_data_folder_is_not_a_prediction_log_folder(places, skew_inputs, capsys):
    run, _ = skew_inputs
    argv = ["skew", "--run", str(run), "--data", str(places / "synth")]
    _error(
        capsys,
        argv,
        f"--data: '{places / 'synth'}' is a data folder (schema.toml, Parquet shards), not a "
        "prediction log folder",
        "expected the log folder `stitchrec serve` writes",
    )


def test_daily_takes_a_model_folder_with_its_versions_and_traffic_file(tmp_path):
    model = tmp_path / "ctr"
    (model / "1").mkdir(parents=True)
    (model / ".2.tmp-7").mkdir()  # an export being written
    (model / "traffic.toml").write_text("[labels]\nstable = 1\n")
    check_repo(model)
    (model / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match=r"'notes\.txt'"):
        check_repo(model)
