"""``stitchrec tune``: a study of real training runs on the tiny dataset, its outputs, resuming,
the checks of the space, and the pruning of a run whose validation curve is below the median."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import optuna
import pytest

import pipelines
from pipelines import cli, tune, tune_space
from pipelines.config import ConfigError, load_config
from tests.testdata import write_run_config, write_tiny_dataset

SPACE = """
[tune]
learning_rate = {low = 1e-3, high = 0.1, log = true}
model.embedding_dim = {choices = [4, 8]}
model.mlp = {choices = [[8], [16, 8]]}
train.epochs = {low = 1, high = 2}
"""


def _config(tmp_path: Path, space: str = SPACE, **train) -> Path:
    (tmp_path / "data").mkdir()
    data = write_tiny_dataset(tmp_path / "data", rows=1500, train_rows=1200)
    return write_run_config(
        tmp_path / "run.toml",
        data,
        tmp_path / "run",
        model={"type": "dnn", "embedding_dim": 4, "mlp": [8]},
        train={"batch_size": 128, "epochs": 1, "log_every": 1000, "deterministic": True, **train},
        extra=space,
    )


def _tune(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["tune", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """A study of 3 trials in two calls: 1 trial, a trial left running by a killed tuner, then
    the same command with --trials 3 (the left trial re-run, one more trial)."""
    tmp = tmp_path_factory.mktemp("tune")
    config = _config(tmp)
    out = tmp / "tune"
    t0 = time.time()
    assert cli.main(["tune", "--config", str(config), "--trials", "1", "--output", str(out)]) == 0
    first = time.time() - t0
    study = tune.open_study(tune.load_tuning(config, output=out))
    left = study.ask()  # a tuner killed in the middle of this trial leaves it RUNNING
    left.suggest_float("train.learning_rate", 1e-3, 0.1, log=True)
    t0 = time.time()
    assert cli.main(["tune", "--config", str(config), "--trials", "3", "--output", str(out)]) == 0
    print(f"tune wall seconds: 1 trial {first:.1f}, then 2 trials {time.time() - t0:.1f}")
    return {"config": config, "out": out, "left": left.number, "left_params": left.params}


def _study(study_dir) -> dict:
    return json.loads((study_dir["out"] / "study.json").read_text())


def test_the_study_lists_every_trial_with_its_run(study_dir):
    s = _study(study_dir)
    assert s["metric"] == "auc" and s["direction"] == "maximize"
    states = [t["state"] for t in s["trials"]]
    # the last trial runs once two have completed: the median pruner may stop it
    assert states[:3] == ["COMPLETE", "FAIL", "COMPLETE"] and len(states) == 4, states
    assert states[3] in ("COMPLETE", "PRUNED"), states
    for t in s["trials"]:
        assert set(t) >= {"number", "params", "state", "value", "wall_seconds", "steps"}
    for t in s["trials"]:
        if t["state"] == "COMPLETE":
            assert t["wall_seconds"] > 0 and t["steps"] > 0
            assert set(t["params"]) == {
                "train.learning_rate",
                "model.embedding_dim",
                "model.mlp",
                "train.epochs",
            }
            assert isinstance(t["params"]["model.mlp"], list)
            assert len(t["evaluations"]) == t["params"]["train.epochs"]
        if t["state"] == "PRUNED":  # its last evaluation was below the median of the others'
            k = len(t["evaluations"])
            others = [
                o["evaluations"][k - 1]
                for o in s["trials"]
                if o["state"] == "COMPLETE" and len(o["evaluations"]) >= k
            ]
            assert t["evaluations"][-1] < statistics.median(others)


def test_the_objective_is_each_runs_best_validation_metric(study_dir):
    for t in _study(study_dir)["trials"]:
        if t["state"] != "COMPLETE":
            continue
        report = json.loads((Path(t["run"]) / "train_report.json").read_text())
        assert t["value"] == report["selection"]["best"]["auc"]
        assert t["value"] == max(e["auc"] for e in report["epochs"])
        assert t["steps"] == report["steps"]


def test_an_interrupted_trial_is_run_again_with_its_parameters_in_its_folder(study_dir):
    s = _study(study_dir)
    left = s["trials"][study_dir["left"]]
    assert left["state"] == "FAIL"
    rerun = [t for t in s["trials"] if t.get("reruns") == study_dir["left"]]
    assert len(rerun) == 1 and rerun[0]["state"] == "COMPLETE"
    lr = study_dir["left_params"]["train.learning_rate"]
    assert rerun[0]["params"]["train.learning_rate"] == lr
    assert Path(rerun[0]["run"]).name == f"trial-{study_dir['left']}"


def test_best_config_is_a_plain_training_config_of_the_best_trial(study_dir):
    s = _study(study_dir)
    complete = [t for t in s["trials"] if t["state"] == "COMPLETE"]
    best = max(complete, key=lambda t: t["value"])
    assert s["best"]["number"] == best["number"] and s["best"]["value"] == best["value"]
    cfg = load_config(study_dir["out"] / "best_config.toml")
    p = best["params"]
    assert cfg.train.learning_rate == p["train.learning_rate"]
    assert cfg.train.epochs == p["train.epochs"]
    assert cfg.model.embedding_dim == p["model.embedding_dim"]
    assert list(cfg.model.mlp) == p["model.mlp"]
    assert cfg.output_dir == str(study_dir["config"].parent / "run")
    trial_cfg = load_config(Path(best["run"]) / "trial.toml")
    assert trial_cfg.model == cfg.model and trial_cfg.train == cfg.train


def test_search_svg_draws_every_completed_trial(study_dir):
    root = ET.fromstring((study_dir["out"] / "search.svg").read_text())
    circles = root.findall(".//{http://www.w3.org/2000/svg}circle")
    drawn = [t for t in _study(study_dir)["trials"] if t["state"] in ("COMPLETE", "PRUNED")]
    assert len(circles) == len(drawn) + 3  # completed and pruned trials, 3 legend entries
    assert root.findall(".//{http://www.w3.org/2000/svg}polyline")


def test_a_study_at_its_total_runs_no_more_trials(study_dir, capsys):
    argv = ["--config", str(study_dir["config"]), "--trials", "3"]
    rc, out, _ = _tune(capsys, *argv, "--output", str(study_dir["out"]))
    assert rc == 0 and "3 of 3 trial(s) done, 0 to run" in out
    assert "COMPLETE" in out and "best: trial" in out
    assert len(_study(study_dir)["trials"]) == 4


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            "[tune]\nlearning_rat = {low = 0.1, high = 1.0}",
            "learning_rat: not a [train] or [model]",
        ),
        ("[tune]\nlearning_rate = {low = 0.1, high = 0.01}", "low must be < high"),
        ("[tune]\nlearning_rate = {low = 0.0, high = 0.1, log = true}", "log range needs low > 0"),
        ("[tune]\nbatch_size = {choices = []}", "choices must be a non-empty list"),
        ("[tune]\nmodel.dropout = {low = 0.0, high = 1.5}", "model.dropout = 1.5 is not a valid"),
        ("[tune]\ndata.test_fraction = {low = 0.1, high = 0.2}", "only [train] and [model]"),
        ("[tune]\ntrain.select_metric = {choices = ['auc']}", "cannot be searched"),
        ("[tune]\nlearning_rate = {low = 0.1, high = 1.0, steps = 2}", "unknown keys ['steps']"),
        ("[tune]\nlearning_rate = 0.1", "expected a range"),
    ],
)
def test_a_bad_space_is_one_error_line(tmp_path, capsys, space, message):
    rc, _, err = _tune(capsys, "--config", str(_config(tmp_path, space)), "--trials", "1")
    assert rc == 2 and message in err, err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert not (tmp_path / "run-tune").exists()


def test_a_space_file_replaces_the_section_and_the_default_space_is_valid(tmp_path):
    config = _config(tmp_path)
    space = tmp_path / "space.toml"
    space.write_text("[tune]\nmodel.l2 = {low = 1e-6, high = 1e-3, log = true}\n")
    tuning = tune.load_tuning(config, space_file=space)
    assert [p.key for p in tuning.space] == ["model.l2"]
    assert tuning.root == tmp_path / "run-tune"
    (tmp_path / "plain.toml").write_text(config.read_text().split("[tune]")[0])
    keys = [p.key for p in tune.load_tuning(tmp_path / "plain.toml").space]
    assert keys == [*tune_space.DEFAULT_SPACE, "model.mlp"]


def test_with_output_the_config_may_leave_output_dir_out(tmp_path, capsys):
    config = _config(tmp_path)
    plain = tmp_path / "no_output_dir.toml"
    plain.write_text(
        "\n".join(ln for ln in config.read_text().splitlines() if "output_dir" not in ln)
    )
    rc, _, err = _tune(capsys, "--config", str(plain), "--trials", "1")
    assert rc == 2 and "missing `output_dir`" in err
    tuning = tune.load_tuning(plain, output=tmp_path / "t")
    assert tuning.root == tmp_path / "t"
    assert tuning.base.output_dir == str(tmp_path / "t" / "best")


def test_a_run_without_a_validation_split_cannot_be_tuned(tmp_path, capsys):
    config = _config(tmp_path)
    rc, _, err = _tune(
        capsys, "--config", str(config), "--trials", "1", "--set", "data.validation_fraction=0.0"
    )
    assert rc == 2 and "validation split" in err


def test_without_optuna_the_command_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tune, "optuna", None)
    rc, _, err = _tune(capsys, "--config", str(tmp_path / "missing.toml"), "--trials", "1")
    assert rc == 2
    assert err == "error: stitchrec tune needs optuna: pip install 'stitchrec[tune]'\n"


def _study_with_one_trial(curve: dict[int, float]):
    study = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1)
    )
    study.add_trial(optuna.trial.create_trial(value=max(curve.values()), intermediate_values=curve))
    return study


def _history(run_dir: Path, *aucs: float) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"epoch": i + 1, "step": 10 * (i + 1), "auc": a, "logloss": 0.6, "best": True})
        for i, a in enumerate(aucs)
    ]
    (run_dir / tune.HISTORY).write_text("".join(line + "\n" for line in lines))


def test_a_run_below_the_median_is_pruned_and_killed(tmp_path):
    study = _study_with_one_trial({1: 0.70, 2: 0.72})
    trial = study.ask()
    run_dir = tmp_path / "trial-1"
    _history(run_dir, 0.55)
    pid_file = tmp_path / "pid"
    sleeper = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    t0 = time.time()
    with pytest.raises(optuna.TrialPruned, match=r"evaluation 1 .* auc 0\.5500"):
        tune.watch_run(trial, [sys.executable, "-c", sleeper], run_dir, "auc", poll_seconds=0.05)
    assert time.time() - t0 < 30
    for _ in range(100):  # the child may not have written its pid before it was killed
        if pid_file.exists() and pid_file.read_text():
            with pytest.raises(ProcessLookupError):
                os.kill(int(pid_file.read_text()), 0)
            break
        time.sleep(0.01)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    pruned = study.trials[1]
    assert pruned.state.name == "PRUNED" and pruned.intermediate_values == {1: 0.55}
    assert pruned.user_attrs["steps"] == 10


def test_a_run_at_or_above_the_median_reports_every_evaluation(tmp_path):
    study = _study_with_one_trial({1: 0.60, 2: 0.62})
    trial = study.ask()
    run_dir = tmp_path / "trial-1"
    _history(run_dir, 0.65, 0.66)
    tune.watch_run(trial, [sys.executable, "-c", "pass"], run_dir, "auc", poll_seconds=0.05)
    assert study.trials[1].intermediate_values == {1: 0.65, 2: 0.66}


def test_a_failed_run_is_a_trial_run_error_naming_its_log(tmp_path):
    trial = optuna.create_study().ask()
    run_dir = tmp_path / "trial-0"
    run_dir.mkdir()
    command = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(tune.TrialRunError, match=r"status 3 \(boom\); see .*train.log"):
        tune.watch_run(trial, command, run_dir, "auc", poll_seconds=0.05)


def test_the_command_is_listed_and_every_option_has_help():
    parser = cli.build_parser()
    assert "tune" in " ".join(parser.format_help().split())
    assert "``tune``" in pipelines.__doc__
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = [a.option_strings[0] for a in sub.choices["tune"]._actions if not a.help]
    assert not bare


def test_the_tuner_does_not_load_tensorflow():
    code = "import sys, pipelines.tune; print('tensorflow' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.strip() == "False"


def test_an_exact_lr_fit_is_not_tuned(tmp_path, capsys):
    config = _config(tmp_path)
    lbfgs = ["--set", 'model.type="lr"', "--set", 'train.optimizer="lbfgs"']
    rc, _, err = _tune(capsys, "--config", str(config), "--trials", "1", *lbfgs)
    assert rc == 2 and "chooses its C on the validation split itself" in err, err
    assert not (tmp_path / "run-tune").exists()
    # type = "lr" with its default optimizer (auto): the same, and the way to tune FTRL
    rc, _, err = _tune(capsys, "--config", str(config), "--trials", "1", *lbfgs[:2])
    assert rc == 2 and "set [train] optimizer = 'ftrl' to search" in err, err
    assert not (tmp_path / "run-tune").exists()


def test_a_journal_line_torn_by_a_kill_is_dropped_and_a_bad_one_is_one_error(tmp_path):
    config, out = _config(tmp_path), tmp_path / "tune"
    tuning = tune.load_tuning(config, output=out)
    tune.open_study(tuning).ask()  # the journal holds the study and one running trial
    journal = out / tune.JOURNAL
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"op_code": 4, "worker_id": "x", "tri')  # a write cut short
    assert [t.number for t in tune.open_study(tuning).trials] == [0]
    after = journal.read_bytes()
    assert after.startswith(whole) and b'"worker_id": "x"' not in after
    lines = whole.splitlines(keepends=True)
    journal.write_bytes(lines[0] + b"not json\n" + b"".join(lines[1:]))
    with pytest.raises(ConfigError, match=r"line 2 of the study journal is not an Optuna record"):
        tune.open_study(tuning)


def test_a_study_continues_only_with_the_space_it_was_created_with(tmp_path, capsys):
    config, out = _config(tmp_path), tmp_path / "tune"
    tune.open_study(tune.load_tuning(config, output=out))  # records the config's [tune] space
    space = tmp_path / "space.toml"
    space.write_text(
        "learning_rate = {low = 1e-3, high = 0.5, log = true}\n"
        "model.embedding_dim = {choices = [4, 8]}\nmodel.l2 = {low = 1e-6, high = 1e-3}\n"
    )
    argv = ["--config", str(config), "--trials", "1", "--output", str(out), "--space", str(space)]
    rc, _, err = _tune(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {out / tune.JOURNAL}: the study was created with another ")
    assert "(model.l2 added; model.mlp removed; train.epochs removed; " in err
    assert "train.learning_rate was {low = 0.001, high = 0.1, log = true}, now " in err
    assert not (out / "trial-0").exists()
    # a study whose journal records no space (an older one) continues, and records this one
    old = tmp_path / "old"
    old.mkdir()
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(old / tune.JOURNAL))
    )
    optuna.create_study(storage=storage, study_name=tune.STUDY_NAME, direction="maximize")
    tuning = tune.load_tuning(config, space_file=space, output=old)
    assert tune.open_study(tuning).user_attrs["space"] == tune_space.space_record(tuning.space)
    with pytest.raises(ConfigError, match="another search space"):
        tune.open_study(tune.load_tuning(config, output=old))
