"""``stitchrec tune``: a hyper-parameter search (Optuna) in which every trial is a real
``stitchrec train`` run, compared on its validation split only (docs/tuning.md).

    stitchrec tune --config FILE --trials N [--timeout S] [--output DIR] [--space FILE]
                   [--set KEY=VALUE]...

The search space is the config's ``[tune]`` section (or a ``--space`` TOML file, or the
default space; ``pipelines.tune_space``)::

    [tune]
    learning_rate = {low = 1e-4, high = 1e-1, log = true}
    model.mlp = {choices = [[64], [128, 64]]}

The tune folder (``--output``; default ``<output_dir>-tune``, and with ``--output`` the config
may leave ``output_dir`` out: ``best_config.toml`` then trains into ``<tune dir>/best``)::

    <tune dir>/
      study.journal     the Optuna study (JournalStorage): the same command again continues it
      trial-<n>/        trial n's training run folder, with trial.toml (its config) and train.log
      study.json        every trial: number, params, state, value, wall seconds, steps
      best_config.toml  a plain training config holding the best trial's parameters
      search.svg        trial number vs value, with the best-so-far line

A trial's value is its run's best validation metric (``report["selection"]["best"]``, AUC
maximized or log loss minimized per ``[train] select_metric``). While a run trains, its
``history.jsonl`` is polled and each validation evaluation reported to the trial; the median
pruner stops (kills) a run whose curve is below the median of the earlier trials'. The tuner
reads no test metric.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.config import (
    ConfigError,
    PipelineConfig,
    config_from_dict,
    parse_override,
    read_toml,
    set_path,
)
from pipelines.errors import UsageError, check_output_path
from pipelines.evaluation import svg
from pipelines.run.paths import RunPaths
from pipelines.tune_base import check_study_base
from pipelines.tune_space import Param, check_study_space, default_space, parse_space

try:  # an optional dependency (the `tune` extra): without it the command says how to get it
    import optuna
except ImportError:
    optuna = None

_print = functools.partial(print, flush=True)

NO_OPTUNA = "stitchrec tune needs optuna: pip install 'stitchrec[tune]'"
STUDY_NAME = "stitchrec-tune"
JOURNAL = "study.journal"
TRIAL_CONFIG = "trial.toml"
TRIAL_LOG = "train.log"
HISTORY = "history.jsonl"  # a training run's validation evaluations (pipelines.run.selection)
POLL_SECONDS = 0.5


class TrialRunError(RuntimeError):
    """A trial's training run failed (the trial is recorded as FAIL and the study goes on)."""


@dataclasses.dataclass
class Tuning:
    """The base training config (``[tune]`` stripped, ``--set`` applied), its space, the folder."""

    data: dict[str, Any]  # the config as TOML data, relative paths as written
    base_dir: Path  # the config file's folder (relative paths resolve against it)
    where: str
    base: PipelineConfig
    space: list[Param]
    root: Path
    flag: str = "--output"  # what named ``root``: --output, or the config's output_dir

    @property
    def metric(self) -> str:
        return self.base.train.select_metric

    @property
    def direction(self) -> str:
        return "maximize" if self.metric == "auc" else "minimize"

    def config(self, values: Mapping[str, Any], output_dir: str) -> PipelineConfig:
        """The plain training config of ``values`` (dotted key -> value) writing to ``output_dir``."""
        data = copy.deepcopy(self.data)
        for key, value in values.items():
            set_path(data, key, value)
        data["output_dir"] = output_dir
        return config_from_dict(data, base_dir=self.base_dir, where=self.where)


