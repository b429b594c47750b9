"""``stitchrec predict``: batch scoring of logs with a SavedModel, as a job of tasks on an engine
(``pipelines.engines``), written as Parquet scores that ``stitchrec ab`` reads.

    stitchrec predict --model SAVED_MODEL --data LOGS... --output SCORES [--schema S]
                      [--row-id FIELD] [--batch-size N] [--max-bad-rows N] [--engine ...]

The logs are Parquet shards (``stitchrec convert`` / ``generate`` output, read with the
SavedModel's own schema) or, with ``--schema``, raw files of that schema (validated as
``convert`` validates them; bad rows skipped and counted with ``--max-bad-rows``). Each task
scores one part of the logs (a row-group range of a shard, or a chunk of a raw file): the
SavedModel is loaded once per worker process and kept for the worker's next tasks.

SCORES is a folder of ``part-00000.parquet``, ... (the parts in log order) with the columns
``row_id`` (the row's 0-based position in the logs, as ``stitchrec ab`` numbers logged rows, or
the ``--row-id`` field's value) and the model's outputs: ``score``, or for a multi-task model
every task's ``score_<task>`` (and ``score_<task>_given_<parent>``); ``_SUCCESS`` (written last) holds the row count. The folder appears
complete or not at all (written under a hidden name, renamed at the end).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from features import partitions
from features.read_report import BadRowBudget, ReadReport
from features.readers import list_files
from features.schema import FeatureSpec, Schema, SchemaError, load_schema
from features.shard_reader import column_to_numpy, iter_record_batches, list_parquet
from features.tasks import TaskRunner, atomic_path, runner_or_local
from pipelines.engines import chunk_bytes, engine_config, open_runner
from pipelines.errors import UsageError
from pipelines.evaluation.tasks import (
    needed_outputs,
    read_model_meta,
    recorded_tasks,
    unloadable_saved_model,
)
from pipelines.unique_ids import check_unique_ids

_print = functools.partial(print, flush=True)
SUCCESS = "_SUCCESS"
#: SavedModel signatures loaded in this process (a worker keeps its model between tasks)
_LOADED: dict[str, Any] = {}


def _tf() -> Any:
    """TensorFlow, imported by the process that scores (a worker, with its first task): the
    driver of a job on a cluster never loads it."""
    import tensorflow as tf

    return tf


def _signature(model: str) -> Any:
    if model not in _LOADED:
        tf = _tf()
        try:
            _LOADED[model] = tf.saved_model.load(model).signatures["serving_default"]
        except (OSError, tf.errors.OpError) as e:
            raise unloadable_saved_model(model, e) from None
    return _LOADED[model]


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every scoring task reads: the model, the logs' schema, the inputs and outputs."""

    model: str
    schema: Schema  # of the logs as read (the shards' schema, or the raw files')
    inputs: tuple[FeatureSpec, ...]  # the model's inputs, as the logs hold them
    outputs: tuple[str, ...]
    row_id: FeatureSpec | None
    batch_size: int


@dataclasses.dataclass(frozen=True)
class _Task:
    part: partitions.ShardPart | partitions.Chunk
    out: str
    first_line: int = 1
    keep: int = 0


def _score(job: _Job, batch: pa.RecordBatch | pa.Table, first: int) -> pa.Table:
    """The scores of ``batch``, whose first row is row ``first`` (when not ``--row-id``)."""
    fn, tf = _signature(job.model), _tf()
    cols: dict[str, list[np.ndarray]] = {name: [] for name in job.outputs}
    for lo in range(0, batch.num_rows, job.batch_size):
        part = batch.slice(lo, job.batch_size)
        feats = {f.name: column_to_numpy(part.column(f.name), f) for f in job.inputs}
        res = fn(**{k: tf.constant(v) for k, v in feats.items()})
        for name in job.outputs:
            cols[name].append(res[name].numpy().reshape(-1).astype(np.float64))
    if job.row_id is None:
        ids = pa.array(np.arange(first, first + batch.num_rows, dtype=np.int64))
    else:
        ids = pa.array(column_to_numpy(batch.column(job.row_id.name), job.row_id))
    return pa.table({"row_id": ids, **{n: np.concatenate(v) for n, v in cols.items()}})


def score_part(task: _Task, job: _Job) -> partitions.ChunkRead:
    """Scores one part of the logs into ``task.out`` (row ids of a raw chunk counted from 0: the
    driver shifts them). A task function."""
    tables: list[pa.Table] = []
    if isinstance(task.part, partitions.ShardPart):
        p = task.part
        fields = [*job.inputs, *([job.row_id] if job.row_id else [])]
        rows = (p.first_row, p.first_row + p.rows)
        start = p.offset
        for rb in iter_record_batches(job.schema, [Path(p.path)], fields, row_range=rows):
            tables.append(_score(job, rb, start))
            start += rb.num_rows
        read = partitions.ChunkRead(p.rows, 0, [], None)
    else:
        events = partitions.chunk_events(job.schema, task.part, {}, task.first_line)

        def add(batch: pa.RecordBatch) -> None:
            tables.append(_score(job, batch, sum(t.num_rows for t in tables)))  # chunk's rows

        read = partitions.consume_chunk(events, task.keep, add)
    if tables:
        with atomic_path(Path(task.out)) as tmp:
            pq.write_table(pa.concat_tables(tables), tmp)
    return read


