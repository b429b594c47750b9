"""``stitchrec daily``: one day of continuous training. A window of data -> a training run that
continues the previous day's -> scored against the served version -> exported as the next
version of the model repository when the decision rule accepts it (docs/continuous.md).

    stitchrec daily --config FILE --window DATA --repo MODELS/NAME [--runs DIR]
                    [--rule not_worse|better|always] [--metric auc|logloss]
                    [--bootstrap N] [--seed S] [--set KEY=VALUE]...

``DATA`` is one window in the layout of ``stitchrec generate``: ``schema.toml``, ``train/`` and
``test/`` Parquet shards (and optionally ``validation/``). The day's run is
``<runs>/day-<window name>`` (a window name that starts with ``day-`` is the run's name as it
is); ``--runs`` defaults to the config's ``output_dir``. The config's ``[model]`` and
``[train]`` train it, its ``[data]`` split settings (``validation_fraction``, ``split_seed``,
...) apply to the window's files, which replace the config's.

Steps, each recorded in ``<run>/daily_journal.json`` once done (``pipelines.daily_state``):

1. ``trained``: ``pipelines.train.train`` on the window's training rows (validation split and
   early stopping as the config says), starting from the latest finished day run under
   ``--runs`` before this one (``[train] continue_from``); the first day trains from scratch.
2. ``scored``: the candidate is exported into ``<run>/export/1`` (``export_run``) and compared
   with the repository's served version (its highest complete version) on the window's
   ``test/`` rows by ``run_ab``: both metrics, the paired difference candidate - served and
   its 95% bootstrap interval.
3. ``decided``: the rule. ``not_worse`` (default): accepted unless the interval lies wholly on
   the worse side of 0 (below 0 for AUC, above 0 for log loss); ``better``: accepted only when
   it lies wholly on the better side; ``always``: accepted. An empty repository accepts.
4. ``exported``: an accepted candidate is copied into the next version ``<repo>/<N>/``
   (``serving.version_files.atomic_dir``: hidden folder, marker, rename), its
   ``assets.extra/stitchrec.json`` naming the run and window.

``<run>/daily_report.json`` (decision, figures, version) is written last. The command is
idempotent: a rerun of a finished day changes nothing; a rerun after a kill skips the recorded
steps, resumes training from its checkpoints, and exports only when the repository holds no
complete version of this run, so a day adds at most one version.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

from pipelines.config import PipelineConfig, load_config
from pipelines.daily_state import (
    JOURNAL_FILE,
    REPORT_FILE,
    Journal,
    clean_temporaries,
    finished_day,
    previous_day,
    served_version,
    version_of_run,
)
from pipelines.errors import UsageError, check_output_path
from pipelines.evaluation.ab_run import ABOptions, run_ab
from pipelines.export import export_run, next_version
from pipelines.files import write_json_atomic
from pipelines.run.paths import ASSETS_EXTRA, Log, RunPaths
from pipelines.train import train
from serving.traffic import TRAFFIC_FILE
from serving.version_files import COMPLETE, atomic_dir, version_state

RULES = ("not_worse", "better", "always")
METRICS = ("auc", "logloss")
#: +1: higher is better, -1: lower is better.
_DIRECTION = {"auc": 1, "logloss": -1}


@dataclasses.dataclass(frozen=True)
class DailyOptions:
    """One call of ``stitchrec daily`` (the flags, module docstring).

    Attributes:
      config: the pipeline config TOML.
      window: the window's folder (``schema.toml``, ``train/``, ``test/``).
      repo: the model folder of the repository (``<repo>/<version>/``).
      runs: the folder of the day runs (None: the config's ``output_dir``).
      rule: ``not_worse``, ``better`` or ``always``.
      metric: ``auc`` or ``logloss``: the metric the rule reads.
      resamples: paired bootstrap resamples of the comparison (>= 1).
      seed: seed of the bootstrap.
      overrides: ``KEY=VALUE`` config overrides (``--set``).
    """

    config: str
    window: str
    repo: str
    runs: str | None = None
    rule: str = "not_worse"
    metric: str = "auc"
    resamples: int = 1000
    seed: int = 0
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise UsageError(f"daily --rule {self.rule!r}: expected one of {', '.join(RULES)}")
        if self.metric not in METRICS:
            raise UsageError(
                f"daily --metric {self.metric!r}: expected one of {', '.join(METRICS)}"
            )
        if self.resamples < 1:
            raise UsageError(f"daily --bootstrap {self.resamples}: expected resamples >= 1")


def run_name(window: Path) -> str:
    """``day-<window name>``; a window named ``day-...`` gives its own name."""
    name = Path(window).resolve().name
    return name if name.startswith("day-") else f"day-{name}"


def is_shard_window(window: Path) -> bool:
    """True for a window of shards (``schema.toml`` and a ``train/`` folder of Parquet
    shards, as `stitchrec generate` writes); False for a folder of raw files that the config's
    schema reads (as `stitchrec windows` writes)."""
    return (window / "schema.toml").is_file() and any((window / "train").glob("*.parquet"))


#: The files a folder of windows holds beside them (``generate --days``, ``windows``).
WINDOWS_REPORTS = ("days.json", "windows.json")


def check_window(window: Path) -> None:
    """Raises UsageError unless ``window`` is a folder of shards with a ``test/`` folder of
    Parquet shards too, or a folder holding at least one raw file; a folder of windows (the
    output of ``generate --days`` or ``windows``, or a folder whose sub-folders are windows of
    shards) is not one window."""
    if not window.is_dir():
        raise UsageError(f"daily --window {str(window)!r}: expected a folder of one window")
    if not is_shard_window(window) and not (window / "schema.toml").is_file():
        subs = sorted(p.name for p in window.iterdir() if p.is_dir() and is_shard_window(p))
        report = [n for n in WINDOWS_REPORTS if (window / n).is_file()]
        if subs or report:
            if not subs:  # the windows of `stitchrec windows`: folders of raw files
                subs = sorted(
                    p.name for p in window.iterdir() if p.is_dir() and not p.name.startswith(".")
                )
            shown = ", ".join(subs[:3]) + (", ..." if len(subs) > 3 else "")
            why = "no schema.toml, train/ and test/ shards or raw files at its top" + (
                f"; it holds {report[0]}, the report of its windows" if report else ""
            )
            raise UsageError(
                f"daily --window {str(window)!r} is a folder of windows, not one window ({why}); "
                f"its sub-folders {shown} look like windows: give one of them, e.g. --window "
                f"{str(window / subs[0]) if subs else '<window>'}"
            )
    if (window / "schema.toml").is_file() and not is_shard_window(window):
        raise UsageError(
            f"daily --window {str(window)!r}: no Parquet shards in train/ (a window of shards "
            "holds schema.toml, train/ and test/, as `stitchrec generate` writes)"
        )
    if not is_shard_window(window):
        if not any(p.is_file() and not p.name.startswith(".") for p in window.rglob("*")):
            raise UsageError(
                f"daily --window {str(window)!r}: no files (a window holds schema.toml, train/ "
                "and test/ shards as `stitchrec generate` writes, or raw files of the config's "
                "schema as `stitchrec windows` writes)"
            )
        return
    if not any((window / "test").glob("*.parquet")):
        raise UsageError(
            f"daily --window {str(window)!r}: no Parquet shards in test/ (a window of shards "
            "holds schema.toml, train/ and test/, as `stitchrec generate` writes)"
        )


def _window_overrides(window: Path) -> list[str]:
    """``--set`` lines that make a config read ``window``'s files: its shards and schema, or its
    raw files with the config's schema (test and validation rows split off by the config's
    ``test_fraction`` and ``validation_fraction``)."""
    q = json.dumps
    if not is_shard_window(window):
        return [f"data.raw={q([str(window)])}", "data.train=[]", "data.test=[]"]
    validation = [str(window / "validation")] if (window / "validation").is_dir() else []
    return [
        f"data.schema={q(str(window / 'schema.toml'))}",
        "data.raw=[]",
        f"data.train={q([str(window / 'train')])}",
        f"data.test={q([str(window / 'test')])}",
        f"data.validation={q(validation)}",
    ]


def _not_owned(folder: Path, own: Any) -> list[str]:
    """The names in ``folder`` (hidden ones aside) for which ``own(path)`` is False."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".") and not own(p))


