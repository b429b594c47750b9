"""bench/compiler/dynamic: compilations and latency of serving requests of random batch sizes.

    .venv/bin/python -m bench.compiler.dynamic --out runs/bench-compiler-dynamic

DCN-v2 with full embeddings (``bench/compiler/workload.py``), the inference pass on
preprocessed inputs (ids, dense). ``--requests`` requests (200) of batch sizes drawn uniformly
from 1..``--max-batch`` (512) with the process's seed, served one after the other by:

* ``frozen``: the frozen serving graph, plain TensorFlow (no XLA);
* ``frozen+buckets``: the same, padded to the ladder 8, 16, ..., 512 (what padding costs);
* ``xla``: the whole function with ``jit_compile=True`` (one compilation per new size);
* ``xla+buckets``: the same, padded to the ladder 8, 16, ..., 512 (``warm``: every bucket
  compiled at load, as below);
* ``clusters``: the planned groups as XLA clusters (``compiler_opt.realize``), exact sizes;
* ``clusters+buckets``: the same, padded to the ladder 8, 16, ..., 512
  (``compiler_opt.buckets.Bucketed``), cold: buckets compile during the requests;
* ``clusters+buckets warm``: the same with every bucket compiled at load (``Bucketed.warmup``).

Each variant is a fresh instance (its own compilation cache), is loaded (one untimed call at
the largest batch, 511 rows when padded: graph instantiation, or the warm-up), then serves the whole request
sequence in one block; compilations are counted at load and over the requests from a profiler
trace (``buckets.count_compilations``). Latency per request: call + copy of the output to numpy.
``--processes`` processes with seeds 0, 1, 2...; figures are the median [min-max] over them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = (
    "frozen",
    "frozen+buckets",
    "xla",
    "xla+buckets",
    "xla+buckets warm",
    "clusters",
    "clusters+buckets",
    "clusters+buckets warm",
)


@dataclasses.dataclass
class _Requests:
    """The request sequence in both call forms (``structured``: ``(ids, dense)``; ``flat``:
    the flat tensors the frozen graphs take) and the largest batch in both (the load call)."""

    structured: list[Any]
    flat: list[tuple]
    full_structured: tuple
    full_flat: tuple


def _variant(name: str, w: Any, r: Any, ladder: list[int], req: _Requests) -> tuple:
    """A fresh instance of variant ``name``: (callable, its requests, its load call's args)."""
    import tensorflow as tf

    from compiler_opt import buckets, graph_io

    def graph_fn(graph_def: Any) -> Any:
        return graph_io.load_graph_def(graph_def, r.frozen.inputs, r.frozen.outputs, r.frozen.bound)

    flat, full_flat = req.flat, req.full_flat
    if name == "frozen":
        return graph_fn(r.frozen.graph_def), flat, full_flat
    if name == "frozen+buckets":  # what padding alone costs
        return buckets.Bucketed(graph_fn(r.frozen.graph_def), ladder), flat, full_flat
    if name == "xla":
        jit = tf.function(w.inference, jit_compile=True)
        return (lambda i, d, f=jit: [f(i, d)]), req.structured, req.full_structured
    if name.startswith("xla+buckets"):
        jit = tf.function(w.inference, jit_compile=True)

        def whole(*xs: Any, f: Any = jit) -> list[Any]:
            return [f(*tf.nest.pack_sequence_as(req.full_structured, xs, expand_composites=True))]

        return buckets.Bucketed(whole, ladder), flat, full_flat
    if name == "clusters":
        return graph_fn(r.tagged), flat, full_flat
    return buckets.Bucketed(graph_fn(r.tagged), ladder), flat, full_flat


def _serve(
    name: str, variant: tuple, full_flat: tuple, reference: list[np.ndarray]
) -> dict[str, Any]:
    """Loads variant ``name`` and serves the requests one after the other: compilations,
    latencies and the largest difference from ``reference`` (the ``frozen`` outputs, which
    this call appends to when ``name`` is ``frozen``)."""
    from compiler_opt import buckets

    fn, inputs, load_args = variant
    # loading: one call at the largest batch (graph instantiation, first compile; one row
    # fewer when padded), or the warm-up of every bucket; timed and counted apart from the
    # requests
    t0 = time.perf_counter()
    with buckets.count_compilations() as at_load:
        if name.endswith("warm"):
            fn.warmup(full_flat)
        elif isinstance(fn, buckets.Bucketed):  # 511 rows: a padded call
            fn(*[t[:-1] for t in load_args])[0].numpy()
        else:
            fn(*load_args)[0].numpy()
    load_s = time.perf_counter() - t0
    latencies = []
    diff = 0.0
    with buckets.count_compilations() as c:
        for i, a in enumerate(inputs):
            t0 = time.perf_counter()
            out = fn(*a)[0].numpy()
            latencies.append(time.perf_counter() - t0)
            if name == "frozen":
                reference.append(out)
            else:
                diff = max(diff, float(np.abs(out - reference[i]).max()))
    row = {
        "compilations": c.count,
        "p50_s": float(np.percentile(latencies, 50)),
        "p99_s": float(np.percentile(latencies, 99)),
        "total_s": float(sum(latencies)),
        "max_abs_diff": diff,
        "latencies_s": latencies,
        "load_s": load_s,
        "load_compilations": at_load.count,
    }
    if isinstance(fn, buckets.Bucketed):
        row["buckets_used"] = fn.stats.buckets_used
        row["padding_share"] = 1 - fn.stats.rows / fn.stats.padded_rows
    return row


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: every variant over the same seeded request sequence."""
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import buckets, cost, realize

    coefficients = cost.load_or_calibrate()
    data_dir = workload.write_data(Path(args.out) / "work", args.rows)
    w = workload.build(data_dir, "full", (args.max_batch,), seed=0)
    ids, dense = w.inputs[args.max_batch]
    spec = tf.nest.map_structure(
        lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), (ids, dense)
    )
    r = realize.xla_clusters(
        tf.function(w.inference).get_concrete_function(*spec), coefficients, 256
    )
    rng = np.random.default_rng(args.seed)
    sizes = [int(n) for n in rng.integers(1, args.max_batch + 1, args.requests)]
    structured = [tf.nest.map_structure(lambda t, n=n: t[:n], (ids, dense)) for n in sizes]
    req = _Requests(
        structured,
        [tuple(tf.nest.flatten(s, expand_composites=True)) for s in structured],
        (ids, dense),
        tuple(tf.nest.flatten((ids, dense), expand_composites=True)),
    )
    ladder = buckets.powers_of_two(8, args.max_batch)
    res: dict[str, Any] = {"seed": args.seed, "sizes": sizes, "load_start": os.getloadavg()}
    res["n_clusters"] = r.clusters
    reference: list[np.ndarray] = []
    for name in VARIANTS:
        row = _serve(name, _variant(name, w, r, ladder, req), req.full_flat, reference)
        res[name] = row
        print(
            f"[seed {args.seed}] {name}: {row['compilations']} compilations, p50 "
            f"{row['p50_s'] * 1e3:.2f} ms, p99 {row['p99_s'] * 1e3:.2f} ms, total "
            f"{row['total_s']:.2f} s, diff {row['max_abs_diff']:.1e}; load {row['load_s']:.2f} s, "
            f"{row['load_compilations']} compilations",
            flush=True,
        )
    res["load_end"] = os.getloadavg()
    return res


def _spread(values: list[float], scale: float = 1.0, fmt: str = ".2f") -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):{fmt}} [{min(v):{fmt}}-{max(v):{fmt}}]"


def summarize(procs: list[dict[str, Any]]) -> str:
    """A markdown table: per variant, median [min-max] over processes."""
    lines = [
        "| variant | at load: compilations / s | compilations in requests | p50 ms | p99 ms | total s | p99 over frozen | "
        "max abs diff vs frozen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in VARIANTS:
        rows = [p[name] for p in procs]
        ratio = [p[name]["p99_s"] / p["frozen"]["p99_s"] for p in procs]
        comp = _spread([r["compilations"] for r in rows], fmt=".0f")
        load = f"{_spread([r['load_compilations'] for r in rows], fmt='.0f')} / "
        load += _spread([r["load_s"] for r in rows])
        lines.append(
            f"| {name} | {load} | {comp} | {_spread([r['p50_s'] for r in rows], 1e3)} | "
            f"{_spread([r['p99_s'] for r in rows], 1e3)} | {_spread([r['total_s'] for r in rows])} | "
            f"{_spread(ratio)}x | {max(r['max_abs_diff'] for r in rows):.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.compiler.dynamic", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="runs/bench-compiler-dynamic")
    p.add_argument("--rows", type=int, default=50_000, help="synthetic rows (vocabularies)")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--max-batch", type=int, default=512)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="seed of the first process (+1 each)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.requests < 1 or args.max_batch < 8 or args.max_batch & (args.max_batch - 1):
        raise SystemExit(
            f"error: --requests {args.requests} / --max-batch {args.max_batch}: expected >= 1 "
            "requests and a power of two >= 8"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        res = child(args)
        (out / f"seed-{args.seed}.json").write_text(json.dumps(res))
        return 0
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import cost

    t0 = time.time()
    workload.write_data(out / "work", args.rows)
    coefficients = cost.load_or_calibrate()
    procs = []
    for i in range(args.processes):
        seed = args.seed + i
        cmd = [sys.executable, "-m", "bench.compiler.dynamic", "--child", "--seed", str(seed)]
        cmd += ["--out", str(out), "--rows", str(args.rows), "--requests", str(args.requests)]
        cmd += ["--max-batch", str(args.max_batch)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        procs.append(json.loads((out / f"seed-{seed}.json").read_text()))
    table = summarize(procs)
    info = {
        "tf_version": tf.__version__,
        "cpus": os.cpu_count(),
        "device": coefficients.device,
        "rows": args.rows,
        "requests": args.requests,
        "max_batch": args.max_batch,
        "processes": args.processes,
        "clusters": procs[0]["n_clusters"],
        "distinct_sizes": [len(set(p["sizes"])) for p in procs],
        "seconds": round(time.time() - t0, 1),
        "load": [p["load_start"] for p in procs] + [procs[-1]["load_end"]],
    }
    (out / "results.json").write_text(json.dumps({"info": info, "processes": procs}))
    (out / "summary.md").write_text(f"# bench/compiler/dynamic\n\n{json.dumps(info)}\n\n{table}\n")
    print(table)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