def shift_ids(item: tuple[str, int]) -> str:
    """Adds ``offset`` to the row ids of the scores file ``path``. A task function."""
    path, offset = item
    table = pq.read_table(path)
    ids = pa.array(table.column("row_id").to_numpy() + offset)
    with atomic_path(Path(path)) as tmp:
        pq.write_table(table.set_column(0, "row_id", ids), tmp)
    return path


def _model(model: str | Path) -> tuple[Schema, tuple[str, ...]]:
    """The schema a StitchRec SavedModel takes and the score outputs of its signature:
    ``score``, or a multi-task model's task outputs (``stitchrec.json``)."""
    schema_file = Path(model) / "assets.extra" / "schema.toml"
    if not schema_file.is_file():
        raise UsageError(f"--model {str(model)!r} is not a StitchRec SavedModel: no {schema_file}")
    where = repr(str(schema_file.parent / "stitchrec.json"))
    tasks = recorded_tasks(read_model_meta(model), where)
    return load_schema(schema_file), tuple(needed_outputs(tasks)) if tasks else ("score",)


def _job(args: argparse.Namespace) -> tuple[_Job, bool]:
    """The job of the command's flags, and whether the logs are raw files."""
    model_schema, outputs = _model(args.model)
    raw = args.schema is not None
    schema = load_schema(args.schema) if raw else model_schema.as_parquet()
    missing = [f.name for f in model_schema.model_inputs if f.name not in schema.names]
    if missing:
        raise SchemaError(f"schema {schema.name!r} lacks fields the model needs: {missing}")
    if args.row_id is not None and args.row_id not in schema.names:
        raise UsageError(
            f"--row-id {args.row_id!r} is not a field of schema {schema.name!r}; fields: "
            f"{schema.names}"
        )
    inputs = tuple(schema.field(f.name) for f in model_schema.model_inputs)
    row_id = schema.field(args.row_id) if args.row_id else None
    return _Job(str(args.model), schema, inputs, outputs, row_id, args.batch_size), raw


def predict(
    job: _Job,
    data: Sequence[str | Path],
    raw: bool,
    out: Path,
    runner: TaskRunner | None = None,
    max_bad_rows: int = 0,
    report: ReadReport | None = None,
    chunk_bytes: int = partitions.CHUNK_BYTES,
) -> int:
    """Writes the scores of ``data`` into the folder ``out`` (see the module docstring);
    returns the rows scored."""
    runner = runner_or_local(runner)
    report = report if report is not None else ReadReport()
    if raw:
        files = list_files(list(data), job.schema)
        chunks = partitions.plan_chunks(job.schema, files, chunk_bytes)
        first = partitions.chunk_first_lines(chunks, runner, "predict: count lines")
        keep = partitions.messages_to_keep(max_bad_rows)
        tasks = [
            _Task(c, str(out / f"part-{i:05d}.parquet"), first[i], keep)
            for i, c in enumerate(chunks)
        ]
    else:
        parts = partitions.shard_parts(list_parquet(list(data)))
        tasks = [_Task(p, str(out / f"part-{i:05d}.parquet")) for i, p in enumerate(parts)]
    reads = runner.map(score_part, tasks, shared=job, label="predict")
    if raw:
        partitions.replay_reads(chunks, reads, BadRowBudget(max_bad_rows, report), report)
        if report.rows == 0:
            raise partitions.no_rows_error(data, len(files), report)
        if job.row_id is None:
            offsets = np.concatenate([[0], np.cumsum([r.rows for r in reads])])[:-1]
            moves = [
                (t.out, int(o))
                for t, o, r in zip(tasks, offsets, reads, strict=True)
                if r.rows and o
            ]
            runner.map(shift_ids, moves, label="predict: number rows")
    else:
        report.rows = sum(r.rows for r in reads)
    return report.rows


def _check_output(out: Path) -> None:
    """An existing ``--output`` must be an earlier predict's folder (which is replaced)."""
    if not out.exists():
        return
    if not out.is_dir() or not (out / SUCCESS).is_file():
        raise UsageError(
            f"--output {str(out)!r} exists and is not a `stitchrec predict` output (no {SUCCESS}): "
            f"expected a new folder or an earlier predict's output (which is replaced)"
        )


def cmd_predict(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    out = Path(args.output)
    _check_output(out)
    job, raw = _job(args)
    tmp = out.parent / f".{out.name}.predicting-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    report = ReadReport()
    t0 = time.time()
    try:
        with open_runner(engine_config(args), _print) as runner:
            rows = predict(
                job, args.data, raw, tmp, runner, args.max_bad_rows, report, chunk_bytes(args)
            )
            if job.row_id is not None:
                check_unique_ids(tmp, job.row_id.name, runner)
        summary = {"rows": rows, "bad_rows": report.bad_rows, "model": str(args.model)}
        (tmp / SUCCESS).write_text(json.dumps(summary, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.time() - t0
    _print(
        f"scored {rows:,} rows in {seconds:.1f}s ({rows / max(seconds, 1e-9):,.0f} rows/s); "
        f"bad rows skipped: {report.bad_rows}; scores: {out}"
    )
    return 0
