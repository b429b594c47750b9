"""What the training loop reads the training split from (``[data] input_format``).

``tfrecord``: the run's Parquet training shards are written once as TFRecord shards into
``<run>/data/tfrecord/train/`` (``features.tfrecord.convert.parquet_to_tfrecord``; the
manifest is written last, then ``source.json`` naming the Parquet files they were written
from; shards are reused only when both are there and agree, else written again), and the loop
reads them with ``features.tfrecord.dataset.make_tfrecord_dataset``, TensorFlow ops alone. ``parquet``:
the loop reads the Parquet shards with ``features.dataset.make_dataset`` (pyarrow, Python).
Both yield the same rows and values; the order within an epoch differs between them, each a
pure function of ``(seed, epoch)``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from features.dataset import count_rows, make_dataset
from features.read_report import DataError
from features.schema import Schema
from features.tasks import TaskRunner
from features.tfrecord.convert import parquet_to_tfrecord
from features.tfrecord.dataset import make_tfrecord_dataset
from features.tfrecord.manifest import list_tfrecord
from pipelines.run.paths import Log, RunPaths

TFRECORD = "tfrecord"
PARQUET = "parquet"
_SOURCE = "source.json"


@dataclasses.dataclass(frozen=True)
class TrainInput:
    """The training split as the loop reads it: its format, the files of that format (TFRecord
    or Parquet) and their rows."""

    format: str
    files: list[Path]
    rows: int

    @property
    def worker_side(self) -> bool:
        """Whether a remote worker can build this input itself (TensorFlow ops only)."""
        return self.format == TFRECORD

    def reader(self, schema: Schema) -> Callable[..., tf.data.Dataset]:
        """``make(batch_size=..., shuffle=..., seed=..., epoch=..., ...)`` over the files:
        ``make_dataset``'s signature for either format."""
        make = make_tfrecord_dataset if self.format == TFRECORD else make_dataset
        return functools.partial(make, schema, self.files)


def _source(parquet: list[Path]) -> dict:
    return {"files": [str(p) for p in parquet], "rows": count_rows(parquet) if parquet else 0}


def _complete(folder: Path, source: dict) -> bool:
    """Whether ``folder`` holds finished TFRecord shards of ``source``: its marker names the
    same Parquet files and rows, and its manifest lists every file with that many rows."""
    marker = folder / _SOURCE
    if not marker.exists() or json.loads(marker.read_text()) != source:
        return False
    try:
        return list_tfrecord(folder).rows == source["rows"]
    except (DataError, FileNotFoundError):
        return False


def prepare_train_input(
    input_format: str,
    schema: Schema,
    parquet: list[Path],
    paths: RunPaths,
    log: Log,
    runner: TaskRunner | None = None,
) -> TrainInput:
    """The run's ``TrainInput`` of the Parquet training shards ``parquet``: as they are, or
    (``tfrecord``) written once as TFRecord shards into ``paths.data / "tfrecord" / "train"``,
    one task per file on ``runner`` (the run's ``[engine]``; default this process)."""
    if input_format == PARQUET:
        return TrainInput(PARQUET, list(parquet), count_rows(parquet))
    folder = paths.data / TFRECORD / "train"
    source = _source(parquet)
    if not _complete(folder, source):
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.time()
        files = parquet_to_tfrecord(schema, parquet, folder, runner=runner)
        tmp = folder / f".{_SOURCE}.tmp"
        tmp.write_text(json.dumps(source, indent=1))
        tmp.replace(folder / _SOURCE)
        size = sum(f.stat().st_size for f in files)
        log(
            f"wrote {source['rows']:,} training rows as {len(files)} TFRecord file(s) "
            f"({size / 2**20:,.1f} MiB) in {folder} in {time.time() - t0:.1f}s"
        )
    shards = list_tfrecord(folder)
    # absolute: tf.data service workers (``[data] data_service``) read them from their own folder
    return TrainInput(TFRECORD, [Path(f.path).resolve() for f in shards.files], shards.rows)
