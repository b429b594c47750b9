"""`stitchrec serve` end to end: a model trained and exported by the pipeline, served by two
processes on one port (SO_REUSEPORT), scored like the SavedModel itself, counted by one
aggregated /metrics (Prometheus multiprocess mode), stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from prometheus_client.multiprocess import MultiProcessCollector

from pipelines.config import load_config
from pipelines.export import export_run
from pipelines.train import train
from serving.client import RankingClient
from serving.testing import wait_serving
from tests.testdata import write_run_config, write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported_repo(tmp_path_factory) -> Path:
    """A DCN-v2 trained for one epoch on 2,000 tiny rows, exported as models/ctr/1."""
    d = tmp_path_factory.mktemp("cli")
    data = write_tiny_dataset(d, rows=2500, train_rows=2000)
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [16], "cross_layers": 1}
    train_section = {
        "batch_size": 256,
        "epochs": 1,
        "learning_rate": 0.01,
        "checkpoint_every": 100,
        "deterministic": True,
    }
    cfg_path = write_run_config(d / "run.toml", data, d / "run", model, train_section)
    train(load_config(cfg_path), log=lambda _: None)
    repo = d / "models"
    export_run(d / "run", repo / "ctr" / "1")
    return repo


def _samples(text: str, sample: str) -> list[float]:
    """The values of every exposition line for ``sample`` (name and labels, exactly)."""
    pattern = "^" + re.escape(sample) + r" (\S+)$"
    return [float(v) for v in re.findall(pattern, text, re.M)]


def _rank_ok_in(db_file: str) -> float:
    """Rank calls answered OK by the one worker that wrote ``db_file``."""
    for metric in MultiProcessCollector.merge([db_file]):
        for s in metric.samples:
            if s.name == "stitchrec_requests_total" and s.labels == {
                "method": "Rank",
                "code": "OK",
            }:
                return s.value
    return 0.0


def test_serve_two_workers_exported_model(exported_repo):
    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(exported_repo),
        "--host", "127.0.0.1", "--port", "0", "--workers", "2", "--metrics-port", "0",
        "--poll-seconds", "0", "--log-level", "WARNING", "--http-port", "0", "--drain-seconds", "0",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = [json.loads(proc.stdout.readline()) for _ in range(3)]  # parent + 2 workers
        port, metrics_dir = lines[0]["port"], Path(lines[0]["metrics_dir"])
        assert [w["serving"] for w in lines] == [f"127.0.0.1:{port}"] * 3
        assert lines[0]["workers"] == 2
        assert {w["port"] for w in lines[1:]} == {port}
        assert [w["metrics_port"] for w in lines[1:]] == [None, None]  # only the parent's
        http_port = lines[0]["http_port"]
        assert {w["http_port"] for w in lines[1:]} == {http_port}  # one HTTP port, SO_REUSEPORT
        target = f"127.0.0.1:{port}"
        wait_serving(target)

        users = ["u1", "u30"]
        cands = {
            "item": np.array([3, 5, 7], dtype=np.int64),
            "tags": np.array([b"c|a", b"b", b""], dtype=object),
            "price": np.array([10.0, 2.5, 40.0], dtype=np.float32),
            "age": np.array([30.0, 50.0, 20.0], dtype=np.float32),
        }
        model = tf.saved_model.load(str(exported_repo / "ctr" / "1"))
        fn = model.signatures["serving_default"]
        for i in range(16):  # a fresh connection each: the kernel spreads them over workers
            user = users[i % 2]
            with RankingClient(target) as c:
                r = c.rank("ctr", {"user": user}, cands)
            ref = fn(
                user=tf.constant([user.encode()] * 3),
                **{k: tf.constant(v) for k, v in cands.items()},
            )
            np.testing.assert_allclose(r.scores, ref["score"].numpy(), rtol=1e-5, atol=1e-7)
            assert r.version == 1
        url = f"http://127.0.0.1:{lines[0]['metrics_port']}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        # one series per label set, summed over the workers, no per-process breakdown
        assert _samples(text, 'stitchrec_requests_total{code="OK",method="Rank"}') == [16.0]
        assert _samples(text, 'stitchrec_request_latency_seconds_count{method="Rank"}') == [16.0]
        state = 'stitchrec_model_version_state{model="ctr",state="AVAILABLE",version="1"}'
        assert _samples(text, state) == [2.0]  # livesum: both workers serve version 1
        assert "pid=" not in text
        per_worker = [_rank_ok_in(str(f)) for f in sorted(metrics_dir.glob("counter_*.db"))]
        assert len(per_worker) == 2 and sum(per_worker) == 16
        assert min(per_worker) > 0, per_worker  # both processes answered
        ready = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=10)
        assert json.loads(ready.read()) == {"ready": True}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not metrics_dir.exists()  # the parent's temporary folder is removed at exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--version-policy", "newest"],
            "error: version policy 'newest': expected latest[:N], all or specific",
        ),
        (
            ["--max-string-kb", "0"],
            "error: limits: max_string_bytes must be an integer >= 1, got 0",
        ),
        (
            ["--otlp-endpoint", "collector"],
            "error: otlp endpoint 'collector': expected HOST:PORT",
        ),
        (
            ["--trace-detail", "spans"],
            "error: stitchrec serve: argument --trace-detail: invalid choice: 'spans'",
        ),
    ],
)
def test_serve_rejects_bad_flags_with_one_error_line(tmp_path, flags, message):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(tmp_path), *flags],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def _serve_workers_error(repo: Path, metrics_port: int, env: dict[str, str]) -> str:
    """stderr of `stitchrec serve --workers 2` that must fail with a user error (exit 2)."""
    p = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(repo), "--host",
         "127.0.0.1", "--port", "0", "--workers", "2", "--metrics-port", str(metrics_port)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    return p.stderr.strip()


def test_serve_workers_refuse_a_bad_metrics_folder_or_port(tmp_path):
    not_a_folder = tmp_path / "prom"
    not_a_folder.write_text("")
    err = _serve_workers_error(tmp_path, 0, {"PROMETHEUS_MULTIPROC_DIR": str(not_a_folder)})
    assert err == (
        f"error: --workers metrics folder: PROMETHEUS_MULTIPROC_DIR '{not_a_folder}' "
        "is not a folder"
    )
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]
        err = _serve_workers_error(tmp_path, busy, {"PROMETHEUS_MULTIPROC_DIR": ""})
    assert err.startswith(f"error: --metrics-port {busy}: cannot serve on 127.0.0.1: ")
    assert "\n" not in err
