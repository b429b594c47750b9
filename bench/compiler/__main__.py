"""bench/compiler: the baseline compiler_opt has to beat, measured on DCN-v2.

    .venv/bin/python -m bench.compiler --out runs/bench-compiler
    .venv/bin/python -m bench.compiler --out runs/bench-compiler --processes 1 --methods full

For DCN-v2 (``bench/compiler/workload.py``) with ``full``, ``amtl`` and ``bh`` embeddings, at
batch 256 and 4096, for the inference pass and the SGD training step:

* ops in the IR of the traced function (``compiler_opt.ir``: nodes, kernels) and the ops /
  XLA kernels one call executed (a profiler trace, ``compiler_opt/executed.py``; first
  process only, largest batch);
* cost-model bytes per example with every kernel alone and under the fusion plan, launches
  before / after (``compiler_opt.planner`` with this machine's calibrated coefficients);
* time per call of plain graph mode (``tf.function``) and of whole-function XLA
  (``jit_compile=True``), interleaved in one process (rounds of plain, then XLA), in
  ``--processes`` separate processes; the ratio plain / XLA of each process, then the median
  and min-max over processes;
* the generated kernel (``compiler_opt.embedding_op``: the embedding block, lookups through the
  concat with the dense inputs, as one generated C++ op) in the same rounds: ``kernel`` (the
  op, then the rest of the model in graph mode) and ``kernel_xla`` (the op, then the rest as
  one ``jit_compile`` sub-function); ``--no-kernels`` leaves them out;
* horizontally fused tables (``compiler_opt.table_fusion``: a dim's tables as one variable, one
  gather) in the same rounds, ``sparse`` and ``inference`` modes: ``htables`` (graph mode) and
  ``htables_xla`` (whole function ``jit_compile=True``), for the methods with at least two
  fused fields (``full``: all 26; ``amtl``, ``bh``: their small fields kept ``full``);
  ``--no-htables`` leaves them out;
* the serving path, ``sparse`` and ``inference`` modes, on the frozen graph as the server runs
  a fused export: ``loops`` (the plan's elementwise ``loop`` groups as generated C++ ops,
  ``compiler_opt.loop_op``), ``kernel_frozen`` (the generated embedding op, its graph
  frozen with the tables left as handles) and ``kernel_loops`` (both).

Prints a table, writes ``results.json`` (every process's figures) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.compiler.measure import MODES, child
from bench.compiler.summary import summarize

ROOT = Path(__file__).resolve().parents[2]
BATCHES = (256, 4096)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compiler", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/bench-compiler")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows (vocabularies)")
    p.add_argument(
        "--model",
        default="dcn_v2",
        choices=["dcn_v2", "fm"],
        help="the model (fm: the FM term, a row program on the serving path)",
    )
    p.add_argument("--methods", nargs="+", default=["full", "amtl", "bh"])
    p.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--no-kernels",
        dest="kernels",
        action="store_false",
        help="leave out the generated-kernel variants (compiler_opt.embedding_op)",
    )
    p.add_argument(
        "--no-htables",
        dest="htables",
        action="store_false",
        help="leave out the horizontally fused tables variants (compiler_opt.table_fusion)",
    )
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the process-N.json files a cut-short run of the same --out already wrote",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        res = child(args)
        (out / f"process-{args.process}.json").write_text(json.dumps(res, indent=1))
        return 0
    import tensorflow as tf

    from bench.compiler import workload
    from compiler_opt import cost

    t0 = time.time()
    workload.write_data(out / "work", args.rows)  # once, before the processes
    coefficients = cost.load_or_calibrate()
    print(f"coefficients: {coefficients.to_json()}", flush=True)
    procs = []
    for i in range(args.processes):
        cmd = [sys.executable, "-m", "bench.compiler", "--child", "--process", str(i)]
        cmd += ["--out", str(out), "--rows", str(args.rows), "--rounds", str(args.rounds)]
        cmd += ["--seed", str(args.seed), "--methods", *args.methods, "--model", args.model]
        cmd += ["--batches", *map(str, args.batches), "--modes", *args.modes]
        if not args.kernels:
            cmd.append("--no-kernels")
        if not args.htables:
            cmd.append("--no-htables")
        if not (args.resume and (out / f"process-{i}.json").exists()):
            subprocess.run(cmd, check=True, cwd=ROOT)
        procs.append(json.loads((out / f"process-{i}.json").read_text()))
    table = summarize(procs)
    info = {
        "model": args.model,
        "tf_version": tf.__version__,
        "cpus": os.cpu_count(),
        "device": coefficients.device,
        "rows": args.rows,
        "processes": args.processes,
        "rounds": args.rounds,
        "seconds": round(time.time() - t0, 1),
        "load": [p["load_start"] for p in procs],
    }
    (out / "results.json").write_text(json.dumps({"info": info, "processes": procs}, indent=1))
    (out / "summary.md").write_text(
        f"# bench/compiler\n\n{json.dumps(info)}\n\n{table}\n"
        "\nTimes: median over processes [min-max] of each process's median of interleaved "
        "rounds; ratios: per process, then median [min-max] over processes. frozen: the serving "
        "graph with variables as constants, unfused; clusters: the same with the planned "
        "groups compiled as XLA clusters (compiler_opt.realize); frozen XLA: the frozen graph as "
        "one XLA cluster.\n"
    )
    print(table)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
