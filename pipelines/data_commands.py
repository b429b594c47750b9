"""``stitchrec generate``, ``convert`` and ``stats``: the data commands (flags in
``pipelines.cli_args``).

    stitchrec generate  --output DIR [--rows N] [--seed S] [--test-fraction X] [--criteo-tsv]
    stitchrec convert   --schema S --input F... --output DIR [--test-fraction X] [--max-bad-rows N]
    stitchrec stats     --schema S --input F... --output DIR [--max-bad-rows N]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

from features import read_report, readers, shards, synthetic, synthetic_config
from features.schema import load_schema
from features.stats import compute_stats

_print = functools.partial(print, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    cfg = synthetic_config.SyntheticConfig(rows=args.rows, seed=args.seed)
    t0 = time.time()
    summary = synthetic.write_dataset(
        cfg, args.output, test_fraction=args.test_fraction, criteo_tsv=args.criteo_tsv
    )
    _print(json.dumps(summary, indent=1, default=str))
    _print(f"generated {args.rows:,} rows in {time.time() - t0:.1f}s into {args.output}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
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
