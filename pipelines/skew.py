"""``stitchrec skew``: training/serving skew between a finished training run and the traffic its
model served (docs/skew.md).

    stitchrec skew --run RUN --data LOGS... [--model M] [--reference LOGS...] [--output DIR]
                   [--threshold-psi X] [--watch-psi X] [--threshold-oov X] [--max-bins N]
                   [--score-output NAME] [--include-shadow] [--json]

The run gives its schema (``RUN/schema.toml``), its training statistics (``RUN/stats/``:
vocabularies with counts, numeric moments and quantiles) and, for the numeric fields' reference
bins, its training shards when they are there (``RUN/data/train/``, else the Parquet files its
``config.toml`` names in ``[data] train``; at most ``MAX_REFERENCE_ROWS`` rows). The served side
is a prediction log folder (``serving.log_format``; shadow rows left out unless
``--include-shadow``). Every model input of the schema found among the logged features gets a
skew entry (``pipelines.skew_fields``); the score's shift is measured against the same output
of ``--reference`` logs, since a run keeps no predictions of its own. The flags are defined in
``pipelines.cli_args_skew``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.schema import FeatureKind, Schema, load_schema
from features.stats import STATS_FILE, DatasetStats, transform_numeric
from pipelines import skew_report
from pipelines.errors import UsageError, replacing_folder
from pipelines.run.paths import RunPaths
from pipelines.skew_fields import (
    Thresholds,
    categorical_skew,
    numeric_reference,
    numeric_skew,
    score_skew,
    score_values,
)
from serving import log_format

#: Training rows read per numeric field for its reference histogram.
MAX_REFERENCE_ROWS = 1_000_000
SKEW_JSON = "skew.json"
#: The logged output whose shift is measured when ``--score-output`` is not given.
DEFAULT_SCORE_OUTPUT = "score"
SKEW_HTML = "skew.html"


@dataclasses.dataclass(frozen=True)
class SkewOptions:
    """What ``run_skew`` compares (see the module docstring and ``Thresholds``)."""

    run: str
    data: list[str]
    model: str | None = None
    reference: list[str] | None = None
    output: str | None = None
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    max_bins: int = 20
    score_output: str | None = None
    include_shadow: bool = False


def load_run(run: str | Path) -> tuple[Schema, DatasetStats]:
    """The schema and training statistics of the run folder ``run``; a UsageError names what is
    missing."""
    paths = RunPaths(Path(run))
    if not paths.root.is_dir():
        raise UsageError(
            f"--run {str(run)!r}: no such run folder (expected the output_dir of "
            f"a `stitchrec train` run)"
        )
    if not paths.schema.is_file():
        raise UsageError(
            f"--run {str(run)!r}: no schema.toml in the folder; expected a training run folder"
        )
    if not (paths.stats / STATS_FILE).is_file():
        raise UsageError(
            f"--run {str(run)!r}: no statistics ({paths.stats / STATS_FILE}); "
            f"expected a run whose training has computed them"
        )
    return load_schema(paths.schema), DatasetStats.load(paths.stats)


def training_files(run: str | Path) -> list[Path]:
    """The run's training shards: ``RUN/data/train/*.parquet``, else the Parquet files (or
    folders of them, or glob patterns) of ``[data] train`` in ``RUN/config.toml``; [] when
    neither is there."""
    paths = RunPaths(Path(run))
    own = sorted((paths.data / "train").glob("*.parquet"))
    if own or not paths.config.is_file():
        return own
    entries = tomllib.loads(paths.config.read_text()).get("data", {}).get("train", [])
    found: list[Path] = []
    for entry in entries if isinstance(entries, list) else [entries]:
        p = Path(entry)
        if p.is_dir():
            found += sorted(p.glob("*.parquet"))
        else:
            found += sorted(Path(f) for f in glob.glob(str(p)) if f.endswith(".parquet"))
    return found


def training_values(files: list[Path], name: str) -> np.ndarray | None:
    """The first ``MAX_REFERENCE_ROWS`` non-null values of column ``name`` in ``files``; None
    when a file lacks the column."""
    parts, n = [], 0
    for f in files:
        if name not in pq.read_schema(f).names:
            return None
        col = pq.read_table(f, columns=[name]).column(name).drop_null()
        parts.append(pc.cast(col, pa.float64()).to_numpy())
        n += len(col)
        if n >= MAX_REFERENCE_ROWS:
            break
    return np.concatenate(parts)[:MAX_REFERENCE_ROWS] if parts else None


def served_rows(paths: list[str], model: str | None, shadow: bool, flag: str) -> pa.Table:
    """The log rows of ``model`` (None: the only model in the logs) under ``paths``; without
    ``shadow``, the non-shadow rows."""
    try:
        files = log_format.log_files(paths)
    except FileNotFoundError as e:
        raise UsageError(f"{flag}: {e}") from None
    models = sorted({f.parent.name for f in files})
    if not files:
        raise UsageError(
            f"{flag} {', '.join(paths)}: no prediction log files (*{log_format.SUFFIX})"
        )
    _check_log_files(files, flag)
    if model is None and len(models) > 1:
        raise UsageError(
            f"{flag} {', '.join(paths)}: the logs hold models {models}; choose one with --model"
        )
    if model is not None and model not in models:
        raise UsageError(
            f"{flag} {', '.join(paths)}: no prediction logs of model {model!r}; the logs hold {models}"
        )
    try:
        table = log_format.read_logs(paths, model or models[0])
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None
    if not shadow:
        table = table.filter(pc.invert(table.column("shadow")))
    if table.num_rows == 0:
        raise UsageError(
            f"{flag} {', '.join(paths)}: the logs of model {model or models[0]!r} hold no "
            "rows" + ("" if shadow else " but shadow rows (see --include-shadow)")
        )
    return table


def _check_log_files(files: list[Path], flag: str) -> None:
    """Raises UsageError naming the first of ``files`` that lacks a prediction log's columns
    (``serving.log_format.META_COLUMNS``), and the data folder it lies in when it is one."""
    for f in files:
        names = set(pq.read_schema(f).names)
        missing = [c for c in log_format.META_COLUMNS if c not in names]
        if not missing:
            continue
        folder = next(
            (p for p in f.parents if (p / "schema.toml").is_file()),
            None,
        )
        what = (
            f"{str(folder)!r} is a data folder (schema.toml, Parquet shards), not a prediction "
            "log folder"
            if folder is not None
            else f"{str(f)!r} is not a prediction log file (no column(s) {', '.join(missing)})"
        )
        raise UsageError(
            f"{flag}: {what}; expected the log folder `stitchrec serve` writes "
            f"(<log dir>/<model>/part-*{log_format.SUFFIX}, with the columns "
            f"{', '.join(log_format.META_COLUMNS)})"
        )


def field_skews(
    schema: Schema, stats: DatasetStats, table: pa.Table, opts: SkewOptions
) -> dict[str, Any]:
    """``fields`` (per model input found in the logs), ``skipped`` (field: why), and the
    schema's inputs missing from the logs and the logged features not in the schema."""
    logged = log_format.features_of(table)
    inputs = [f for f in schema.model_inputs if f.name in logged]
    files = training_files(opts.run)
    fields, skipped = {}, {}
    for spec in inputs:
        fs = stats.fields.get(spec.name)
        if fs is None or fs.count == 0:
            skipped[spec.name] = "the run's statistics have no values of the field"
        elif spec.kind == FeatureKind.NUMERIC:
            train = training_values(files, spec.name) if files else None
            train = transform_numeric(train, spec) if train is not None else None
            ref = numeric_reference(fs, train)
            fields[spec.name] = numeric_skew(spec, fs, logged[spec.name], ref, opts.thresholds)
        elif not fs.vocab:
            how = "hashed" if spec.vocab == "hash" else "shares another field's vocabulary"
            skipped[spec.name] = f"{how}: the statistics keep no value counts of the field"
        else:
            col = logged[spec.name]
            fields[spec.name] = categorical_skew(spec, fs, col, opts.thresholds, opts.max_bins)
    names = set(schema.names)
    return {
        "fields": fields,
        "skipped": skipped,
        "missing_fields": [f.name for f in schema.model_inputs if f.name not in logged],
        "extra_columns": sorted(n for n in logged if n not in names),
    }


