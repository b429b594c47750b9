"""``stitchrec skew`` on a run built from statistics alone (``stitchrec stats`` + schema, no
training) and prediction logs written from ScoredCalls with serving.log_format."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipelines import cli
from pipelines.skew import SkewOptions, run_skew
from serving.calls import ScoredCall
from serving.log_format import call_table, file_name, write_file
from tests.testdata import TINY_SCHEMA, make_tiny_table, write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]
ROWS_PER_CALL = 200


def _make_run(tmp_path: Path, shards: bool = True) -> Path:
    """A run folder with schema.toml, stats/ of the tiny dataset's 4,000 training rows and,
    with ``shards``, its training shard under data/train/."""
    (tmp_path / "data").mkdir()
    data = write_tiny_dataset(tmp_path / "data", rows=5000, train_rows=4000)
    run = tmp_path / "run"
    argv = ["stats", "--schema", str(data["schema"]), "--input", str(data["train"])]
    assert cli.main([*argv, "--output", str(run / "stats")]) == 0
    (run / "schema.toml").write_text(TINY_SCHEMA)
    if shards:
        shutil.copytree(data["train"], run / "data" / "train")
    return run


def _write_logs(folder: Path, table: pa.Table, model: str = "ctr", score_shift: float = 0.0):
    """``table``'s rows as calls of ``ROWS_PER_CALL`` rows, logged in two files."""
    rng = np.random.default_rng(7)
    tables = []
    for i, start in enumerate(range(0, table.num_rows, ROWS_PER_CALL)):
        part = table.slice(start, ROWS_PER_CALL)
        n = part.num_rows
        feats = {
            "user": np.array([v.encode() for v in part.column("user").to_pylist()], object),
            "item": part.column("item").to_numpy(),
            "tags": np.array([v.encode() for v in part.column("tags").to_pylist()], object),
            "price": part.column("price").to_numpy(),
            "age": part.column("age").to_numpy(),
            "page": np.array([b"home"] * n, object),
        }
        score = np.clip(rng.beta(2, 5, n) + score_shift, 0, 1).astype(np.float32)
        call = ScoredCall(
            f"r{i}",
            1.7e9 + i,
            "grpc",
            model,
            1,
            "serving_default",
            "",
            False,
            feats,
            {"score": score},
        )
        tables.append(call_table(call))
    half = len(tables) // 2
    for seq, chunk in enumerate((tables[:half], tables[half:])):
        write_file(folder / model / file_name(1_700_000_000_000, 1, seq), pa.concat_tables(chunk))
    return folder


def _shifted(table: pa.Table) -> pa.Table:
    """User values all new (out of vocabulary), age moved by about 3 training std."""
    users = pa.array([f"new-{u}" for u in table.column("user").to_pylist()])
    ages = pa.array(table.column("age").to_numpy() + 45.0)
    return table.set_column(0, "user", users).set_column(4, "age", ages)


def test_training_traffic_is_not_flagged_and_a_planted_shift_is(tmp_path):
    run = _make_run(tmp_path)
    served = make_tiny_table(2000, seed=1)
    same = run_skew(SkewOptions(str(run), [str(_write_logs(tmp_path / "same", served))]))
    assert same["flagged"] == [] and same["rows"] == 2000 and same["model"] == "ctr"
    assert set(same["fields"]) == {"user", "item", "tags", "price", "age"}
    assert all(d["psi"] < 0.1 for d in same["fields"].values()), same["fields"]
    assert same["fields"]["price"]["reference"] == "training_shards"
    assert len(same["fields"]["age"]["bins"]) == 4  # num_buckets = 4: the stats' quantiles
    assert same["fields"]["user"]["oov_rate_served"] == 0.0
    assert same["extra_columns"] == ["page"] and same["missing_fields"] == []
    assert "psi" not in same["score"]  # no --reference logs

    out = tmp_path / "report"
    logs = _write_logs(tmp_path / "shifted", _shifted(served))
    shifted = run_skew(SkewOptions(str(run), [str(logs)], output=str(out)))
    assert shifted["flagged"] == ["age", "user"]
    assert list(shifted["fields"])[:2] == ["age", "user"]  # flagged first
    user = shifted["fields"]["user"]
    assert user["oov_rate_served"] == 1.0 and user["oov_change"] == pytest.approx(1.0)
    assert user["served"][-1] == 1.0 and user["bins"][-1] == "(oov)"
    assert shifted["fields"]["age"]["mean_shift_std"] == pytest.approx(3.0, abs=0.3)
    assert json.loads((out / "skew.json").read_text())["flagged"] == ["age", "user"]
    page = (out / "skew.html").read_text()
    assert page.count("<svg") == 6 and "Flagged: <b>age, user</b>" in page


def test_score_shift_against_reference_logs_and_stats_only_bins(tmp_path):
    run = _make_run(tmp_path, shards=False)
    served = make_tiny_table(1000, seed=2)
    ref = _write_logs(tmp_path / "ref", served)
    logs = _write_logs(tmp_path / "now", served, score_shift=0.3)
    result = run_skew(SkewOptions(str(run), [str(logs)], reference=[str(ref)]))
    score = result["score"]
    assert score["flagged"] and score["mean_shift"] == pytest.approx(0.3, abs=0.03)
    assert score["rows_reference"] == score["rows_served"] == 1000
    assert result["fields"]["price"]["reference"] == "normal"  # no shards, no quantiles
    assert result["fields"]["age"]["reference"] == "stats_quantiles"
    assert result["fields"]["age"]["train"] == [0.25] * 4


def test_cli_errors_are_one_line_and_exit_2(tmp_path):
    run = _make_run(tmp_path, shards=False)
    logs = _write_logs(tmp_path / "logs", make_tiny_table(400, seed=3))
    other = tmp_path / "other"
    call = ScoredCall(
        "x",
        1.7e9,
        "grpc",
        "ranker",
        1,
        "s",
        "",
        False,
        {"q": np.ones(2)},
        {"score": np.ones(2, np.float32)},
    )
    write_file(other / "ranker" / file_name(1, 1, 0), call_table(call))
    cases = {
        "no such run folder": ["--run", str(tmp_path / "nope"), "--data", str(logs)],
        "does not exist": ["--run", str(run), "--data", str(tmp_path / "empty")],
        "another model": ["--run", str(run), "--data", str(other)],
        "no prediction logs of model 'x'": ["--run", str(run), "--data", str(logs), "--model", "x"],
    }
    code = (
        "import sys\nfrom pipelines import cli\n"
        f"for argv in {list(cases.values())!r}:\n"
        "    print(cli.main(['skew', *argv]), flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.stdout.split() == ["2"] * len(cases), p.stderr
    assert len(errors) == len(cases)
    for line, expected in zip(errors, cases, strict=True):
        assert expected in line, line
