"""``stitchrec train`` and ``stitchrec export``: a training run and its SavedModel (flags in
``pipelines.cli_args``).

    stitchrec train   --config FILE [--set KEY=VALUE]... [--output DIR] [--max-bad-rows N]
                      [--engine local|dask] [--cluster ADDRESS] [--workers N]
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

from compiler_opt.fused_signature import FUSION_FILE, FusionSpec, write_spec
from features.read_report import short_list
from pipelines.config import PipelineConfig, load_config
from pipelines.config_sections import EngineConfig
from pipelines.engines import engine_config
from pipelines.errors import UsageError, check_output_path
from pipelines.export import (
    export_ensemble,
    export_run,
    export_run_ensemble,
    next_version,
    saved_model_bytes,
)
from pipelines.preranking import export_cascade_runs
from pipelines.run.paths import ASSETS_EXTRA, RunPaths
from pipelines.run.snapshots import ENSEMBLE_FILE, chosen_ensemble
from pipelines.train import train
from serving.version_files import MARKER, atomic_dir

_print = functools.partial(print, flush=True)

#: The candidates a cascade's pre-ranking keeps when ``export --cascade-rank`` has no --keep.
DEFAULT_KEEP = 50


def cmd_train(args: argparse.Namespace) -> int:
    overrides = list(args.set)
    if args.max_bad_rows is not None:
        overrides.append(f"data.max_bad_rows={args.max_bad_rows}")
    if args.output:  # the config may then leave output_dir out
        overrides.append(f"output_dir={json.dumps(str(Path(args.output).resolve()))}")
    cfg = load_config(args.config, overrides)
    check_output_path(cfg.output_dir, "--output" if args.output else "output_dir")
    if args.continue_from:  # relative to the working directory, as --output
        cont = str(Path(args.continue_from).resolve())
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, continue_from=cont))
    engine = engine_config(args, cfg.engine)
    if engine != (cfg.engine or EngineConfig()):
        cfg = dataclasses.replace(cfg, engine=engine)
    return train_and_report(cfg)


def train_and_report(cfg: PipelineConfig) -> int:
    """Trains ``cfg`` with its log on standard output, then prints the test score and the run
    folder; the command's exit status."""
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
    if args.keep is not None and not args.cascade_rank:
        raise UsageError(
            f"export --keep {args.keep}: only with --cascade-rank (the candidates a cascade's "
            "pre-ranking keeps); a single model, ensemble or --ensemble-runs export scores "
            "every candidate: drop --keep or add --cascade-rank RANK_RUN"
        )
    if args.combine is not None and not args.ensemble_runs:
        raise UsageError(
            f"export --combine {args.combine}: only with --ensemble-runs (how their members "
            "are averaged); a run's own ensemble combines as its training chose: drop --combine "
            "or add --ensemble-runs RUN ..."
        )
    if args.output:
        _check_export_output(Path(args.output))
    out = Path(args.output) if args.output else next_version(RunPaths(Path(args.run)).exports)
    with atomic_dir(out) as tmp:  # fusion.json is in the version before it is in place
        _export(args, tmp, fused=spec is not None)
        if spec is not None:
            write_spec(tmp, spec)
    size = saved_model_bytes(out)
    _print(f"exported {out} ({size['total']:,} bytes, variables {size['variables']:,})")
    if args.quantize:
        _print(_quantization_line(out))
    if spec is not None:
        _print(
            f"fusion: {out / ASSETS_EXTRA / FUSION_FILE} ({spec.realization}, buckets "
            f"{', '.join(map(str, spec.ladder))}; the server plans and compiles at load)"
        )
    return 0


def _check_export_output(out: Path) -> None:
    """UsageError unless ``--output`` is new, an empty folder or an earlier export (a folder
    with the completion marker, which the export replaces): a model repository, a model's
    folder or any other folder is never replaced."""
    check_output_path(out)
    if not out.is_dir() or (out / MARKER).is_file():
        return
    held = sorted(p.name for p in out.iterdir())
    if held:
        raise UsageError(
            f"--output {str(out)!r} is a folder that is not an earlier export (it holds "
            f"{short_list(held)}): expected a new folder, e.g. a model's next version REPO/MODEL/N"
        )


def _export(args: argparse.Namespace, output: Path, fused: bool) -> None:
    """Writes the SavedModel ``args`` ask for to ``output``."""
    if args.ensemble_runs:
        if args.cascade_rank or args.single or args.fuse_kernels or fused:
            raise UsageError(
                "export --ensemble-runs: not with --cascade-rank, --single, --fuse-kernels or "
                "--fuse"
            )
        export_run_ensemble(
            [args.run, *args.ensemble_runs],
            output,
            args.combine or "logits",
            quantize=args.quantize,
            quantize_min_rows=args.quantize_min_rows,
        )
        _print(f"ensemble of {1 + len(args.ensemble_runs)} runs' selected checkpoints")
    elif args.cascade_rank:
        if not args.output:
            raise UsageError("export --cascade-rank needs --output (the cascade's folder)")
        keep = DEFAULT_KEEP if args.keep is None else args.keep
        export_cascade_runs(
            args.run, args.cascade_rank, output, keep=keep, kernels=args.fuse_kernels
        )
    else:
        ensemble = None if args.single else chosen_ensemble(args.run)
        if ensemble is not None:
            if args.fuse_kernels or fused:
                raise UsageError(
                    f"export --fuse-kernels / --fuse: not available for the ensemble of "
                    f"{args.run} ({ENSEMBLE_FILE}); add --single to export its selected "
                    "checkpoint alone"
                )
            export_ensemble(
                args.run,
                ensemble["members"],
                output,
                combine=ensemble["combine"],
                quantize=args.quantize,
                quantize_min_rows=args.quantize_min_rows,
            )
            _print(f"ensemble of {len(ensemble['members'])}: {', '.join(ensemble['members'])}")
        else:
            export_run(
                args.run,
                output,
                kernels=args.fuse_kernels,
                quantize=args.quantize,
                quantize_min_rows=args.quantize_min_rows,
            )


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
