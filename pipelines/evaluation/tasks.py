"""The tasks of an exported model: which signature output scores which label, on which rows.

A single-task export has one task, named by its label, scored by the ``score`` output. A
multi-task export records its tasks in ``assets.extra/stitchrec.json`` under ``tasks``: one
record per task, in task order (the first is the primary task, also served as ``score``)::

    {"name": "buy", "label": "buy", "output": "score_buy",
     "parent": "click", "conditional_output": "score_buy_given_click"}

``output`` is the probability of the label on every row (for a label defined only on rows where
its ``parent`` label is 1, such as a conversion after a click, the probability over the whole
impression space: P(click and buy)); ``conditional_output``, when the model has one, is the
probability given the parent (P(buy | click)), scored on the parent-positive rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from features.schema import Schema
from ranking import metrics


class TaskError(ValueError):
    """A task name the model does not have, or a model's task records that do not fit its
    schema (a user error)."""


@dataclasses.dataclass(frozen=True)
class ModelTask:
    """One task of an exported model (see the module docstring)."""

    name: str
    label: str
    output: str = "score"
    parent: str | None = None
    conditional_output: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def model_tasks(meta: Mapping[str, Any], schema: Schema) -> list[ModelTask]:
    """The tasks of the export whose ``stitchrec.json`` is ``meta`` and whose schema (with its
    labels) is ``schema``, primary task first."""
    records = meta.get("tasks")
    if not records:
        return [ModelTask(name=schema.label.name, label=schema.label.name)]
    labels = {f.name for f in schema.fields if f.kind == "label"}
    tasks = []
    for r in records:
        task = ModelTask(**r)
        if task.label not in labels or (task.parent is not None and task.parent not in labels):
            raise TaskError(
                f"task {task.name!r} reads label {task.label!r} (parent {task.parent!r}), which "
                f"the model's schema does not have; its labels: {sorted(labels)}"
            )
        tasks.append(task)
    return tasks


def select_tasks(tasks: Sequence[ModelTask], names: Sequence[str] | None) -> list[ModelTask]:
    """The tasks named by ``names`` in the order given (None or empty: every task)."""
    if not names:
        return list(tasks)
    by_name = {t.name: t for t in tasks}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise TaskError(
            f"--task {', '.join(unknown)}: the model has no such task; its tasks: {sorted(by_name)}"
        )
    return [by_name[n] for n in dict.fromkeys(names)]


def needed_outputs(tasks: Sequence[ModelTask]) -> list[str]:
    """The signature outputs that scoring ``tasks`` reads."""
    out = [t.output for t in tasks] + [t.conditional_output for t in tasks if t.conditional_output]
    return list(dict.fromkeys(out))


def needed_labels(tasks: Sequence[ModelTask]) -> list[str]:
    """The label fields that scoring ``tasks`` reads."""
    out = [t.label for t in tasks] + [t.parent for t in tasks if t.parent]
    return list(dict.fromkeys(out))


def point_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, Any]:
    """Rows, positives, AUC (None when the rows hold one class), log loss, mean score."""
    try:
        auc: float | None = metrics.auc(y, p)
    except metrics.OneClassError:
        auc = None
    return {
        "rows": int(y.size),
        "positives": int(y.sum()),
        "auc": auc,
        "logloss": metrics.logloss(y, p) if y.size else None,
        "mean_score": float(p.mean()) if y.size else None,
    }


def task_metrics(
    task: ModelTask, labels: Mapping[str, np.ndarray], scores: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """The metrics of ``task`` on every row, and for a task with a parent label also on the
    parent-positive rows (``given_<parent>``: scored by the conditional output when the model
    has one, else by the task's output)."""
    y = np.asarray(labels[task.label], np.float64)
    result = point_metrics(y, np.asarray(scores[task.output], np.float64))
    if task.parent is not None:
        on = np.asarray(labels[task.parent]) == 1
        p = np.asarray(scores[task.conditional_output or task.output], np.float64)
        result[f"given_{task.parent}"] = point_metrics(y[on], p[on])
    return result
