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
from features.crosses.fives_encoding import read_table, searchable_fields
from features.crosses.fives_search import search
from features.schema import Schema, load_schema
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


def search_fields(args: argparse.Namespace, schema: Schema, config: FivesConfig) -> list[str]:
    """The fields ``--fields`` names (default: every field a cross can take), checked against
    ``schema`` and ``config.max_order`` before any data is read; a field that cannot be searched,
    or a ``max_order`` given above the number of fields, is a ``UsageError``."""
    allowed = searchable_fields(schema)
    if args.fields is None:
        fields = allowed
    else:
        fields = [f.strip() for f in args.fields.split(",") if f.strip()]
        for name in fields:
            if name not in schema.names:
                raise UsageError(
                    f"--fields: schema {schema.name!r} has no field {name!r}; fields: "
                    f"{schema.names}"
                )
            if name not in allowed:
                raise UsageError(
                    f"--fields: {name!r} is a {schema.field(name).kind.value} field of schema "
                    f"{schema.name!r}, which a cross cannot take; expected fields from {allowed}"
                )
        repeated = sorted({f for f in fields if fields.count(f) > 1})
        if repeated:
            raise UsageError(f"--fields {args.fields!r}: {repeated} given more than once")
        if len(fields) < 2:
            raise UsageError(
                f"--fields {args.fields!r}: a cross needs two or more fields; expected at least "
                f"two of {allowed}"
            )
    given = args.max_order is not None or any(
        parse_override(text)[0] == "max_order" for text in args.set
    )
    if given and config.max_order > len(fields):
        k = config.max_order
        flag = f"--max-order {k}" if args.max_order is not None else f"--set max_order={k}"
        searched = f"--fields {args.fields!r}" if args.fields else f"schema {schema.name!r}"
        raise UsageError(
            f"{flag} is above the {len(fields)} fields searched ({searched}): a cross takes "
            f"each field at most once; expected a max order from 2 to {len(fields)}"
        )
    return fields


def cmd_fives(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(msg, flush=True)

    cfg = load_config(args.config)
    config = fives_config(args)
    if args.out:
        check_output_path(args.out, "--out", folder=False)
    if args.max_rows < 0:
        raise UsageError(f"--max-rows must be >= 0, got {args.max_rows}")
    fields = search_fields(args, load_schema(cfg.data.schema), config)
    engine = engine_config(args, cfg.engine)
    paths = RunPaths(Path(cfg.output_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    with open_runner(engine, log) as runner:
        if engine.name == "dask" and engine.address:
            # connect now: a scheduler that does not answer is an error before the search, not
            # after it (the runner connects on its first job, the interaction screen's)
            runner.describe()
        schema, train_files, _, _ = prepare_data(cfg, paths, log, runner)
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