def _refuse(flag: str, folder: Path, names: list[str], expected: str) -> None:
    shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    raise UsageError(
        f"daily {flag} {str(folder)!r} holds files that are not {expected[0]} ({shown}): "
        f"expected {expected[1]}"
    )


def check_repo(repo: Path) -> None:
    """Raises UsageError unless ``repo`` is new, an empty folder, or a model folder: numbered
    version folders and its ``traffic.toml`` (``serving.repository``, ``serving.traffic``;
    hidden names, a writer's temporary folders, aside)."""
    check_output_path(repo, "--repo")

    def own(p: Path) -> bool:
        version = p.is_dir() and p.name.isdigit() and int(p.name) > 0
        return version or (p.is_file() and p.name == TRAFFIC_FILE)

    other = _not_owned(repo, own)
    if other:
        _refuse(
            "--repo",
            repo,
            other,
            (
                "versions of a model",
                "a new or empty folder, or a model folder of a repository (MODELS/NAME: "
                f"numbered version folders 1/, 2/, ... and its {TRAFFIC_FILE})",
            ),
        )


def check_runs(runs: Path, run_dir: Path, flag: str) -> None:
    """Raises UsageError unless ``runs`` is new, an empty folder, or a folder of day runs
    (``day-*`` folders holding ``daily_journal.json``, or empty), and the day's ``run_dir``
    is new, empty or a day run."""
    check_output_path(runs, flag)
    check_output_path(run_dir, flag)

    def own(p: Path) -> bool:
        return (
            p.is_dir()
            and p.name.startswith("day-")
            and ((p / JOURNAL_FILE).is_file() or not _not_owned(p, lambda _: False))
        )

    other = _not_owned(runs, own)
    if other:
        _refuse(
            flag,
            runs,
            other,
            (
                "day runs of `stitchrec daily`",
                "a new or empty folder, or the folder of earlier day runs (day-*/ folders "
                f"with {JOURNAL_FILE})",
            ),
        )


