"""``stitchrec train`` with ``[fusion] kernels = true`` (compiler_opt.embedding_op) against without."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from compiler_opt.embedding_op import assets as emb_assets
from tests.compiler_opt.conftest import need_compiler, share_kernels
from tests.testdata import write_run_config, write_tiny_dataset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A fresh ``$STITCHREC_CACHE`` (no calibration) whose kernels folder is the suite's."""
    monkeypatch.setenv("STITCHREC_CACHE", str(share_kernels(tmp_path / "cache")))
    return tmp_path / "cache"


def test_stitchrec_train_with_fusion_reaches_the_same_auc(cache, tmp_path):
    """``[fusion] kernels = true``: same seed, same data, same test AUC (the fused block is
    exact up to float rounding, so the runs differ only by rounding)."""
    need_compiler()
    from pipelines.config import ConfigError, load_config
    from pipelines.train import train

    (tmp_path / "data").mkdir()
    tiny_data = write_tiny_dataset(tmp_path / "data", rows=2500, train_rows=2000)
    model = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [16], "cross_layers": 1}
    opts = {"batch_size": 500, "epochs": 1, "learning_rate": 0.02, "deterministic": True}
    reports, logs = {}, {}
    for fused in (False, True):
        out = tiny_data["root"] / f"run-{fused}"
        extra = "[fusion]\nkernels = true\n" if fused else ""
        path = write_run_config(out.with_suffix(".toml"), tiny_data, out, model, opts, extra)
        cfg = load_config(path)
        assert (cfg.fusion is not None) == fused
        lines: list[str] = []
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # every field covered, no fallback
            reports[fused] = train(cfg, log=lines.append)
        logs[fused] = lines
    assert any("generated kernel" in line for line in logs[True])
    assert any((cache / "compiler_opt" / "kernels").glob("*.so"))
    assert not any("generated kernel" in line for line in logs[False])
    a, b = reports[False]["test"]["auc"], reports[True]["test"]["auc"]
    assert a > 0.55 and abs(a - b) < 2e-3, (a, b)  # learned something; the same AUC
    assert abs(reports[False]["test"]["logloss"] - reports[True]["test"]["logloss"]) < 2e-3
    bad = write_run_config(
        tiny_data["root"] / "bad.toml",
        tiny_data,
        tiny_data["root"] / "x",
        model,
        opts,
        "[fusion]\nkernels = 1\n",
    )
    with pytest.raises(ConfigError, match="kernels must be true or false"):
        load_config(bad)
    # the fused run exported with its kernel: a fresh server process loads (or compiles) the op
    # first and scores like the plain export of the same checkpoint
    from pipelines import cli

    run = tiny_data["root"] / "run-True"
    assert cli.main(["export", "--run", str(run), "--output", str(tmp_path / "plain")]) == 0
    argv = ["export", "--run", str(run), "--output", str(tmp_path / "fused"), "--fuse-kernels"]
    assert cli.main(argv) == 0
    assert (tmp_path / "fused" / "assets" / emb_assets.ASSETS_DIR / "manifest.json").exists()
    # and with the server fusing the rest: the elementwise loop groups as generated ops around
    # the embedding op (its tables stay handles when the signature is frozen)
    argv[4] = str(tmp_path / "both")
    assert cli.main([*argv, "--fuse", "--fuse-realization", "generated"]) == 0
    script = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "import pipelines\n"
        "from serving.model_version import ModelVersion, _signature_inputs\n"
        "from tests.testdata import make_tiny_table\n"
        "t = make_tiny_table(50, seed=3)\n"
        "out = {}\n"
        "for name in ('fused', 'plain', 'both'):\n"
        "    mv = ModelVersion(name, 1, Path(sys.argv[1]) / name, ['/CPU:0']).load()\n"
        "    feats = {k: t.column(k).to_numpy(zero_copy_only=False) for k in mv.inputs}\n"
        "    out[name] = mv.run(0, feats)['score']\n"
        "    print(name, mv.kernels, [f.describe() for f in mv.fused])\n"
        "for name in ('fused', 'both'):\n"
        "    assert np.abs(out[name] - out['plain']).max() <= 1e-5, f'{name}: scores differ'\n"
        "print('equal')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "equal" in r.stdout and "plain []" in r.stdout
    assert "fused ['" in r.stdout  # the op was loaded from the export's assets
    both = next(ln for ln in r.stdout.splitlines() if ln.startswith("both"))
    assert "'realization': 'generated'" in both and "'generated_loops': 0" not in both
