"""A run's data: raw files -> Parquet shards (train, validation, test) once, statistics once, crosses the config names;
the checks and device set-up a training run starts with.

A training run also keeps its vocabularies' state (``features.vocab_state.VocabState``) in
``stats/vocab_state/``: the first window's for a run from scratch, and for a run with ``[train]
continue_from = RUN`` the previous run's state advanced by this run's window, whose vocabulary
(ids stable for the kept values, docs/continuous.md) is the run's. What changed is kept in
``stats/vocab_change.json`` for the training report."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import tensorflow as tf

from features import convert, read_report
from features.crosses.artifact import add_crosses, load_crosses
from features.read_report import DataError
from features.readers import list_files
from features.schema import FeatureKind, Schema, load_schema
from features.shard_reader import list_parquet
from features.stats import STATS_FILE, DatasetStats, cap_hash_tables
from features.stats_job import shard_stats
from features.tasks import TaskRunner
from features.vocab_state import VocabChange, VocabOptions, VocabState
from pipelines.config import ConfigError, DataConfig, PipelineConfig, load_config
from pipelines.run.paths import Log, RunPaths


def _direct_parquet(schema: Schema) -> bool:
    """True when Parquet shards can be read as they are: columns named by field, no label
    threshold, unix timestamps."""
    return schema.source.format == "parquet" and all(
        f.column == f.name
        and f.threshold is None
        and not (f.kind == FeatureKind.TIMESTAMP and f.time_format != "unix")
        for f in schema.fields
    )


def _input_schema(schema: Schema, d: DataConfig) -> Schema:
    """The schema ``[data] train``/``validation``/``test`` are read with: with a raw-format
    schema (CSV/TSV) whose inputs are all Parquet shards (``stitchrec convert``'s output), the
    schema of those shards (``Schema.as_parquet``); else ``schema`` itself.

    Raises:
      DataError: the inputs mix Parquet shards and raw files, or one does not exist.
    """
    if d.raw or schema.source.format == "parquet":
        return schema
    files = list_files([*d.train, *d.validation, *d.test], schema)
    parquet = [f for f in files if f.suffix == ".parquet"]
    if not parquet:
        return schema
    raw = [f for f in files if f.suffix != ".parquet"]
    if raw:
        raise DataError(
            f"[data] train/validation/test mix Parquet shards ({parquet[0]}) and raw files "
            f"({raw[0]}): give the raw {schema.source.format} files of schema "
            f"{schema.name!r}, or all as Parquet shards written by `stitchrec convert`"
        )
    return schema.as_parquet()


class RunData(NamedTuple):
    """The shards a run reads: the schema they follow, train, validation and test files."""

    schema: Schema
    train: list[Path]
    validation: list[Path]
    test: list[Path]


def _listed(files: tuple[str, ...]) -> list[Path]:
    return list_parquet(list(files)) if files else []


def _split_dir(folder: Path) -> list[Path]:
    return list_parquet(folder) if folder.is_dir() and any(folder.glob("*.parquet")) else []


def prepare_data(
    cfg: PipelineConfig, paths: RunPaths, log: Log, runner: TaskRunner | None = None
) -> RunData:
    """The run's shards, converting raw files once into ``paths.data`` (``train/``,
    ``validation/``, ``test/``).

    Parquet shards whose columns are the schema's fields are read as they are, unless
    ``[data] validation_fraction`` splits validation rows off them (then the training shards
    are rewritten once as ``data/train`` and ``data/validation``). Explicit ``[data]
    validation`` files replace the fraction. With a raw-format schema, ``train``/``test`` may be
    its raw files (converted here) or the Parquet shards ``stitchrec convert`` wrote of them.
    The conversion's tasks run on ``runner`` (default: this process).
    """
    d = cfg.data
    schema = _input_schema(load_schema(d.schema), d)
    fraction = 0.0 if d.validation else d.validation_fraction
    # with max_bad_rows > 0 the shards are read through the conversion, which skips bad rows
    direct = bool(d.train) and _direct_parquet(schema) and not d.max_bad_rows
    if direct and fraction == 0:
        return RunData(
            schema.as_parquet(), _listed(d.train), _listed(d.validation), _listed(d.test)
        )
    if not (paths.data / "_SUCCESS").exists():
        _convert(cfg, schema, paths, fraction, direct, log, runner)
    return RunData(
        schema.as_parquet(),
        list_parquet(paths.data / "train"),
        _split_dir(paths.data / "validation"),
        _listed(d.test) if direct else _split_dir(paths.data / "test"),
    )


def _convert(
    cfg: PipelineConfig,
    schema: Schema,
    paths: RunPaths,
    fraction: float,
    direct: bool,
    log: Log,
    runner: TaskRunner | None,
) -> None:
    """Converts the config's inputs into ``paths.data``; writes the ``_SUCCESS`` marker last."""
    d = cfg.data
    report = read_report.ReadReport()
    t0 = time.time()
    split = {"validation_fraction": fraction, "seed": d.split_seed}
    split |= {"validation_split": d.validation_split}
    split |= {"max_bad_rows": d.max_bad_rows, "report": report, "runner": runner}
    held = f"validation_fraction={fraction}" + (
        f", validation_split={d.validation_split}" if fraction else ""
    )
    if d.raw:
        log(
            f"converting {len(d.raw)} raw input(s) to Parquet (test_fraction={d.test_fraction}, "
            f"{held})"
        )
        convert.convert(schema, list(d.raw), paths.data, test_fraction=d.test_fraction, **split)
    else:
        what = "Parquet" if schema.source.format == "parquet" else "raw"
        log(
            f"converting {len(d.train)} {what} training input(s) to the run's Parquet shards "
            f"({held})"
        )
        convert.convert(schema, list(d.train), paths.data, **split)
        if d.test and not direct:
            _convert_side(schema, d.test, paths.data, "test", d.max_bad_rows, report, runner)
    if d.validation and not direct:
        _convert_side(
            schema, d.validation, paths.data, "validation", d.max_bad_rows, report, runner
        )
    summary = {"rows": report.rows, "bad_rows": report.bad_rows, "examples": report.examples}
    (paths.data / "_SUCCESS").write_text(json.dumps(summary, indent=1))
    log(
        f"converted {report.rows:,} rows in {time.time() - t0:.1f}s"
        + (f", skipped {report.bad_rows} bad rows" if report.bad_rows else "")
    )


