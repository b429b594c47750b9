"""bench/compiler/activations: the training step's memory and time with the MLP tower's ReLU and
dropout differentiated three ways.

    .venv/bin/python -m bench.compiler.activations --out runs/bench-compiler-activations

DCN-v2 of ``bench/compiler/workload.py`` (full embeddings, 3 cross layers, MLP ``--mlp``,
256-128 by default) with ``--dropout`` (0.1) on the MLP, one SGD step on preprocessed inputs, at each ``--batches``:

* ``backprop``: TensorFlow's gradients (plain back-propagation);
* ``forward_ad``: the tower with ``gradient = "forward_ad"`` (``ranking.forward_ad``: at most a
  boolean derivative kept instead of the ReLU's output and the keep mask), what ``[fusion]
  activations = "forward_ad"`` trains;
* ``recompute``: the tower under ``tf.recompute_grad`` (its activations recomputed in the
  backward pass from its input; the dropout masks keyed as in the plain step).

Before timing, each variant's gradients of the same loss (same dropout masks) are compared with
``backprop``'s (max abs difference). Memory: the CPU allocator's peak during one step minus
what it held before (weights, inputs): what the step itself needs, activations held for the
backward pass included; and what the forward pass leaves held for the backward pass (the
forward as a tf.function under a tape: the allocator's bytes after it, minus before). Time:
median of ``--steps`` steps, variants interleaved in ``--rounds`` rounds. ``--processes`` processes; figures are the median [min-max] over them.
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

from bench.compiler.data import write_data  # no TensorFlow: only the child processes load it

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("backprop", "forward_ad", "recompute")
#: the children's environment: the BFC allocator on the CPU, whose byte counters the memory
#: figures read
CHILD_ENV = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}


def _recomputed(mlp: Any) -> Any:
    """A layer running ``mlp`` under ``tf.recompute_grad``; the dropout call count is read
    once, outside, so the recomputation draws the forward pass's masks."""
    import tensorflow as tf

    class Recomputed(tf.keras.layers.Layer):
        def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
            counter = mlp.dropout_calls
            calls = None
            if counter is not None and training:
                counter.assign_add(1)
                calls = tf.identity(counter)

            def body(h: tf.Tensor) -> tf.Tensor:
                for i, layer in enumerate(mlp.dense_layers):
                    h = layer(h)
                    if calls is not None:
                        seed = tf.stack([tf.constant(mlp.seed + i, tf.int64), calls])
                        h = tf.nn.experimental.stateless_dropout(h, rate=mlp.dropout, seed=seed)
                return h

            return tf.recompute_grad(body)(x)

    return Recomputed(name=mlp.name)


def _models(w: Any) -> dict[str, Any]:
    from pipelines.run.fusion import with_gradient

    return {
        "backprop": w.model,
        "forward_ad": with_gradient(w.model, "forward_ad"),
        "recompute": w.model.with_blocks(tower=_recomputed(w.model.tower)),
    }


def _grad_diffs(w: Any, models: dict[str, Any], batch: int) -> dict[str, float]:
    """Max abs difference of each variant's gradients from ``backprop``'s (same masks)."""
    import tensorflow as tf

    ids, dense = w.inputs[batch]
    weights = tf.random.stateless_normal([batch], seed=[0, 1])
    counter = w.model.tower.dropout_calls
    grads = {}
    for name, m in models.items():
        counter.assign(1000)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(m.logits_from(ids, dense, True) * weights)
        grads[name] = tape.gradient(loss, w.model.trainable_variables)
    base = grads["backprop"]
    return {
        name: max(
            float(tf.reduce_max(tf.abs(tf.convert_to_tensor(a) - tf.convert_to_tensor(b))))
            for a, b in zip(g, base, strict=True)
        )
        for name, g in grads.items()
    }


def _held_bytes(m: Any, ids: Any, dense: Any) -> int:
    """Bytes held after the forward pass (a tf.function) under a tape: the tensors the backward
    pass reads (TensorFlow keeps them as the function's extra outputs)."""
    import tensorflow as tf

    forward = tf.function(lambda i, d: tf.reduce_sum(m.logits_from(i, d, True)))
    for _ in range(2):  # the first call traces
        start = tf.config.experimental.get_memory_info("CPU:0")["current"]
        with tf.GradientTape() as tape:
            loss = forward(ids, dense)
        held = tf.config.experimental.get_memory_info("CPU:0")["current"] - start
        del tape, loss
    return held


def _peak_bytes(fn: Any, args: tuple) -> int:
    import tensorflow as tf

    start = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    fn(*args).numpy()
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - start