def day_config(opts: DailyOptions, run_dir: Path | None, previous: Path | None) -> PipelineConfig:
    """The config of the day: ``opts.config`` and its overrides reading the window's files,
    trained into ``run_dir`` (None: the config's ``output_dir``) continuing ``previous`` (None:
    from scratch)."""
    window = Path(opts.window).resolve()
    lines = [*opts.overrides, *_window_overrides(window)]
    if run_dir is not None:
        lines.append(f"output_dir={json.dumps(str(run_dir))}")
    elif opts.runs is not None:  # the config may leave output_dir out
        lines.append(f"output_dir={json.dumps(str(Path(opts.runs).resolve()))}")
    cfg = load_config(opts.config, lines)
    # The day continues the previous day's run by value (pipelines.run.continuation), so every
    # day trains stochastically: ``auto`` (a linear model's default) is FTRL, the first day too.
    optimizer = "ftrl" if cfg.train.optimizer == "auto" else cfg.train.optimizer
    train = dataclasses.replace(
        cfg.train, optimizer=optimizer, continue_from=str(previous) if previous else ""
    )
    return dataclasses.replace(cfg, train=train)


def run_daily(opts: DailyOptions, log: Log = print) -> dict[str, Any]:
    """Runs (or finishes) the day of ``opts``; returns ``daily_report.json``'s content."""
    window = Path(opts.window).resolve()
    check_window(window)
    repo = Path(opts.repo).resolve()
    check_repo(repo)
    base = day_config(opts, None, None)  # the config and overrides checked before any write
    if base.train.optimizer == "lbfgs":
        raise UsageError(
            f"daily --config {opts.config}: [train] optimizer = 'lbfgs' fits each run exactly "
            "and cannot continue the day before; choose a stochastic optimizer (ftrl for "
            "type = 'lr'), or train each window on its own with stitchrec train"
        )
    runs = Path(opts.runs).resolve() if opts.runs else Path(base.output_dir)
    run_dir = runs / run_name(window)
    check_runs(runs, run_dir, "--runs" if opts.runs else f"(output_dir of {opts.config})")
    call = {"window": str(window), "repo": str(repo), "rule": opts.rule, "metric": opts.metric}
    journal = Journal.open(run_dir, call)
    if journal is not None and finished_day(run_dir):
        report = json.loads((run_dir / REPORT_FILE).read_text())
        log(f"{run_dir.name} is finished: {_summary(report)}")
        return report
    clean_temporaries(run_dir)
    if journal is None:
        previous = previous_day(runs, run_dir)
        journal = Journal.start(run_dir, {**call, "continue_from": previous and str(previous)})
    previous = Path(journal.call["continue_from"]) if journal.call["continue_from"] else None
    log(f"{run_dir.name}: " + (f"continues {previous}" if previous else "trains from scratch"))
    cfg = day_config(opts, run_dir, previous)
    if not journal.done("trained"):
        report = train(cfg, log=log)
        journal.record("trained", {"steps": report["steps"], "test": report["test"]})
    candidate = _export_candidate(run_dir, log)
    if not journal.done("scored"):
        journal.record("scored", score_day(opts, test_files(run_dir), repo, candidate, log))
    scored = journal.steps["scored"]
    if not journal.done("decided"):
        journal.record("decided", decide(opts.rule, opts.metric, scored["difference"]))
    if not journal.done("exported"):
        version = None
        if journal.steps["decided"]["accepted"]:
            version = publish(candidate, repo, run_dir, window, log)
        journal.record("exported", {"version": version})
    report = day_report(journal, run_dir)
    write_json_atomic(run_dir / REPORT_FILE, report)
    log(f"{run_dir.name}: {_summary(report)}")
    return report


