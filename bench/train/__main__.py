"""bench/train: where training time goes, and peak memory as the dataset grows.

    .venv/bin/python -m bench.train --out runs/bench-train
    .venv/bin/python -m bench.train --out runs/bench-train --rows 100000 --processes 1 --no-rss

Throughput (DCN-v2 on the synthetic set, batch ``--batch-size``, ``--rows`` rows of which 20%
test): in each of ``--processes`` fresh processes, one after the other on the same data,

* ``parquet read``: pyarrow record batches of the training files, nothing else;
* ``batches (numpy)``: the same plus the (seed, epoch) shuffle buffer and slicing into batches;
* ``input pipeline``: the tf.data dataset training consumes (``features.dataset.make_dataset``:
  the above plus conversion to tensors), one full epoch;
* ``input, one worker's shard``: the same for worker 0 of 2 (``[distribute] input = "shard"``);
* ``step alone``: the training step (``pipelines.run.step.make_train_step``) on ``--cached``
  batches held in memory, cycled, after its trace (seconds and graph operations printed) and
  first two calls (seconds printed: the first holds TensorFlow's graph optimization);
* ``training loop``: input pipeline and step together, as ``stitchrec train`` runs them;
* ``TF-native input``, ``TF-native input, one worker's shard``, ``TF-native training loop``: the
  same three with the TFRecord input (``features.tfrecord``), from TFRecord shards written once
  from the training Parquet shards (the conversion's rows/s is printed too).

All in examples/s, with ratios against the Parquet input pipeline and the step alone measured
in the same processes. After each of those processes, ``stitchrec train`` end to end as one
process with each ``[data] input_format``, its rate compared with that round's step alone. Then
``stitchrec train`` as a local cluster of ``--workers`` multi_worker_mirrored workers, and
as a parameter-server cluster (chief, ``--workers`` workers, one ps) with chief-fed (Parquet)
and worker-side (TFRecord) input: examples/s, and the chief's CPU seconds and bytes read while
it trains (``bench/train/ps_input.py``).

Peak memory: ``stitchrec train`` (one epoch, shuffle buffer ``--rss-buffer`` rows) on synthetic
sets of ``--rss-rows`` x 1, 4 and 16 rows (with the default vocabularies, and with ``--rss-vocab``
values per field, which fixes the model size), peak RSS of the process (VmHWM), beside the
dataset's size on disk. Writes ``results.json`` and prints tables with the machine load.
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

from bench.cluster import (
    ROOT,
    cluster_tf_configs,
    dcn_v2_config,
    report,
    run_tasks,
    synthetic_data,
)
from bench.train.ps_input import run_ps

FIRST_STEPS = ("trace seconds", "graph operations", "first step seconds", "second step seconds")
STAGES = (
    "parquet read",
    "batches (numpy)",
    "input pipeline",
    "input, one worker's shard",
    "TF-native input",
    "TF-native input, one worker's shard",
    "step alone",
    "training loop",
    "TF-native training loop",
)
#: where ``throughput`` writes the TFRecord shards of a data folder's training split
TFRECORD_DIR = "tfrecord-train"


def write_data(root: Path, rows: int, vocab: int | None = None) -> Path:
    """The synthetic set of ``rows`` rows in shards of 100,000 rows (row groups of 65,536: the
    same file layout at every size), every categorical field with ``vocab`` values when given
    (else the generator's default vocabularies)."""
    folder = root / (f"data-{rows}" if vocab is None else f"data-{rows}-vocab{vocab}")
    extra = {} if vocab is None else {"vocab_sizes": vocab}
    return synthetic_data(folder, rows, rows_per_shard=100_000, **extra)


def _rate(rows: int, seconds: float) -> float:
    return rows / max(seconds, 1e-9)


def _input_rates(data: Path, batch_size: int) -> dict[str, float]:
    """Examples/s of the input stages (each after one warm-up pass)."""
    from features.dataset import iter_batches, iter_record_batches, list_parquet, make_dataset
    from features.schema import load_schema
    from features.tfrecord.dataset import make_tfrecord_dataset

    schema = load_schema(data / "schema.toml").as_parquet()
    files = list_parquet(data / "train")
    tfrecord = data / TFRECORD_DIR
    kw = {"batch_size": batch_size, "shuffle": True, "seed": 0, "epoch": 0}
    local = {**kw, "batch_size": batch_size // 2, "shard": (0, 2), "drop_remainder": True}
    label = schema.label.name

    def count(ds: Any) -> Any:
        return (int(b[label].shape[0]) for b in ds)

    inputs = {
        "parquet read": lambda: (rb.num_rows for rb in iter_record_batches(schema, files)),
        "batches (numpy)": lambda: (len(b[label]) for b in iter_batches(schema, files, **kw)),
        "input pipeline": lambda: count(make_dataset(schema, files, **kw)),
        "input, one worker's shard": lambda: count(make_dataset(schema, files, **local)),
        "TF-native input": lambda: count(make_tfrecord_dataset(schema, tfrecord, **kw)),
        "TF-native input, one worker's shard": lambda: count(
            make_tfrecord_dataset(schema, tfrecord, **local)
        ),
    }
    out = {}
    for stage, rows in inputs.items():
        sum(rows())  # warm up: file system cache, tf.data tracing
        t0 = time.perf_counter()
        out[stage] = _rate(sum(rows()), time.perf_counter() - t0)
    return out


def _first_steps(step: Any, batches: list[Any], loss: Any) -> dict[str, float]:
    """What the first steps of a fresh training step cost: the trace (seconds and graph
    operations), the first call (graph optimization, kernels, the step) and the second."""
    t0 = time.perf_counter()
    graph = step.get_concrete_function().graph
    out = {"trace seconds": time.perf_counter() - t0}
    out["graph operations"] = len(graph.get_operations())
    for name, batch in zip(("first step seconds", "second step seconds"), batches, strict=True):
        t0 = time.perf_counter()
        step(batch)
        float(loss.result())  # waits for the step
        out[name] = time.perf_counter() - t0
    return out


def measure_stages(data: Path, batch_size: int, cached: int, steps: int) -> dict[str, float]:
    """Examples/s of each stage of ``STAGES`` in this process (see the module docstring)."""
    import tensorflow as tf

    from features.dataset import list_parquet, make_dataset
    from features.schema import load_schema
    from features.tfrecord.dataset import make_tfrecord_dataset
    from pipelines.config import load_config
    from pipelines.run.data import prepare_stats
    from pipelines.run.model import build_run_model, make_optimizer
    from pipelines.run.paths import RunPaths
    from pipelines.run.step import make_train_step

    out = _input_rates(data, batch_size)
    schema = load_schema(data / "schema.toml").as_parquet()
    files = list_parquet(data / "train")
    kw = {"batch_size": batch_size, "shuffle": True, "seed": 0}
    cfg = load_config(dcn_v2_config(data.parent / "stages.toml", data, batch_size))
    paths = RunPaths(data.parent / "stages-run")
    stats = prepare_stats(schema, files, paths, lambda _: None)
    tf.keras.utils.set_random_seed(0)
    model = build_run_model(cfg, schema, stats)
    optimizer = make_optimizer("adam", 1e-3)
    ds = make_dataset(schema, files, epoch=0, **kw)
    batches = list(ds.take(cached))
    model(batches[0])
    loss, auc = tf.keras.metrics.Mean(), tf.keras.metrics.AUC(num_thresholds=1000)
    step = make_train_step(
        model, optimizer, element_spec=ds.element_spec, loss_metric=loss, auc_metric=auc
    )
    out.update(_first_steps(step, batches[:2], loss))
    t0 = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)])
    float(loss.result())  # waits for the last step
    out["step alone"] = _rate(steps * batch_size, time.perf_counter() - t0)

    loops = {
        "training loop": lambda: make_dataset(schema, files, epoch=1, **kw),
        "TF-native training loop": lambda: make_tfrecord_dataset(
            schema, data / TFRECORD_DIR, epoch=2, **kw
        ),
    }
    for stage, make in loops.items():
        t0, n = time.perf_counter(), 0
        for b in make():
            step(b)
            n += int(b[schema.label.name].shape[0])
        float(loss.result())
        out[stage] = _rate(n, time.perf_counter() - t0)
    return out


