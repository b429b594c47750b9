"""Resident memory of a fresh serving process: load a SavedModel, score one batch of 1,024 rows
of a Parquet folder, read ``VmRSS`` before and after (``/proc/self/status``); or the load alone,
with or without restoring the variables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
import pipelines
import tensorflow as tf
from features.dataset import iter_batches, list_parquet
from features.schema import load_schema

def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

model_dir, data_dir = sys.argv[1], sys.argv[2]
tf.constant([1.0]) + 1.0
base = rss_kb()
if model_dir != "-":
    schema = load_schema(model_dir + "/assets.extra/schema.toml")
    fn = tf.saved_model.load(model_dir).signatures["serving_default"]
    batch = next(iter_batches(schema, list_parquet(data_dir), batch_size=1024, shuffle=False))
    fn(**{f.name: tf.constant(batch[f.name]) for f in schema.model_inputs})
print(json.dumps({"base_kb": base, "rss_kb": rss_kb()}))
"""


def serving_rss_kb(model_dir: Path | None, data_dir: Path) -> tuple[int, int]:
    """``(VmRSS before the load, VmRSS after scoring)`` of a fresh process, in KiB
    (``model_dir`` None: TensorFlow alone)."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model_dir or "-"), str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return int(r["base_kb"]), int(r["rss_kb"])


LOAD_SCRIPT = """
import sys
import pipelines
import tensorflow as tf

def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

tf.constant([1.0]) + 1.0
base = rss_kb()
options = tf.saved_model.LoadOptions(experimental_skip_checkpoint=sys.argv[2] == "graph")
tf.saved_model.load(sys.argv[1], options=options)
print(rss_kb() - base)
"""


def load_rss_kb(model_dir: Path, variables: bool = True) -> int:
    """VmRSS a fresh process gains by ``tf.saved_model.load(model_dir)`` alone, in KiB: the
    loaded functions and the variables' values; with ``variables`` False the variables are not
    restored (``LoadOptions(experimental_skip_checkpoint=True)``), so the growth is what the
    loaded graph and functions hold."""
    out = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, str(model_dir), "all" if variables else "graph"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return int(out.strip().splitlines()[-1])
