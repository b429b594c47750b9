"""bench/compiler/floor: the bench models' forward pass and training step against their floor.

    .venv/bin/python -m bench.compiler.floor --out runs/bench-compiler-floor

The models of ``bench/compiler/workload.py`` (``--models``: DCN-v2, FM; ``--methods``: full,
BH, AMTL tables) on preprocessed inputs of the synthetic data, at each ``--batches``:
``inference(ids, dense)`` frozen, and one SGD step frozen with its variables kept
(``compiler_opt.floor.of_function``): per unit FLOPs, bytes and the roofline floor at this
CPU's measured FMA peak and calibrated bandwidth, each unit's measured op time, the median
wall time of ``--calls`` calls. Printed: the totals and the three units furthest above their
floor. One process; nothing else should run beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def _row(model: str, method: str, mode: str, fl: Any) -> dict[str, Any]:
    over = sorted(fl.units, key=lambda u: -((u.measured_s or 0.0) - u.floor_s))[:3]
    return {
        "model": model,
        "method": method,
        "mode": mode,
        "batch": fl.batch,
        "gflop": fl.flops / 1e9,
        "floor_ms": fl.floor_s * 1e3,
        "measured_ms": fl.wall_s * 1e3,
        "x_floor": fl.wall_s / fl.floor_s,
        "above_floor": [
            f"{u.label} +{((u.measured_s or 0.0) - u.floor_s) * 1e3:.2f} ms" for u in over
        ],
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import cost, floor

    coefficients = cost.load_or_calibrate()
    peak = floor.load_or_measure_peak().flops
    data = workload.write_data(Path(args.out) / "work", args.rows)
    rows = []
    for model in args.models:
        for method in args.methods:
            w = workload.build(data, method, tuple(args.batches), model_type=model)
            for b in args.batches:
                for mode, fn, keep in (
                    ("inference", w.inference, False),
                    ("train", w.train_step, True),
                ):
                    call = workload.call_args(w, mode, b)
                    concrete = tf.function(fn).get_concrete_function(*call)
                    flat = tf.nest.flatten(call, expand_composites=True)
                    fl = floor.of_function(
                        concrete,
                        flat,
                        coefficients,
                        peak,
                        b,
                        keep_variables=keep,
                        calls=args.calls,
                    )
                    rows.append(_row(model, method, mode, fl))
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def summarize(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | method | mode | batch | GFLOP | floor ms | measured ms | x floor | most above "
        "the floor |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['method']} | {r['mode']} | {r['batch']} | {r['gflop']:.3f} | "
            f"{r['floor_ms']:.2f} | {r['measured_ms']:.2f} | {r['x_floor']:.2f} | "
            f"{'; '.join(r['above_floor'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.compiler.floor", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="runs/bench-compiler-floor")
    p.add_argument("--rows", type=int, default=50_000, help="synthetic rows (vocabularies)")
    p.add_argument("--models", nargs="+", default=["dcn_v2", "fm"], choices=["dcn_v2", "fm"])
    p.add_argument(
        "--methods", nargs="+", default=["full", "bh", "amtl"], choices=["full", "bh", "amtl"]
    )
    p.add_argument("--batches", type=int, nargs="+", default=[256, 4096])
    p.add_argument("--calls", type=int, default=9, help="calls timed and profiled per cell")
    args = p.parse_args(argv)
    if min(args.batches) < 1 or args.calls < 1:
        raise SystemExit(
            f"error: --batches {args.batches} / --calls {args.calls}: expected values >= 1"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows = run(args)
    table = summarize(rows)
    info = {"seconds": round(time.time() - t0, 1), "calls": args.calls}
    (out / "results.json").write_text(json.dumps({"info": info, "rows": rows}))
    (out / "summary.md").write_text(f"# bench/compiler/floor\n\n{json.dumps(info)}\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
