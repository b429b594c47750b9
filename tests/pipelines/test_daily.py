"""`stitchrec daily` end to end on tiny windows: three days in a row, the decision rule and its
figures, idempotent reruns, SIGKILL at random points, a server hot-swapping to the new version,
and user errors."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from pipelines.cli import main
from pipelines.daily import DailyOptions, decide, run_daily
from pipelines.daily_state import JOURNAL_FILE, REPORT_FILE, STEPS
from pipelines.evaluation.ab_run import ABOptions, run_ab
from pipelines.evaluation.sources import load_logs, open_source
from serving.client import RankingClient
from serving.testing import wait_serving
from tests.testdata import write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """\
output_dir = "runs"

[data]
validation_fraction = 0.2

[model]
type = "dcn_v2"
embedding_dim = 4
mlp = [16]
cross_layers = 1

[train]
batch_size = 128
epochs = 2
learning_rate = 0.01
checkpoint_every = 5
log_every = 100
deterministic = true
"""


def _windows(root: Path) -> list[Path]:
    """Three day windows d1..d3 of the tiny click log (seeds 0, 1, 2): 2,000 training and 500
    test rows each, every user, item and tag value present every day."""
    out = []
    for i in range(3):
        w = root / f"d{i + 1}"
        w.mkdir(parents=True)
        write_tiny_dataset(w, rows=2500, train_rows=2000, seed=i)
        out.append(w)
    return out


def _opts(root: Path, window: Path, **kw) -> DailyOptions:
    kw.setdefault("runs", str(root / "runs"))
    kw.setdefault("repo", str(root / "models" / "ctr"))
    return DailyOptions(config=str(root / "daily.toml"), window=str(window), **kw)


def _server(models: Path) -> tuple[subprocess.Popen, str]:
    """`stitchrec serve` of the repository ``models`` polling every 0.2 s, and its address."""
    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(models),
        "--host", "127.0.0.1", "--port", "0", "--poll-seconds", "0.2", "--log-level", "WARNING",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    return proc, f"127.0.0.1:{json.loads(proc.stdout.readline())['port']}"


USER = {"user": "u1"}
CANDIDATES = {
    "item": np.array([3, 5], dtype=np.int64),
    "tags": np.array([b"c|a", b""], dtype=object),
    "price": np.array([10.0, 2.5], dtype=np.float32),
    "age": np.array([30.0, 50.0], dtype=np.float32),
}


def _rank(target: str):
    with RankingClient(target) as c:
        return c.rank("ctr", USER, CANDIDATES)


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Three days in a row with the default rule (not_worse) into one repository, served by
    `stitchrec serve` from the end of day d1 on: ``first_served`` is the version it served
    before day d3 started."""
    root = tmp_path_factory.mktemp("daily")
    (root / "daily.toml").write_text(CONFIG)
    windows = _windows(root / "windows")
    reports = [run_daily(_opts(root, windows[0]), log=lambda _: None)]
    server = subprocess.Popen(["true"])
    try:
        server, target = _server(root / "models")  # loads while day d2 trains
        reports.append(run_daily(_opts(root, windows[1]), log=lambda _: None))
        wait_serving(target)
        first_served = _rank(target).version
        reports.append(run_daily(_opts(root, windows[2]), log=lambda _: None))
        yield {
            "root": root,
            "windows": windows,
            "reports": reports,
            "repo": root / "models" / "ctr",
            "target": target,
            "first_served": first_served,
        }
    finally:
        server.kill()
        server.wait()


def _tree(*folders: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folders``: (size, mtime ns) by path."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns)
        for f in folders
        for p in sorted(f.rglob("*"))
        if p.is_file()
    }


def _scores(model: Path, window: Path) -> np.ndarray:
    logs = load_logs([str(window / "test")], str(window / "schema.toml"))
    return open_source(str(model)).scores(logs)