def load_tuning(
    config: str | Path,
    overrides: Sequence[str] = (),
    space_file: str | Path | None = None,
    output: str | Path | None = None,
) -> Tuning:
    """Reads the config, strips its ``[tune]`` section, applies the overrides, and checks the
    space: every bound and choice must make a valid training config."""
    path = Path(config)
    where = f"config file {str(path)!r}"
    data = read_toml(path, "config file")
    table = data.pop("tune", None)
    for text in overrides:
        set_path(data, *parse_override(text))
    if output and "output_dir" not in data:  # best_config.toml then trains into the tune folder
        data["output_dir"] = str(Path(output).resolve() / "best")
    base_dir = path.resolve().parent
    base = config_from_dict(data, base_dir=base_dir, where=where)
    if base.preranking is not None:
        raise ConfigError(
            f"{where}: stitchrec tune searches ranking runs; [preranking] is not supported"
        )
    if base.train.optimizer == "lbfgs":
        raise ConfigError(
            f"{where} [train] optimizer = 'lbfgs' chooses its C on the validation split itself "
            "and has no learning rate, batch or epochs to search: train it with stitchrec train"
        )
    if base.train.optimizer == "auto":  # a trial that sets learning_rate would train with Adam
        raise ConfigError(
            f"{where} [model] type = 'lr' fits exactly by default ([train] optimizer = 'auto' "
            "chooses its C on the validation split itself): train it with stitchrec train, or "
            "set [train] optimizer = 'ftrl' to search FTRL's learning rate and batch size"
        )
    if base.data.validation_fraction == 0 and not base.data.validation:
        raise ConfigError(
            f"{where} [data]: stitchrec tune compares trials on a validation split: set "
            "validation_fraction > 0 or give validation files"
        )
    if space_file is not None:
        sf = Path(space_file)
        table = read_toml(sf, "space file")
        table = table["tune"] if set(table) == {"tune"} else table
        space = parse_space(table, f"space file {str(sf)!r}")
    elif table is not None:
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: [tune] must be a table")
        space = parse_space(table, f"{where} [tune]")
    else:
        space = default_space(base.model.type)
    root = Path(output).resolve() if output else Path(base.output_dir + "-tune")
    flag = "--output" if output else f"the tune folder (output_dir + '-tune' of {where})"
    tuning = Tuning(data, base_dir, where, base, space, root, flag)
    for p in space:
        for value in p.extremes():
            try:
                tuning.config({p.key: value}, str(root / "check"))
            except ConfigError as e:
                raise ConfigError(
                    f"search space {p.key} = {value!r} is not a valid config: {e}"
                ) from None
    return tuning


def _history(path: Path) -> list[dict[str, Any]]:
    """The validation evaluations written so far (the run replaces the file atomically)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def watch_run(
    trial: Any,
    command: Sequence[str],
    run_dir: Path,
    metric: str,
    poll_seconds: float = POLL_SECONDS,
) -> None:
    """Runs ``command`` (a training run into ``run_dir``, output in ``train.log``) to its end.

    Every ``poll_seconds`` the run's ``history.jsonl`` is read and each new validation
    evaluation reported to the trial, its number (1, 2, ...) as the step; when the pruner says
    so the run is killed and ``optuna.TrialPruned`` raised. A run that exits with a non-zero
    status raises ``TrialRunError``."""
    history, log_path = run_dir / HISTORY, run_dir / TRIAL_LOG
    with log_path.open("ab") as log:
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT)
    reported = 0
    try:
        while True:
            finished = proc.poll() is not None
            for entry in _history(history)[reported:]:
                reported += 1
                trial.report(float(entry[metric]), reported)
                if not finished and trial.should_prune():
                    proc.kill()
                    proc.wait()
                    trial.set_user_attr("steps", int(entry["step"]))
                    raise optuna.TrialPruned(
                        f"validation evaluation {reported} (step {entry['step']}): {metric} "
                        f"{float(entry[metric]):.4f} is worse than the median of the trials"
                    )
            if finished:
                break
            time.sleep(poll_seconds)
    finally:
        if proc.poll() is None:  # an exception (Ctrl-C) in the tuner ends its run too
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        raise TrialRunError(
            f"trial {trial.number}: stitchrec train exited with status {proc.returncode} "
            f"({lines[-1] if lines else 'no output'}); see {log_path}"
        )


def run_value(run_dir: Path, metric: str) -> tuple[float, int]:
    """The finished run's best validation ``metric`` and its step count, from its report."""
    report = json.loads(RunPaths(run_dir).report.read_text())
    best = (report.get("selection") or {}).get("best")
    if not best:
        raise TrialRunError(f"{run_dir}: the run has no validation selection in its report")
    return float(best[metric]), int(report["steps"])


