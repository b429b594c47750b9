"""``stitchrec crosses fives``: search which feature crosses matter (FIVES) and write them.

    stitchrec crosses fives --config FILE [--out PATH] [--set KEY=VALUE]... [--max-rows N]
                            [--triple-search] [--no-screen]
        [--epochs N] [--max-order K] [--seed S] [--fields F1,F2,...]

The flags and the command's full description (``stitchrec crosses fives --help``) are in
``pipelines.cli_args``; docs/fives.md explains the search.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from features.crosses.fives_config import TRIPLE_SEARCH, FivesConfig
from features.crosses.fives_encoding import read_table
from features.crosses.fives_search import search
from pipelines.cli_args import FIVES_ARTIFACT
from pipelines.config import load_config, parse_override
from pipelines.config_types import type_error
from pipelines.engines import engine_config, open_runner
from pipelines.errors import UsageError, check_output_path
from pipelines.run.data import prepare_data
from pipelines.run.paths import RunPaths


def fives_config(args: argparse.Namespace) -> FivesConfig:
    """``FivesConfig`` from ``--set`` and the shortcut flags (flags win); a setting it rejects
    is a ``UsageError``."""
    allowed = {f.name for f in dataclasses.fields(FivesConfig)}
    values: dict[str, Any] = dict(TRIPLE_SEARCH) if getattr(args, "triple_search", False) else {}
    for text in args.set:
        key, value = parse_override(text)
        if key not in allowed:
            raise UsageError(
                f"--set {text!r}: unknown FIVES setting {key!r}; allowed: {sorted(allowed)}"
            )
        values[key] = tuple(value) if isinstance(value, list) else value
    for key in ("epochs", "max_order", "seed"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if getattr(args, "no_screen", False):
        values["screen_orders"] = ()
    problem = type_error(FivesConfig, values)
    if problem:
        raise UsageError(f"--set: FIVES setting {problem}")
    try:
        return FivesConfig(**values)
    except ValueError as e:  # FivesConfig checks each value and names it
        raise UsageError(str(e)) from None


def cmd_fives(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(msg, flush=True)

    cfg = load_config(args.config)
    config = fives_config(args)
    if args.out:
        check_output_path(args.out, "--out", folder=False)
    if args.max_rows < 0:
        raise UsageError(f"--max-rows must be >= 0, got {args.max_rows}")
    paths = RunPaths(Path(cfg.output_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    with open_runner(engine_config(args, cfg.engine), log) as runner:
        schema, train_files, _, _ = prepare_data(cfg, paths, log, runner)
        fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
        for name in fields or ():
            if name not in schema.names:
                raise UsageError(
                    f"--fields: schema {schema.name!r} has no field {name!r}; fields: "
                    f"{schema.names}"
                )
        t0 = time.time()
        table = read_table(schema, train_files, max_rows=args.max_rows)
        log(f"fives: read {table.num_rows:,} training rows in {time.time() - t0:.1f}s")
        result = search(schema, table, config, fields=fields, log=log, runner=runner)
    out = Path(args.out) if args.out else paths.root / FIVES_ARTIFACT
    result.artifact(schema.name).save(out)
    log(f"fives: search took {result.seconds:.1f}s; top crosses:")
    for i, c in enumerate(result.crosses[:10]):
        effect = "" if c.effect is None else f" effect {c.effect:.4f}"
        log(
            f"  {i + 1:2d}. {c.name:<30s} order {c.order} strength {c.strength:.3f}{effect}"
            f" [{c.source}]{'' if c.active else ' (inactive)'}"
        )
    log(f'wrote {out}; name it in a training config: [data] crosses = "{out}"')
    return 0
