"""`stitchrec ab`'s flags and --output: a value or combination it cannot use is one `error:`
line with status 2 before anything is scored, and --output holds only ab's own files, each
written whole."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.cli_args import AB_MIN_BOOTSTRAP
from tests.testdata import write_tiny_dataset

ROWS = 500  # test rows of the tiny dataset below


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab_flags")
    paths = write_tiny_dataset(root, rows=1000 + ROWS, train_rows=1000)
    scores = np.random.default_rng(0).random(ROWS)
    pq.write_table(pa.table({"row_id": np.arange(ROWS), "score": scores}), root / "good.parquet")
    # one row short: scoring it is an error, so a check that ran after scoring shows that one
    short = pa.table({"row_id": np.arange(ROWS - 1), "score": scores[:-1]})
    pq.write_table(short, root / "short.parquet")
    (root / "afile").write_text("x")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("the user's own file")
    return {"root": root, "test": paths["test"]}


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--output", "afile"], "--output '{root}/afile' is a file: expected a folder"),
        (
            ["--output", "mine"],
            "--output '{root}/mine' holds entries `stitchrec ab` does not write (notes.txt): "
            "expected a new or empty folder",
        ),
        (["--bootstrap", "-5"], "--bootstrap -5: expected 0 (no bootstrap) or at least 100 "),
        (["--bootstrap", "5"], "--bootstrap 5: expected 0 (no bootstrap) or at least 100 "),
        (["--bootstrap", "99"], "--bootstrap 99: expected 0 (no bootstrap) or at least 100 "),
        (
            ["--primary", "nosuch"],
            "--primary 'nosuch': expected a metric this comparison computes: auc, logloss, ece, "
            "calibration_ratio, mean_score; gauc, ndcg@k and recall@k need --group",
        ),
        (["--primary", "gauc"], "gauc, ndcg@k and recall@k need --group"),
        (
            ["--group", "user", "--k", "5", "--primary", "ndcg@3"],
            "--primary 'ndcg@3': expected a metric this comparison computes: auc, logloss, ece, "
            "calibration_ratio, mean_score, gauc, ndcg@5, recall@5",
        ),
        (["--propensity", "price"], "--propensity price: off-policy estimates also need the "),
        (["--resample", "groups"], "--resample groups resamples the groups of the --group field"),
        (
            ["--policy-temperature", "-1"],
            "--policy-temperature -1.0: expected a finite number >= 0",
        ),
        (["--policy-temperature", "inf"], "--policy-temperature inf: expected a finite number"),
        (["--reward-folds", "1"], "--reward-folds 1: expected 0 (no reward model: no DM or DR)"),
    ],
)
def test_unusable_flags_are_one_error_line_before_scoring(data, capsys, flags, message):
    root = data["root"]
    flags = [str(root / f) if f in ("afile", "mine") else f for f in flags]
    argv = ["ab", "--control", str(root / "short.parquet"), "--treatment", "uniform"]
    line = _error(capsys, [*argv, "--data", str(data["test"]), "--bootstrap", "0", *flags])
    assert message.format(root=root) in line, line
    assert sorted(p.name for p in (root / "mine").iterdir()) == ["notes.txt"]


def test_bootstrap_minimum_is_in_the_help_and_zero_and_the_minimum_run(data, capsys):
    with pytest.raises(SystemExit):
        main(["ab", "--help"])
    assert f"0 (none: no intervals or verdicts) or at least {AB_MIN_BOOTSTRAP}" in " ".join(
        capsys.readouterr().out.split()
    )
    argv = ["ab", "--control", "uniform", "--treatment", str(data["root"] / "good.parquet")]
    argv += ["--data", str(data["test"]), "--no-html"]
    for resamples in (0, AB_MIN_BOOTSTRAP):
        out = data["root"] / f"boot{resamples}"
        assert main([*argv, "--bootstrap", str(resamples), "--output", str(out)]) == 0
        res = json.loads((out / "ab.json").read_text())
        assert res["overall"]["metrics"]["auc"]["resamples"] == resamples


def test_data_forced_to_a_prediction_log_says_why_it_is_not_one(data, capsys):
    argv = ["ab", "--control", "uniform", "--treatment", "uniform", "--bootstrap", "0"]
    line = _error(capsys, [*argv, "--data", str(data["test"]), "--data-format", "logs"])
    assert f"--data {data['test']} was read as a prediction log because of --data-format logs" in (
        line
    )
    assert "part-00000.parquet' lacks the log's column(s) ['request_id', 'row'," in line
    assert "is a prediction log" not in line
    empty = data["root"] / "empty_log"
    empty.mkdir()
    line = _error(capsys, [*argv, "--data", str(empty), "--data-format", "logs"])
    assert "because of --data-format logs, but it holds no *.parquet file" in line


def test_output_folder_holds_only_ab_outputs_written_whole(data, capsys):
    root = data["root"]
    argv = ["ab", "--control", "uniform", "--treatment", str(root / "good.parquet")]
    argv += ["--data", str(data["test"]), "--bootstrap", "0", "--output"]
    out = root / "report"
    out.mkdir()  # an empty folder is taken
    assert main([*argv, str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["ab.html", "ab.json"]
    # an earlier ab output is replaced; a temporary file a killed ab left is taken and removed
    (out / ".ab.json.tmp-12345").write_text('{"half": ')
    assert main([*argv, str(out), "--seed", "7"]) == 0
    assert json.loads((out / "ab.json").read_text())["settings"]["seed"] == 7
    assert sorted(p.name for p in out.iterdir()) == ["ab.html", "ab.json"]
    # ab.json alone: no ab.html of another comparison is left beside it
    assert main([*argv, str(out), "--no-html"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["ab.json"]
    # a folder with the user's files is refused and left as it was
    (out / "notes.txt").write_text("mine")
    before = (out / "ab.json").read_text()
    line = _error(capsys, [*argv, str(out)])
    assert "holds entries `stitchrec ab` does not write (notes.txt)" in line
    assert sorted(p.name for p in out.iterdir()) == ["ab.json", "notes.txt"]
    assert (out / "ab.json").read_text() == before
