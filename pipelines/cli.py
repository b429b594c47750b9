"""The ``stitchrec`` command line. Flags are read here and nowhere else.

    stitchrec demo      [--rows N] [--output DIR] [--model TYPE]
    stitchrec generate  --output DIR [--rows N] [--seed S] [--criteo-tsv]
    stitchrec convert   --schema S --input F... --output DIR [--test-fraction X] [--max-bad-rows N]
    stitchrec stats     --schema S --input F... --output DIR [--max-bad-rows N]
    stitchrec train     --config FILE [--set KEY=VALUE]... [--output DIR] [--max-bad-rows N]
    stitchrec export    --run DIR [--output DIR] [--cascade-rank RUN --keep M]
    stitchrec evaluate  --model DIR --data F... [--schema S] [--max-bad-rows N]

User errors (bad schema, config or data) print one ``error:`` line naming what, where and what
was expected, and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

# Commands whose flags live in their own module: each exposes ``register(subparsers)``.
_COMMAND_MODULES = ("pipelines.crosses", "pipelines.ab", "pipelines.serve", "pipelines.fuse")


def _print(msg: str) -> None:
    print(msg, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    from features import synthetic, synthetic_config

    cfg = synthetic_config.SyntheticConfig(rows=args.rows, seed=args.seed)
    t0 = time.time()
    summary = synthetic.write_dataset(
        cfg, args.output, test_fraction=args.test_fraction, criteo_tsv=args.criteo_tsv
    )
    _print(json.dumps(summary, indent=1, default=str))
    _print(f"generated {args.rows:,} rows in {time.time() - t0:.1f}s into {args.output}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from features import read_report, shards
    from features.schema import load_schema

    schema = load_schema(args.schema)
    report = read_report.ReadReport()
    out = shards.convert(
        schema,
        args.input,
        args.output,
        test_fraction=args.test_fraction,
        seed=args.seed,
        max_bad_rows=args.max_bad_rows,
        report=report,
    )
    schema.as_parquet().save(Path(args.output) / "schema.toml")
    for split, files in out.items():
        _print(f"{split}: {len(files)} shard(s)")
    _print(f"rows: {report.rows:,}; bad rows skipped: {report.bad_rows}")
    for example in report.examples:
        _print(f"  skipped: {example}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from features import read_report, readers
    from features.schema import load_schema
    from features.stats import compute_stats

    schema = load_schema(args.schema)
    report = read_report.ReadReport()
    batches = readers.read_batches(
        schema, args.input, max_bad_rows=args.max_bad_rows, report=report
    )
    stats = compute_stats(schema, batches)
    stats.save(args.output)
    _print(
        f"rows: {stats.rows:,}  label mean: {stats.label_mean:.4f}  bad rows skipped: {report.bad_rows}"
    )
    for name, fs in stats.fields.items():
        if fs.kind == "numeric":
            _print(
                f"  {name:24s} numeric  missing={fs.missing:<8d} mean={fs.mean:.4g} std={fs.std:.4g}"
            )
        else:
            _print(
                f"  {name:24s} {fs.kind:11s} missing={fs.missing:<8d} distinct={fs.num_distinct:<8d} "
                f"vocab={fs.vocab_size:<8d} oov={fs.oov_count}"
            )
    _print(f"saved to {args.output}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    from pipelines.config import load_config
    from pipelines.train import train

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
    from pipelines.export import export_run, saved_model_bytes

    spec = None
    if args.fuse:  # checked before anything is written
        from compiler_opt.fused_signature import FusionSpec

        spec = FusionSpec(
            realization=args.fuse_realization,
            ladder=args.fuse_ladder,
            plan_batch=args.fuse_plan_batch,
            loop_matmuls=args.fuse_loop_matmuls,
        )
    if args.cascade_rank:
        from pipelines.preranking import export_cascade_runs

        if not args.output:
            raise ValueError("export --cascade-rank needs --output (the cascade's folder)")
        out = export_cascade_runs(
            args.run, args.cascade_rank, args.output, keep=args.keep, kernels=args.fuse_kernels
        )
    else:
        out = export_run(args.run, args.output, kernels=args.fuse_kernels)
    size = saved_model_bytes(out)
    _print(f"exported {out} ({size['total']:,} bytes, variables {size['variables']:,})")
    if spec is not None:
        from compiler_opt.fused_signature import write_spec

        path = write_spec(out, spec)
        _print(
            f"fusion: {path} ({spec.realization}, buckets {', '.join(map(str, spec.ladder))}; "
            "the server plans and compiles at load)"
        )
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from pipelines.evaluate import evaluate

    result = evaluate(args.model, args.data, schema=args.schema, max_bad_rows=args.max_bad_rows)
    _print(json.dumps(result, indent=1))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pipelines.demo import run_demo

    run_demo(rows=args.rows, output=args.output, model=args.model, epochs=args.epochs, log=_print)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pipelines.serve import int_list

    p = argparse.ArgumentParser(
        prog="stitchrec", description="StitchRec: train, export and evaluate ranking models."
    )
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="synthetic data -> stats -> train -> export -> evaluate")
    d.add_argument("--rows", type=int, default=2_000_000)
    d.add_argument("--output", default="runs/demo")
    d.add_argument("--model", default="dcn_v2", choices=["lr", "fm", "dnn", "dcn_v2"])
    d.add_argument("--epochs", type=int, default=1)
    d.set_defaults(func=cmd_demo)

    g = sub.add_parser("generate", help="write the synthetic Criteo-layout dataset")
    g.add_argument("--output", required=True)
    g.add_argument("--rows", type=int, default=1_000_000)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--test-fraction", type=float, default=0.2)
    g.add_argument(
        "--criteo-tsv", action="store_true", help="also write train.tsv in Criteo layout"
    )
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("convert", help="raw files -> Parquet shards (optionally split)")
    c.add_argument("--schema", required=True)
    c.add_argument("--input", nargs="+", required=True)
    c.add_argument("--output", required=True)
    c.add_argument("--test-fraction", type=float, default=0.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--max-bad-rows", type=int, default=0)
    c.set_defaults(func=cmd_convert)

    s = sub.add_parser("stats", help="vocabularies and numeric statistics in one pass")
    s.add_argument("--schema", required=True)
    s.add_argument("--input", nargs="+", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--max-bad-rows", type=int, default=0)
    s.set_defaults(func=cmd_stats)

    t = sub.add_parser("train", help="train (or resume) from a TOML config")
    t.add_argument("--config", required=True)
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.epochs=3",
    )
    t.add_argument("--output", help="run folder (overrides output_dir)")
    t.add_argument(
        "--max-bad-rows", type=int, help="bad raw rows to skip and count (data.max_bad_rows)"
    )
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("export", help="SavedModel of a training run's latest checkpoint")
    e.add_argument("--run", required=True)
    e.add_argument("--output")
    e.add_argument(
        "--cascade-rank",
        metavar="RUN",
        help="export one cascade SavedModel: --run is the pre-ranking run, RUN the ranking run",
    )
    e.add_argument(
        "--keep", type=int, default=50, help="candidates the pre-ranking keeps (--cascade-rank)"
    )
    e.add_argument(
        "--fuse",
        action="store_true",
        help="ask the server to fuse the serving signature (planned XLA clusters, padded to "
        "batch-size buckets, compiled at load): writes assets.extra/fusion.json",
    )
    e.add_argument(
        "--fuse-ladder",
        type=int_list,
        default=(8, 16, 32, 64, 128, 256, 512),
        metavar="N,N,...",
        help="batch-size buckets of --fuse (default 8,16,...,512)",
    )
    e.add_argument(
        "--fuse-plan-batch", type=int, default=256, help="batch size the fusion plan is made at"
    )
    e.add_argument(
        "--fuse-realization",
        choices=("xla_clusters", "generated"),
        default="xla_clusters",
        help="how --fuse runs the planned groups: XLA clusters (default), or the elementwise "
        "loop groups as generated C++ ops and the rest as TensorFlow ops (shape-generic: no "
        "padding, no compilation)",
    )
    e.add_argument(
        "--fuse-loop-matmuls",
        action="store_true",
        help="with --fuse-realization generated: also try each loop op taking the matmul that "
        "feeds it (fewer ops; kept if faster at the server's warm-up)",
    )
    e.add_argument(
        "--fuse-kernels",
        action="store_true",
        help="export the embedding block as one generated C++ op (compiler_opt.codegen); the "
        "server loads or compiles it before the model",
    )
    e.set_defaults(func=cmd_export)

    v = sub.add_parser("evaluate", help="AUC and log loss of a SavedModel on held-out data")
    v.add_argument("--model", required=True)
    v.add_argument("--data", nargs="+", required=True)
    v.add_argument("--schema", help="schema of raw --data files (default: Parquet shards)")
    v.add_argument("--max-bad-rows", type=int, default=0)
    v.set_defaults(func=cmd_evaluate)

    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from features.read_report import DataError
    from features.schema import SchemaError
    from pipelines.config import ConfigError
    from pipelines.distribute import PeerLostError

    try:
        return args.func(args)
    except (SchemaError, ConfigError, DataError, FileNotFoundError, ValueError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {msg}", file=sys.stderr, flush=True)
        return 2
    except PeerLostError as e:  # a supervisor (Kubernetes, a script) restarts the cluster
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
