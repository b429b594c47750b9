"""What the training benchmarks share: the DCN-v2 config they train, and `stitchrec train` run as
one process or as a local cluster of processes on 127.0.0.1 (one TF_CONFIG per task).

Used by bench/distributed (multi-worker and parameter servers) and bench/train.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

DCN_V2_CONFIG = """output_dir = "unused"

[data]
schema = "{data}/schema.toml"
train = ["{data}/train"]
test = ["{data}/test"]

[model]
type = "dcn_v2"
embedding_dim = 16
mlp = [256, 128]
cross_layers = 3

[train]
batch_size = {batch_size}
epochs = 1
learning_rate = 0.001
weight_average = "none"
log_every = 20
checkpoint_every = 100000
shuffle_buffer = {shuffle_buffer}
"""


def dcn_v2_config(
    path: Path, data: Path, batch_size: int, shuffle_buffer: int = 262_144, extra: str = ""
) -> Path:
    """Writes the benchmarks' DCN-v2 training config over the synthetic set in ``data`` (one
    epoch, Adam 1e-3, no weight average) to ``path``, with ``extra`` sections appended; returns ``path``."""
    text = DCN_V2_CONFIG.format(data=data, batch_size=batch_size, shuffle_buffer=shuffle_buffer)
    path.write_text(text + (f"\n{extra.strip()}\n" if extra.strip() else ""))
    return path


def cluster_tf_configs(workers: int, ps: int = 0) -> list[str | None]:
    """TF_CONFIG of every task of a local cluster on free ports: ``workers`` mirrored workers
    (``ps == 0``; one worker: ``[None]``, no cluster), or ps tasks, workers and the chief (the
    chief last)."""
    from pipelines.distribute import free_ports, tf_config, worker_tf_config
    from pipelines.distribute_ps import local_cluster

    if not ps:
        ports = free_ports(workers)
        return [worker_tf_config(ports, i) if workers > 1 else None for i in range(workers)]
    cluster = local_cluster(free_ports(1 + workers + ps), workers, ps)
    tasks = [("ps", i) for i in range(ps)] + [("worker", i) for i in range(workers)]
    return [tf_config(cluster, kind, i) for kind, i in [*tasks, ("chief", 0)]]


def run_tasks(
    cmd: list[str], tf_configs: list[str | None], out: Path, timeout: float
) -> list[Path]:
    """Runs ``cmd`` once per entry of ``tf_configs`` (its TF_CONFIG; None: none), all at once,
    logging to ``<out>-<i>.log`` beside ``out``; returns the logs once every process exited 0.

    Raises RuntimeError naming the exit codes and the logs otherwise; processes still running
    after ``timeout`` seconds are killed.
    """
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    logs = [out.parent / f"{out.name}-{i}.log" for i in range(len(tf_configs))]
    procs: list[subprocess.Popen] = []
    t0 = time.time()
    try:
        for tf_config, log in zip(tf_configs, logs, strict=True):
            e = dict(env, TF_CONFIG=tf_config) if tf_config else env
            procs.append(
                subprocess.Popen(
                    cmd, cwd=ROOT, env=e, stdout=log.open("w"), stderr=subprocess.STDOUT
                )
            )
        codes = [p.wait(timeout=max(1.0, timeout - (time.time() - t0))) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if set(codes) != {0}:
        raise RuntimeError(f"{out.name}: exit codes {codes}; see {out.parent}/{out.name}-*.log")
    return logs


def train_command(config: Path, out: Path, *overrides: str) -> list[str]:
    """``stitchrec train --config config --output out --set o...`` as this Python runs it."""
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config)]
    cmd += ["--output", str(out)]
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def report(out: Path, t0: float, **extra: Any) -> dict[str, Any]:
    """The figures the benchmarks keep from the chief's ``train_report.json`` in ``out``."""
    r = json.loads((out / "train_report.json").read_text())
    return {
        **extra,
        "auc": r["test"]["auc"],
        "logloss": r["test"]["logloss"],
        "examples_per_second": r["examples_per_second"],
        "train_seconds": r["train_seconds"],
        "parameters": r["parameters"],
        "wall_seconds": round(time.time() - t0, 1),
    }


def synthetic_data(folder: Path, rows: int, rows_per_shard: int = 1_000_000, **config: Any) -> Path:
    """The synthetic set (seed 0, 20% test, ``SyntheticConfig`` fields in ``config``) written
    once into ``folder``; returns ``folder``."""
    from features import synthetic, synthetic_config

    if not (folder / "schema.toml").exists():
        cfg = synthetic_config.SyntheticConfig(rows=rows, seed=0, **config)
        synthetic.write_dataset(cfg, folder, rows_per_shard=rows_per_shard)
    return folder


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    return mean, (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0
