"""`stitchrec serve` end to end: a model trained and exported by the pipeline, served by two
processes on one port (SO_REUSEPORT), scored like the SavedModel itself, stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

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


def _requests_ok(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(r'^stitchrec_requests_total\{code="OK",method="Rank"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_serve_two_workers_exported_model(exported_repo):
    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(exported_repo),
        "--host", "127.0.0.1", "--port", "0", "--workers", "2", "--metrics-port", "0",
        "--poll-seconds", "0", "--log-level", "WARNING", "--http-port", "0",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = [json.loads(proc.stdout.readline()) for _ in range(3)]  # parent + 2 workers
        port = lines[0]["port"]
        assert lines[0]["workers"] == 2
        assert {w["port"] for w in lines[1:]} == {port}
        http_port = lines[0]["http_port"]
        assert {w["http_port"] for w in lines[1:]} == {http_port}  # one HTTP port, SO_REUSEPORT
        metrics_ports = [w["metrics_port"] for w in lines[1:]]
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
        ready = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=10)
        assert json.loads(ready.read()) == {"ready": True}
        counts = [_requests_ok(p) for p in metrics_ports]
        assert sum(counts) == 16
        assert min(counts) > 0, counts  # both processes answered
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
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
