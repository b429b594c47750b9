"""``stitchrec generate``, ``convert`` and ``stats``: the data commands (flags in
``pipelines.cli_args``).

    stitchrec generate  --output DIR [--rows N] [--seed S] [--test-fraction X] [--criteo-tsv]
                        [--sequences] [--conversion]
    stitchrec generate  --output DIR --days N [--rows N] [--seed S] [--test-fraction X]
                        [--item-churn F] [--user-churn F] [--drift F] [--items N] [--users N]
    stitchrec convert   --schema S --input F... --output DIR [--test-fraction X] [--max-bad-rows N]
                        [--engine local|dask] [--cluster ADDRESS] [--workers N]
    stitchrec stats     --schema S --input F... --output DIR [--max-bad-rows N] [--engine ...]
    stitchrec add-history --input F --output F [--user C] [--item C] [--time C] [--length N]
                          [--column NAME] [--attributes F --attribute C]
    stitchrec windows   --input F --output DIR --by day|week|month|year|rows:N [--time C]
                        [--time-format unix|iso] [--format csv|parquet] [--count C]...
                        [--min-rows N]

``convert`` writes ``DIR`` complete or not at all: into a hidden ``.DIR.converting`` folder
(``convert.json`` first, ``_SUCCESS`` last; ``features.completion``) renamed into place; an
existing ``DIR`` is replaced only when it holds nothing but an earlier convert's output.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import time
from pathlib import Path
from typing import Any

from features import (
    completion,
    convert,
    history,
    read_report,
    synthetic,
    synthetic_config,
    synthetic_days,
    synthetic_days_config,
    windows,
)
from features.schema import load_schema
from features.stats_job import raw_stats
from features.stats_types import STATS_FILE
from pipelines.engines import chunk_bytes, engine_config, open_runner
from pipelines.errors import UsageError, check_output_path, replacing_folder

_print = functools.partial(print, flush=True)


# The flags of daily windows (``generate --days``), their DaysConfig fields.
_DAYS_FLAGS = {
    "item_churn": "--item-churn",
    "user_churn": "--user-churn",
    "drift": "--drift",
    "items": "--items",
    "users": "--users",
}


#: the files that mark a folder as `generate`'s output (one dataset; daily windows)
GENERATED = ("ground_truth.json", "days.json")


def cmd_generate(args: argparse.Namespace) -> int:
    if args.days is not None:
        return _generate_days(args)
    given = [flag for name, flag in _DAYS_FLAGS.items() if getattr(args, name) is not None]
    if given:
        raise UsageError(f"generate {given[0]} sets up daily windows: give --days N with it")
    cfg = synthetic_config.SyntheticConfig(
        rows=args.rows, seed=args.seed, sequences=args.sequences, conversion=args.conversion
    )
    t0 = time.time()
    with replacing_folder(args.output, GENERATED, "generate") as tmp:
        summary = synthetic.write_dataset(
            cfg, tmp, test_fraction=args.test_fraction, criteo_tsv=args.criteo_tsv
        )
    summary = _moved(summary, tmp, Path(args.output))
    _print(json.dumps(summary, indent=1, default=str))
    _print(f"generated {args.rows:,} rows in {time.time() - t0:.1f}s into {args.output}")
    return 0


def _moved(value: Any, tmp: Path, out: Path) -> Any:
    """``value`` (a summary: dicts, lists, strings) with paths under ``tmp`` under ``out``."""
    if isinstance(value, dict):
        return {k: _moved(v, tmp, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, tmp, out) for v in value]
    if isinstance(value, str) and value.startswith(str(tmp)):
        return str(out) + value[len(str(tmp)) :]
    return value


def _generate_days(args: argparse.Namespace) -> int:
    """``generate --days N``: the daily windows of ``features.synthetic_days``."""
    for flag in ("sequences", "conversion", "criteo_tsv"):
        if getattr(args, flag):
            raise UsageError(
                f"generate --days with --{flag.replace('_', '-')}: daily windows are Parquet "
                f"shards with one label and their own item and user fields; drop one of the two"
            )
    options = {n: getattr(args, n) for n in _DAYS_FLAGS if getattr(args, n) is not None}
    try:
        cfg = synthetic_days_config.DaysConfig(
            base=synthetic_config.SyntheticConfig(rows=args.rows, seed=args.seed),
            days=args.days,
            test_fraction=args.test_fraction,
            **options,
        )
    except ValueError as e:  # --rows, --seed or --test-fraction out of range
        raise UsageError(f"generate --days: {e}") from None
    t0 = time.time()
    with replacing_folder(args.output, GENERATED, "generate") as tmp:
        report = synthetic_days.write_days(cfg, tmp)
    report = _moved(report, tmp, Path(args.output))
    for w in report["windows"]:
        frozen = w["next_day_frozen_auc"]
        _print(
            f"{w['name']}: {w['rows']:,} rows, items +{w['items']['born']} "
            f"-{w['items']['retired']} ({w['items']['active']:,} active), users "
            f"+{w['users']['born']} -{w['users']['retired']} ({w['users']['active']:,} active), "
            f"oracle AUC {_auc_text(w['oracle_auc'])}, next day under this day's model "
            f"{_auc_text(frozen)}"
        )
    _print(
        f"generated {args.days} days of {args.rows:,} rows in {time.time() - t0:.1f}s into "
        f"{args.output} (days.json)"
    )
    return 0


def _auc_text(auc: float | None) -> str:
    return "-" if auc is None else f"{auc:.4f}"


# What `stitchrec convert` writes in its output folder; an existing one holding anything else
# is refused rather than replaced.
_CONVERT_ENTRIES = {"train", "test", "schema.toml", completion.STARTED, completion.SUCCESS}


def _check_output(out: Path) -> None:
    """Raises UsageError when ``--output`` exists and is not an earlier convert's folder."""
    check_output_path(out)
    if not out.exists():
        return
    other = sorted(p.name for p in out.iterdir() if p.name not in _CONVERT_ENTRIES)
    if other:
        raise UsageError(
            f"--output {str(out)!r} holds entries `stitchrec convert` does not write {other}: "
            f"expected a new folder or an earlier convert's output (which is replaced)"
        )