def _score(table: pa.Table, opts: SkewOptions, model: str) -> dict[str, Any] | None:
    """The score's shift (``score_skew``) of output ``opts.score_output`` (None: ``score``,
    or None when the logs have no ``score``); a UsageError names an output the logs lack."""
    outputs = log_format.outputs_of(table)
    name = DEFAULT_SCORE_OUTPUT if opts.score_output is None else opts.score_output
    if name not in outputs:
        if opts.score_output is None:
            return None
        raise UsageError(
            f"--score-output {name!r}: the logs of model {model!r} under "
            f"{', '.join(opts.data)} have no such output; they have {sorted(outputs)}"
        )
    reference = None
    if opts.reference:
        ref = served_rows(opts.reference, model, opts.include_shadow, "--reference")
        ref_outputs = log_format.outputs_of(ref)
        if name not in ref_outputs:
            raise UsageError(
                f"--reference {', '.join(opts.reference)}: the logs have no output "
                f"{name!r}; they have {sorted(ref_outputs)}"
            )
        reference = score_values(ref_outputs[name])
    out = score_skew(score_values(outputs[name]), reference, opts.thresholds)
    out["output"] = name
    out["reference_logs"] = list(opts.reference) if opts.reference else None
    return out


def run_skew(opts: SkewOptions) -> dict[str, Any]:
    """The skew report (the dict ``skew.json`` holds); writes ``skew.json`` and ``skew.html``
    under ``opts.output`` when given: a new or empty folder, or an earlier skew output (a
    folder holding ``skew.json``), checked before anything is read and replaced whole
    (``replacing_folder``)."""
    if not opts.output:
        return _skew(opts)
    with replacing_folder(opts.output, (SKEW_JSON,), "skew") as tmp:
        result = _skew(opts)
        (tmp / SKEW_JSON).write_text(json.dumps(result, indent=1))
        (tmp / SKEW_HTML).write_text(skew_report.html(result))
    return result


