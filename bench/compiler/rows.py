"""bench/compiler/rows: row programs (``compiler_opt.row_op``) against the ops they replace.

    .venv/bin/python -m bench.compiler.rows --out runs/bench-compiler-rows

Three groups with reductions, at batch 256 and 4096: DeepFM's FM term over ``[B, 39, 16]``
(Criteo's 39 fields, dim 16), a LayerNorm over ``[B, 256]`` (with gamma and beta) and a
softmax over ``[B, 8, 39]`` (attention weights over the fields). Each is a frozen
``tf.function`` run three ways in the same process, in interleaved rounds:

* ``graph``: the frozen graph, TensorFlow's ops one by one;
* ``row``: the same graph with the computation replaced by its row program (one op);
* ``xla``: the function with ``jit_compile=True`` (XLA:CPU, compiled before timing).

Per process: the median time per call over ``--rounds`` rounds of ``--calls`` calls, and the
ratios ``graph / row`` and ``xla / row`` (above 1: the row program is faster). ``--processes``
fresh processes; the summary is the median [min-max] over them. Ops per call: the frozen
graph's kernels against 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CASES = ("fm", "layer_norm", "softmax")
SHAPES = {"fm": (39, 16), "layer_norm": (256,), "softmax": (8, 39)}


def _fn(case: str) -> Any:
    import tensorflow as tf

    if case == "fm":

        def fm(v: tf.Tensor) -> tf.Tensor:
            sum_sq = tf.square(tf.reduce_sum(v, axis=1))
            sq_sum = tf.reduce_sum(tf.square(v), axis=1)
            return 0.5 * tf.reduce_sum(sum_sq - sq_sum, axis=1, keepdims=True)

        return fm
    if case == "layer_norm":
        gamma = tf.constant(np.linspace(0.5, 1.5, 256, dtype=np.float32))
        beta = tf.constant(np.linspace(-0.1, 0.1, 256, dtype=np.float32))

        def layer_norm(x: tf.Tensor) -> tf.Tensor:
            m = tf.reduce_mean(x, axis=-1, keepdims=True)
            c = x - m
            var = tf.reduce_mean(tf.square(c), axis=-1, keepdims=True)
            return c * tf.math.rsqrt(var + 1e-5) * gamma + beta

        return layer_norm

    def softmax(x: tf.Tensor) -> tf.Tensor:
        return tf.nn.softmax(x * 0.125, axis=-1)

    return softmax


def worker(batches: list[int], rounds: int, calls: int, seed: int) -> dict[str, Any]:
    import tensorflow as tf

    from compiler_opt import graph_io, ir, realize, xy_op
    from compiler_opt.row_op import groups as row_groups

    out: dict[str, Any] = {}
    rng = np.random.default_rng(seed)
    for case in CASES:
        fn = _fn(case)
        shape = SHAPES[case]
        concrete = tf.function(fn).get_concrete_function(tf.TensorSpec([None, *shape]))
        frozen = realize.freeze(concrete)
        graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
        order = ir.topological_order(graph.nodes)
        nodes = [n for n in order if row_groups.expressible(graph, n)]
        group, reason = row_groups.row_spec(graph, nodes, frozen.outputs)
        if group is None:
            raise RuntimeError(f"{case}: no row program: {reason}")
        graph_def, outputs = xy_op.rewrite(frozen.graph_def, [group], frozen.outputs)
        plain = graph_io.load_graph_def(frozen.graph_def, frozen.inputs, frozen.outputs)
        row = graph_io.load_graph_def(graph_def, frozen.inputs, outputs)
        xla = tf.function(fn, jit_compile=True)
        kernels = sum(
            n.op not in ("Placeholder", "Const", "Identity", "NoOp") for n in frozen.graph_def.node
        )
        for batch in batches:
            x = tf.constant(rng.normal(size=(batch, *shape)).astype(np.float32))
            runs = {
                "graph": lambda x=x, f=plain: f(x)[0],
                "row": lambda x=x, f=row: f(x)[0],
                "xla": lambda x=x, f=xla: f(x),
            }
            want = runs["graph"]().numpy()
            # first calls: compile, allocate; and check (float32 rounding: the FM term's
            # difference of squares cancels, so the tolerance scales with the values)
            atol = 1e-5 * max(1.0, float(np.abs(want).max()))
            for name, f in runs.items():
                np.testing.assert_allclose(f().numpy(), want, rtol=1e-4, atol=atol, err_msg=name)
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(rounds):
                for name, f in runs.items():
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        y = f()
                    y.numpy()
                    times[name].append((time.perf_counter() - t0) / calls)
            med = {k: statistics.median(v) for k, v in times.items()}
            out[f"{case}@{batch}"] = {
                "ms": {k: round(1e3 * v, 4) for k, v in med.items()},
                "graph_over_row": med["graph"] / med["row"],
                "xla_over_row": med["xla"] / med["row"],
                "ops_per_call": {"graph": kernels, "row": 1},
            }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[256, 4096])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.batches, args.rounds, args.calls, args.worker)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    per_process = []
    for seed in range(args.processes):
        cmd = [sys.executable, "-m", "bench.compiler.rows", "--out", str(args.out)]
        cmd += ["--batches", *map(str, args.batches), "--rounds", str(args.rounds)]
        cmd += ["--calls", str(args.calls), "--worker", str(seed)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        per_process.append(json.loads(r.stdout.strip().splitlines()[-1]))
    summary: dict[str, Any] = {}
    lines = [
        "| case | batch | ops (graph -> row) | graph / row | xla / row | row ms |",
        "|---|---|---|---|---|---|",
    ]
    for key in per_process[0]:
        entry = {}
        for ratio in ("graph_over_row", "xla_over_row"):
            vals = [pp[key][ratio] for pp in per_process]
            entry[ratio] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        row_ms = statistics.median(pp[key]["ms"]["row"] for pp in per_process)
        entry["row_ms"] = row_ms
        entry["ops_per_call"] = per_process[0][key]["ops_per_call"]
        summary[key] = entry
        case, batch = key.split("@")
        g, x = entry["graph_over_row"], entry["xla_over_row"]
        lines.append(
            f"| {case} | {batch} | {entry['ops_per_call']['graph']} -> 1 | "
            f"{g['median']:.2f}x [{g['min']:.2f}-{g['max']:.2f}] | "
            f"{x['median']:.2f}x [{x['min']:.2f}-{x['max']:.2f}] | {row_ms:.3f} |"
        )
    (args.out / "rows.json").write_text(
        json.dumps({"per_process": per_process, "summary": summary}, indent=1)
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
