"""The tasks of an exported model: records, selection and per-task metrics by hand."""

from __future__ import annotations

import numpy as np
import pytest

from features.schema import FeatureKind, FeatureSpec, Schema
from pipelines.evaluation.tasks import (
    ModelTask,
    TaskError,
    model_tasks,
    needed_labels,
    needed_outputs,
    select_tasks,
    task_metrics,
)
from ranking import metrics


def _schema(*labels: str) -> Schema:
    fields = [FeatureSpec(name="item", kind=FeatureKind.CATEGORICAL)]
    fields += [FeatureSpec(name=n, kind=FeatureKind.LABEL) for n in labels]
    return Schema(name="t", fields=tuple(fields))


def test_single_task_model_has_one_task_named_by_its_label():
    tasks = model_tasks({}, _schema("click"))
    assert tasks == [ModelTask(name="click", label="click", output="score")]


def test_records_name_outputs_and_parents():
    schema = _schema("click", "buy")
    meta = {
        "tasks": [
            {"name": "ctr", "label": "click", "output": "score_ctr"},
            {
                "name": "cvr",
                "label": "buy",
                "output": "score_cvr",
                "parent": "click",
                "conditional_output": "score_cvr_given_click",
            },
        ]
    }
    tasks = model_tasks(meta, schema)
    assert [t.name for t in tasks] == ["ctr", "cvr"]
    assert needed_outputs(tasks) == ["score_ctr", "score_cvr", "score_cvr_given_click"]
    assert needed_labels(tasks) == ["click", "buy"]


def test_a_record_with_an_unknown_label_is_refused():
    with pytest.raises(TaskError, match=r"label 'buy'.*labels: \['click'\]"):
        model_tasks(
            {"tasks": [{"name": "b", "label": "buy", "output": "score_b"}]}, _schema("click")
        )


def test_select_keeps_the_order_given_and_names_unknown_tasks():
    tasks = [ModelTask("a", "a", "score_a"), ModelTask("b", "b", "score_b")]
    assert [t.name for t in select_tasks(tasks, None)] == ["a", "b"]
    assert [t.name for t in select_tasks(tasks, ["b", "a", "b"])] == ["b", "a"]
    with pytest.raises(
        TaskError, match=r"--task c: the model has no such task; its tasks: \['a', 'b'\]"
    ):
        select_tasks(tasks, ["c"])


def test_task_metrics_on_all_rows_and_on_parent_positive_rows():
    click = np.array([1, 1, 1, 0, 0, 0], np.float64)
    buy = np.array([1, 0, 1, 0, 0, 0], np.float64)
    joint = np.array([0.5, 0.2, 0.3, 0.1, 0.4, 0.05])
    given = np.array([0.9, 0.1, 0.6, 0.7, 0.8, 0.2])
    task = ModelTask("buy", "buy", "joint", parent="click", conditional_output="given")
    m = task_metrics(task, {"buy": buy, "click": click}, {"joint": joint, "given": given})
    assert m["rows"] == 6 and m["positives"] == 2
    # positives 0.5, 0.3 against negatives 0.2, 0.1, 0.4, 0.05: 7 of 8 pairs ordered right
    assert m["auc"] == pytest.approx(7 / 8)
    assert m["logloss"] == pytest.approx(metrics.logloss(buy, joint))
    on = m["given_click"]
    # clicked rows: buy 1, 0, 1 scored 0.9, 0.1, 0.6 -> both pairs ordered right
    assert on["rows"] == 3 and on["positives"] == 2 and on["auc"] == pytest.approx(1.0)
    assert on["mean_score"] == pytest.approx((0.9 + 0.1 + 0.6) / 3)


def test_one_class_rows_give_no_auc():
    task = ModelTask("buy", "buy", "s")
    m = task_metrics(task, {"buy": np.zeros(3)}, {"s": np.array([0.1, 0.2, 0.3])})
    assert m["auc"] is None and m["positives"] == 0
