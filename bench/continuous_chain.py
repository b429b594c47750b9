"""A chain of ``stitchrec daily`` days, killed and resumed, and the versions it serves.

    PYTHONPATH=. .venv/bin/python -m bench.continuous_chain [--days 3] [--rows 3000]
        [--kills 5] [--seed 0] [--work DIR] [--keep] [--json FILE]

Checks two targets on ``--days`` synthetic windows (``stitchrec generate --days``, ``--rows``
rows a day) trained by a tiny DNN with ``[train] deterministic = true`` and ``--rule always``
(every day adds one version), each day a real ``python -m pipelines.cli daily`` subprocess:

1. **SIGKILL.** Chain A runs the days uninterrupted into repository A, and records each day's
   duration and when it entered each phase: ``training`` (from the start: TensorFlow loads,
   the window is converted, the run trains), ``export`` (the journal records ``trained``;
   the candidate ``<run>/export/1`` is written), ``scoring`` (the candidate is complete;
   ``run_ab`` against the served version), ``publishing`` (the journal records ``scored``:
   the decision and the copy into the repository, until ``daily_report.json`` is written). Chain B runs the same days into
   repository B and kills the daily process with SIGKILL ``--kills`` times in all, at least
   once a day when there are as many kills as days, its phases cycling over the four (a
   seeded shuffle). A kill's time ``t`` is drawn uniformly in its phase's span of chain A's
   day (so ``t`` lies in [0, the uninterrupted day's duration]); in chain B the process is
   killed ``t - start of that phase in chain A`` seconds after it is seen entering the phase,
   or as soon as it leaves the phase if that comes first (a faster phase than chain A's).
   After each kill the same call runs again; the last run finishes the day. Each day of chain
   B must then have added exactly one complete version, leave no hidden (temporary) or
   incomplete folder in the repository, and score the day's test rows as chain A's version of
   the day does (max abs difference <= 1e-6). Where each kill landed is the journal's steps
   at the moment of the kill, plus the latest training checkpoint, whether the candidate
   export was complete, and any hidden folder the kill left in the repository.
2. **Serving.** Every version of chain A loads and scores the day's test rows in a fresh
   process (``tf.saved_model.load`` + ``serving_default`` on the raw column values), and in
   ``stitchrec serve`` (a subprocess on 127.0.0.1 port 0, a plain export: no generated ops),
   whose scores must equal the fresh process's (max abs difference <= 1e-6); and the op types
   of every version's graphs (functions included) that ``tf.raw_ops`` lacks are listed
   ("none" for stock TensorFlow).

Prints a markdown report; ``--json`` also writes every figure to a file. Exit status 1 when a
check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.continuous_chain_models import fresh_scores, served_scores, unknown_ops
from pipelines.daily_state import JOURNAL_FILE, complete_versions, finished_day
from serving.version_files import COMPLETE, version_state

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("training", "export", "scoring", "publishing")
#: The phases, then the state of a day whose daily_report.json is written (the process exits).
STATES = (*PHASES, "finished")
TOLERANCE = 1e-6
MODEL = "ctr"
#: Paired bootstrap resamples of each day's comparison (``stitchrec daily --bootstrap``).
BOOTSTRAP = 200

CONFIG = """\
[data]
validation_fraction = 0.2

[model]
type = "dnn"
embedding_dim = 4
mlp = [16]

[train]
batch_size = 256
epochs = 1
learning_rate = 0.01
checkpoint_every = 3
log_every = 100
deterministic = true
"""


def _journal_steps(run_dir: Path) -> list[str]:
    try:
        return list(json.loads((run_dir / JOURNAL_FILE).read_text())["steps"])
    except (OSError, ValueError, KeyError):  # not written yet
        return []


def _candidate_complete(run_dir: Path) -> bool:
    out = run_dir / "export" / "1"
    return out.is_dir() and version_state(out)[0] == COMPLETE


def _checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's latest regular checkpoint (``checkpoints/ckpt-<step>.index``)."""
    steps = [int(p.name[5:-6]) for p in (run_dir / "checkpoints").glob("ckpt-*.index")]
    return max(steps, default=None)


def phase(run_dir: Path) -> str:
    """The state a day's run is in (``STATES``), read from its journal, its candidate export
    and its report."""
    if finished_day(run_dir):
        return "finished"
    steps = _journal_steps(run_dir)
    if "trained" not in steps:
        return "training"
    if "scored" in steps:
        return "publishing"
    return "scoring" if _candidate_complete(run_dir) else "export"