class Objective:
    """One trial: its parameters sampled, its training config written, its run watched."""

    def __init__(self, tuning: Tuning, poll_seconds: float = POLL_SECONDS) -> None:
        self.tuning, self.poll_seconds = tuning, poll_seconds

    def __call__(self, trial: Any) -> float:
        t = self.tuning
        # a trial re-running one a killed tuner left unfinished resumes that trial's run folder
        run_dir = t.root / f"trial-{trial.user_attrs.get('reruns', trial.number)}"
        values = {p.key: p.suggest(trial) for p in t.space}
        cfg = t.config(values, str(run_dir))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / TRIAL_CONFIG).write_text(cfg.to_toml())
        trial.set_user_attr("run", str(run_dir))
        command = [sys.executable, "-m", "pipelines.cli", "train"]
        command += ["--config", str(run_dir / TRIAL_CONFIG), "--output", str(run_dir)]
        t0 = time.time()
        try:
            watch_run(trial, command, run_dir, t.metric, self.poll_seconds)
        except KeyboardInterrupt:  # Optuna records it as failed: the next call re-runs it
            trial.set_user_attr("interrupted", True)
            raise
        finally:
            trial.set_user_attr("wall_seconds", round(time.time() - t0, 2))
        value, steps = run_value(run_dir, t.metric)
        trial.set_user_attr("steps", steps)
        return value


def drop_torn_line(journal: Path) -> bool:
    """Cuts a last line without its newline off the study journal (a record whose write a kill
    interrupted: it never took effect, and a continued study re-queues its trial); True when it
    cut one."""
    if not journal.is_file():
        return False
    data = journal.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with journal.open("r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
    return True


def _first_bad_line(journal: Path) -> int:
    """The 1-based number of the journal's first line that is not JSON (0: none)."""
    with journal.open("rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                json.loads(line)
            except ValueError:
                return number
    return 0


def check_tune_folder(root: Path, flag: str = "--output") -> None:
    """Raises UsageError unless the tune folder ``root`` is new, an empty folder, or an earlier
    tune folder (one holding ``study.journal``, which the command continues)."""
    check_output_path(root, flag)
    if not root.is_dir() or (root / JOURNAL).is_file():
        return
    other = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    if other:
        shown = ", ".join(repr(n) for n in other[:3]) + (", ..." if len(other) > 3 else "")
        raise UsageError(
            f"{flag} {str(root)!r} holds files that are not a `stitchrec tune` folder ({shown}; "
            f"no {JOURNAL}): expected a new or empty folder, or an earlier tune folder to "
            "continue"
        )


def open_study(tuning: Tuning) -> Any:
    """The study of the tune folder (created, or loaded to continue), with its TPE sampler
    seeded by ``[train] seed`` plus the trials it holds and the median pruner.

    Raises UsageError for a tune folder that is a file or holds files of something else
    (``check_tune_folder``), ConfigError for a study of another metric direction, search space
    or base config."""
    check_tune_folder(tuning.root, tuning.flag)
    tuning.root.mkdir(parents=True, exist_ok=True)
    journal = tuning.root / JOURNAL
    drop_torn_line(journal)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    try:
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(journal))
        )
        study = optuna.create_study(
            storage=storage,
            study_name=STUDY_NAME,
            direction=tuning.direction,
            pruner=pruner,
            load_if_exists=True,
        )
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{journal}: line {_first_bad_line(journal)} of the study journal is not an Optuna "
            f"record ({e.msg}); expected the file `stitchrec tune` writes: restore it, or use "
            "another --output"
        ) from None
    if study.direction.name.lower() != tuning.direction:
        raise ConfigError(
            f"{tuning.root} holds a study that {study.direction.name.lower()}s its metric; this "
            f"config's select_metric = {tuning.metric!r} {tuning.direction}s: use another --output"
        )
    check_study_space(study, tuning.space, journal)
    check_study_base(study, tuning.base, tuning.space, journal)
    # seeded by the trials it holds: a continued study samples new points, not the first ones
    study.sampler = optuna.samplers.TPESampler(seed=tuning.base.train.seed + len(study.trials))
    return study


