"""``[train] continue_from`` end to end through ``pipelines.train.train``: a second window with a
bigger vocabulary (where ``warm_start`` fails), exactness against one uninterrupted run, and
continuing under MultiWorkerMirroredStrategy and ParameterServerStrategy (real local clusters)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.stats import DatasetStats
from pipelines.cli import main
from pipelines.config import load_config
from pipelines.distribute import free_ports, worker_tf_config
from pipelines.run.model import load_trained_model
from pipelines.run.paths import RunPaths
from pipelines.train import train
from tests.pipelines.test_distribute_ps import _Cluster
from tests.testdata import NO_VALIDATION, TINY_SCHEMA, make_tiny_table, write_run_config

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"
MODEL = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [16], "cross_layers": 1}


def _window(root: Path, table: pa.Table, test: pa.Table) -> dict[str, Path]:
    (root / "train").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "schema.toml").write_text(TINY_SCHEMA)
    pq.write_table(table, root / "train" / "part-00000.parquet")
    pq.write_table(test, root / "test" / "part-00000.parquet")
    return {
        "schema": root / "schema.toml",
        "train": root / "train",
        "test": root / "test",
        "root": root,
    }


def _grown_window(root: Path) -> dict[str, Path]:
    """The tiny click log of another day: users u30..u39 are gone and 20 new users n0..n19 take
    their rows (a 50-value vocabulary instead of 40)."""
    t = make_tiny_table(1200, seed=1)
    users = [u if int(u[1:]) < 30 else f"n{i % 20}" for i, u in enumerate(t["user"].to_pylist())]
    t = t.set_column(0, "user", pa.array(users))
    return _window(root, t.slice(0, 1000), t.slice(1000))


def _rows(run: Path, field: str, weight: str = "table") -> dict[str, np.ndarray]:
    """``{value: row}`` of a field's ``weight`` (rows by id) in a run's selected checkpoint
    (``""``: the OOV row)."""
    model, _, _ = load_trained_model(run)
    table = getattr(model.embedding.layers_by_field[field], weight).numpy()
    vocab = DatasetStats.load(RunPaths(run).stats)[field].vocab
    return {"": table[0], **{v: table[i + 1] for i, v in enumerate(vocab)}}


#: ``[model]`` of the runs on the grown window: user full (its vocabulary grows), item AMTL
#: (its counts follow the values), tags hashing
_METHODS = '[model.embedding_methods]\nitem = "amtl"\ntags = "hashing"\n'
_GROWN_MODEL = MODEL | {"embedding_compression": 2.0, "compress_min_rows": 2}
_KEYS = {"batch_size": 128, "epochs": 1, "learning_rate": 0.01, "log_every": 1}


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> dict[str, Path]:
    """Day 1 (the tiny click log), the grown day 2 and a finished run on day 1 (8 steps)."""
    root = tmp_path_factory.mktemp("days")
    table = make_tiny_table(1200)
    day1 = _window(root / "day1", table.slice(0, 1000), table.slice(1000))
    first = root / "first"
    config = write_run_config(
        root / "first.toml", day1, first, _GROWN_MODEL, _KEYS, _METHODS, NO_VALIDATION
    )
    train(load_config(config), lambda _: None)
    return {"day2": _grown_window(root / "day2"), "first": first}


def _on_day2(days: dict, out: Path, distribute: str = "", **keys) -> Path:
    """The config of a run on day 2 into ``out`` continuing the day 1 run: 2 steps (unless
    ``keys`` say otherwise) at a learning rate too small to move anything (the rows it starts
    from stay)."""
    keys = {**_KEYS, "continue_from": str(days["first"]), "learning_rate": 1e-12, **keys}
    extra = _METHODS + distribute
    return write_run_config(
        out.with_suffix(".toml"), days["day2"], out, _GROWN_MODEL, {"max_steps": 2} | keys, extra,
        NO_VALIDATION,
    )  # fmt: skip


def _check_continued(first: Path, second: Path) -> None:
    """The continued run's rows by value are the previous run's (a new user: its OOV row), its
    AMTL item rows and counts too, and its optimizer counted on from 8 steps."""
    before, after = _rows(first, "user"), _rows(second, "user")
    # the vocabulary state keeps u30..u39 (evict_after = 0): 40 kept values + 20 new ones
    assert len(after) == 61 and len(before) == 41
    for value, row in after.items():
        if value:  # the OOV row, reached by no row of either day, holds each run's mean row
            np.testing.assert_allclose(row, before.get(value, before[""]), atol=1e-6, err_msg=value)
    for weight in ("table", "counts"):  # every item is kept
        before, after = _rows(first, "item", weight), _rows(second, "item", weight)
        assert sorted(after) == sorted(before)
        for value, row in after.items():
            np.testing.assert_allclose(row, before[value], atol=1e-6, err_msg=f"{weight} {value}")
    ckpt = tf.train.latest_checkpoint(str(second / "checkpoints"))
    assert tf.train.load_variable(ckpt, ITERATIONS) == 8 + 2


def test_a_bigger_vocabulary_continues_by_value_where_warm_start_fails(
    days, tmp_path, monkeypatch, capsys
):
    warm = load_config(_on_day2(days, tmp_path / "warm"))
    warm = dataclasses.replace(
        warm, train=dataclasses.replace(warm.train, continue_from="", warm_start=str(days["first"]))
    )
    with pytest.raises(ValueError, match="shape"):  # by position: 41 rows there, 51 here
        train(warm, lambda _: None)
    # `stitchrec train --continue RUN`, RUN relative to the working directory
    config = _on_day2(days, tmp_path / "second", continue_from="")
    monkeypatch.chdir(days["first"].parent)
    assert main(["train", "--config", str(config), "--continue", days["first"].name]) == 0
    assert "user 40 kept / 20 new" in capsys.readouterr().out
    _check_continued(days["first"], tmp_path / "second")
    cfg = load_config(config, [f"train.continue_from={json.dumps(str(days['first']))}"])
    lines: list[str] = []
    # resuming the continued run restores its own checkpoint, not the previous run again
    lines.clear()
    assert train(cfg, lines.append)["steps_this_run"] == 0
    assert any("resuming this run's own checkpoint instead" in line for line in lines)


def test_continue_epochs_bounds_a_continued_run_only(days, tmp_path):
    """``epochs = 3, continue_epochs = 1``: the continued run trains one epoch of day 2 (1,000
    rows of 128: 8 steps), not three."""
    keys = {"epochs": 3, "continue_epochs": 1, "max_steps": 0, "learning_rate": 0.01}
    report = train(load_config(_on_day2(days, tmp_path / "second", **keys)), lambda _: None)
    assert report["steps_this_run"] == 8
    ckpt = tf.train.latest_checkpoint(str(tmp_path / "second" / "checkpoints"))
    assert tf.train.load_variable(ckpt, ITERATIONS) == 8 + 8


# ---------------------------------------------------------------- exactness

_CATEGORICAL_SCHEMA = """
name = "days"

