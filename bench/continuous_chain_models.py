"""The model-side checks of ``bench.continuous_chain``: scores of exported versions in a fresh
process and through ``stitchrec serve``, and the op types of their graphs.

- ``fresh_scores(jobs)``: one new Python process loads each SavedModel with
  ``tf.saved_model.load`` and calls its ``serving_default`` signature on the raw column values
  of a test folder (strings for categorical fields, as logged); returns the scores per job.
- ``served_scores(models_root, name, versions, test)``: ``stitchrec serve --repo models_root``
  (a subprocess on ``127.0.0.1`` port 0, every version loaded: ``--version-policy all``, no
  polling) scores the test rows of each version through TensorFlow Serving's
  ``PredictionService.Predict`` with the version pinned.
- ``unknown_ops(model_dir)``: the op types of the SavedModel's graphs (every meta graph's nodes
  and the nodes of every function in its library) that ``tf.raw_ops`` does not name, i.e. ops
  a stock TensorFlow build cannot run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from pipelines.evaluation.sources import GrpcSource, load_logs
from serving.testing import wait_serving

ROOT = Path(__file__).resolve().parents[1]

#: The child of ``fresh_scores``: argv[1] a JSON list of [model_dir, test_dir], argv[2] the
#: output .npz (scores as arrays ``s0``, ``s1``, ...).
_CHILD = """
import json, sys
import numpy as np
import tensorflow as tf
from pipelines.evaluation.sources import load_logs

jobs, out = json.loads(sys.argv[1]), sys.argv[2]
logs, scores = {}, {}
for i, (model_dir, test_dir) in enumerate(jobs):
    if test_dir not in logs:
        logs[test_dir] = load_logs([test_dir])
    fn = tf.saved_model.load(model_dir).signatures["serving_default"]
    specs = fn.structured_input_signature[1]
    feed = {n: tf.constant(logs[test_dir].column(n), dtype=s.dtype) for n, s in specs.items()}
    scores[f"s{i}"] = fn(**feed)["score"].numpy().reshape(-1).astype(np.float64)
np.savez(out, **scores)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}


def fresh_scores(jobs: list[tuple[Path, Path]], timeout_s: float = 600) -> list[np.ndarray]:
    """Scores ``[n_rows]`` float64 of each ``(model_dir, test_dir)`` job, computed by one new
    Python process (``tf.saved_model.load`` + ``serving_default``).

    Raises:
      RuntimeError: the child process failed (its output in the message).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "scores.npz"
        arg = json.dumps([[str(m), str(t)] for m, t in jobs])
        cmd = [sys.executable, "-c", _CHILD, arg, str(out)]
        res = subprocess.run(
            cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout_s
        )
        if res.returncode != 0:
            raise RuntimeError(f"fresh scoring process failed ({res.returncode}):\n{res.stderr}")
        with np.load(out) as z:
            return [z[f"s{i}"] for i in range(len(jobs))]


def served_scores(
    models_root: Path, name: str, jobs: list[tuple[int, Path]], timeout_s: float = 120
) -> list[np.ndarray]:
    """Scores of each ``(version, test_dir)`` job: the test rows scored by that version of
    model ``name`` as served by ``stitchrec serve --repo models_root --version-policy all`` (a
    subprocess on 127.0.0.1, port 0; ``Predict`` with the version pinned)."""
    cmd = [
        sys.executable, "-m", "pipelines.cli", "serve", "--repo", str(models_root),
        "--host", "127.0.0.1", "--port", "0", "--poll-seconds", "0",
        "--version-policy", "all", "--log-level", "WARNING",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"stitchrec serve exited ({proc.wait()}) before listening")
        target = f"127.0.0.1:{json.loads(line)['port']}"
        wait_serving(target, timeout=timeout_s)
        return [
            GrpcSource(f"grpc://{target}/{name}?version={v}").scores(load_logs([str(test)]))
            for v, test in jobs
        ]
    finally:
        proc.kill()
        proc.wait()


def op_types(model_dir: Path) -> set[str]:
    """Every op type of the SavedModel's meta graphs, their function libraries included."""
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((Path(model_dir) / "saved_model.pb").read_bytes())
    ops: set[str] = set()
    for mg in sm.meta_graphs:
        ops.update(n.op for n in mg.graph_def.node)
        for fn in mg.graph_def.library.function:
            ops.update(n.op for n in fn.node_def)
    return ops


def unknown_ops(model_dir: Path) -> list[str]:
    """The op types of ``model_dir``'s graphs that ``tf.raw_ops`` lacks (sorted; [] when the
    SavedModel runs on stock TensorFlow)."""
    stock = set(dir(tf.raw_ops))
    return sorted(op_types(model_dir) - stock)