def _export_candidate(run_dir: Path, log: Log) -> Path:
    """``<run>/export/1``: the run's selected checkpoint as a SavedModel (written once)."""
    out = RunPaths(run_dir).exports / "1"
    if not (out.is_dir() and version_state(out)[0] == COMPLETE):
        export_run(run_dir, out)
        log(f"candidate exported to {out}")
    return out


def test_files(run_dir: Path) -> list[str]:
    """The day's test shards: those the run's training scored (``train_report.json``)."""
    report = json.loads(RunPaths(run_dir).report.read_text())
    return list(report["test_files"])


def score_day(
    opts: DailyOptions, test: list[str], repo: Path, candidate: Path, log: Log
) -> dict[str, Any]:
    """The ``scored`` step: ``run_ab`` of the served version (control) and the candidate
    (treatment) on the day's ``test`` shards (their schema is the candidate's); with an empty
    repository, the candidate against uniform scores (its metric only, no difference)."""
    served = served_version(repo)
    result = run_ab(
        ABOptions(
            control=str(served[1]) if served else "uniform",
            treatment=str(candidate),
            data=test,
            schema=None,
            resamples=opts.resamples,
            seed=opts.seed,
            primary=opts.metric,
        ),
        log=log,
    )
    figures = result["overall"]["metrics"][opts.metric]
    keys = ("delta", "ci_low", "ci_high", "p_value", "verdict", "resamples")
    return {
        "rows": result["rows"],
        "positives": result["positives"],
        "served": (
            {"version": served[0], "path": str(served[1]), opts.metric: figures["control"]}
            if served
            else None
        ),
        "candidate": {"path": str(candidate), opts.metric: figures["treatment"]},
        "difference": {k: figures[k] for k in keys} if served else None,
    }


