"""``stitchrec export`` writes a version under a hidden name and renames it into place: a killed
export never becomes a served version, a replaced version is never half written, and the next
export deletes what a killed one left (pipelines.export, serving.version_files)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from features.schema import Schema, load_schema
from pipelines.export import export_saved_model, next_version
from serving.client import RankingClient
from serving.config import ServerOptions
from serving.testing import SCHEMA, ServerThread, reference_score, wait_until
from serving.version_files import COMPLETE, version_state

ROOT = Path(__file__).resolve().parents[2]


class TinyRanker(tf.Module):
    """The linear model of serving.testing as a ranking model: features -> logit."""

    def __init__(self, bias: float):
        super().__init__(name="tiny")
        self.bias = tf.Variable(bias, dtype=tf.float32)

    def __call__(self, features: dict[str, tf.Tensor], training: bool = False) -> tf.Tensor:
        return (
            self.bias
            + 0.5 * features["price"]
            + tf.cast(tf.equal(features["item"], 3), tf.float32)
            + 2.0 * tf.cast(tf.equal(features["user"], "u1"), tf.float32)
        )


def linear_schema(folder: Path) -> Schema:
    path = Path(folder) / "linear.toml"
    path.write_text(SCHEMA + '\n[[fields]]\nname = "click"\nkind = "label"\n')
    return load_schema(path)


# Exports TinyRanker(1.0) to argv[1] and stops for good when it opens stitchrec.json to write
# it (after the SavedModel, before the assets are complete), so the test kills it midway.
KILLED_EXPORT = """
import sys, time
from pathlib import Path

def stop_at_assets(event, args):
    if event == "open" and str(args[0]).endswith("stitchrec.json") and "w" in str(args[1]):
        print("writing assets", flush=True)
        time.sleep(600)

from pipelines.export import export_saved_model
from tests.pipelines.test_export_atomic import TinyRanker, linear_schema

schema = linear_schema(Path(sys.argv[2]))
sys.addaudithook(stop_at_assets)
export_saved_model(TinyRanker(1.0), schema, sys.argv[1])
"""


def _export_killed_midway(out: Path, scratch: Path) -> int:
    """Runs KILLED_EXPORT in a subprocess, SIGKILLs it midway; returns its pid."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = scratch / "export.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILLED_EXPORT, str(out), str(scratch)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            line = proc.stdout.readline().strip() if ready else ""
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            proc.stdout.close()
    assert line == "writing assets", log.read_text()[-2000:]
    return proc.pid


def _rank(target: str):
    with RankingClient(target) as c:
        # the first call after a load warms the model up: 10 s was too short beside a busy test
        return c.rank("m", {"user": "u1"}, {"item": [3], "price": [1.0]}, timeout=60)


def test_killed_export_never_serves_and_the_next_export_cleans_up(tmp_path):
    schema = linear_schema(tmp_path)
    models = tmp_path / "repo" / "m"
    export_saved_model(TinyRanker(0.0), schema, models / "1")
    pid = _export_killed_midway(models / "2", tmp_path)
    with ServerThread(tmp_path / "repo", ServerOptions(poll_interval_s=0.05)) as s:
        r = _rank(s.target)
        assert r.version == 1
        assert r.scores[0] == pytest.approx(reference_score(0.0, "u1", 3, 1.0), rel=1e-6)
        time.sleep(0.3)  # several scans: the hidden folder is never a version
        assert list(s.server.repository.status("m")) == [1]
        assert sorted(p.name for p in models.iterdir()) == [f".2.tmp-{pid}", "1"]
        assert next_version(models) == models / "2"
        export_saved_model(TinyRanker(1.0), schema, next_version(models))
        assert sorted(p.name for p in models.iterdir()) == ["1", "2"]  # the leftover is gone
        wait_until(lambda: s.server.repository.live_versions("m") == [2])
        r = _rank(s.target)
    assert r.version == 2
    assert r.scores[0] == pytest.approx(reference_score(1.0, "u1", 3, 1.0), rel=1e-6)


def _bias(path: Path) -> float:
    return float(tf.saved_model.load(str(path)).model.bias.numpy())


def test_export_replaces_a_version_whole_or_not_at_all(tmp_path):
    schema = linear_schema(tmp_path)
    out = tmp_path / "export" / "1"
    export_saved_model(TinyRanker(0.0), schema, out)
    # an export that fails midway (the model reads a field the schema lacks) leaves it as it was
    without_price = schema.select(["user", "item"])
    with pytest.raises(KeyError, match="price"):
        export_saved_model(TinyRanker(2.0), without_price, out)
    assert _bias(out) == 0.0
    export_saved_model(TinyRanker(1.0), schema, out)
    assert _bias(out) == 1.0
    assert version_state(out) == (COMPLETE, "")
    assert [p.name for p in out.parent.iterdir()] == ["1"]  # no temporary folder left


def test_next_version_skips_and_the_next_export_deletes_a_killed_exports_leftovers(tmp_path):
    schema = linear_schema(tmp_path)
    base = tmp_path / "export"
    export_saved_model(TinyRanker(0.0), schema, base / "1")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    for name in (f".7.tmp-{dead}", f".1.old-{dead}", f".3.tmp-{os.getppid()}"):
        (base / name).mkdir()
        (base / name / "saved_model.pb").write_bytes(b"half")
    assert next_version(base) == base / "2"
    export_saved_model(TinyRanker(1.0), schema, next_version(base))
    # the dead process's folders are deleted; a running process's (another export) is kept
    assert sorted(p.name for p in base.iterdir()) == [f".3.tmp-{os.getppid()}", "1", "2"]
