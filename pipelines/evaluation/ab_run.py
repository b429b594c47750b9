"""``run_ab``, the engine of ``stitchrec ab``: reads the logs (data files, or a server's
prediction log joined with outcomes: ``pipelines.evaluation.logged``) and both score sources,
compares them (``compare.compare_scores``) task by task, estimates off-policy values when the
logs carry propensities, and writes ``ab.json`` / ``ab.html``.

With a ``logged:ARM`` / ``logged:vN`` source the comparison keeps the rows that arm or version
served; when both sources are logged scores of different arms, each is measured on its own
rows: an unpaired comparison of two populations (``unpaired.compare_populations``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.evaluation import logged, report, sources
from pipelines.evaluation.compare import clean_json, compare_scores, off_policy, verdict
from pipelines.evaluation.tasks import ModelTask, select_tasks
from pipelines.evaluation.unpaired import compare_populations


@dataclass
class ABOptions:
    control: str
    treatment: str
    data: list[str]
    schema: str | None = None
    output: str | None = None
    row_id: str | None = None
    id_column: str = "row_id"
    score_column: str = "score"
    group: str | None = None
    k: list[int] = field(default_factory=lambda: [5, 10])
    slices: list[str] = field(default_factory=list)
    resamples: int = 1000
    seed: int = 0
    unit: str = "rows"
    bins: int = 10
    min_slice_rows: int = 100
    max_slice_values: int = 20
    primary: str = "auc"
    action: str | None = None
    propensity: str | None = None
    temperature: float = 1.0
    reward_folds: int = 2
    policies: list[str] = field(default_factory=lambda: ["uniform"])
    max_bad_rows: int = 0
    grpc_timeout_s: float = 60.0
    html: bool = True
    workers: int = 1
    tasks: list[str] = field(default_factory=list)
    data_format: str = "auto"  # auto | files | logs (a prediction log)
    join: str | None = None
    on: str = "request_id"
    model: str | None = None
    include_shadow: bool = False


def _open_sources(opts: ABOptions) -> dict[str, sources.ScoreSource]:
    return {
        m: logged.open_logged(spec)
        or sources.open_source(
            spec,
            id_column=opts.id_column,
            score_column=opts.score_column,
            action=opts.action,
            grpc_timeout_s=opts.grpc_timeout_s,
        )
        for m, spec in (("control", opts.control), ("treatment", opts.treatment))
    }


def _score_logs(
    srcs: Mapping[str, sources.ScoreSource], logs: sources.Logs
) -> dict[str, np.ndarray]:
    """The ``[n]`` scores of the logged rows by each source."""
    scores = {}
    for m, src in srcs.items():
        s = src.scores(logs)
        if s.shape != (logs.n,):
            raise sources.SourceError(
                f"{m} source {src.name} returned {s.size} scores for {logs.n} logged rows"
            )
        scores[m] = s
    return scores


def ab_tasks(opts: ABOptions, srcs: Mapping[str, sources.ScoreSource]) -> list[ModelTask]:
    """The tasks to compare: ``opts.tasks`` (default: every task) of the SavedModel source with
    the most tasks (the treatment on a tie); none when neither model has several tasks and no
    task is named (the models' ``score`` against the logs' label). A gRPC source alone names
    tasks by their label fields, scored by their ``score_<task>`` outputs."""
    declared = [s.tasks for s in (srcs["treatment"], srcs["control"]) if hasattr(s, "tasks")]
    tasks = max(declared, key=len, default=[])
    if not opts.tasks and len(tasks) <= 1:
        return []
    if not tasks:
        return [ModelTask(name=n, label=n, output=f"score_{n}") for n in opts.tasks]
    return select_tasks(tasks, opts.tasks)


def _compare(
    opts: ABOptions, logs: sources.Logs, labels: np.ndarray, scores: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    return compare_scores(
        labels,
        scores["control"],
        scores["treatment"],
        groups=logs.column(opts.group) if opts.group else None,
        slices={f: logs.column(f) for f in opts.slices},
        ks=opts.k,
        resamples=opts.resamples,
        seed=opts.seed,
        unit=opts.unit,
        bins=opts.bins,
        min_slice_rows=opts.min_slice_rows,
        max_slice_values=opts.max_slice_values,
        workers=opts.workers,
    )


def _compare_tasks(
    opts: ABOptions,
    logs: sources.Logs,
    srcs: Mapping[str, sources.ScoreSource],
    tasks: list[ModelTask],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the first task's comparison, ``{task: label, rows, overall metrics, verdict}``)."""
    first: dict[str, Any] = {}
    per_task = {}
    for t in tasks:
        if t.label not in logs.table.column_names:
            raise sources.SourceError(
                f"task {t.name!r} reads label {t.label!r}, which the logs lack; logs fields: "
                f"{logs.table.column_names[:40]}"
            )
        scores = _score_logs({m: s.for_task(t) for m, s in srcs.items()}, logs)
        res = _compare(opts, logs, logs.column(t.label).astype(np.float64), scores)
        per_task[t.name] = {
            "label": t.label,
            "rows": res["rows"],
            "positives": res["positives"],
            "overall": res["overall"],
            "verdict": verdict(res, opts.primary),
        }
        first = first or res
    return first, per_task