def write_tfrecord(data: Path) -> dict[str, float]:
    """The TFRecord shards of ``data``'s training split, written once (``TFRECORD_DIR``);
    the conversion's rows, seconds and rows/s in a fresh process."""
    code = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from features.dataset import list_parquet, count_rows\n"
        "from features.schema import load_schema\n"
        "from features.tfrecord.convert import parquet_to_tfrecord\n"
        "d = Path(sys.argv[1])\n"
        "s = load_schema(d / 'schema.toml').as_parquet()\n"
        "files = list_parquet(d / 'train')\n"
        "t0 = time.perf_counter()\n"
        f"parquet_to_tfrecord(s, files, d / {TFRECORD_DIR!r})\n"
        "t = time.perf_counter() - t0\n"
        "print('CONVERT ' + json.dumps({'rows': count_rows(files), 'seconds': round(t, 2)}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(
        [sys.executable, "-c", code, str(data)], cwd=ROOT, env=env, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("CONVERT "))
    result = json.loads(line[len("CONVERT ") :])
    return {**result, "rows_per_second": round(result["rows"] / result["seconds"])}


def run_train(config: Path, out: Path, workers: int, timeout: float) -> dict[str, Any]:
    """``stitchrec train`` as ``workers`` processes (1: no TF_CONFIG): the chief's report plus
    the peak RSS of each process (bytes: its VmHWM, which counts from its exec, unlike the
    ``ru_maxrss`` of ``wait4``, which keeps the forking parent's resident size)."""
    tf_configs = cluster_tf_configs(workers)
    cmd = [sys.executable, "-m", "bench.train", "--out", str(out), "--train-child", str(config)]
    t0 = time.time()
    logs = run_tasks(cmd, tf_configs, out, timeout)
    rss = []
    for log in logs:
        line = [ln for ln in log.read_text().splitlines() if ln.startswith("PEAK_RSS ")]
        rss.append(int(line[-1].split()[1]))
    return report(out, t0, workers=workers, peak_rss_bytes=rss)