def _convert_side(
    schema: Schema,
    files: tuple[str, ...],
    data: Path,
    name: str,
    max_bad_rows: int,
    report: read_report.ReadReport,
    runner: TaskRunner | None,
) -> None:
    """Converts the test or validation ``files`` whole into ``data/<name>/``."""
    tmp = data / f"_{name}"
    convert.convert(
        schema, list(files), tmp, max_bad_rows=max_bad_rows, report=report, runner=runner
    )
    if (data / name).exists():
        shutil.rmtree(data / name)
    (tmp / "train").rename(data / name)
    shutil.rmtree(tmp)


def add_configured_crosses(cfg: PipelineConfig, schema: Schema, log: Log) -> Schema:
    """The schema plus the top crosses of the artifact ``[data] crosses`` names (if any)."""
    if not cfg.data.crosses:
        return schema
    artifact = load_crosses(cfg.data.crosses)
    schema = add_crosses(schema, artifact, cfg.data.cross_top_n, cfg.data.cross_hash_buckets)
    names = ", ".join(f"{c.name} ({c.hash_buckets} rows)" for c in schema.crosses)
    log(f"crosses from {cfg.data.crosses}: {names}")
    return schema


#: The ``VocabChange`` of a continued run's window (``VocabChange.to_dict()``), in its stats dir.
VOCAB_CHANGE_FILE = "vocab_change.json"


def prepare_stats(
    schema: Schema,
    train: list[Path],
    paths: RunPaths,
    log: Log,
    cap_hash_buckets: bool = True,
    vocab: VocabOptions | None = None,
    continue_from: str = "",
    runner: TaskRunner | None = None,
) -> DatasetStats:
    """The statistics of the training shards ``train``: computed once (tasks on ``runner``,
    ``features.stats_job.shard_stats``), then read from ``paths.stats``.

    Hashed fields get the table rows of ``features.stats.cap_hash_tables`` (``[data]
    cap_hash_buckets``), saved in ``stats.json`` with the statistics, so a resumed run builds
    the same tables. One line is logged per capped field.

    With ``vocab`` (the run's ``[vocab]`` options), the vocabularies' state is kept in
    ``paths.stats`` (``track_vocabularies``): with ``continue_from`` (a finished run) the
    vocabulary fields of the returned statistics are that run's state advanced by this window.
    The state and the change are written before ``stats.json``, which marks the statistics
    done: a rerun of a cut-short run advances the previous run's state again (the same result),
    and one after ``stats.json`` reads everything back, so a window is never advanced twice.
    """
    if (paths.stats / STATS_FILE).exists():
        stats = DatasetStats.load(paths.stats)
        _log_capped(schema, stats, cap_hash_tables(stats, schema, cap_hash_buckets), log)
        return stats
    t0 = time.time()
    stats = shard_stats(schema, train, runner=runner, all_counts=vocab is not None)
    if vocab is not None:
        stats = track_vocabularies(stats, schema, paths, vocab, continue_from, log)
    capped = cap_hash_tables(stats, schema, cap_hash_buckets)
    stats.save(paths.stats)
    sizes = ", ".join(f"{n}={s.vocab_size}" for n, s in stats.fields.items() if s.vocab_size)
    log(f"statistics of {stats.rows:,} training rows in {time.time() - t0:.1f}s; vocab {sizes}")
    _log_capped(schema, stats, capped, log)
    return stats