def decide(rule: str, metric: str, difference: dict[str, Any] | None) -> dict[str, Any]:
    """The ``decided`` step: ``{"accepted": bool, "reason": str}`` of ``rule`` on the paired
    difference candidate - served of ``metric`` and its interval ``[ci_low, ci_high]``
    (None: no served version, accepted)."""
    if difference is None:
        return {"accepted": True, "reason": "first version: the repository has no complete one"}
    low, high = difference["ci_low"], difference["ci_high"]
    known = all(isinstance(v, int | float) and math.isfinite(v) for v in (low, high))
    up = _DIRECTION[metric]
    worse = known and (high < 0 if up > 0 else low > 0)
    better = known and (low > 0 if up > 0 else high < 0)
    interval = f"95% interval of candidate - served {metric} {_interval(low, high)}"
    if rule == "always":
        return {"accepted": True, "reason": f"rule always; {interval}"}
    if rule == "not_worse":
        verb = "lies" if worse else "does not lie"
        return {
            "accepted": not worse,
            "reason": f"rule not_worse: {interval} {verb} wholly on the worse side of 0",
        }
    verb = "lies" if better else "does not lie"
    return {
        "accepted": better,
        "reason": f"rule better: {interval} {verb} wholly on the better side of 0",
    }


def _interval(low: Any, high: Any) -> str:
    def f(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, int | float) else str(v)

    return f"[{f(low)}, {f(high)}]"


def publish(candidate: Path, repo: Path, run_dir: Path, window: Path, log: Log) -> int:
    """Copies ``candidate`` into the next version of ``repo`` (``atomic_dir``), unless a complete
    version of ``run_dir`` is there already (a rerun after a kill); returns its version."""
    done = version_of_run(repo, run_dir)
    if done is not None:
        log(f"version {done} of {repo} is this run's: not exported again")
        return done
    repo.mkdir(parents=True, exist_ok=True)
    final = next_version(repo)
    with atomic_dir(final) as tmp:
        shutil.copytree(candidate, tmp)
        meta_file = tmp / ASSETS_EXTRA / "stitchrec.json"
        meta = json.loads(meta_file.read_text())
        meta["daily"] = {"window": str(window), "run": str(run_dir.resolve())}
        meta_file.write_text(json.dumps(meta, indent=1))
    log(f"exported version {final.name} to {final}")
    return int(final.name)


def day_report(journal: Journal, run_dir: Path) -> dict[str, Any]:
    """``daily_report.json`` from the journal's steps."""
    call, steps = journal.call, journal.steps
    scored, decided, exported = steps["scored"], steps["decided"], steps["exported"]
    return {
        "run": str(run_dir),
        "window": call["window"],
        "repo": call["repo"],
        "continued_from": call["continue_from"],
        "rule": call["rule"],
        "metric": call["metric"],
        "decision": "exported" if decided["accepted"] else "rejected",
        "reason": decided["reason"],
        "version": exported["version"],
        "rows": scored["rows"],
        "positives": scored["positives"],
        "served": scored["served"],
        "candidate": scored["candidate"],
        "difference": scored["difference"],
        "train": steps["trained"],
    }


def _summary(report: dict[str, Any]) -> str:
    m = report["metric"]
    cand = f"candidate {m} {report['candidate'][m]:.4f}"
    served = f", served {m} {report['served'][m]:.4f}" if report["served"] else ""
    where = f" as version {report['version']}" if report["version"] is not None else ""
    return f"{report['decision']}{where} ({cand}{served}; {report['reason']})"


def cmd_daily(args: argparse.Namespace) -> int:
    """``stitchrec daily`` (flags in ``pipelines.cli_args_daily``)."""
    opts = DailyOptions(
        config=args.config,
        window=args.window,
        repo=args.repo,
        runs=args.runs,
        rule=args.rule,
        metric=args.metric,
        resamples=args.bootstrap,
        seed=args.seed,
        overrides=tuple(args.set),
    )
    run_daily(opts, log=lambda m: print(m, flush=True))
    return 0
