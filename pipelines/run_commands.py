"""``stitchrec train`` and ``stitchrec export``: a training run and its SavedModel (flags in
``pipelines.cli_args``).

    stitchrec train   --config FILE [--set KEY=VALUE]... [--output DIR] [--max-bad-rows N]
    stitchrec export  --run DIR [--output DIR] [--single] [--cascade-rank RUN --keep M]
                      [--ensemble-runs RUN... [--combine logits|probabilities]]
                      [--fuse-kernels] [--quantize int8|fp16 [--quantize-min-rows N]]
                      [--fuse [--fuse-ladder N,...] [--fuse-plan-batch B]
                       [--fuse-realization xla_clusters|generated] [--fuse-loop-matmuls]]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path

from compiler_opt.fused_signature import FusionSpec, write_spec
from pipelines.config import load_config
from pipelines.errors import UsageError
from pipelines.export import export_ensemble, export_run, export_run_ensemble, saved_model_bytes
from pipelines.preranking import export_cascade_runs
from pipelines.run.paths import ASSETS_EXTRA
from pipelines.run.snapshots import ENSEMBLE_FILE, chosen_ensemble
from pipelines.train import train

_print = functools.partial(print, flush=True)


def cmd_train(args: argparse.Namespace) -> int:
    overrides = list(args.set)
    if args.max_bad_rows is not None:
        overrides.append(f"data.max_bad_rows={args.max_bad_rows}")
    cfg = load_config(args.config, overrides)
    if args.output:
        cfg = dataclasses.replace(cfg, output_dir=str(Path(args.output).resolve()))
    report = train(cfg, log=_print)
    test = report.get("test")
    if test:
        _print(f"test auc {test['auc']:.4f} logloss {test['logloss']:.4f} on {test['rows']:,} rows")
    _print(f"run: {cfg.output_dir}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    spec = None
    if args.fuse:  # checked before anything is written
        spec = FusionSpec(
            realization=args.fuse_realization,
            ladder=args.fuse_ladder,
            plan_batch=args.fuse_plan_batch,
            loop_matmuls=args.fuse_loop_matmuls,
        )
    _check_quantize(args)
    if args.ensemble_runs:
        if args.cascade_rank or args.single or args.fuse_kernels or spec is not None:
            raise UsageError(
                "export --ensemble-runs: not with --cascade-rank, --single, --fuse-kernels or "
                "--fuse"
            )
        out = export_run_ensemble(
            [args.run, *args.ensemble_runs],
            args.output,
            args.combine,
            quantize=args.quantize,
            quantize_min_rows=args.quantize_min_rows,
        )
        _print(f"ensemble of {1 + len(args.ensemble_runs)} runs' selected checkpoints")
    elif args.cascade_rank:
        if not args.output:
            raise UsageError("export --cascade-rank needs --output (the cascade's folder)")
        out = export_cascade_runs(
            args.run, args.cascade_rank, args.output, keep=args.keep, kernels=args.fuse_kernels
        )
    else:
        ensemble = None if args.single else chosen_ensemble(args.run)
        if ensemble is not None:
            if args.fuse_kernels or spec is not None:
                raise UsageError(
                    f"export --fuse-kernels / --fuse: not available for the ensemble of "
                    f"{args.run} ({ENSEMBLE_FILE}); add --single to export its selected "
                    "checkpoint alone"
                )
            out = export_ensemble(
                args.run,
                ensemble["members"],
                args.output,
                combine=ensemble["combine"],
                quantize=args.quantize,
                quantize_min_rows=args.quantize_min_rows,
            )
            _print(f"ensemble of {len(ensemble['members'])}: {', '.join(ensemble['members'])}")
        else:
            out = export_run(
                args.run,
                args.output,
                kernels=args.fuse_kernels,
                quantize=args.quantize,
                quantize_min_rows=args.quantize_min_rows,
            )
    size = saved_model_bytes(out)
    _print(f"exported {out} ({size['total']:,} bytes, variables {size['variables']:,})")
    if args.quantize:
        _print(_quantization_line(out))
    if spec is not None:
        path = write_spec(out, spec)
        _print(
            f"fusion: {path} ({spec.realization}, buckets {', '.join(map(str, spec.ladder))}; "
            "the server plans and compiles at load)"
        )
    return 0


def _check_quantize(args: argparse.Namespace) -> None:
    """UsageError for a ``--quantize`` the export cannot honour (checked before any work)."""
    if args.quantize_min_rows < 0:
        raise UsageError(
            f"export --quantize-min-rows {args.quantize_min_rows}: expected a row count >= 0"
        )
    if not args.quantize:
        return
    others = [
        flag
        for flag, given in (
            ("--fuse-kernels", args.fuse_kernels),
            ("--cascade-rank", args.cascade_rank),
        )
        if given
    ]
    if others:
        raise UsageError(
            f"export --quantize: not with {', '.join(others)}: the generated embedding op and "
            "the cascade export read fp32 tables; export without --quantize"
        )


def _quantization_line(out: Path) -> str:
    """What ``--quantize`` did, from the export's ``stitchrec.json``."""
    meta = json.loads((Path(out) / ASSETS_EXTRA / "stitchrec.json").read_text())["quantization"]
    records = meta.get("members", [meta])
    tables = [t for r in records for t in r["tables"]]
    done = sum(t["mode"] != "fp32" for t in tables)
    before, after = sum(t["bytes_fp32"] for t in tables), sum(t["bytes"] for t in tables)
    return (
        f"quantized {done} of {len(tables)} embedding tables to {meta['mode']} (those of at least "
        f"{meta['min_rows']:,} rows): {before:,} -> {after:,} table bytes"
    )