def test_three_days_export_versions_1_to_3_with_the_figures_of_run_ab(days):
    root, repo, windows = days["root"], days["repo"], days["windows"]
    assert sorted(p.name for p in repo.iterdir()) == ["1", "2", "3"]
    runs = [root / "runs" / f"day-d{i}" for i in (1, 2, 3)]
    for i, (report, run) in enumerate(zip(days["reports"], runs, strict=True)):
        assert report["version"] == i + 1 and report["decision"] == "exported"
        assert report["continued_from"] == (str(runs[i - 1]) if i else None)
        assert json.loads((run / REPORT_FILE).read_text()) == report
        assert list(json.loads((run / JOURNAL_FILE).read_text())["steps"]) == list(STEPS)
        meta = json.loads((repo / str(i + 1) / "assets.extra" / "stitchrec.json").read_text())
        assert meta["run"] == str(run) and meta["daily"]["window"] == str(windows[i])
    first = days["reports"][0]
    assert first["served"] is None and first["difference"] is None
    assert "first version" in first["reason"]
    # the third day's figures are run_ab's comparison of version 2 and the candidate
    third = days["reports"][2]
    ab = run_ab(
        ABOptions(
            control=str(repo / "2"),
            treatment=str(runs[2] / "export" / "1"),
            data=[str(windows[2] / "test")],
            schema=str(windows[2] / "schema.toml"),
        ),
        log=lambda _: None,
    )
    auc = ab["overall"]["metrics"]["auc"]
    assert third["served"] == {"version": 2, "path": str(repo / "2"), "auc": auc["control"]}
    assert third["candidate"]["auc"] == auc["treatment"]
    for key in ("delta", "ci_low", "ci_high", "p_value", "verdict"):
        assert third["difference"][key] == auc[key], key
    assert third["rows"] == ab["rows"] == 500
    assert third["train"]["test"]["auc"] == pytest.approx(auc["treatment"], abs=1e-6)
    # the version is the candidate that was scored
    np.testing.assert_array_equal(
        _scores(repo / "3", windows[2]), _scores(runs[2] / "export" / "1", windows[2])
    )


def test_rerun_of_a_finished_day_changes_nothing(days):
    root = days["root"]
    before = _tree(root / "runs", days["repo"])
    lines: list[str] = []
    report = run_daily(_opts(root, days["windows"][2]), log=lines.append)
    assert report == days["reports"][2]
    assert len(lines) == 1 and lines[0].startswith("day-d3 is finished: exported as version 3")
    assert _tree(root / "runs", days["repo"]) == before


def test_rule_better_rejects_a_candidate_that_is_the_served_model(days, tmp_path):
    """Day d1 trained from scratch again (deterministic) is version 1 itself: the paired
    difference is 0, so `better` rejects it and nothing is exported."""
    repo = tmp_path / "models" / "ctr"
    shutil.copytree(days["repo"] / "1", repo / "1")
    (tmp_path / "daily.toml").write_text(CONFIG)
    report = run_daily(_opts(tmp_path, days["windows"][0], rule="better"), log=lambda _: None)
    assert report["decision"] == "rejected" and report["version"] is None
    assert report["difference"]["delta"] == 0.0
    assert report["difference"]["ci_low"] == report["difference"]["ci_high"] == 0.0
    assert "does not lie wholly on the better side" in report["reason"]
    assert sorted(p.name for p in repo.iterdir()) == ["1"]
    steps = json.loads((tmp_path / "runs" / "day-d1" / JOURNAL_FILE).read_text())["steps"]
    assert steps["exported"] == {"version": None}


def test_decision_rules_read_the_interval_on_the_metric_s_better_side():
    below, around, above = (
        {"ci_low": lo, "ci_high": hi} for lo, hi in ((-0.03, -0.01), (-0.01, 0.02), (0.01, 0.03))
    )
    accepted = {
        (rule, metric, name): decide(rule, metric, d)["accepted"]
        for rule in ("not_worse", "better", "always")
        for metric in ("auc", "logloss")
        for name, d in (("below", below), ("around", around), ("above", above))
    }
    # auc: higher is better; logloss: lower is better
    assert [accepted["not_worse", "auc", n] for n in ("below", "around", "above")] == [0, 1, 1]
    assert [accepted["not_worse", "logloss", n] for n in ("below", "around", "above")] == [1, 1, 0]
    assert [accepted["better", "auc", n] for n in ("below", "around", "above")] == [0, 0, 1]
    assert [accepted["better", "logloss", n] for n in ("below", "around", "above")] == [1, 0, 0]
    assert all(accepted["always", m, n] for m in ("auc", "logloss") for n in ("below", "above"))
    assert decide("better", "auc", None)["accepted"]  # an empty repository takes the first
    assert not decide("better", "auc", {"ci_low": None, "ci_high": None})["accepted"]
    assert decide("not_worse", "auc", {"ci_low": None, "ci_high": None})["accepted"]