def peak_rss_bytes() -> int:
    """This process's peak resident set size since its exec (Linux ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (peak RSS needs Linux)")


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.parquet"))


def spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def _stage_process(args: argparse.Namespace, out: Path, data: Path) -> dict[str, float]:
    """``measure_stages`` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    cmd = [sys.executable, "-m", "bench.train", "--out", str(out), "--stages-only", str(data)]
    cmd += ["--batch-size", str(args.batch_size), "--cached", str(args.cached)]
    cmd += ["--steps", str(args.steps)]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("STAGES ")), None)
    if line is None:
        raise RuntimeError(f"stage process failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    rates = json.loads(line[len("STAGES ") :])
    print(json.dumps(rates), flush=True)
    return rates


def _format_config(out: Path, data: Path, batch_size: int, fmt: str, extra: str = "") -> Path:
    """The DCN-v2 config with ``[data] input_format = fmt``."""
    path = dcn_v2_config(out / f"run-{fmt}.toml", data, batch_size, extra=extra)
    path.write_text(path.read_text().replace("[data]\n", f'[data]\ninput_format = "{fmt}"\n'))
    return path


def throughput(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``--processes`` rounds of the stages in a fresh process followed by ``stitchrec train``
    end to end in one process per input format (so each run has its own round's step-alone
    rate to be compared with), then a multi_worker_mirrored cluster of ``--workers`` and a
    parameter-server cluster with chief-fed and worker-side input."""
    data = write_data(out, args.rows)
    convert = write_tfrecord(data)
    print(json.dumps({"tfrecord conversion": convert}), flush=True)
    per_process: list[dict[str, float]] = []
    single: dict[str, list[dict[str, Any]]] = {"parquet": [], "tfrecord": []}
    for i in range(args.processes):
        per_process.append(_stage_process(args, out, data))
        for fmt, runs in single.items():
            config = _format_config(out, data, args.batch_size, fmt)
            runs.append(run_train(config, out / f"train-1-{fmt}-{i}", 1, args.timeout))
            print(json.dumps(runs[-1]), flush=True)
    end_to_end = {}
    config = _format_config(out, data, args.batch_size, "tfrecord")
    mirrored = run_train(config, out / f"train-{args.workers}", args.workers, args.timeout)
    end_to_end[f"{args.workers} mirrored workers"] = mirrored
    ps = '[distribute]\nstrategy = "parameter_server"'
    for fmt, how in (("parquet", "chief-fed"), ("tfrecord", "worker-side")):
        config = _format_config(out, data, args.batch_size, fmt, extra=ps)
        config.write_text(config.read_text().replace("log_every = 20", "log_every = 5"))
        r = run_ps(config, out / f"train-ps-{fmt}", args.workers, 1, args.timeout)
        end_to_end[f"ps {args.workers} workers, {how}"] = r
        print(json.dumps(r), flush=True)
    return {
        "rows": args.rows,
        "tfrecord_conversion": convert,
        "stages": per_process,
        "single_process": single,
        "input_over_step": [p["input pipeline"] / p["step alone"] for p in per_process],
        "end_to_end": end_to_end,
    }


def rss_series(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Peak RSS of ``stitchrec train`` at 1x, 4x and 16x ``--rss-rows``, per ``--rss-vocab``."""
    series = []
    for vocab in args.rss_vocab:
        for scale in (1, 4, 16):
            rows = args.rss_rows * scale
            data = write_data(out, rows, vocab or None)
            config = dcn_v2_config(
                out / f"rss-{data.name}.toml", data, args.batch_size, args.rss_buffer
            )
            r = run_train(config, out / f"rss-{data.name}", 1, args.timeout)
            series.append(
                {"vocab": vocab or "default", "scale": scale, "rows": rows,
                 "disk_bytes": disk_bytes(data), **r}
            )  # fmt: skip
            print(json.dumps(series[-1]), flush=True)
    return series


def _ratio(per_process: list[dict[str, float]], num: str, den: str) -> str:
    r = [p[num] / p[den] for p in per_process]
    return f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]"


def print_throughput(args: argparse.Namespace, results: dict[str, Any]) -> None:
    per_process, e2e = results["stages"], results["end_to_end"]
    conv = results["tfrecord_conversion"]
    print(
        f"\nDCN-v2, {args.rows:,} synthetic rows, batch {args.batch_size}, "
        f"{args.processes} processes: median [min-max] examples/s"
    )
    print("| stage | examples/s |\n|---|---|")
    for stage in STAGES:
        print(f"| {stage} | {spread([p[stage] for p in per_process])} |")
    med = {k: statistics.median(p[k] for p in per_process) for k in FIRST_STEPS}
    print(
        f"\ntraining step: traced in {med['trace seconds']:.2f} s "
        f"({med['graph operations']:,.0f} graph operations), first call "
        f"{med['first step seconds']:.2f} s, second {med['second step seconds']:.2f} s (medians)"
    )
    print(
        f"TFRecord conversion (once): {conv['rows']:,} rows in {conv['seconds']} s "
        f"({conv['rows_per_second']:,} rows/s)"
    )
    for num, den, target in (
        ("TF-native input", "input pipeline", ">= 2"),
        ("TF-native input, one worker's shard", "input, one worker's shard", ""),
        ("input pipeline", "step alone", ">= 3"),
        ("TF-native input", "step alone", ""),
        ("training loop", "step alone", ""),
        ("TF-native training loop", "step alone", ">= 0.9"),
    ):
        note = f" (target {target})" if target else ""
        print(f"{num} / {den}: {_ratio(per_process, num, den)}{note}")
    print(
        "\n| stitchrec train, 1 process | examples/s | / step alone of its round | test AUC |"
        "\n|---|---|---|---|"
    )
    for fmt, runs in results["single_process"].items():
        rates = [r["examples_per_second"] for r in runs]
        ratios = [r / p["step alone"] for r, p in zip(rates, per_process, strict=True)]
        aucs = sorted({f"{r['auc']:.4f}" for r in runs})
        print(
            f"| {fmt} | {spread(rates)} | {statistics.median(ratios):.2f}x "
            f"[{min(ratios):.2f}-{max(ratios):.2f}] (target >= 0.8) | {', '.join(aucs)} |"
        )
    step = statistics.median(p["step alone"] for p in per_process)
    print("\n| stitchrec train | examples/s | / step alone | test AUC | chief CPU s | chief read |")
    print("|---|---|---|---|---|---|")
    for name, r in e2e.items():
        chief = r.get("tasks", {}).get("chief")
        cpu = f"{chief['cpu_s']}" if chief else ""
        read = f"{chief['rchar'] / 2**20:,.1f} MiB" if chief else ""
        print(
            f"| {name} | {r['examples_per_second']:,} | {r['examples_per_second'] / step:.2f}x "
            f"| {r['auc']:.4f} | {cpu} | {read} |"
        )
    ps = [r for name, r in e2e.items() if name.startswith("ps ")]
    if len(ps) == 2:
        print(
            f"\nparameter servers, worker-side / chief-fed examples/s: "
            f"{ps[1]['examples_per_second'] / ps[0]['examples_per_second']:.2f}x; "
            f"tasks between logged steps {ps[0]['window_steps']}: chief-fed {ps[0]['tasks']}, "
            f"worker-side {ps[1]['tasks']}"
        )


def print_rss(args: argparse.Namespace, series: list[dict[str, Any]]) -> None:
    print(f"\npeak RSS of stitchrec train (shuffle buffer {args.rss_buffer:,} rows)")
    print("| vocabulary | scale | rows | Parquet on disk | parameters | peak RSS |")
    print("|---|---|---|---|---|---|")
    for r in series:
        print(
            f"| {r['vocab']} | {r['scale']}x | {r['rows']:,} | {r['disk_bytes'] / 2**20:,.1f} MiB "
            f"| {r['parameters']:,} | {r['peak_rss_bytes'][0] / 2**20:,.0f} MiB |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--cached", type=int, default=8, help="batches held for 'step alone'")
    ap.add_argument("--steps", type=int, default=30, help="steps timed for 'step alone'")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rss-rows", type=int, default=100_000)
    ap.add_argument("--rss-buffer", type=int, default=65_536)
    ap.add_argument(
        "--rss-vocab",
        type=int,
        nargs="+",
        default=[0, 100],
        help="vocabulary per categorical field of each RSS series (0: the generator's default, "
        "whose distinct values, and so the model, grow with the rows; 100: a fixed model)",
    )
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--stages-only", help=argparse.SUPPRESS)  # child: data folder
    ap.add_argument("--train-child", help=argparse.SUPPRESS)  # child: stitchrec train CONFIG
    args = ap.parse_args()
    if args.train_child:
        from pipelines.cli import main as cli_main

        code = cli_main(["train", "--config", args.train_child, "--output", args.out])
        print(f"PEAK_RSS {peak_rss_bytes()}", flush=True)
        sys.exit(code)
    if args.stages_only:
        rates = measure_stages(Path(args.stages_only), args.batch_size, args.cached, args.steps)
        print("STAGES " + json.dumps(rates), flush=True)
        return

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()]
    results: dict[str, Any] = {"batch_size": args.batch_size}
    if not args.no_throughput:
        results["throughput"] = throughput(args, out)
    if not args.no_rss:
        results["rss"] = rss_series(args, out)
    load.append(os.getloadavg())
    results["cpus"] = os.cpu_count()
    results["loadavg_before_after"] = load
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if not args.no_throughput:
        print_throughput(args, results["throughput"])
    if not args.no_rss:
        print_rss(args, results["rss"])
    print(f"\nload average before {load[0]}, after {load[1]} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
