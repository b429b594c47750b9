"""The engine choice, measured: Dask distributed, Ray and Apache Spark running the same tasks as
the data jobs, each as a local cluster of two single-core workers on 127.0.0.1.

    /path/to/venv/bin/python -m bench.scale.engines --work /tmp/engines --rows 2000000

The venv needs StitchRec and the engines compared (``pip install "dask[distributed]" ray
pyspark``; Spark needs a Java runtime); engines not installed are skipped. For each engine, one
after the other:

* ``start_s``: from nothing to a cluster whose two workers accept tasks (Spark: a standalone
  master and two workers; Ray: ``ray start --head`` and two worker nodes; Dask: a scheduler and
  two workers, each process as a user would start it);
* ``empty_tasks_s``: 200 tasks that return at once (the per-task overhead);
* ``chunks_s``: ``features.convert.read_chunk`` (parse and validate a chunk of the TSV into an
  Arrow file) over every chunk of ``--rows`` synthetic Criteo rows, and ``rows_per_s``; the
  chunk files are checked equal to this process's;
* ``peak_rss_mb``: the largest summed RSS of the cluster's processes (and this driver) while
  the chunks ran, polled every 0.3 s;
* ``stop_s``.

This process's own run of the same tasks is the baseline (``local``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from features import partitions
from features.convert import ReadTask, read_chunk
from features.schema import load_schema

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    """The engines' processes' environment; Dask's workers as ``pipelines.engines`` starts
    them (without the ``MALLOC_TRIM_THRESHOLD_`` its nannies set)."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON__MALLOC_TRIM_THRESHOLD_": "None",
    }


def empty(i: int) -> int:
    return i


class Local:
    def map(self, fn: Any, items: list, shared: Any = None) -> list:
        return [fn(i) if shared is None else fn(i, shared) for i in items]

    def pids(self) -> list[int]:
        return [os.getpid()]

    def close(self) -> None:
        pass