def child(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf

    from bench.compiler import workload

    batches = tuple(args.batches)
    w = workload.build(
        workload.write_data(Path(args.out) / "work", args.rows),
        "full",
        batches,
        seed=args.seed,
        dropout=args.dropout,
        mlp=tuple(args.mlp),
    )
    models = _models(w)
    optimizer = tf.keras.optimizers.SGD(0.01)
    optimizer.build(w.model.trainable_variables)
    steps = {
        name: tf.function(workload.sgd_step(m, optimizer, m.logits_from))
        for name, m in models.items()
    }
    out: dict[str, Any] = {"seed": args.seed}
    for b in batches:
        call = workload.call_args(w, "train", b)
        res: dict[str, Any] = {"grad_max_abs_diff": _grad_diffs(w, models, b)}
        for name, fn in steps.items():
            fn(*call).numpy()  # traced and run
            res[name] = {
                "peak_bytes": _peak_bytes(fn, call),
                "held_bytes": _held_bytes(models[name], *w.inputs[b]),
                "step_s": [],
            }
        for _ in range(args.rounds):
            for name, fn in steps.items():
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    fn(*call).numpy()
                    res[name]["step_s"].append(time.perf_counter() - t0)
        for name in steps:
            res[name]["step_s"] = statistics.median(res[name]["step_s"])
        out[str(b)] = res
    return out


def _spread(values: list[float], fmt: str = ".2f") -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def summarize(procs: list[dict[str, Any]], batches: list[int]) -> str:
    lines = [
        "| batch | variant | held for backward MB | x less | step peak MB | x less | step ms "
        "| x backprop's time | max abs grad diff |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in map(str, batches):
        for name in VARIANTS:
            rows = [p[b] for p in procs]
            held = [r[name]["held_bytes"] / 1e6 for r in rows]
            held_less = [r["backprop"]["held_bytes"] / r[name]["held_bytes"] for r in rows]
            mb = [r[name]["peak_bytes"] / 1e6 for r in rows]
            less = [r["backprop"]["peak_bytes"] / r[name]["peak_bytes"] for r in rows]
            ms = [r[name]["step_s"] * 1e3 for r in rows]
            slow = [r[name]["step_s"] / r["backprop"]["step_s"] for r in rows]
            diff = max(r["grad_max_abs_diff"][name] for r in rows)
            lines.append(
                f"| {b} | {name} | {_spread(held, '.1f')} | {_spread(held_less)}x "
                f"| {_spread(mb, '.1f')} | {_spread(less)}x | {_spread(ms, '.1f')} "
                f"| {_spread(slow)}x | {diff:.1e} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.compiler.activations", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="runs/bench-compiler-activations")
    p.add_argument("--rows", type=int, default=50_000, help="synthetic rows (vocabularies)")
    p.add_argument("--batches", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--mlp", type=int, nargs="+", default=[256, 128], help="MLP layer sizes")
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 0.0 < args.dropout < 1.0 or min(args.batches) < 1 or args.steps < 1:
        raise SystemExit(
            f"error: --dropout {args.dropout} / --batches {args.batches} / --steps "
            f"{args.steps}: expected a dropout in (0, 1), batches >= 1 and steps >= 1"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        (out / f"seed-{args.seed}.json").write_text(json.dumps(child(args)))
        return 0
    t0 = time.time()
    write_data(out / "work", args.rows)
    procs = []
    for i in range(args.processes):
        seed = args.seed + i
        cmd = [sys.executable, "-m", "bench.compiler.activations", "--child", "--seed", str(seed)]
        cmd += ["--out", str(out), "--rows", str(args.rows), "--dropout", str(args.dropout)]
        cmd += ["--steps", str(args.steps), "--rounds", str(args.rounds)]
        cmd += ["--mlp", *map(str, args.mlp), "--batches"]
        cmd += [str(b) for b in args.batches]
        subprocess.run(cmd, check=True, cwd=ROOT, env=CHILD_ENV)
        procs.append(json.loads((out / f"seed-{seed}.json").read_text()))
    table = summarize(procs, args.batches)
    info = {
        "cpus": os.cpu_count(),
        "dropout": args.dropout,
        "mlp": args.mlp,
        "processes": args.processes,
        "seconds": round(time.time() - t0, 1),
    }
    (out / "results.json").write_text(json.dumps({"info": info, "processes": procs}))
    (out / "summary.md").write_text(
        f"# bench/compiler/activations\n\n{json.dumps(info)}\n\n{table}\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
