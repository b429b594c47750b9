"""bench/scale: the data jobs on one process, on Dask's local mode and on a 2-worker cluster, as
the rows grow; and a cost model for a billion rows a day.

    .venv/bin/python -m bench.scale --work /tmp/scale --out runs/bench-scale
    .venv/bin/python -m bench.scale --work /tmp/scale --rows 200000 --screen-rows 50000 --quick

For each size of ``--rows`` (synthetic Criteo-layout TSV, ``stitchrec generate --criteo-tsv``):

* ``stitchrec convert`` (test fraction 0.2) and ``stitchrec stats`` of the raw TSV, each run as
  ``local`` (one process, the default engine), ``dask1`` (Dask's local mode with one worker: the
  engine's own overhead) and ``dask2`` (a local Dask cluster of two worker processes): seconds,
  rows/s, the ratio to ``local`` and the peak RSS of the largest process (the command and its
  workers, polled every 0.2 s); every engine's shards and statistics are checked equal to
  ``local``'s;
* ``stitchrec predict`` of the converted training shards with a linear model (``lr``, trained on
  the smallest size) on ``local`` and ``dask2`` for sizes up to ``--predict-max-rows``;
* the FIVES interaction screen (order 3 over the 39 fields, the capped values of the first
  ``--screen-rows`` training rows) in this process and on a 2-worker cluster, equal results.

Then the cost model (``bench.scale.model``): from the measured CPU seconds per row of each job
and the 2-worker cluster's parallel efficiency, the workers a day of 1 billion rows needs to fit
a window, with its assumptions. Writes ``results.json`` and prints the tables with the machine
load.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.scale.model import cost_table
from bench.scale.screen import screen_times

ROOT = Path(__file__).resolve().parents[2]
MODES = {
    "local": [],
    "dask1": ["--engine", "dask", "--workers", "1"],
    "dask2": ["--engine", "dask", "--workers", "2"],
}


def _stitchrec(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", *args]


class PeakRSS:
    """Polls the RSS of a process and its descendants; ``peak``: the largest single process."""

    def __init__(self, pid: int, every: float = 0.2) -> None:
        self.root, self.every, self.peak = psutil.Process(pid), every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.peak = max(self.peak, p.memory_info().rss)
            time.sleep(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run(cmd: list[str], log: Path) -> dict[str, Any]:
    """Runs ``cmd``; its seconds, exit status and peak RSS (MB) of its largest process."""
    t0 = time.time()
    with log.open("w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        rss = PeakRSS(p.pid)
        code = p.wait()
    peak = rss.stop()
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}; see {log}")
    return {"seconds": round(time.time() - t0, 2), "peak_rss_mb": round(peak / 2**20)}


def digest(folder: Path, pattern: str) -> str:
    h = hashlib.sha256()
    for p in sorted(f for f in folder.rglob(pattern) if f.is_file()):
        h.update(p.relative_to(folder).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def make_data(work: Path, rows: int) -> Path:
    """The synthetic Criteo TSV of ``rows`` rows (generated once)."""
    folder = work / f"data-{rows}"
    tsv = folder / "train.tsv"
    if not tsv.exists():
        cmd = ["generate", "--output", str(folder), "--rows", str(rows), "--test-fraction", "0"]
        subprocess.run(_stitchrec(*cmd, "--criteo-tsv"), check=True, cwd=ROOT, capture_output=True)
    return tsv


def data_jobs(work: Path, rows: int, modes: list[str]) -> dict[str, Any]:
    """convert and stats of ``rows`` rows on every mode."""
    tsv = make_data(work, rows)
    out: dict[str, Any] = {"rows": rows, "tsv_bytes": tsv.stat().st_size}
    for job in ("convert", "stats"):
        cells = {}
        for mode in modes:
            target = work / f"{job}-{rows}-{mode}"
            subprocess.run(["rm", "-rf", str(target)], check=True)
            cmd = [job, "--schema", "criteo", "--input", str(tsv), "--output", str(target)]
            cmd += ["--test-fraction", "0.2"] if job == "convert" else []
            cell = run(_stitchrec(*cmd, *MODES[mode]), work / f"{job}-{rows}-{mode}.log")
            cell["rows_per_s"] = round(rows / cell["seconds"])
            cell["digest"] = digest(target, "*.parquet" if job == "convert" else "*")
            cells[mode] = cell
        base = cells[modes[0]]
        for cell in cells.values():
            cell["speed_vs_local"] = round(base["seconds"] / cell["seconds"], 2)
            cell["equal_to_local"] = cell["digest"] == base["digest"]
        out[job] = cells
    return out


def train_model(work: Path, rows: int) -> Path:
    """A linear model trained one epoch on the converted shards of ``rows`` rows, exported."""
    model = work / "model" / "export" / "1"
    if model.exists():
        return model
    data = work / f"convert-{rows}-local"
    schema = work / f"data-{rows}" / "schema-criteo.toml"
    subprocess.run(
        [sys.executable, "-c", f"from features.schema import load_schema; "
         f"load_schema('criteo').as_parquet().save({str(schema)!r})"],
        check=True, cwd=ROOT,
    )  # fmt: skip
    config = work / "model.toml"
    config.write_text(
        f'output_dir = "{work / "model"}"\n[data]\nschema = "{schema}"\n'
        f'train = ["{data / "train"}"]\ntest = ["{data / "test"}"]\n'
        f'[model]\ntype = "lr"\n[train]\nepochs = 1\nbatch_size = 4096\n'
    )
    subprocess.run(_stitchrec("train", "--config", str(config)), check=True, cwd=ROOT)
    subprocess.run(_stitchrec("export", "--run", str(work / "model")), check=True, cwd=ROOT)
    return model


def predict_jobs(work: Path, sizes: list[int], limit: int) -> dict[str, Any]:
    model = train_model(work, sizes[0])
    out: dict[str, Any] = {}
    for rows in [r for r in sizes if r <= limit]:
        shards = work / f"convert-{rows}-local" / "train"
        cells = {}
        for mode in ("local", "dask2"):
            target = work / f"predict-{rows}-{mode}"
            subprocess.run(["rm", "-rf", str(target)], check=True)
            cmd = ["predict", "--model", str(model), "--data", str(shards), "--output", str(target)]
            cell = run(_stitchrec(*cmd, *MODES[mode]), work / f"predict-{rows}-{mode}.log")
            scored = json.loads((target / "_SUCCESS").read_text())["rows"]
            cell["rows_per_s"] = round(scored / cell["seconds"])
            cell["digest"] = digest(target, "*.parquet")
            cells[mode] = cell
        cells["dask2"]["speed_vs_local"] = round(
            cells["local"]["seconds"] / cells["dask2"]["seconds"], 2
        )
        cells["dask2"]["equal_to_local"] = cells["dask2"]["digest"] == cells["local"]["digest"]
        out[str(rows)] = cells
    return out


def print_tables(results: dict[str, Any]) -> None:
    print(f"\nmachine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at the end")
    for job in ("convert", "stats"):
        print(f"\n{job}: rows/s, speed vs local, peak RSS of the largest process (MB), equal")
        for size in results["sizes"]:
            cells = size[job]
            line = f"  {size['rows']:>11,}"
            for mode, c in cells.items():
                line += (
                    f"  {mode}: {c['rows_per_s']:>8,}/s x{c['speed_vs_local']:<4} "
                    f"{c['peak_rss_mb']:>5}MB {'=' if c['equal_to_local'] else 'DIFFERS'}"
                )
            print(line)
    if results.get("predict"):
        print("\npredict (lr model): rows/s local vs dask2")
        for rows, cells in results["predict"].items():
            d = cells["dask2"]
            print(
                f"  {int(rows):>11,}  local {cells['local']['rows_per_s']:,}/s  dask2 "
                f"{d['rows_per_s']:,}/s x{d['speed_vs_local']} "
                f"{'=' if d['equal_to_local'] else 'DIFFERS'}"
            )
    if results.get("screen"):
        s = results["screen"]
        print(
            f"\ninteraction screen, {s['sets']:,} triples over {s['rows']:,} rows: local "
            f"{s['local_s']}s, 2 workers {s['dask2_s']}s (x{s['speed']}), equal {s['equal']}"
        )
    print("\ncost model: a day of 1,000,000,000 rows")
    for line in results["cost_model"]["lines"]:
        print("  " + line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="folder for the data and outputs")
    p.add_argument("--out", default=None, help="folder for results.json")
    p.add_argument("--rows", default="1000000,4000000,16000000", help="comma-separated sizes")
    p.add_argument("--modes", default="local,dask1,dask2", help="of local, dask1, dask2")
    p.add_argument("--predict-max-rows", type=int, default=4_000_000)
    p.add_argument("--screen-rows", type=int, default=1_000_000, help="0: no screen")
    p.add_argument("--quick", action="store_true", help="convert and stats only")
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.rows.split(",")]
    modes = args.modes.split(",")
    results: dict[str, Any] = {"sizes": [], "modes": modes}
    for rows in sizes:
        results["sizes"].append(data_jobs(work, rows, modes))
        print(json.dumps(results["sizes"][-1]), flush=True)
    if not args.quick:
        results["predict"] = predict_jobs(work, sizes, args.predict_max_rows)
        if args.screen_rows:
            shards = work / f"convert-{sizes[-1]}-local" / "train"
            results["screen"] = screen_times(shards, args.screen_rows)
    results["cost_model"] = cost_table(results)
    results["load_at_end"] = os.getloadavg()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1))
    print_tables(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
