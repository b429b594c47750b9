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
from pathlib import Path
from typing import Any

import numpy as np

from features.json_files import read_json_object
from features.schema import Schema, load_schema
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


#: what a SavedModel's ``assets.extra/stitchrec.json`` holds
META_WHAT = "the model metadata `stitchrec export` writes"


def read_model_meta(model_dir: str | Path) -> dict[str, Any]:
    """A SavedModel's ``assets.extra/stitchrec.json`` ({} when it has none). Raises DataError
    when it is not a JSON object."""
    meta_file = Path(model_dir) / "assets.extra" / "stitchrec.json"
    return read_json_object(meta_file, META_WHAT) if meta_file.is_file() else {}


def recorded_tasks(meta: Mapping[str, Any], where: str = "stitchrec.json") -> list[ModelTask]:
    """The task records of ``meta`` (``[]`` without any). Raises TaskError naming ``where``
    when ``tasks`` is not a list of task objects."""
    records = meta.get("tasks") or []
    fields = {f.name for f in dataclasses.fields(ModelTask)}
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and set(r) <= fields and {"name", "label"} <= set(r) for r in records
    ):
        raise TaskError(
            f"{where}: tasks {records!r} are not task records: expected a list of objects with "
            f"name and label (and {', '.join(sorted(fields - {'name', 'label'}))}) in {META_WHAT}"
        )
    return [ModelTask(**r) for r in records]


def model_tasks(
    meta: Mapping[str, Any], schema: Schema, where: str = "stitchrec.json"
) -> list[ModelTask]:
    """The tasks of the export whose ``stitchrec.json`` (``where``) is ``meta`` and whose
    schema (with its labels) is ``schema``, primary task first."""
    records = recorded_tasks(meta, where)
    if not records:
        return [ModelTask(name=schema.label.name, label=schema.label.name)]
    labels = {f.name for f in schema.fields if f.kind == "label"}
    tasks = []
    for task in records:
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


def tasks_of_model(model: Any, conditional: bool = True) -> list[ModelTask]:
    """The tasks of a ``ranking.multitask.MultiTaskModel`` in task order, named by the outputs
    ``task_logits`` gives them (an export's signature outputs, with a ``score_`` prefix);
    ``conditional``: name the conditional output of a task with a parent (an ensemble of
    members has none)."""
    names, tasks = model.task_names, model.tasks
    out = []
    for t, task in enumerate(tasks):
        parent = model.parents[t]
        out.append(
            ModelTask(
                name=task.name,
                label=task.label,
                output=f"score_{task.name}",
                parent=None if parent is None else tasks[parent].label,
                conditional_output=(
                    f"score_{task.name}_given_{names[parent]}"
                    if parent is not None and conditional
                    else None
                ),
            )
        )
    return out


def task_logits(model: Any, features: Mapping[str, Any]) -> dict[str, Any]:
    """A ``MultiTaskModel``'s logits ``[batch]`` by output name without its ``score_`` /
    ``logit_`` prefix: ``<task>`` = the logit of P(label) over every row (for a task with a
    parent, of P(parent) * P(label | parent)), and ``<task>_given_<parent task>`` = the logit
    of P(label | parent) (``MultiTaskModel.serving_logits``)."""
    names, parents = model.task_names, model.parents
    joint, conditional = model.serving_logits(features)
    out = {n: joint[:, t] for t, n in enumerate(names)}
    for t, logit in conditional.items():
        out[f"{names[t]}_given_{names[parents[t]]}"] = logit
    return out


def unloadable_saved_model(model_dir: str | Path, error: BaseException) -> TaskError:
    """The error for a SavedModel folder TensorFlow could not load (``error``, an OSError or a
    ``tf.errors.OpError``): the folder, the first line of TensorFlow's reason, and what was
    expected."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return TaskError(
        f"{model_dir} is not a complete SavedModel ({lines[0].strip()}); expected the folder "
        f"`stitchrec export` writes (saved_model.pb, variables/, assets.extra/)"
    )


def saved_model_tasks(model_dir: str | Path) -> tuple[Schema, list[ModelTask]]:
    """The schema a StitchRec SavedModel takes (labels included) and its tasks, from its
    ``assets.extra/schema.toml`` and ``stitchrec.json``."""
    extra = Path(model_dir) / "assets.extra"
    schema_file = extra / "schema.toml"
    if not schema_file.exists():
        raise FileNotFoundError(f"{model_dir} is not a StitchRec SavedModel: no {schema_file}")
    meta = read_model_meta(model_dir)
    schema = load_schema(schema_file)
    return schema, model_tasks(meta, schema, repr(str(extra / "stitchrec.json")))
