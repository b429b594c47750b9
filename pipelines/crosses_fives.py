"""``stitchrec crosses fives``: search which feature crosses matter (FIVES) and write them.

    stitchrec crosses fives --config FILE [--out PATH] [--set KEY=VALUE]... [--max-rows N]
                            [--triple-search] [--no-screen]
        [--epochs N] [--max-order K] [--seed S] [--fields F1,F2,...]

Reads the training split of a pipeline config's data (converting raw files into the run's
``data/`` folder once, exactly as ``stitchrec train`` does), runs the FIVES search
(``features.crosses.fives_search``) with one progress line per epoch and writes the cross artifact
(``features.crosses``; default ``<output_dir>/crosses_fives.json``). The training config then
names it::

    [data]
    crosses = "../runs/movielens/crosses_fives.json"
    cross_top_n = 5

``--set`` takes ``features.crosses.fives_config.FivesConfig`` keys (``--set sparsity=0.02``). After the
search, every triple (``screen_orders``) is also tested by the exhaustive interaction screen
(``features.crosses.interaction_screen``), which finds pure interactions the edge search cannot;
``--no-screen`` leaves it out.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from pipelines.config import load_config, parse_override
from pipelines.run.paths import RunPaths

DEFAULT_NAME = "crosses_fives.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fives",
        help="FIVES edge search over the feature graph: rank explicit crosses (KDD'21)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="a pipeline config TOML (its [data] is read)")
    p.add_argument(
        "--out", default=None, help=f"artifact path (default <output_dir>/{DEFAULT_NAME})"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a FivesConfig setting, e.g. sparsity=0.02 (repeatable)",
    )
    p.add_argument("--max-rows", type=int, default=0, help="search on the first N rows (0: all)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--max-order", type=int, default=None, help="K: highest cross order")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--fields", default=None, help="comma-separated fields to search (default all)")
    p.add_argument(
        "--triple-search",
        action="store_true",
        help="start from features.crosses.fives_config.TRIPLE_SEARCH (linear readout, contribution strength): "
        "finds pure triples among a few fields (docs/fives.md); --set still overrides",
    )
    p.add_argument(
        "--no-screen",
        action="store_true",
        help="skip the exhaustive interaction screen (screen_orders = [])",
    )
    p.set_defaults(func=run)


def fives_config(args: argparse.Namespace) -> Any:
    """``FivesConfig`` from ``--set`` and the shortcut flags (flags win)."""
    from features.crosses.fives_config import TRIPLE_SEARCH, FivesConfig  # off `stitchrec --help`

    allowed = {f.name for f in dataclasses.fields(FivesConfig)}
    values: dict[str, Any] = dict(TRIPLE_SEARCH) if getattr(args, "triple_search", False) else {}
    for text in args.set:
        key, value = parse_override(text)
        if key not in allowed:
            raise ValueError(
                f"--set {text!r}: unknown FIVES setting {key!r}; allowed: {sorted(allowed)}"
            )
        values[key] = tuple(value) if isinstance(value, list) else value
    for key in ("epochs", "max_order", "seed"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if getattr(args, "no_screen", False):
        values["screen_orders"] = ()
    return FivesConfig(**values)


def run(args: argparse.Namespace) -> int:
    # TensorFlow and the search load only when the command runs, off `stitchrec --help`
    from features.crosses.fives_encoding import read_table
    from features.crosses.fives_search import search
    from pipelines.run.data import prepare_data

    def log(msg: str) -> None:
        print(msg, flush=True)

    cfg = load_config(args.config)
    config = fives_config(args)
    if args.max_rows < 0:
        raise ValueError(f"--max-rows must be >= 0, got {args.max_rows}")
    paths = RunPaths(Path(cfg.output_dir))
    paths.root.mkdir(parents=True, exist_ok=True)
    schema, train_files, _ = prepare_data(cfg, paths, log)
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
    if fields:
        for name in fields:
            schema.field(name)  # KeyError naming the schema's fields
    t0 = time.time()
    table = read_table(schema, train_files, max_rows=args.max_rows)
    log(f"fives: read {table.num_rows:,} training rows in {time.time() - t0:.1f}s")
    result = search(schema, table, config, fields=fields, log=log)
    out = Path(args.out) if args.out else paths.root / DEFAULT_NAME
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
