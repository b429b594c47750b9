"""bench/compiler/cuda_check: the CUDA forms of DCN-v2's embedding op, run on a GPU without
TensorFlow.

    .venv/bin/python -m bench.compiler.cuda_check --out runs/cuda-check          # writes, builds
    runs/cuda-check/run.sh                                                       # on a GPU

The device code of a generated op (``compiler_opt.embedding_op.cuda``) needs only CUDA's runtime, so
it can be checked and timed on a machine that has a GPU and nvcc but no TensorFlow (the lent
GPU machines have no TensorFlow, and it cannot be carried there). For the embedding block of
DCN-v2 with ``full`` and ``bh`` embeddings (``bench/compiler/workload.py``, the spec built from
the real model), this writes per method the op's ``.cu`` source and a generated harness
(``harness_<method>.cu``) and ``run.sh``, which builds each with nvcc and runs it. Each
harness fills the tables and dense inputs from a fixed-seed generator and draws ids (10% out of
range, ragged rows of 0-3 ids), then:

* runs ``Element`` on the host (the launcher's ``on_host`` path, checked against the CPU op by
  ``tests/compiler_opt/test_codegen_cuda.py``) and the kernel on the GPU into NaN-poisoned
  outputs: ``max_abs_diff``, ``unwritten`` (forward and gradient);
* times the kernel (CUDA events, ``--reps`` launches after warm-up) against a device-to-device
  copy of the same number of bytes in the same process: ``ms``, ``bytes`` (ids, table rows,
  dense, outputs), ``copy_ms``, ``copy_over_kernel`` (1.0: the op runs at copy speed).
  ``kernels_per_call``: 1 (forward), 1 (gradient).

Prints one JSON line per (method, op, batch). On a machine without a GPU the harness still
runs the host part and exits 3 after saying so (``--host-only`` makes that the whole run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from compiler_opt import toolchain
from compiler_opt.embedding_op import cuda as emb_cuda
from compiler_opt.embedding_op import spec as emb_spec
from compiler_opt.embedding_op.cuda_harness import harness_source


def write(out: Path, methods: tuple[str, ...], rows: int) -> dict[str, emb_spec.KernelSpec]:
    """Writes ``<method>.cu``, ``harness_<method>.cu`` and ``run.sh`` under ``out``."""
    from bench.compiler import workload

    out.mkdir(parents=True, exist_ok=True)
    specs = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = workload.write_data(Path(tmp), rows)
        for method in methods:
            w = workload.build(data, method, (64,))
            ids, dense = w.inputs[64]
            block = emb_spec.build_spec(
                w.model.embedding, ids, dense_dim=0 if dense is None else int(dense.shape[1])
            )
            if block.spec is None or block.uncovered:
                raise ValueError(f"{method}: fields left out of the op: {block.uncovered}")
            reason = emb_cuda.embedding_unsupported(block.spec)
            if reason:
                raise ValueError(f"{method}: {reason}")
            (out / f"{method}.cu").write_text(emb_cuda.embedding_source(block.spec))
            (out / f"harness_{method}.cu").write_text(harness_source(block.spec, method))
            specs[method] = block.spec
    archs = " ".join(f"-gencode=arch=compute_{a},code=sm_{a}" for a in toolchain.DEFAULT_ARCHS)
    lines = [
        "#!/usr/bin/env bash",
        "# Builds and runs the CUDA check of each method (bench/compiler/cuda_check.py).",
        '# Usage: run.sh [BATCHES] [REPS] [--host-only]    (BATCHES default "256 4096")',
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        'batches="${1:-256 4096}"; reps="${2:-200}"; mode="${3:-}"',
        "status=0",
        f"for m in {' '.join(methods)}; do",
        f"  nvcc -O3 -std=c++17 --diag-suppress=177 {archs} -o check_$m harness_$m.cu $m.cu",
        '  for b in $batches; do ./check_$m "$b" "$reps" $mode || status=$?; done',
        "done",
        "exit $status",
        "",
    ]
    (out / "run.sh").write_text("\n".join(lines))
    (out / "run.sh").chmod(0o755)
    return specs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder to write the check into")
    p.add_argument("--methods", nargs="+", default=["full", "bh"], choices=["full", "bh"])
    p.add_argument("--rows", type=int, default=20000, help="synthetic rows for the vocabularies")
    p.add_argument("--run", action="store_true", help="also build and run it here")
    p.add_argument("--batches", default="256 4096")
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args(argv)
    specs = write(args.out, tuple(args.methods), args.rows)
    summary = {
        m: {"tables": len(s.tables), "fields": len(s.fields), "out_dim": s.out_dim}
        for m, s in specs.items()
    }
    print(json.dumps({"written": str(args.out), "specs": summary}))
    if not args.run:
        return 0
    if shutil.which("nvcc") is None and toolchain.nvcc() is None:
        print("no nvcc here: copy the folder to a machine with one", file=sys.stderr)
        return 2
    r = subprocess.run([str(args.out / "run.sh"), args.batches, str(args.reps)], check=False)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
