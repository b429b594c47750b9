"""bench/train/data_service: the TFRecord training input made by tf.data service workers
(``[data] data_service``) against the training process reading it itself.

    .venv/bin/python -m bench.train.data_service --out runs/bench-data-service

On ``bench.train``'s synthetic set (``--rows`` rows, 20% test; TFRecord shards of the training
split written once; windows of ``--shuffle-buffer`` rows), a dispatcher with one worker and another with two (``stitchrec
data-service``, separate processes on 127.0.0.1) stay up while, in ``--rounds`` interleaved
rounds, this process reads one shuffled epoch (batch ``--batch-size``) of

* ``local``: ``make_tfrecord_dataset`` in this process (the baseline);
* ``service, 1 worker`` and ``service, 2 workers``: the same dataset through ``distribute``.

Per case: examples/s, this process's CPU seconds per epoch (what the training process pays for
its input) and the workers' CPU seconds, with ratios against ``local`` of the same round. With
``--train``, ``stitchrec train`` (DCN-v2, one epoch) with and without ``data_service`` (one
worker) in each round: examples/s and the training process's CPU seconds. Every process shares
this machine's cores: the service moves the input's CPU out of the training process, it adds
no cores. Writes ``data_service.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.cluster import ROOT, dcn_v2_config
from bench.train.__main__ import TFRECORD_DIR, write_data, write_tfrecord
from bench.train.ps_input import _sample
from features.schema import Schema, load_schema
from features.tfrecord.dataset import make_tfrecord_dataset
from features.tfrecord.service import distribute

CASES = ("local", "service, 1 worker", "service, 2 workers")


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    """``stitchrec data-service ARGS`` in the background and the address it prints."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "pipelines.cli", "data-service", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"stitchrec data-service {' '.join(args)} ended before serving")
    return proc, json.loads(line)["address"]


def _cpu(pids: list[int]) -> float:
    """User and system CPU seconds of the processes ``pids`` so far."""
    return sum(_sample(p)[0] for p in pids)


def _epoch(make: Any, epoch: int, workers: list[int], label: str) -> dict[str, float]:
    """One epoch of ``make(epoch)``: examples/s, this process's and ``workers``' CPU seconds."""
    me = os.getpid()
    t0, own0, work0 = time.perf_counter(), _cpu([me]), _cpu(workers)
    rows = sum(int(b[label].shape[0]) for b in make(epoch))
    seconds = time.perf_counter() - t0
    return {
        "examples_per_second": rows / seconds,
        "process_cpu_seconds": _cpu([me]) - own0,
        "worker_cpu_seconds": _cpu(workers) - work0,
    }


def _train(config: Path, out: Path) -> dict[str, Any]:
    """``stitchrec train --config config`` into ``out``: examples/s and the process's CPU."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config)]
    cmd += ["--output", str(out)]
    proc = psutil.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cpu = proc.cpu_times()
    while proc.poll() is None:
        cpu = proc.cpu_times()
        time.sleep(0.2)
    if proc.returncode != 0:
        raise RuntimeError(f"stitchrec train failed:\n{proc.stderr.read().decode()[-3000:]}")
    r = json.loads((out / "train_report.json").read_text())
    return {
        "examples_per_second": r["examples_per_second"],
        "process_cpu_seconds": cpu.user + cpu.system,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Starts the services, runs the rounds, stops the services."""
    data = write_data(args.out, args.rows)
    if not (data / TFRECORD_DIR).exists():
        write_tfrecord(data)
    schema = load_schema(data / "schema.toml").as_parquet()
    procs, services = [], {}
    for case, count in ((CASES[1], 1), (CASES[2], 2)):
        disp, address = _start("dispatcher", "--port", "0")
        workers = [_start("worker", "--dispatcher", address)[0] for _ in range(count)]
        procs += [disp, *workers]
        services[case] = (address, [w.pid for w in workers])
    try:
        return _rounds(args, data, schema, services)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)