[source]
format = "parquet"

[[fields]]
name = "user"
kind = "categorical"

[[fields]]
name = "item"
kind = "categorical"

[[fields]]
name = "label"
kind = "label"
"""


def _same_vocabulary_windows(root: Path) -> list[Path]:
    """Two windows of 32 rows whose columns hold the same values the same number of times (user
    u0..u3: 12, 9, 7, 4 rows; item i0..i2: 16, 10, 6; 12 clicks), paired into rows differently:
    each window's vocabularies, counts and label mean are the two windows' together, so one run
    over both has the same vocabularies (same order) and initial bias as a run over either.
    Row groups of one row."""
    users = np.repeat(["u0", "u1", "u2", "u3"], [12, 9, 7, 4])
    items = np.repeat(["i0", "i1", "i2"], [16, 10, 6])
    labels = np.repeat([1.0, 0.0], [12, 20]).astype(np.float32)
    rng = np.random.default_rng(5)
    paths = []
    for day in range(2):
        t = pa.table(
            {
                "user": pa.array(rng.permutation(users).tolist()),
                "item": pa.array(rng.permutation(items).tolist()),
                "label": pa.array(rng.permutation(labels)),
            }
        )
        path = root / f"{day}-day.parquet"
        pq.write_table(t, path, row_group_size=1)
        paths.append(path)
    return paths


def _variables(prefix: str) -> dict[str, np.ndarray]:
    """The model and optimizer values of a checkpoint (the run's counters left out)."""
    names = [n for n, _ in tf.train.list_variables(prefix)]
    keep = [n for n in names if n.startswith(("model/", "optimizer/"))]
    return {n: tf.train.load_variable(prefix, n) for n in keep}


def test_continuing_reproduces_one_uninterrupted_run_exactly(tmp_path):
    """Day 1 then a run continued on day 2 ends bitwise where one run over day 1 then day 2 ends.

    The uninterrupted reference is the real training loop over both days' files (in this order),
    one epoch: its steps 1..32 are day 1's rows and 33..64 day 2's. For its batches to be the
    split runs' batches, the data order must not depend on what else the epoch holds: with
    batches of one row, a shuffle buffer of one row and row groups of one row every shuffle
    permutes one row, so the order is the files' order, which the seed keeps as it is (the one
    permutation of two files the loop draws is the identity for that seed). Constant learning
    rate, Adam, ``deterministic = true``, the same vocabularies and initial bias in all runs
    (``_same_vocabulary_windows``). Its checkpoint at step 32 is the day 1 run's; at step 64 the
    continued run's, every weight and every Adam slot and iteration count bitwise."""
    days = _same_vocabulary_windows(tmp_path)
    seed = next(
        s for s in range(100) if list(np.random.default_rng([s, 0]).permutation(2)) == [0, 1]
    )
    folders = {}
    for name, files in (("day1", days[:1]), ("day2", days[1:]), ("both", days)):
        folder = tmp_path / name
        folder.mkdir()
        for f in files:
            (folder / f.name).write_bytes(f.read_bytes())
        folders[name] = folder
    (tmp_path / "schema.toml").write_text(_CATEGORICAL_SCHEMA)

    def config(name: str, train_on: str, **keys) -> object:
        data = {
            "schema": tmp_path / "schema.toml",
            "train": folders[train_on],
            "test": folders["day2"],
        }
        train_keys = {"batch_size": 1, "epochs": 1, "learning_rate": 0.01, "deterministic": True}
        train_keys |= {"shuffle_buffer": 1, "checkpoint_every": 32, "log_every": 1000, "seed": seed}
        model = {"type": "dcn_v2", "embedding_dim": 3, "mlp": [4], "cross_layers": 1}
        path = write_run_config(
            tmp_path / f"{name}.toml",
            data,
            tmp_path / name,
            model,
            train_keys | keys,
            data_extra=NO_VALIDATION,
        )
        return load_config(path)

    assert train(config("reference", "both"), lambda _: None)["steps"] == 64
    train(config("first", "day1"), lambda _: None)
    report = train(
        config("continued", "day2", continue_from=str(tmp_path / "first")), lambda _: None
    )
    assert report["steps"] == 32
    ref = tmp_path / "reference" / "checkpoints"
    for run, ref_step in (("first", 32), ("continued", 64)):
        got = _variables(tf.train.latest_checkpoint(str(tmp_path / run / "checkpoints")))
        want = _variables(str(ref / f"ckpt-{ref_step}"))
        assert sorted(got) == sorted(want) and any(
            n.startswith("optimizer/_variables/") for n in got
        )
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{run} {name}")
    assert _variables(str(ref / "ckpt-64"))[ITERATIONS] == 64


# ---------------------------------------------------------------- distributed


def _two_workers(config: Path, root: Path, timeout: float = 300) -> list[str]:
    """Runs ``stitchrec train --config config`` as 2 MultiWorkerMirroredStrategy workers on
    127.0.0.1; both must exit 0. Returns their logs."""
    ports = free_ports(2)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env |= {"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config)]
    logs = [root / f"worker-{i}.log" for i in range(2)]
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=dict(env, TF_CONFIG=worker_tf_config(ports, i)),
            stdout=logs[i].open("w"),
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n---\n".join(t[-3000:] for t in texts)
    return texts


def test_continue_under_multi_worker_mirrored(days, tmp_path):
    """Two local workers each restore the previous run and fill their mirrored variables."""
    second = tmp_path / "second"
    texts = _two_workers(_on_day2(days, second, '[distribute]\ninput = "split"\n'), tmp_path)
    for text in texts:
        assert "user 40 kept / 20 new" in text, text[-3000:]
    _check_continued(days["first"], second)


def test_continue_under_parameter_servers(days, tmp_path):
    """Chief, 1 worker and 2 ps (so the tables are split in 2 shards, which 1 ps never does):
    the chief gathers each sharded table whole, remaps it and assigns it back shard by shard
    (the chief alone continues: one worker runs the steps)."""
    ps = '[distribute]\nstrategy = "parameter_server"\nps_min_shard_bytes = 16\n'
    second = tmp_path / "second"
    config = _on_day2(days, second, ps)
    cluster = _Cluster(config, workers=1, ps=2)
    try:
        for task in cluster.tasks():
            cluster.start(task)
        cluster.join(timeout=300)
    finally:
        cluster.close()
    chief = cluster.log("chief-0")
    assert "user 40 kept / 20 new" in chief, chief[-3000:]
    sharding = [line for line in chief.splitlines() if line.startswith("parameter_server: ")]
    assert "emb_000/table in 2 shards" in sharding[-1], sharding
    _check_continued(days["first"], second)