def _off_policy_of(
    opts: ABOptions,
    logs: sources.Logs,
    srcs: Mapping[str, sources.ScoreSource],
    log: Callable[[str], None],
) -> tuple[dict[str, Any], float]:
    """``off_policy`` of both sources and the extra ``opts.policies``, and its seconds."""
    if not opts.action:
        raise ValueError("off-policy estimates need --action (the logged action field)")
    policies = dict(srcs)
    for p in opts.policies:
        policies[p] = sources.open_source(p, action=opts.action)
    t0 = time.perf_counter()
    estimates = off_policy(
        logs,
        policies,
        action=opts.action,
        propensity=opts.propensity,
        temperature=opts.temperature,
        reward_folds=opts.reward_folds,
        resamples=max(opts.resamples, 200),
        seed=opts.seed,
        log=log,
    )
    return estimates, time.perf_counter() - t0


def _load_logs(opts: ABOptions) -> sources.Logs:
    """The logged rows: data files, or a prediction log joined with ``opts.join``."""
    if opts.data_format not in ("auto", "files", "logs"):
        raise sources.SourceError(
            f"--data-format {opts.data_format!r}: expected auto, files or logs"
        )
    is_log = opts.data_format == "logs" or (
        opts.data_format == "auto" and logged.is_prediction_log(opts.data)
    )
    if is_log:
        if opts.row_id:
            raise sources.SourceError("--row-id: a prediction log's rows are joined by --on")
        return logged.load_log_data(
            opts.data,
            opts.schema,
            join=opts.join,
            on=opts.on,
            model=opts.model,
            include_shadow=opts.include_shadow,
            sources=[opts.control, opts.treatment],
        )
    for flag, value in (("--join", opts.join), ("--model", opts.model)):
        if value:
            raise sources.SourceError(
                f"{flag} applies to a prediction log, and --data {' '.join(opts.data)} is not "
                f"one (pass --data-format logs if it is)"
            )
    return sources.load_logs(
        opts.data,
        opts.schema,
        row_id=opts.row_id,
        sources=[opts.control, opts.treatment],
        max_bad_rows=opts.max_bad_rows,
    )


def _logged_rows(
    opts: ABOptions, logs: sources.Logs, srcs: Mapping[str, sources.ScoreSource]
) -> tuple[sources.Logs, dict[str, np.ndarray] | None]:
    """With ``logged:`` sources: (the logs cut to the rows they served, None) when the rows are
    shared, else (the logs, each model's rows) for an unpaired comparison."""
    masks = {m: s.rows(logs) for m, s in srcs.items() if isinstance(s, logged.LoggedSource)}
    if not masks:
        return logs, None
    if len(masks) == 1 or np.array_equal(masks["control"], masks["treatment"]):
        return logged.subset(logs, next(iter(masks.values()))), None
    refused = [
        flag
        for flag, used in (
            ("--group", opts.group),
            ("--slice", opts.slices),
            ("--propensity", opts.propensity),
            ("--task", opts.tasks),
        )
        if used
    ]
    if refused:
        raise sources.SourceError(
            f"{opts.control} against {opts.treatment} compares two populations (the rows each "
            f"arm served) and takes no {', '.join(refused)}; replay both models as SavedModels "
            f"on the same logged rows for a paired comparison with them"
        )
    return logs, masks


def _compare_arms(
    opts: ABOptions,
    logs: sources.Logs,
    srcs: Mapping[str, sources.ScoreSource],
    masks: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """The unpaired comparison of two logged arms, each on the rows it served."""
    labels, scores = {}, {}
    for m, src in srcs.items():
        part = logged.subset(logs, masks[m])
        labels[m], scores[m] = part.labels, src.scores(part)
    return compare_populations(
        labels,
        scores,
        resamples=opts.resamples,
        seed=opts.seed,
        bins=opts.bins,
        workers=opts.workers,
    )


def run_ab(opts: ABOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Reads the logs and both sources, compares, writes ab.json / ab.html under ``output``."""
    t0 = time.perf_counter()
    logs = _load_logs(opts)
    log(f"logs: {logs.n:,} rows, {int(logs.labels.sum()):,} clicks from {logs.description}")
    srcs = _open_sources(opts)
    logs, arm_rows = _logged_rows(opts, logs, srcs)
    for name in [opts.group, *opts.slices]:
        if name is not None and name not in logs.table.column_names:
            raise sources.SourceError(
                f"field {name!r} is not in the logs; fields: {logs.table.column_names[:40]}"
            )
    tasks = ab_tasks(opts, srcs)
    if arm_rows is not None:
        result = _compare_arms(opts, logs, srcs, arm_rows)
        t_scores = time.perf_counter() - t0
    elif tasks:
        result, per_task = _compare_tasks(opts, logs, srcs, tasks)
        result["task"] = tasks[0].name
        result["tasks"] = per_task
        t_scores = time.perf_counter() - t0  # scoring and comparing, task by task
    else:
        scores = _score_logs(srcs, logs)
        t_scores = time.perf_counter() - t0
        result = _compare(opts, logs, logs.labels, scores)
    result["control"] = {"source": srcs["control"].name}
    result["treatment"] = {"source": srcs["treatment"].name}
    result["data"] = {
        "files": opts.data,
        "schema": logs.schema.name,
        "bad_rows_skipped": logs.bad_rows,
        **logs.info,
    }
    result["group_field"] = opts.group
    result["verdict"] = verdict(result, opts.primary)
    result["timing_s"]["scoring"] = t_scores
    if opts.propensity:
        result["off_policy"], result["timing_s"]["off_policy"] = _off_policy_of(
            opts, logs, srcs, log
        )
    result["timing_s"]["total"] = time.perf_counter() - t0
    result = clean_json(result)
    if opts.output:
        out = Path(opts.output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ab.json").write_text(json.dumps(result, indent=1))
        if opts.html:
            (out / "ab.html").write_text(report.html(result))
    return result
