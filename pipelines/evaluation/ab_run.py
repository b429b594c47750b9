"""``run_ab``, the engine of ``stitchrec ab``: reads the logs (data files, or a server's
prediction log joined with outcomes: ``pipelines.evaluation.logged``) and both score sources,
compares them (``compare.compare_scores``) task by task, estimates off-policy values when the
logs carry propensities, and writes ``ab.json`` / ``ab.html``.

``check_options`` refuses options that cannot be used before anything is read or scored: a
negative resample count, a policy temperature below 0, 1 or fewer than 0 reward-model folds,
``--resample groups`` without ``--group``, ``--propensity`` without ``--action``, a
``--primary`` metric the comparison does not compute, and an ``--output`` that is a file or a
folder holding files ``ab`` does not write.
Each output file is written to a hidden temporary file beside it and renamed over it, so a
reader never sees a partly written ``ab.json`` or ``ab.html``.

With a ``logged:ARM`` / ``logged:vN`` source the comparison keeps the rows that arm or version
served; when both sources are logged scores of different arms, each is measured on its own
rows: an unpaired comparison of two populations (``unpaired.compare_populations``)."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.errors import UsageError, check_output_path
from pipelines.evaluation import logged, report, sources
from pipelines.evaluation.compare import clean_json, compare_scores, off_policy, verdict
from pipelines.evaluation.tasks import ModelTask, select_tasks
from pipelines.evaluation.unpaired import compare_populations
from pipelines.files import write_text_atomic


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


#: the metrics every comparison computes; ``--group`` adds gauc, ndcg@k and recall@k
ROW_METRICS = ("auc", "logloss", "ece", "calibration_ratio", "mean_score")
#: the files ``run_ab`` writes under ``output``
OUTPUTS = ("ab.json", "ab.html")
#: the hidden temporary file an output is written to before it is renamed over the output
_TEMPORARY = re.compile(r"\.ab\.(json|html)\.tmp-\d+")


def metric_names(opts: ABOptions) -> list[str]:
    """The metrics the comparison of ``opts`` computes (the names ``--primary`` takes)."""
    names = list(ROW_METRICS)
    if opts.group:
        names += ["gauc", *(f"ndcg@{k}" for k in opts.k), *(f"recall@{k}" for k in opts.k)]
    return names


def check_output(output: str | Path) -> None:
    """Raises UsageError when ``output`` cannot hold the report: a file, a path under a file,
    or a folder holding entries other than ``ab``'s own outputs (``OUTPUTS``)."""
    out = Path(output)
    check_output_path(out)
    if not out.is_dir():
        return
    other = sorted(
        p.name for p in out.iterdir() if p.name not in OUTPUTS and not _TEMPORARY.fullmatch(p.name)
    )
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise UsageError(
            f"--output {str(out)!r} holds entries `stitchrec ab` does not write ({shown}): "
            f"expected a new or empty folder, or one holding only an earlier ab's "
            f"{' and '.join(OUTPUTS)} (which are replaced)"
        )


def check_options(opts: ABOptions) -> None:
    """Raises UsageError for options ``run_ab`` cannot use; reads no data, scores nothing."""
    if opts.resamples < 0:
        raise UsageError(
            f"--bootstrap {opts.resamples}: expected 0 (no bootstrap) or a number of resamples"
        )
    if not math.isfinite(opts.temperature) or opts.temperature < 0:
        raise UsageError(
            f"--policy-temperature {opts.temperature}: expected a finite number >= 0 (the "
            f"softmax temperature of a model's policy; 0: greedy)"
        )
    if opts.reward_folds < 0 or opts.reward_folds == 1:
        raise UsageError(
            f"--reward-folds {opts.reward_folds}: expected 0 (no reward model: no DM or DR) or "
            f"at least 2 cross-fitting folds"
        )
    if opts.unit not in ("rows", "groups"):
        raise UsageError(f"--resample {opts.unit!r}: expected rows or groups")
    if opts.unit == "groups" and not opts.group:
        raise UsageError(
            "--resample groups resamples the groups of the --group field, and no --group was "
            "given: pass --group FIELD or --resample rows"
        )
    if opts.propensity and not opts.action:
        raise UsageError(
            f"--propensity {opts.propensity}: off-policy estimates also need the logged action "
            f"field: pass --action FIELD (e.g. item_id)"
        )
    names = metric_names(opts)
    if opts.primary not in names:
        needs_group = "" if opts.group else "; gauc, ndcg@k and recall@k need --group"
        raise UsageError(
            f"--primary {opts.primary!r}: expected a metric this comparison computes: "
            f"{', '.join(names)}{needs_group}"
        )
    if opts.output:
        check_output(opts.output)


def write_outputs(output: str | Path, result: dict[str, Any], html: bool) -> None:
    """``ab.json`` (and with ``html`` ``ab.html``, else an earlier ``ab.html`` is removed, so
    the folder never pairs a new ab.json with an old report) under ``output``."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if _TEMPORARY.fullmatch(p.name):  # left by an ab that was killed while writing
            p.unlink(missing_ok=True)
    write_text_atomic(out / "ab.json", json.dumps(result, indent=1))
    if html:
        write_text_atomic(out / "ab.html", report.html(result))
    else:
        (out / "ab.html").unlink(missing_ok=True)


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
        raise UsageError("off-policy estimates need --action (the logged action field)")
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
        if opts.data_format == "logs":
            problem = logged.log_problem(opts.data)
            if problem:
                raise sources.SourceError(
                    f"--data {' '.join(opts.data)} was read as a prediction log because of "
                    f"--data-format logs, but {problem}: expected a folder that `stitchrec serve "
                    f"--log-dir` wrote, or --data-format auto or files for data files"
                )
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
    """Checks ``opts`` (``check_options``), reads the logs and both sources, compares, and
    writes ab.json / ab.html under ``output``."""
    check_options(opts)
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
        write_outputs(opts.output, result, opts.html)
    return result