def check_continue_from(continue_from: str) -> None:
    """Raises ConfigError unless ``continue_from`` is the folder of a training run (its
    statistics: the vocabulary state or ``STATS_FILE``)."""
    prev = RunPaths(Path(continue_from)).stats
    if not (VocabState.exists(prev) or (prev / STATS_FILE).exists()):
        raise ConfigError(
            f"[train] continue_from = {continue_from!r}: no statistics of a training run there "
            f"({prev / STATS_FILE} missing); expected the folder of a finished run"
        )


def track_vocabularies(
    window: DatasetStats,
    schema: Schema,
    paths: RunPaths,
    options: VocabOptions,
    continue_from: str,
    log: Log,
) -> DatasetStats:
    """Saves the run's ``VocabState`` into ``paths.stats``; returns the run's statistics.

    Without ``continue_from``: the first window's state of ``window`` (every value's count,
    ``compute_stats(..., all_counts=True)``), and ``window`` itself. With it: the state of the
    run ``continue_from`` (saved, else ``VocabState.first`` of its statistics) advanced by
    ``window`` under ``options``, and ``window`` with that state's vocabularies
    (``VocabState.stats``); the ``VocabChange`` goes to ``VOCAB_CHANGE_FILE`` and the log.

    Raises:
      ConfigError: ``continue_from`` holds no run statistics.
    """
    if not continue_from:
        VocabState.first(window, schema, options).save(paths.stats)
        return window
    check_continue_from(continue_from)
    prev = RunPaths(Path(continue_from)).stats
    if VocabState.exists(prev):
        state = VocabState.load(prev)
    else:
        state = VocabState.first(DatasetStats.load(prev), schema, options)
    state, change = state.advance(window, schema, options)
    state.save(paths.stats)
    tmp = paths.stats / f".{VOCAB_CHANGE_FILE}.tmp"
    tmp.write_text(json.dumps(change.to_dict(), indent=1))
    tmp.replace(paths.stats / VOCAB_CHANGE_FILE)
    _log_change(change, continue_from, log)
    return state.stats(window)


def vocabulary_change(paths: RunPaths) -> dict[str, Any] | None:
    """The ``VocabChange.to_dict()`` of a continued run (None for a run from scratch)."""
    path = paths.stats / VOCAB_CHANGE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _log_change(change: VocabChange, continue_from: str, log: Log) -> None:
    for name, c in change.fields.items():
        log(
            f"vocabulary {name} (window {change.window}, continuing {continue_from}): "
            f"{c.kept} kept, {c.added} added, {c.evicted} evicted, {c.moved} moved, size {c.size}"
        )


def _log_capped(schema: Schema, stats: DatasetStats, capped: dict[str, int], log: Log) -> None:
    for name, rows in capped.items():
        log(
            f"field {name}: hash_buckets {schema.field(name).hash_buckets} capped to {rows} "
            f"({stats[name].num_distinct} distinct values in the training rows; [data] "
            f"cap_hash_buckets = false keeps the schema's value)"
        )


#: ``[data]`` keys a resumed run may change: how bad rows are handled, where the input is made
_RESUME_MAY_CHANGE = ("max_bad_rows", "data_service", "data_service_timeout")


def _run_data(data: DataConfig) -> dict[str, Any]:
    """``data``'s settings that a resumed run must keep."""
    kept = dataclasses.asdict(data)
    for key in _RESUME_MAY_CHANGE:
        kept.pop(key)
    return kept


def check_same_run(cfg: PipelineConfig, paths: RunPaths) -> None:
    """Raises ConfigError when the run folder's checkpoints belong to another run.

    A run folder with checkpoints resumes only the run it holds: its [data] (but for
    ``max_bad_rows`` and where the input is made, ``data_service`` and its timeout) and
    [model] must not change; [train] may, e.g. more epochs."""
    if not paths.config.exists() or tf.train.latest_checkpoint(str(paths.checkpoints)) is None:
        return
    previous = load_config(paths.config)
    changed = [
        name
        for name, before, now in (
            ("data", _run_data(previous.data), _run_data(cfg.data)),
            ("model", previous.model, cfg.model),
        )
        if before != now
    ]
    if changed:
        raise ConfigError(
            f"{paths.root} holds a run whose {' and '.join(f'[{s}]' for s in changed)} differ "
            f"from this config's; resume it with the same settings, or train into a new "
            f"output_dir"
        )


def use_gpus_if_present(log: Log) -> list:
    """GPUs TensorFlow sees, with memory growth on (so a server or a second job can share them).

    TensorFlow places the model's ops on the first GPU when there is one and on the CPU
    otherwise; the same code runs on both.
    """
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        # RuntimeError: already initialized in this process; keep its setting
        with contextlib.suppress(RuntimeError):
            tf.config.experimental.set_memory_growth(gpu, True)
    log(
        f"devices: {len(gpus)} GPU(s), training on {gpus[0].name}"
        if gpus
        else "devices: CPU only (no GPU found)"
    )
    return gpus
