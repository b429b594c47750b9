"""``stitchrec evaluate``: AUC and log loss of an exported SavedModel on held-out data.

The data is either Parquet shards written by StitchRec (columns named by field; the schema comes
from the SavedModel's ``assets.extra/schema.toml``), or raw files read with a schema
(``--schema``), streamed through ``features.readers`` with the same bad-row rules as training.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from features import read_report, readers
from features.dataset import iter_batches, list_parquet, table_to_numpy
from features.schema import Schema, SchemaError, load_schema
from pipelines.evaluation.tasks import (
    ModelTask,
    needed_labels,
    needed_outputs,
    saved_model_tasks,
    select_tasks,
    task_metrics,
    unloadable_saved_model,
)


def _batches(
    schema: Schema | None,
    model_schema: Schema,
    labels: list[str],
    data: Sequence[str | Path],
    batch_size: int,
    max_bad_rows: int,
    report: read_report.ReadReport,
) -> Iterator[dict[str, np.ndarray]]:
    fields = [*model_schema.model_inputs, *(model_schema.field(n) for n in labels)]
    if schema is None:
        yield from iter_batches(
            model_schema, list_parquet(list(data)), batch_size=batch_size, shuffle=False
        )
        return
    missing = [f.name for f in fields if f.name not in schema.names]
    if missing:
        raise SchemaError(f"schema {schema.name!r} lacks fields the model needs: {missing}")
    for batch in readers.read_batches(
        schema, data, batch_rows=batch_size, max_bad_rows=max_bad_rows, report=report
    ):
        yield table_to_numpy(batch, [schema.field(f.name) for f in fields])


def score_tasks(
    model_dir: str | Path,
    data: Sequence[str | Path],
    tasks: Sequence[ModelTask] | None = None,
    *,
    schema: Schema | None = None,
    batch_size: int = 8192,
    max_bad_rows: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], read_report.ReadReport]:
    """({label: [n]}, {output: [n]}, read report): the labels and signature outputs that
    ``tasks`` (default: every task of the model) read, over ``data``."""
    model_schema, all_tasks = saved_model_tasks(model_dir)
    return _score(
        model_dir, model_schema, list(tasks or all_tasks), data, schema, batch_size, max_bad_rows
    )


def _score(
    model_dir: str | Path,
    model_schema: Schema,
    tasks: list[ModelTask],
    data: Sequence[str | Path],
    schema: Schema | None,
    batch_size: int,
    max_bad_rows: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], read_report.ReadReport]:
    try:
        fn = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    except (OSError, tf.errors.OpError) as e:
        raise unloadable_saved_model(model_dir, e) from None
    inputs = [f.name for f in model_schema.model_inputs]
    label_names, outputs = needed_labels(tasks), needed_outputs(tasks)
    report = read_report.ReadReport()
    labels: dict[str, list[np.ndarray]] = {n: [] for n in label_names}
    scores: dict[str, list[np.ndarray]] = {n: [] for n in outputs}
    for batch in _batches(
        schema, model_schema, label_names, data, batch_size, max_bad_rows, report
    ):
        out = fn(**{n: tf.constant(batch[n]) for n in inputs})
        for n in label_names:
            labels[n].append(batch[n])
        for n in outputs:
            scores[n].append(out[n].numpy())
    if not labels[label_names[0]]:
        raise read_report.DataError(f"no rows to evaluate in {[str(d) for d in data]}")
    return (
        {n: np.concatenate(v) for n, v in labels.items()},
        {n: np.concatenate(v) for n, v in scores.items()},
        report,
    )


def score_saved_model(
    model_dir: str | Path,
    data: Sequence[str | Path],
    *,
    schema: Schema | None = None,
    batch_size: int = 8192,
    max_bad_rows: int = 0,
) -> tuple[np.ndarray, np.ndarray, read_report.ReadReport]:
    """(labels, scores, read report) of the primary task over ``data``."""
    model_schema, tasks = saved_model_tasks(model_dir)
    labels, scores, report = _score(
        model_dir, model_schema, tasks[:1], data, schema, batch_size, max_bad_rows
    )
    return labels[tasks[0].label], scores[tasks[0].output], report


def evaluate(
    model_dir: str | Path,
    data: Sequence[str | Path],
    *,
    schema: str | Path | None = None,
    tasks: Sequence[str] | None = None,
    batch_size: int = 8192,
    max_bad_rows: int = 0,
) -> dict[str, Any]:
    """The metrics of the model's tasks (``tasks``: names; default every task) on ``data``.

    The top-level keys are the first evaluated task's metrics (the primary task by default);
    a multi-task model's result also holds ``tasks``: ``{task: metrics}`` of every task
    evaluated, with ``given_<parent>`` metrics on the parent-positive rows of a task whose
    label is defined only there (``pipelines.evaluation.tasks``).
    """
    model_schema, all_tasks = saved_model_tasks(model_dir)
    chosen = select_tasks(all_tasks, tasks)
    data_schema = load_schema(schema) if schema else None
    labels, scores, report = _score(
        model_dir, model_schema, chosen, data, data_schema, batch_size, max_bad_rows
    )
    per_task = {t.name: task_metrics(t, labels, scores) for t in chosen}
    first = per_task[chosen[0].name]
    result: dict[str, Any] = {**first, "bad_rows_skipped": report.bad_rows}
    if len(all_tasks) > 1:
        result = {"task": chosen[0].name, **result, "tasks": per_task}
    return result


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``stitchrec evaluate`` (flags in ``pipelines.cli_args``): prints the metrics as JSON."""
    result = evaluate(
        args.model,
        args.data,
        schema=args.schema,
        tasks=args.task,
        max_bad_rows=args.max_bad_rows,
    )
    print(json.dumps(result, indent=1), flush=True)
    return 0