def test_bad_arguments_print_one_error_line_and_exit_2(days, tmp_path, capsys):
    root, window = days["root"], str(days["windows"][0])
    (tmp_path / "empty").mkdir()
    no_test = tmp_path / "no_test"  # a window of shards without test/ shards
    no_test.mkdir()
    shutil.copy(Path(window) / "schema.toml", no_test / "schema.toml")
    shutil.copytree(Path(window) / "train", no_test / "train")
    no_train = tmp_path / "no_train"  # a window of shards without train/ shards
    no_train.mkdir()
    shutil.copy(Path(window) / "schema.toml", no_train / "schema.toml")
    shutil.copytree(Path(window) / "test", no_train / "test")
    base = ["daily", "--config", str(root / "daily.toml"), "--repo", str(days["repo"])]
    runs = ["--runs", str(root / "runs")]
    lbfgs = ["--set", 'model.type="lr"', "--set", 'train.optimizer="lbfgs"']
    cases = [
        (["--window", window, "--rule", "best", *runs], "--rule 'best': expected one of"),
        (["--window", window, "--metric", "ndcg", *runs], "--metric 'ndcg': expected one of"),
        (["--window", window, "--bootstrap", "0", *runs], "--bootstrap 0: expected"),
        (["--window", str(tmp_path / "none"), *runs], "expected a folder of one window"),
        (["--window", str(tmp_path / "empty"), *runs], "': no files (a window holds"),
        (["--window", str(no_test), *runs], "no Parquet shards in test/"),
        (["--window", str(no_train), *runs], "no Parquet shards in train/"),
        (
            ["--window", window, *lbfgs, *runs],
            "'lbfgs' fits each run exactly and cannot continue the day before",
        ),
        # day d1 of these runs was decided under the rule not_worse
        (["--window", window, "--rule", "always", *runs], "holds the day of --rule not_worse"),
    ]
    for flags, message in cases:
        assert main([*base, *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def _daily_process(root: Path, window: Path, lines: list[str]) -> subprocess.Popen:
    """`stitchrec daily --rule always` in a subprocess; its output lines are appended to
    ``lines``."""
    cmd = [sys.executable, "-m", "pipelines.cli", "daily", "--config", str(root / "daily.toml")]
    cmd += ["--window", str(window), "--runs", str(root / "runs"), "--repo", str(root / "repo")]
    cmd += ["--rule", "always"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return proc


def _versions(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.iterdir()) if repo.is_dir() else []


@pytest.mark.slow
def test_sigkill_at_random_points_then_rerun_exports_one_version_equal_to_uninterrupted(
    days, tmp_path
):
    """Day d1 again, into a repository serving the module's day d1 (version 1), killed twice at
    random and rerun: it ends with one new version, scoring as the uninterrupted day."""
    (tmp_path / "daily.toml").write_text(CONFIG)
    repo = tmp_path / "repo"
    shutil.copytree(days["repo"] / "1", repo / "1")
    window, rng = days["windows"][0], random.Random(7)
    journal = tmp_path / "runs" / "day-d1" / JOURNAL_FILE
    killed_at = []
    # seconds after the day's first line (TensorFlow loaded): in training, then once the
    # journal records `trained` (the exports and the scoring)
    for bound, after_training in ((8.0, False), (3.0, True)):
        lines: list[str] = []
        proc = _daily_process(tmp_path, window, lines)
        deadline = time.time() + 180
        while not any(line.startswith("day-d1") for line in lines) or (
            after_training and "trained" not in json.loads(journal.read_text())["steps"]
        ):
            if proc.poll() is not None:
                break
            assert time.time() < deadline, "".join(lines)
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, bound))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_at.append(lines[-1].strip() if lines else "")
        # never a second new version; a killed copy is a hidden folder, not a version
        named = [v for v in _versions(repo) if not v.startswith(".")]
        assert named in (["1"], ["1", "2"]), killed_at
    lines = []
    proc = _daily_process(tmp_path, window, lines)
    assert proc.wait(240) == 0, "".join(lines)
    assert _versions(repo) == ["1", "2"], killed_at
    report = json.loads((tmp_path / "runs" / "day-d1" / REPORT_FILE).read_text())
    assert report["version"] == 2 and report["served"]["version"] == 1
    # the resumed day ends where the uninterrupted one (the module's day d1) ends
    np.testing.assert_allclose(
        _scores(repo / "2", window), _scores(repo / "1", window), rtol=1e-5, atol=1e-7
    )


def test_a_running_server_hot_swaps_to_the_day_s_version(days):
    assert days["first_served"] in (1, 2)  # served before day d3 exported version 3
    deadline = time.time() + 60
    while (r := _rank(days["target"])).version != 3 and time.time() < deadline:
        time.sleep(0.2)
    assert r.version == 3
    fn = tf.saved_model.load(str(days["repo"] / "3")).signatures["serving_default"]
    ref = fn(user=tf.constant([b"u1", b"u1"]), **{k: tf.constant(v) for k, v in CANDIDATES.items()})
    np.testing.assert_allclose(r.scores, ref["score"].numpy(), rtol=1e-5, atol=1e-7)