def _skew(opts: SkewOptions) -> dict[str, Any]:
    """The skew report of ``opts`` (``run_skew``, nothing written)."""
    schema, stats = load_run(opts.run)
    table = served_rows(opts.data, opts.model, opts.include_shadow, "--data")
    model = table.column("model")[0].as_py()
    part = field_skews(schema, stats, table, opts)
    if not part["fields"] and not part["skipped"]:
        raise UsageError(
            f"--data {', '.join(opts.data)}: the logs of model {model!r} have none of the run's model "
            f"inputs {[f.name for f in schema.model_inputs]} (they log "
            f"{sorted(log_format.features_of(table))}); are they the logs of another model?"
        )
    order = sorted(part["fields"], key=lambda n: (_RANK[part["fields"][n]["status"]], n))
    th = opts.thresholds
    result = {
        "run": str(opts.run),
        "data": list(opts.data),
        "model": model,
        "versions": sorted(set(table.column("version").to_pylist())),
        "rows": table.num_rows,
        "training_rows": stats.rows,
        "include_shadow": opts.include_shadow,
        "thresholds": {"psi": th.psi, "watch_psi": th.watch_psi, "oov": th.oov},
        "epsilon": th.epsilon,
        "fields": {n: part["fields"][n] for n in order},
        "skipped": part["skipped"],
        "missing_fields": part["missing_fields"],
        "extra_columns": part["extra_columns"],
        "score": _score(table, opts, model),
    }
    result["flagged"] = [n for n in order if part["fields"][n]["flagged"]]
    result["watch"] = [n for n in order if part["fields"][n]["status"] == "watch"]
    return _finite(result)


_RANK = {"flagged": 0, "watch": 1, "ok": 2}


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (at any depth) replaced by None, so the
    report is strict JSON (a field with no served values has no mean)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _positive_float(value: float, flag: str) -> float:
    if not value > 0:
        raise UsageError(f"{flag} must be > 0, got {value}")
    return value


def thresholds(psi: float, watch_psi: float, oov: float) -> Thresholds:
    """The flags' ``Thresholds``; a UsageError names a value out of range: a PSI threshold
    that is not positive, ``--watch-psi`` above ``--threshold-psi`` (the watch band lies below
    the flag), or an OOV-rate growth outside (0, 1]."""
    _positive_float(psi, "--threshold-psi")
    _positive_float(watch_psi, "--watch-psi")
    if watch_psi > psi:
        raise UsageError(
            f"--watch-psi {watch_psi} is above --threshold-psi {psi}: expected a watch "
            "threshold at most the flag threshold (a field is 'watch' when its PSI is above "
            "--watch-psi and not above --threshold-psi)"
        )
    if not 0 < oov <= 1:
        raise UsageError(
            f"--threshold-oov must be in (0, 1], got {oov}: it is a growth of the OOV rate "
            "(a fraction of the rows; 0.05 = five points)"
        )
    return Thresholds(psi=psi, watch_psi=watch_psi, oov=oov)


def cmd_skew(args: argparse.Namespace) -> int:
    th = thresholds(args.threshold_psi, args.watch_psi, args.threshold_oov)
    opts = SkewOptions(
        run=args.run,
        data=list(args.data),
        model=args.model,
        reference=list(args.reference) if args.reference else None,
        output=args.output,
        thresholds=th,
        max_bins=args.max_bins,
        score_output=args.score_output,
        include_shadow=args.include_shadow,
    )
    result = run_skew(opts)
    if args.json:
        print(json.dumps(result, indent=1), flush=True)
    else:
        print(skew_report.console(result), flush=True)
        if args.output:
            print(f"wrote {Path(args.output) / SKEW_JSON} and {Path(args.output) / SKEW_HTML}")
    return 0
