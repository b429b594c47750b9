"""End to end with real parts: two trained and exported models, one of them behind our gRPC
server (TF Serving's PredictionService), `stitchrec ab` in a subprocess, and the HTML report
rendered by headless Chromium."""

from __future__ import annotations

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

from pipelines.cli import main
from pipelines.config import load_config
from pipelines.evaluate import score_saved_model
from pipelines.evaluation import compare, report, sources
from pipelines.export import export_run
from pipelines.train import train
from ranking import metrics as M
from tests.testdata import write_run_config, write_tiny_dataset

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    data = write_tiny_dataset(root)
    out = {"root": root, "test": root / "test"}
    train_section = {"batch_size": 256, "epochs": 1, "learning_rate": 0.02, "log_every": 100}
    for name, model in (("control", "lr"), ("treatment", "dcn_v2")):
        model_section = {"type": model, "embedding_dim": 4, "mlp": [16], "cross_layers": 1}
        cfg_path = write_run_config(
            root / f"{name}.toml", data, root / name, model_section, train_section
        )
        train(load_config(cfg_path), log=lambda _: None)
        out[name] = export_run(root / name)
    return out


def test_saved_model_source_matches_evaluate(models):
    logs = sources.load_logs([str(models["test"])], str(models["root"] / "schema.toml"))
    got = sources.open_source(str(models["treatment"])).scores(logs)
    labels, expected, _ = score_saved_model(models["treatment"], [models["test"]])
    np.testing.assert_allclose(got, expected, atol=1e-7)
    np.testing.assert_array_equal(logs.labels, labels)


@pytest.fixture(scope="module")
def server(models):
    from serving.server import ServerOptions
    from serving.testing import ServerThread

    repo = models["root"] / "repo"
    shutil.copytree(models["treatment"], repo / "ctr" / "1")
    with ServerThread(repo, ServerOptions()) as s:
        yield s


def test_grpc_source_scores_like_the_saved_model(models, server):
    logs = sources.load_logs([str(models["test"])])  # schema.toml found beside the shards
    grpc_src = sources.open_source(f"grpc://{server.target}/ctr")
    np.testing.assert_allclose(
        grpc_src.scores(logs), sources.open_source(str(models["treatment"])).scores(logs), atol=1e-6
    )
    with pytest.raises(sources.SourceError, match=r"Predict failed|GetModelMetadata failed"):
        sources.open_source(f"grpc://{server.target}/nope").scores(logs)


def test_cli_compares_saved_model_with_grpc_server(models, server, tmp_path):
    out = tmp_path / "report"
    cmd = [
        sys.executable, "-m", "pipelines.cli", "ab",
        "--control", str(models["control"]),
        "--treatment", f"grpc://{server.target}/ctr",
        "--data", str(models["test"]),
        "--group", "user", "--slice", "item", "--slice", "price", "--k", "3",
        "--bootstrap", "200", "--seed", "3", "--output", str(out),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "VERDICT (auc, 95%)" in proc.stdout
    res = json.loads((out / "ab.json").read_text())
    logs = sources.load_logs([str(models["test"])])
    sc = sources.open_source(str(models["control"])).scores(logs)
    st = sources.open_source(str(models["treatment"])).scores(logs)
    m = res["overall"]["metrics"]
    assert m["auc"]["control"] == pytest.approx(M.auc(logs.labels, sc), abs=1e-9)
    assert m["auc"]["treatment"] == pytest.approx(M.auc(logs.labels, st), abs=1e-6)
    users = logs.column("user")
    assert m["gauc"]["control"] == pytest.approx(M.gauc(users, logs.labels, sc), abs=1e-9)
    assert m["ndcg@3"]["treatment"] == pytest.approx(
        M.ndcg_at_k(users, logs.labels, st, 3), abs=1e-6
    )
    assert res["verdict"]["verdict"] in ("better", "worse", "no significant difference")
    assert set(res["slices"]) == {"item", "price"}
    assert sum(e["rows"] for e in res["slices"]["item"]["slices"]) == 1000  # nothing dropped
    assert (out / "ab.html").stat().st_size > 10_000


def test_cli_bad_input_is_one_error_line(models, tmp_path, capsys):
    bad = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"row_id": np.arange(999), "score": np.full(999, 0.5)}), bad)
    args = ["ab", "--control", "uniform", "--treatment", str(bad), "--data", str(models["test"])]
    assert main([*args, "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: scores file") and "1 of 1000 logged rows have no score" in err
    assert main([*args[:4], "uniform", "--data", str(models["test"]), "--slice", "nope"]) == 2
    assert "field 'nope' is not in the logs" in capsys.readouterr().err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_report_renders_in_headless_chromium(tmp_path):
    exe = _chromium()
    if exe is None:
        if os.environ.get("STITCHREC_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is not installed but STITCHREC_REQUIRE_CHROMIUM is set")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    rng = np.random.default_rng(0)
    n = 3000
    g = rng.integers(0, 100, n)
    z = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z - 1.5)))).astype(float)
    a = 1 / (1 + np.exp(-(z + rng.normal(size=n) - 1.5)))
    b = 1 / (1 + np.exp(-(z + 0.5 * rng.normal(size=n) - 1.5)))
    r = compare.compare_scores(y, a, b, groups=g, slices={"g": g % 4}, resamples=100)
    r["verdict"] = compare.verdict(r, "auc")
    page = tmp_path / "ab.html"
    page.write_text(report.html(compare.clean_json(r)))
    shot = tmp_path / "shot.png"
    cmd = [
        exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
        f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a page with plots, not a blank screen
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    console_errors = [
        line for line in proc.stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line
    ]
    assert console_errors == []
