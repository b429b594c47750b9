"""``stitchrec skew`` on a run built from statistics alone (``features.stats`` + schema, no
training) and prediction logs written from ScoredCalls with serving.log_format."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.schema import load_schema
from features.stats import compute_stats
from pipelines.cli import main
from pipelines.skew import SkewOptions, run_skew
from serving.calls import ScoredCall
from serving.log_format import call_table, file_name, write_file
from tests.testdata import TINY_SCHEMA, make_tiny_table, write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]
ROWS_PER_CALL = 200


def _make_run(tmp_path: Path, shards: bool = True) -> Path:
    """A run folder with schema.toml, stats/ of the tiny dataset's 4,000 training rows (as
    ``stitchrec stats`` computes them) and, with ``shards``, its training shard under
    data/train/."""
    (tmp_path / "data").mkdir()
    data = write_tiny_dataset(tmp_path / "data", rows=5000, train_rows=4000)
    run = tmp_path / "run"
    batches = pq.read_table(data["train"]).to_batches()
    compute_stats(load_schema(data["schema"]), batches).save(run / "stats")
    (run / "schema.toml").write_text(TINY_SCHEMA)
    if shards:
        shutil.copytree(data["train"], run / "data" / "train")
    return run


def _write_logs(
    folder: Path,
    table: pa.Table,
    model: str = "ctr",
    score_shift: float = 0.0,
    drop: tuple[str, ...] = (),
    shadow_calls: int = 0,
) -> Path:
    """``table``'s rows as calls of ``ROWS_PER_CALL`` rows, logged in two files, without the
    features ``drop``; the first ``shadow_calls`` calls are also logged as shadow calls with
    every age 1000."""
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
        feats = {k: v for k, v in feats.items() if k not in drop}
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
        if i < shadow_calls:
            feats = {**feats, "age": np.full(n, 1000.0, np.float32)}
            shadow = dataclasses.replace(call, version=2, shadow=True, features=feats)
            tables.append(call_table(shadow))
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
    logs = _write_logs(tmp_path / "now", served, score_shift=0.3, drop=("tags",), shadow_calls=2)
    result = run_skew(SkewOptions(str(run), [str(logs)], reference=[str(ref)]))
    score = result["score"]
    assert score["flagged"] and score["mean_shift"] == pytest.approx(0.3, abs=0.03)
    assert score["rows_reference"] == score["rows_served"] == 1000
    assert result["fields"]["price"]["reference"] == "normal"  # no shards, no quantiles
    assert result["fields"]["age"]["reference"] == "stats_quantiles"
    assert result["fields"]["age"]["train"] == [0.25] * 4
    assert result["fields"]["age"]["status"] == "ok"  # the shadow rows' ages are left out
    assert result["missing_fields"] == ["tags"] and result["versions"] == [1]
    with_shadow = run_skew(SkewOptions(str(run), [str(logs)], include_shadow=True))
    assert with_shadow["rows"] == 1400 and with_shadow["versions"] == [1, 2]
    assert with_shadow["flagged"] == ["age"]


def test_cli_json_and_errors_are_one_line_and_exit_2(tmp_path):
    run = _make_run(tmp_path, shards=False)
    logs = _write_logs(tmp_path / "logs", make_tiny_table(400, seed=3))
    other = tmp_path / "other"
    call = ScoredCall(
        "x", 1.7e9, "grpc", "ranker", 1, "s", "", False, {"q": np.ones(2)}, {"s": np.ones(2)}
    )
    write_file(other / "ranker" / file_name(1, 1, 0), call_table(call))
    cases = {
        "no such run folder": ["--run", str(tmp_path / "nope"), "--data", str(logs)],
        "does not exist": ["--run", str(run), "--data", str(tmp_path / "empty")],
        "another model": ["--run", str(run), "--data", str(other)],
        "no prediction logs of model 'x'": ["--run", str(run), "--data", str(logs), "--model", "x"],
    }
    ok = ["--run", str(run), "--data", str(logs), "--json"]
    code = (
        "import sys\nfrom pipelines import cli\n"
        f"for argv in {[ok, *cases.values()]!r}:\n"
        "    print('exit', cli.main(['skew', *argv]), file=sys.stderr, flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert json.loads(p.stdout)["rows"] == 400, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith(("error:", "exit"))]
    assert lines[0] == "exit 0" and len(lines) == 1 + 2 * len(cases), p.stderr
    for expected, line in zip(cases, lines[1::2], strict=True):
        assert line.startswith("error: ") and expected in line, line
    assert lines[2::2] == ["exit 2"] * len(cases), p.stderr


def test_a_score_output_the_logs_lack_is_one_error_line(tmp_path, capsys):
    run = _make_run(tmp_path, shards=False)
    logs = _write_logs(tmp_path / "logs", make_tiny_table(400, seed=3))
    out = tmp_path / "report"
    argv = ["skew", "--run", str(run), "--data", str(logs), "--output", str(out)]
    assert main([*argv, "--score-output", "probability"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [
        f"error: --score-output 'probability': the logs of model 'ctr' under {logs} have no "
        "such output; they have ['score']"
    ]
    assert not out.exists()
    assert main([*argv, "--score-output", "score", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["score"]["output"] == "score"