def _replace_folder(new: Path, out: Path) -> None:
    """Moves the complete folder ``new`` to ``out``, replacing an earlier ``out``."""
    old = out.parent / f".{out.name}.replaced"
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        out.rename(old)
    new.rename(out)
    if old.exists():
        shutil.rmtree(old)


def cmd_convert(args: argparse.Namespace) -> int:
    """Converts into a hidden folder next to ``--output`` (``convert.json`` first, the shards,
    ``schema.toml``, ``_SUCCESS`` last) and renames it into place once complete, so a killed
    convert never leaves a folder that looks complete."""
    schema = load_schema(args.schema)
    out = Path(args.output)
    _check_output(out)
    tmp = out.parent / f".{out.name}.converting"
    if tmp.exists():
        shutil.rmtree(tmp)
    settings = {"test_fraction": args.test_fraction, "seed": args.seed}
    completion.mark_started(
        tmp, {"schema": schema.name, "inputs": list(map(str, args.input)), **settings}
    )
    report = read_report.ReadReport()
    t0 = time.time()
    try:
        with open_runner(engine_config(args), _print) as runner:
            result = convert.convert(
                schema,
                args.input,
                tmp,
                max_bad_rows=args.max_bad_rows,
                report=report,
                runner=runner,
                chunk_bytes=chunk_bytes(args),
                **settings,
            )
        schema.as_parquet().save(tmp / "schema.toml")
        summary = {"rows": report.rows, "bad_rows": report.bad_rows, "examples": report.examples}
        completion.mark_complete(tmp, summary)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_folder(tmp, out)
    for split, files in result.items():
        _print(f"{split}: {len(files)} shard(s)")
    _print(
        f"rows: {report.rows:,}; bad rows skipped: {report.bad_rows}; "
        f"{time.time() - t0:.1f}s ({report.rows / max(time.time() - t0, 1e-9):,.0f} rows/s)"
    )
    for example in report.examples:
        _print(f"  skipped: {example}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    schema = load_schema(args.schema)
    report = read_report.ReadReport()
    # an earlier statistics folder is replaced whole: no vocabulary file of it stays behind
    with replacing_folder(args.output, (STATS_FILE,), "stats") as tmp:
        with open_runner(engine_config(args), _print) as runner:
            stats = raw_stats(
                schema,
                args.input,
                runner=runner,
                max_bad_rows=args.max_bad_rows,
                report=report,
                chunk_bytes=chunk_bytes(args),
            )
        stats.save(tmp)
    _print(
        f"rows: {stats.rows:,}  label mean: {stats.label_mean:.4f}  bad rows skipped: {report.bad_rows}"
    )
    if len(stats.label_means) > 1:
        on_parent = stats.label_means_on_parent
        _print(
            "  label means: "
            + ", ".join(
                f"{n}={m:.4f}"
                + (f" ({on_parent[n]:.4f} where its parent is 1)" if n in on_parent else "")
                for n, m in stats.label_means.items()
            )
        )
    for name, fs in stats.fields.items():
        if fs.kind == "sequence":
            shared = schema.field(name).shares_embedding_with
            vocab = f"shared with {shared}" if shared else f"vocab={fs.vocab_size}"
            _print(
                f"  {name:24s} sequence    mean length={fs.mean_length:.3g} max={fs.max_length} "
                f"over max_len={fs.frac_truncated:.2%} empty={fs.frac_empty:.2%} "
                f"{vocab}"
            )
        elif fs.kind == "numeric":
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


def cmd_add_history(args: argparse.Namespace) -> int:
    """``features.history.add_history`` with the command's flags."""
    if (args.attributes is None) != (args.attribute is None):
        raise UsageError("--attributes and --attribute go together: give both or neither")
    if Path(args.input).resolve() == Path(args.output).resolve():
        raise UsageError(f"--output {args.output!r} is the --input file: expected another file")
    check_output_path(args.output, folder=False)
    spec = history.HistorySpec(
        user=args.user,
        item=args.item,
        time=args.time,
        length=args.length,
        column=args.column,
        attributes=args.attributes,
        attribute=args.attribute,
    )
    t0 = time.time()
    rows = history.add_history(args.input, args.output, spec)
    added = [spec.history_column, *(spec.attribute_columns or ())]
    _print(f"wrote {rows:,} rows with {added} in {time.time() - t0:.1f}s to {args.output}")
    return 0


# The WindowSpec fields a message names, as their `stitchrec windows` flags.
_WINDOW_FLAGS = {
    "by": "--by",
    "time_format": "--time-format",
    "format": "--format",
    "min_rows": "--min-rows",
}


def cmd_windows(args: argparse.Namespace) -> int:
    """``features.windows.cut_windows`` with the command's flags."""
    try:
        spec = windows.WindowSpec(
            time=args.time,
            by=args.by,
            time_format=args.time_format,
            count=tuple(dict.fromkeys(args.count)),
            min_rows=args.min_rows,
            output_format=args.format,
        )
    except ValueError as e:  # "<field> must be ...": named by its flag
        field, rest = str(e).split(" ", 1)
        raise UsageError(f"windows {_WINDOW_FLAGS.get(field, field)} {rest}") from None
    t0 = time.time()
    report = windows.cut_windows(args.input, args.output, spec)
    for w in report["windows"]:
        churn = "".join(
            f", {c} {n['distinct']:,} distinct ({n['new']:,} new)" for c, n in w["count"].items()
        )
        _print(f"{w['folder']} {w['name']}: {w['rows']:,} rows{churn}")
    _print(
        f"cut {report['rows']:,} rows into {len(report['windows'])} window(s) in "
        f"{time.time() - t0:.1f}s: {args.output} ({windows.REPORT})"
    )
    return 0
