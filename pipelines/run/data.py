"""A run's data: raw files -> Parquet shards once, statistics once, crosses the config names;
the checks and device set-up a training run starts with."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path

import tensorflow as tf

from features import read_report, shards
from features.crosses.artifact import add_crosses, load_crosses
from features.dataset import iter_record_batches, list_parquet
from features.schema import FeatureKind, Schema, load_schema
from features.stats import DatasetStats, compute_stats
from pipelines.config import ConfigError, PipelineConfig, load_config
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


def prepare_data(cfg: PipelineConfig, paths: RunPaths, log: Log) -> tuple[Schema, list, list]:
    """Returns (schema of the shards, train shards, test shards), converting raw files once."""
    schema = load_schema(cfg.data.schema)
    d = cfg.data
    if d.train and _direct_parquet(schema) and not d.max_bad_rows:  # else skip bad rows in convert
        train = list_parquet(list(d.train))
        test = list_parquet(list(d.test)) if d.test else []
        return schema.as_parquet(), train, test
    marker = paths.data / "_SUCCESS"
    if not marker.exists():
        report = read_report.ReadReport()
        t0 = time.time()
        if d.raw:
            log(
                f"converting {len(d.raw)} raw input(s) to Parquet (test_fraction={d.test_fraction})"
            )
            shards.convert(
                schema,
                list(d.raw),
                paths.data,
                test_fraction=d.test_fraction,
                seed=d.split_seed,
                max_bad_rows=d.max_bad_rows,
                report=report,
            )
        else:
            log("converting Parquet inputs to the schema's fields")
            shards.convert(
                schema, list(d.train), paths.data, max_bad_rows=d.max_bad_rows, report=report
            )
            if d.test:
                shards.convert(
                    schema,
                    list(d.test),
                    paths.data / "_test",
                    max_bad_rows=d.max_bad_rows,
                    report=report,
                )
                (paths.data / "_test" / "train").rename(paths.data / "test")
        summary = {"rows": report.rows, "bad_rows": report.bad_rows, "examples": report.examples}
        marker.write_text(json.dumps(summary, indent=1))
        log(
            f"converted {report.rows:,} rows in {time.time() - t0:.1f}s"
            + (f", skipped {report.bad_rows} bad rows" if report.bad_rows else "")
        )
    train = list_parquet(paths.data / "train")
    test_dir = paths.data / "test"
    test = list_parquet(test_dir) if test_dir.exists() and any(test_dir.glob("*.parquet")) else []
    return schema.as_parquet(), train, test


def add_configured_crosses(cfg: PipelineConfig, schema: Schema, log: Log) -> Schema:
    """The schema plus the top crosses of the artifact ``[data] crosses`` names (if any)."""
    if not cfg.data.crosses:
        return schema
    artifact = load_crosses(cfg.data.crosses)
    schema = add_crosses(schema, artifact, cfg.data.cross_top_n, cfg.data.cross_hash_buckets)
    names = ", ".join(f"{c.name} ({c.hash_buckets} rows)" for c in schema.crosses)
    log(f"crosses from {cfg.data.crosses}: {names}")
    return schema


def prepare_stats(schema: Schema, train: list[Path], paths: RunPaths, log: Log) -> DatasetStats:
    """The statistics of the training shards ``train``: computed once, then read from
    ``paths.stats``."""
    if (paths.stats / "stats.json").exists():
        return DatasetStats.load(paths.stats)
    t0 = time.time()
    stats = compute_stats(schema, iter_record_batches(schema, train))
    stats.save(paths.stats)
    sizes = ", ".join(f"{n}={s.vocab_size}" for n, s in stats.fields.items() if s.vocab_size)
    log(f"statistics of {stats.rows:,} training rows in {time.time() - t0:.1f}s; vocab {sizes}")
    return stats


def check_same_run(cfg: PipelineConfig, paths: RunPaths) -> None:
    """Raises ConfigError when the run folder's checkpoints belong to another run.

    A run folder with checkpoints resumes only the run it holds: its [data] (but for
    ``max_bad_rows``) and [model] must not change; [train] may, e.g. more epochs."""
    if not paths.config.exists() or tf.train.latest_checkpoint(str(paths.checkpoints)) is None:
        return
    previous = load_config(paths.config)
    same_data = dataclasses.replace(previous.data, max_bad_rows=cfg.data.max_bad_rows)
    changed = [
        name
        for name, before, now in (
            ("data", same_data, cfg.data),
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