class Dask:
    def __init__(self) -> None:
        from distributed import Client

        port, py = _port(), sys.executable
        self.procs = [
            subprocess.Popen(
                [
                    py,
                    "-m",
                    "distributed.cli.dask_scheduler",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--dashboard-address",
                    ":0",
                ],
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ]
        for _ in range(2):
            self.procs.append(
                subprocess.Popen(
                    [
                        py,
                        "-m",
                        "distributed.cli.dask_worker",
                        f"tcp://127.0.0.1:{port}",
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                    ],
                    env=_env(),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self.client = Client(f"tcp://127.0.0.1:{port}", timeout="60s")
        self.client.wait_for_workers(2, timeout=120)

    def map(self, fn: Any, items: list, shared: Any = None) -> list:
        if shared is None:
            return self.client.gather(self.client.map(fn, items, pure=False))
        [h] = self.client.scatter([shared], broadcast=True, hash=False)
        return self.client.gather(self.client.map(fn, items, [h] * len(items), pure=False))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self) -> None:
        self.client.shutdown()  # the scheduler closes its workers, then itself
        for p in self.procs:
            p.wait()


class Ray:
    def __init__(self) -> None:
        import ray

        self.ray, port = ray, _port()
        self.bin = str(Path(sys.executable).with_name("ray"))
        start = [self.bin, "start", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
        subprocess.run(
            [*start, "--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false"],
            check=True, env=_env(), capture_output=True,
        )  # fmt: skip
        for _ in range(2):
            subprocess.run(
                [*start, f"--address=127.0.0.1:{port}", "--num-cpus=1"],
                check=True, env=_env(), capture_output=True,
            )  # fmt: skip
        ray.init(address=f"127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)

    def map(self, fn: Any, items: list, shared: Any = None) -> list:
        remote = self.ray.remote(num_cpus=1, max_retries=2)(fn)
        if shared is None:
            return self.ray.get([remote.remote(i) for i in items])
        ref = self.ray.put(shared)
        return self.ray.get([remote.remote(i, ref) for i in items])

    def pids(self) -> list[int]:
        names = ("raylet", "gcs_server", "ray::", "default_worker", "plasma")
        return [p.pid for p in psutil.process_iter(["cmdline"]) if any(
            n in " ".join(p.info["cmdline"] or []) for n in names
        )]  # fmt: skip

    def close(self) -> None:
        self.ray.shutdown()
        subprocess.run([self.bin, "stop", "--force"], capture_output=True, env=_env())


class Spark:
    def __init__(self) -> None:
        import pyspark

        home = os.path.dirname(pyspark.__file__)
        env = {**_env(), "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1"}
        env |= {"PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}
        os.environ.update({k: env[k] for k in ("SPARK_HOME", "SPARK_LOCAL_IP", "PYSPARK_PYTHON")})
        cls = os.path.join(home, "bin", "spark-class")
        port = _port()
        quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.procs = [
            subprocess.Popen(
                [
                    cls,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(_port()),
                ],
                **quiet,
            )
        ]
        url = f"spark://127.0.0.1:{port}"
        for _ in range(2):
            self.procs.append(
                subprocess.Popen(
                    [
                        cls,
                        "org.apache.spark.deploy.worker.Worker",
                        url,
                        "--cores",
                        "1",
                        "--memory",
                        "2g",
                        "--host",
                        "127.0.0.1",
                        "--webui-port",
                        str(_port()),
                    ],
                    **quiet,
                )
            )
        from pyspark import SparkConf, SparkContext

        conf = SparkConf().setMaster(url).setAppName("bench.scale.engines")
        conf = conf.set("spark.task.maxFailures", "3").set("spark.cores.max", "2")
        self.sc = SparkContext(conf=conf)
        self.sc.setLogLevel("ERROR")
        deadline = time.time() + 120
        while self.sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.time() < deadline:
            time.sleep(0.2)

    def map(self, fn: Any, items: list, shared: Any = None) -> list:
        rdd = self.sc.parallelize(items, len(items))
        if shared is None:
            return rdd.map(fn).collect()
        b = self.sc.broadcast(shared)
        return rdd.map(lambda i: fn(i, b.value)).collect()

    def pids(self) -> list[int]:
        out = []
        for p in self.procs:
            out.append(p.pid)
            out += [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
        out += [c.pid for c in psutil.Process().children(recursive=True)]
        return out

    def close(self) -> None:
        self.sc.stop()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait()


ENGINES = {"local": Local, "dask": Dask, "ray": Ray, "spark": Spark}


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in set(pids):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_info().rss
    return total / 2**20


def measure(name: str, tsv: Path, work: Path) -> dict[str, Any]:
    schema = load_schema("criteo")
    chunks = partitions.text_chunks(tsv)
    t0 = time.time()
    engine = ENGINES[name]()
    out: dict[str, Any] = {"start_s": round(time.time() - t0, 2)}
    try:
        engine.map(empty, list(range(4)))
        t0 = time.time()
        engine.map(empty, list(range(200)))
        out["empty_tasks_s"] = round(time.time() - t0, 2)
        folder = work / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        ends = [partitions.count_line_ends(c) for c in chunks]
        first = partitions.first_lines(chunks, ends)
        tasks = [
            ReadTask(c, first[i], str(folder / f"chunk-{i:06d}.arrow"), 10, 65536)
            for i, c in enumerate(chunks)
        ]
        peak, running = [0.0], threading.Event()
        running.set()

        def poll() -> None:
            while running.is_set():
                peak[0] = max(peak[0], _rss_mb(engine.pids()))
                time.sleep(0.3)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        t0 = time.time()
        reads = engine.map(read_chunk, tasks, shared=schema)
        out["chunks_s"] = round(time.time() - t0, 2)
        running.clear()
        poller.join()
        out["rows_per_s"] = round(sum(r.rows for r in reads) / out["chunks_s"])
        out["peak_rss_mb"] = round(peak[0])
        h = hashlib.sha256()
        for p in sorted(folder.glob("chunk-*.arrow")):
            h.update(p.read_bytes())
        out["digest"] = h.hexdigest()[:16]
    finally:
        t0 = time.time()
        engine.close()
        out["stop_s"] = round(time.time() - t0, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--engines", default="local,dask,ray,spark")
    p.add_argument("--out", default=None, help="folder for engines.json")
    args = p.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tsv = work / f"data-{args.rows}" / "train.tsv"
    if not tsv.exists():
        subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "generate", "--output", str(tsv.parent), "--rows", str(args.rows), "--test-fraction", "0", "--criteo-tsv"],
            check=True, cwd=ROOT, capture_output=True,
        )  # fmt: skip
    results: dict[str, Any] = {"rows": args.rows, "chunks": len(partitions.text_chunks(tsv))}
    for name in args.engines.split(","):
        try:
            results[name] = measure(name, tsv, work)
        except ImportError as e:
            results[name] = {"skipped": f"not installed ({e})"}
        print(name, json.dumps(results[name]), flush=True)
    base = results.get("local", {}).get("digest")
    for name in args.engines.split(","):
        r = results[name]
        if "digest" in r:
            r["equal_to_local"] = r["digest"] == base
    print(f"\n{args.rows:,} rows in {results['chunks']} chunks; load {os.getloadavg()[0]:.2f}")
    print(f"{'engine':8s} {'start s':>8s} {'200 empty s':>12s} {'chunks s':>9s} {'rows/s':>9s} "
          f"{'RSS MB':>7s} {'stop s':>7s} equal")  # fmt: skip
    for name in args.engines.split(","):
        r = results[name]
        if "skipped" in r:
            print(f"{name:8s} {r['skipped']}")
            continue
        print(
            f"{name:8s} {r['start_s']:>8} {r['empty_tasks_s']:>12} {r['chunks_s']:>9} "
            f"{r['rows_per_s']:>9,} {r['peak_rss_mb']:>7} {r['stop_s']:>7} {r['equal_to_local']}"
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "engines.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