def finished_trials(study: Any) -> int:
    """Re-queues the trials a killed tuner left running (marked failed, their parameters queued
    again, their run folders resumed) and returns the trials counted toward ``--trials``."""
    interrupted = set(study.user_attrs.get("interrupted", []))
    state = optuna.trial.TrialState
    for t in study.get_trials(deepcopy=False):
        stopped = t.state == state.FAIL and t.user_attrs.get("interrupted")
        if t.number in interrupted or not (t.state == state.RUNNING or stopped):
            continue
        if t.state == state.RUNNING:
            study.tell(t.number, state=state.FAIL)
        study.enqueue_trial(t.params, user_attrs={"reruns": t.user_attrs.get("reruns", t.number)})
        interrupted.add(t.number)
    study.set_user_attr("interrupted", sorted(interrupted))
    done = (state.COMPLETE, state.PRUNED, state.FAIL)
    return sum(1 for t in study.trials if t.state in done and t.number not in interrupted)


def _params(tuning: Tuning, stored: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's parameters as config values (choices' labels decoded)."""
    space = {p.key: p for p in tuning.space}
    out = {}
    for key, value in stored.items():
        p = space.get(key)
        out[key] = p.decode(value) if p is not None and value in p.labels() else value
    return out


def trial_records(study: Any, tuning: Tuning) -> list[dict[str, Any]]:
    """``study.json``'s trials: number, state, value, params, wall seconds, steps, run folder,
    and the validation values reported (one per evaluation)."""
    records = []
    for t in study.trials:
        wall = t.user_attrs.get("wall_seconds")
        if wall is None and t.datetime_start and t.datetime_complete:
            wall = round((t.datetime_complete - t.datetime_start).total_seconds(), 2)
        record = {
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "params": _params(tuning, t.params),
            "wall_seconds": wall,
            "steps": t.user_attrs.get("steps"),
            "run": t.user_attrs.get("run"),
            "evaluations": [v for _, v in sorted(t.intermediate_values.items())],
        }
        if "reruns" in t.user_attrs:
            record["reruns"] = t.user_attrs["reruns"]
        records.append(record)
    return records


def search_svg(records: Sequence[Mapping[str, Any]], metric: str, direction: str) -> str:
    """Trial number vs value (completed trials; pruned ones at their last evaluation) and the
    best-so-far line, as SVG text."""
    done = [(r["number"], r["value"]) for r in records if r["state"] == "COMPLETE"]
    pruned = [
        (r["number"], r["evaluations"][-1])
        for r in records
        if r["state"] == "PRUNED" and r["evaluations"]
    ]
    ys = [v for _, v in done + pruned]
    lo, hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 1.0
    last = max((r["number"] for r in records), default=0)
    f = svg.Frame(560, 360, 64, (-0.5, last + 0.5), (lo - pad, hi + pad))
    f.axes(f"stitchrec tune: validation {metric} per trial", "trial", f"validation {metric}")
    better = max if direction == "maximize" else min
    steps, best = [], None
    for number, value in done:
        if best is not None:
            steps.append(f"{f.px(number):.1f},{f.py(best):.1f}")
        best = value if best is None else better(best, value)
        steps.append(f"{f.px(number):.1f},{f.py(best):.1f}")
    if steps:
        steps.append(f"{f.px(last + 0.5):.1f},{f.py(best):.1f}")
        f.add(f"<polyline points='{' '.join(steps)}' fill='none' stroke='{svg.PALETTE[1]}'/>")
    for (x, y), color in [*((p, svg.PALETTE[0]) for p in done), *((p, "#999999") for p in pruned)]:
        f.add(f"<circle cx='{f.px(x):.1f}' cy='{f.py(y):.1f}' r='4' fill='{color}'/>")
    f.legend(
        [
            ("completed trial", svg.PALETTE[0]),
            ("pruned (last evaluation)", "#999999"),
            ("best so far", svg.PALETTE[1]),
        ]
    )
    return f.text()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return json.dumps(v) if isinstance(v, list) else str(v)


def table(records: Sequence[Mapping[str, Any]], metric: str) -> str:
    """The console table of the trials."""
    lines = [f"{'trial':>5}  {'state':<8}  {metric:>8}  {'seconds':>8}  {'steps':>6}  params"]
    for r in records:
        value = f"{r['value']:.4f}" if r["value"] is not None else "-"
        wall = f"{r['wall_seconds']:.1f}" if r["wall_seconds"] is not None else "-"
        steps = str(r["steps"]) if r["steps"] is not None else "-"
        params = " ".join(f"{k}={_fmt(v)}" for k, v in r["params"].items())
        lines.append(
            f"{r['number']:>5}  {r['state']:<8}  {value:>8}  {wall:>8}  {steps:>6}  {params}"
        )
    return "\n".join(lines)


def write_outputs(study: Any, tuning: Tuning) -> dict[str, Any]:
    """``study.json``, ``search.svg`` and (once a trial completed) ``best_config.toml``;
    returns what ``study.json`` holds."""
    records = trial_records(study, tuning)
    complete = [r for r in records if r["state"] == "COMPLETE"]
    best = None
    if complete:
        b = study.best_trial
        best = {"number": b.number, "value": b.value, "params": _params(tuning, b.params)}
        cfg = tuning.config(best["params"], tuning.base.output_dir)
        header = (
            f"# stitchrec tune {tuning.root}: trial {b.number}, validation {tuning.metric} "
            f"{b.value:.6g}\n"
        )
        (tuning.root / "best_config.toml").write_text(header + cfg.to_toml())
    study_json = {
        "metric": tuning.metric,
        "direction": tuning.direction,
        "space": {p.key: p.describe() for p in tuning.space},
        "best": best,
        "trials": records,
    }
    (tuning.root / "study.json").write_text(json.dumps(study_json, indent=1))
    (tuning.root / "search.svg").write_text(search_svg(records, tuning.metric, tuning.direction))
    return study_json


def _log_trial(tuning: Tuning, study: Any, trial: Any) -> None:
    """The line printed as each trial ends."""
    value = f"{trial.value:.4f}" if trial.value is not None else "-"
    wall = trial.user_attrs.get("wall_seconds", 0.0)
    params = " ".join(f"{k}={_fmt(v)}" for k, v in _params(tuning, trial.params).items())
    _print(
        f"trial {trial.number} {trial.state.name}: validation {tuning.metric} {value} "
        f"in {wall:.1f} s, {trial.user_attrs.get('steps', '-')} steps: {params}"
    )


def cmd_tune(args: argparse.Namespace) -> int:
    if optuna is None:
        raise UsageError(NO_OPTUNA)
    tuning = load_tuning(args.config, args.set, args.space, args.output)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(tuning)
    done = finished_trials(study)
    todo = max(args.trials - done, 0)
    _print(
        f"tune {tuning.root}: {done} of {args.trials} trial(s) done, {todo} to run; validation "
        f"{tuning.metric} ({tuning.direction}) over {', '.join(p.key for p in tuning.space)}"
    )
    if todo:
        study.optimize(
            Objective(tuning),
            n_trials=todo,
            timeout=args.timeout,
            catch=(TrialRunError,),
            callbacks=[functools.partial(_log_trial, tuning)],
        )
    result = write_outputs(study, tuning)
    _print(table(result["trials"], tuning.metric))
    if result["best"] is None:
        _print(f"no trial completed; see the train.log of the trials in {tuning.root}")
        return 1
    b = result["best"]
    _print(
        f"best: trial {b['number']}, validation {tuning.metric} {b['value']:.4f}; "
        f"config: {tuning.root / 'best_config.toml'}"
    )
    return 0
