"""`stitchrec train`, `export` and `serve` work without the optional and dev packages
(grpcio-tools, xgboost, matplotlib): every CLI process runs with a ``sitecustomize`` that makes
importing them raise ImportError, and a served model answers a RankRequest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from serving.client import RankingClient
from serving.testing import wait_serving
from tests.testdata import write_run_config, write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("grpc_tools", "xgboost", "matplotlib")

SITECUSTOMIZE = f'''
import sys

BLOCKED = {BLOCKED!r}


class _Blocker:
    """Refuses the optional packages, as if they were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked (not installed)", name=name)
        return None


sys.meta_path.insert(0, _Blocker())
'''


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, f"stitchrec {args[0]} failed:\n{p.stderr[-3000:]}"
    return p


def test_train_export_serve_without_optional_packages(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = _env(site)
    for name in BLOCKED:  # the blocker is active in the CLI's interpreter
        p = subprocess.run(
            [sys.executable, "-c", f"import {name}"], env=env, capture_output=True, text=True
        )
        assert p.returncode != 0 and "is blocked" in p.stderr, (name, p.stderr[-500:])

    data = write_tiny_dataset(tmp_path, rows=600, train_rows=500)
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [8], "cross_layers": 1}
    train = {"batch_size": 128, "epochs": 1, "learning_rate": 0.01, "deterministic": True}
    cfg = write_run_config(tmp_path / "run.toml", data, tmp_path / "run", model, train)
    _cli(env, "train", "--config", str(cfg))
    repo = tmp_path / "models"
    _cli(env, "export", "--run", str(tmp_path / "run"), "--output", str(repo / "ctr" / "1"))
    assert (repo / "ctr" / "1" / "saved_model.pb").is_file()

    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(repo), "--host",
        "127.0.0.1", "--port", "0", "--poll-seconds", "0", "--log-level", "WARNING",
        "--drain-seconds", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(proc.stdout.readline())["port"]
        target = f"127.0.0.1:{port}"
        wait_serving(target)
        cands = {
            "item": np.array([3, 5], dtype=np.int64),
            "tags": np.array([b"a", b""], dtype=object),
            "price": np.array([10.0, 2.5], dtype=np.float32),
            "age": np.array([30.0, 50.0], dtype=np.float32),
        }
        with RankingClient(target) as c:
            r = c.rank("ctr", {"user": "u1"}, cands)
        assert r.version == 1 and len(r.scores) == 2
        assert all(0.0 < s < 1.0 for s in r.scores)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