class Day:
    """One ``stitchrec daily --rule always`` subprocess of one window."""

    def __init__(self, work: Path, chain: str, window: Path):
        self.run_dir = work / f"runs-{chain}" / window.name
        cmd = [sys.executable, "-m", "pipelines.cli", "daily", "--config", str(work / "daily.toml")]
        cmd += ["--window", str(window), "--runs", str(work / f"runs-{chain}")]
        cmd += ["--repo", str(work / f"models-{chain}" / MODEL), "--rule", "always"]
        cmd += ["--bootstrap", str(BOOTSTRAP)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.log = open(work / f"{chain}-{window.name}.log", "a")  # noqa: SIM115 (closed in wait)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.entered: dict[str, float] = {"training": 0.0}

    def poll(self) -> bool:
        """Records the phase the run is in now; True while the process runs."""
        running = self.proc.poll() is None
        now = phase(self.run_dir)
        for p in STATES[: STATES.index(now) + 1]:
            self.entered.setdefault(p, time.monotonic() - self.t0)
        return running

    def wait(self) -> int:
        while self.poll():
            time.sleep(0.02)
        self.log.close()
        return self.proc.returncode


def run_chain_a(work: Path, windows: list[Path]) -> list[dict[str, Any]]:
    """The uninterrupted chain: per day its duration and phase start times (seconds)."""
    out = []
    for w in windows:
        day = Day(work, "A", w)
        rc = day.wait()
        if rc != 0:
            raise RuntimeError(f"chain A {w.name} exited {rc}: see {day.log.name}")
        out.append({"day": w.name, "seconds": time.monotonic() - day.t0, "entered": day.entered})
    return out


def plan_kills(timing: list[dict[str, Any]], kills: int, seed: int) -> list[dict[str, Any]]:
    """``kills`` kills: days cover every day first, phases cycle over the four (seeded
    shuffles); ``t`` uniform in the phase's span of the uninterrupted day."""
    rng = random.Random(seed)
    n = len(timing)
    days = [i % n for i in range(kills)]
    phases = [PHASES[i % len(PHASES)] for i in range(kills)]
    rng.shuffle(days)
    rng.shuffle(phases)
    plan = []
    for d, p in zip(days, phases, strict=True):
        entered, end = timing[d]["entered"], timing[d]["seconds"]
        start = entered.get(p, end)
        later = [entered[q] for q in STATES[STATES.index(p) + 1 :] if q in entered]
        stop = min(later, default=end)
        plan.append({"day": d, "phase": p, "t": round(rng.uniform(start, stop), 3),
                     "phase_start": start})  # fmt: skip
    return sorted(plan, key=lambda k: (k["day"], PHASES.index(k["phase"]), k["t"]))


def _hidden(repo: Path) -> list[str]:
    """Hidden entries and incomplete version folders of the model folder ``repo``."""
    if not repo.is_dir():
        return []
    done = set(complete_versions(repo).values())
    return sorted(p.name for p in repo.iterdir() if p.name.startswith(".") or p not in done)


def _kill_in(day: Day, kill: dict[str, Any]) -> dict[str, Any]:
    """Waits for ``day`` to enter the kill's phase, then SIGKILLs it after the kill's delay, or
    as soon as it leaves the phase when that comes first (``early``); then reads where the kill
    landed (the journal's steps, the candidate export, the report, the repository)."""
    want = STATES.index(kill["phase"])
    while day.poll() and STATES.index(phase(day.run_dir)) < want:
        time.sleep(0.02)
    seen = time.monotonic()
    delay = kill["t"] - kill["phase_start"]
    early = False
    while day.poll() and time.monotonic() - seen < delay:
        if STATES.index(phase(day.run_dir)) > want:
            early = True
            break
        time.sleep(0.01)
    landed: dict[str, Any] = {"early": early, "killed_at_s": None}  # None: it had finished
    if day.proc.poll() is None:
        day.proc.send_signal(signal.SIGKILL)
        landed["killed_at_s"] = round(time.monotonic() - day.t0, 2)
    day.wait()
    landed |= {
        "steps": _journal_steps(day.run_dir),
        "candidate": _candidate_complete(day.run_dir),
        "report": finished_day(day.run_dir),
        "checkpoint_step": _checkpoint_step(day.run_dir),
        "hidden_after_kill": _hidden(day.run_dir.parents[1] / "models-B" / MODEL),
    }
    return {**kill, **landed}


def run_chain_b(work: Path, windows: list[Path], plan: list[dict[str, Any]]) -> dict[str, Any]:
    """The killed chain: each day's kills, then a run to the end; the repository per day."""
    repo = work / "models-B" / MODEL
    kills, days = [], []
    for i, w in enumerate(windows):
        before = sorted(complete_versions(repo))
        reruns = 0
        for kill in (k for k in plan if k["day"] == i):
            kills.append({"day_name": w.name, **_kill_in(Day(work, "B", w), kill)})
            reruns += 1
        rc = Day(work, "B", w).wait()
        after = sorted(complete_versions(repo))
        days.append({"day": w.name, "rc": rc, "kills": reruns, "versions_before": before,
                     "versions_after": after, "new": sorted(set(after) - set(before)),
                     "hidden": _hidden(repo)})  # fmt: skip
    return {"kills": kills, "days": days}


def compare_chains(
    work: Path, windows: list[Path], days_b: list[dict[str, Any]], fresh_a: list[np.ndarray]
) -> list[float]:
    """Max abs difference of chain B's new version of each day from chain A's version of the
    day (``fresh_a``), on the day's test rows (chain B's versions scored in another fresh
    process); NaN for a day that did not add exactly one version."""
    pairs = [(i, d["new"][0]) for i, d in enumerate(days_b) if len(d["new"]) == 1]
    jobs = [(work / "models-B" / MODEL / str(v), windows[i] / "test") for i, v in pairs]
    diffs = [float("nan")] * len(days_b)
    for (i, _), b in zip(pairs, fresh_scores(jobs) if jobs else [], strict=True):
        diffs[i] = float(np.max(np.abs(fresh_a[i] - b)))
    return diffs


def serving_checks(work: Path, windows: list[Path]) -> dict[str, Any]:
    """Target 2 on chain A's versions: fresh-process scores, served scores, unknown ops."""
    repo = work / "models-A" / MODEL
    versions = sorted(complete_versions(repo))
    jobs = [(repo / str(v), windows[v - 1] / "test") for v in versions]
    t0 = time.monotonic()
    fresh = fresh_scores(jobs)
    fresh_s = time.monotonic() - t0
    t0 = time.monotonic()
    served = served_scores(
        work / "models-A", MODEL, [(v, job[1]) for v, job in zip(versions, jobs, strict=True)]
    )
    served_s = time.monotonic() - t0
    rows = []
    for v, f, s in zip(versions, fresh, served, strict=True):
        ops = unknown_ops(repo / str(v))
        rows.append({"version": v, "rows": int(f.size), "mean_score": float(f.mean()),
                     "served_vs_fresh": float(np.max(np.abs(f - s))), "unknown_ops": ops,
                     "fusion_json": (repo / str(v) / "assets.extra" / "fusion.json").exists()})  # fmt: skip
    return {"versions": rows, "fresh_s": fresh_s, "served_s": served_s, "fresh": fresh}


def generate(work: Path, days: int, rows: int, seed: int) -> list[Path]:
    data = work / "days"
    cmd = [sys.executable, "-m", "pipelines.cli", "generate", "--output", str(data)]
    cmd += ["--days", str(days), "--rows", str(rows), "--seed", str(seed)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    (work / "daily.toml").write_text(CONFIG)
    return sorted(p for p in data.iterdir() if p.is_dir())


def _fmt_steps(k: dict[str, Any]) -> str:
    steps = ", ".join(k["steps"]) or "none"
    if "trained" not in k["steps"]:
        ckpt = k["checkpoint_step"]
        steps += "; no checkpoint" if ckpt is None else f"; checkpoint of step {ckpt}"
    report = "; report written" if k["report"] else ""
    hidden = f"; repo holds {', '.join(k['hidden_after_kill'])}" if k["hidden_after_kill"] else ""
    return f"{steps}; candidate {'complete' if k['candidate'] else 'not complete'}{report}{hidden}"


def report(res: dict[str, Any]) -> str:
    """The markdown report of ``main``'s results."""
    a, b, s = res["chain_a"], res["chain_b"], res["serving"]
    lines = [
        "# Continuous chain: SIGKILL and serving",
        "",
        f"{res['days']} days of {res['rows']:,} rows (`generate --days`, seed {res['seed']}), "
        f"tiny dnn, `deterministic = true`, `--rule always`; {res['kills']} kills "
        f"(seed {res['seed']}); total {res['seconds']:.0f} s, load {res['load']}",
        "",
        "## 1. SIGKILL",
        "",
        "| day | uninterrupted s | export at | scoring at | publishing at | report at |",
        "|---|---|---|---|---|---|",
    ]
    for d in a:
        e = d["entered"]
        at = [f"{e[p]:.1f}" if p in e else "-" for p in STATES[1:]]
        lines.append(f"| {d['day']} | {d['seconds']:.1f} | " + " | ".join(at) + " |")
    lines += [
        "",
        "| kill | day | target phase | t (s, chain A clock) | killed at (s) | journal steps at kill |",
        "|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(b["kills"]):
        at = "missed (finished)" if k["killed_at_s"] is None else f"{k['killed_at_s']:.1f}"
        at += " (on leaving the phase)" if k["early"] and k["killed_at_s"] is not None else ""
        lines.append(
            f"| {i + 1} | {k['day_name']} | {k['phase']} | {k['t']:.1f} | {at} | {_fmt_steps(k)} |"
        )
    lines += [
        "",
        "| day | kills | rc | versions before -> after | new | hidden/partial left | "
        "max abs diff vs chain A | ok |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d, diff, ok in zip(b["days"], res["diff_a_b"], res["day_ok"], strict=True):
        lines.append(
            f"| {d['day']} | {d['kills']} | {d['rc']} | {d['versions_before']} -> "
            f"{d['versions_after']} | {d['new']} | {', '.join(d['hidden']) or 'none'} | "
            f"{diff:.2e} | {'yes' if ok else 'NO'} |"
        )
    lines += [
        "",
        "## 2. Versions of chain A: fresh process, `stitchrec serve`, ops",
        "",
        f"fresh process {s['fresh_s']:.0f} s (one, loading every version), "
        f"served {s['served_s']:.0f} s "
        "(one server, `--version-policy all`)",
        "",
        "| version | test rows | mean score | max abs served - fresh | ops not in tf.raw_ops | "
        "fusion.json |",
        "|---|---|---|---|---|---|",
    ]
    for v in s["versions"]:
        ops = ", ".join(v["unknown_ops"]) or "none"
        lines.append(
            f"| {v['version']} | {v['rows']} | {v['mean_score']:.4f} | "
            f"{v['served_vs_fresh']:.2e} | {ops} | {'yes' if v['fusion_json'] else 'no'} |"
        )
    lines += ["", f"**{'PASS' if res['ok'] else 'FAIL'}** (tolerance {TOLERANCE:g})"]
    return "\n".join(lines)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Both targets in ``work``; returns every figure (``report`` formats them)."""
    t0 = time.monotonic()
    windows = generate(work, args.days, args.rows, args.seed)
    chain_a = run_chain_a(work, windows)
    plan = plan_kills(chain_a, args.kills, args.seed)
    chain_b = run_chain_b(work, windows, plan)
    serving = serving_checks(work, windows)
    diffs = compare_chains(work, windows, chain_b["days"], serving.pop("fresh"))
    day_ok = [
        d["rc"] == 0 and len(d["new"]) == 1 and not d["hidden"] and diff <= TOLERANCE
        for d, diff in zip(chain_b["days"], diffs, strict=True)
    ]
    serve_ok = all(
        v["served_vs_fresh"] <= TOLERANCE and not v["unknown_ops"] for v in serving["versions"]
    )
    return {
        "days": args.days, "rows": args.rows, "kills": args.kills, "seed": args.seed,
        "chain_a": chain_a, "chain_b": chain_b, "serving": serving, "diff_a_b": diffs,
        "day_ok": day_ok, "ok": all(day_ok) and serve_ok and len(serving["versions"]) == args.days,
        "seconds": time.monotonic() - t0, "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.continuous_chain", description=__doc__)
    ap.add_argument("--days", type=int, default=3, help="synthetic daily windows")
    ap.add_argument("--rows", type=int, default=3000, help="rows a day")
    ap.add_argument("--kills", type=int, default=5, help="SIGKILLs over chain B's days")
    ap.add_argument("--seed", type=int, default=0, help="seed of the data and the kill times")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work folder")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    args = ap.parse_args(argv)
    if args.days < 1 or args.kills < 0 or args.rows < 100:
        ap.error("expected --days >= 1, --kills >= 0 and --rows >= 100")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="continuous_chain-"))
    if args.work and work.exists() and any(work.iterdir()):
        ap.error(f"--work {work}: expected an empty or new folder")
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = run(args, work)
    finally:
        if not args.work and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(report(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