def _rounds(
    args: argparse.Namespace, data: Path, schema: Schema, services: dict[str, tuple[str, list]]
) -> dict[str, Any]:
    """The interleaved rounds of every input case (and of ``stitchrec train`` with --train)."""
    label = schema.label.name

    def make(service: str | None) -> Any:
        def epoch_of(epoch: int) -> Any:
            kw = {"batch_size": args.batch_size, "shuffle": True, "seed": 0, "epoch": epoch}
            kw["shuffle_buffer"] = args.shuffle_buffer
            ds = make_tfrecord_dataset(schema, data / TFRECORD_DIR, **kw)
            return ds if service is None else distribute(ds, service)

        return epoch_of

    cases = {CASES[0]: (make(None), [])}
    cases.update({c: (make(a), pids) for c, (a, pids) in services.items()})
    for fn, pids in cases.values():  # warm up: tracing, the file system cache, the workers
        _epoch(fn, 0, pids, label)
    results: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    for r in range(args.rounds):
        order = list(cases) if r % 2 == 0 else list(cases)[::-1]
        for case in order:
            fn, pids = cases[case]
            results[case].append(_epoch(fn, r + 1, pids, label))
            print(json.dumps({"round": r, case: results[case][-1]}), flush=True)
    out = {
        "rows": args.rows,
        "rounds": args.rounds,
        "shuffle_buffer": args.shuffle_buffer,
        "input": results,
    }
    if args.train:
        out["train"] = _train_rounds(args, data, services[CASES[1]][0])
    return out


def _train_rounds(args: argparse.Namespace, data: Path, address: str) -> dict[str, list]:
    runs: dict[str, list] = {"local": [], "service, 1 worker": []}
    for r in range(args.rounds):
        for case in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            served = f'data_service = "{address}"\n' if case != "local" else ""
            config = dcn_v2_config(
                args.out / "train.toml", data, args.batch_size, args.shuffle_buffer
            )
            text = config.read_text().replace(
                "[data]\n", f'[data]\ninput_format = "tfrecord"\n{served}'
            )
            config.write_text(text)
            runs[case].append(_train(config, args.out / f"train-{r}-{case.split(',')[0]}"))
            print(json.dumps({"round": r, f"train {case}": runs[case][-1]}), flush=True)
    return runs


def _median(values: list[float]) -> float:
    return statistics.median(values)


def print_tables(res: dict[str, Any]) -> None:
    base = res["input"]["local"]
    print(
        f"\nTFRecord input, one epoch of {res['rows']:,} rows' training split, windows of "
        f"{res['shuffle_buffer']:,} rows, {res['rounds']} rounds"
    )
    print("| input | examples/s | vs local | this process's CPU s | vs local | workers' CPU s |")
    print("|---|---|---|---|---|---|")
    for case, runs in res["input"].items():
        rate = [
            r["examples_per_second"] / b["examples_per_second"]
            for r, b in zip(runs, base, strict=True)
        ]
        cpu = [
            r["process_cpu_seconds"] / b["process_cpu_seconds"]
            for r, b in zip(runs, base, strict=True)
        ]
        print(
            f"| {case} | {_median([r['examples_per_second'] for r in runs]):,.0f} "
            f"| {_median(rate):.2f}x [{min(rate):.2f}-{max(rate):.2f}] "
            f"| {_median([r['process_cpu_seconds'] for r in runs]):.2f} | {_median(cpu):.2f}x "
            f"| {_median([r['worker_cpu_seconds'] for r in runs]):.2f} |"
        )
    if "train" in res:
        print("\n`stitchrec train` (DCN-v2, one epoch, TFRecord input)")
        print("| input | examples/s | training process CPU s |")
        print("|---|---|---|")
        for case, runs in res["train"].items():
            print(
                f"| {case} | {_median([r['examples_per_second'] for r in runs]):,.0f} "
                f"| {_median([r['process_cpu_seconds'] for r in runs]):.1f} |"
            )
    print(f"load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=250_000)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--shuffle-buffer",
        type=int,
        default=262_144,
        help="rows of a shuffle window (the unit the dispatcher hands out)",
    )
    p.add_argument("--train", action="store_true", help="also time `stitchrec train`")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    res = measure(args)
    (args.out / "data_service.json").write_text(json.dumps(res, indent=1))
    print_tables(res)


if __name__ == "__main__":
    main()
