"""What a command pays before it does anything: the import of the module each `stitchrec`
command runs, in a fresh process, against the import of TensorFlow itself in the same rounds.

    .venv/bin/python -m bench.startup [--rounds 5] [--commands train,serve,...] [--json FILE]

Each round starts one process per command, which imports the command's module as the
``stitchrec`` script does (``pipelines.loading``: the garbage collector paused while it loads),
and one for the baseline (``import pipelines, tensorflow, tf_keras`` as any Python program
imports them), in turn; a process times its import with ``time.perf_counter`` and lists the
heavy packages it loaded. Printed per
command: the median seconds [min-max] over the rounds, the median of the per-round ratios to the
baseline, and the heavy packages the command loads. A command whose module needs no TensorFlow
(``data``, ``predict``, ``skew``) is far below 1x; a TensorFlow command below 1x loads faster
than a plain import of TensorFlow alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: the command -> the module `stitchrec` imports to run it (pipelines/cli_args*.py handlers)
COMMANDS = {
    "train": "pipelines.run_commands",
    "serve": "serving.server",
    "evaluate": "pipelines.evaluate",
    "ab": "pipelines.ab",
    "daily": "pipelines.daily",
    "data": "pipelines.data_commands",
    "predict": "pipelines.predict",
    "skew": "pipelines.skew",
}
BASELINE = "pipelines, tensorflow, tf_keras"
#: packages reported when a command loads them
HEAVY = ("tensorflow", "sklearn", "scipy.stats", "scipy.optimize", "pandas", "pyarrow",
         "matplotlib", "optuna", "xgboost", "grpc", "aiohttp", "dask")  # fmt: skip

CHILD = """
import json, sys, time
from pipelines.loading import loading_modules, pause_collector_when_loading
if {as_script!r}:
    pause_collector_when_loading()
t = time.perf_counter()
with loading_modules():
    import {modules}
seconds = time.perf_counter() - t
print("STARTUP " + json.dumps({{"seconds": seconds,
      "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def time_import(modules: str, as_script: bool = True) -> dict[str, Any]:
    """``{"seconds", "loaded"}`` of ``import modules`` in a fresh process: as the ``stitchrec``
    script loads a command's module (``pipelines.loading``: the garbage collector paused), or,
    ``as_script=False``, as any Python program imports it."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")
    code = CHILD.format(modules=modules, heavy=HEAVY, as_script=as_script)
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("STARTUP ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"import {modules} failed: {r.stderr[-2000:]}")
    return json.loads(line[len("STARTUP ") :])


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per command (and ``baseline``): median / min / max seconds over the rounds, the median of
    the rounds' ratios to the baseline of the same round, and the heavy packages loaded."""
    out = {}
    for name in rounds[0]:
        secs = [r[name]["seconds"] for r in rounds]
        ratios = [r[name]["seconds"] / r["baseline"]["seconds"] for r in rounds]
        out[name] = {
            "median_s": round(statistics.median(secs), 3),
            "min_s": round(min(secs), 3),
            "max_s": round(max(secs), 3),
            "ratio_to_baseline": round(statistics.median(ratios), 3),
            "loaded": rounds[-1][name]["loaded"],
        }
    return out


def print_table(summary: dict[str, dict[str, Any]], rounds: int) -> None:
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"
    )
    print(f"baseline: import {BASELINE}, as any program; commands as the stitchrec script loads")
    print(f"them (garbage collector paused); {rounds} rounds, one fresh process each per round")
    print("| command | module | seconds, median [min-max] | x baseline | heavy packages loaded |")
    print("|---|---|---|---|---|")
    for name, s in summary.items():
        module = BASELINE if name == "baseline" else COMMANDS[name]
        print(
            f"| {name} | {module} | {s['median_s']:.2f} [{s['min_s']:.2f}-{s['max_s']:.2f}] | "
            f"{s['ratio_to_baseline']:.2f}x | {', '.join(s['loaded'])} |"
        )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="processes per command (default 5)")
    p.add_argument(
        "--commands", default=",".join(COMMANDS), help=f"comma-separated, of {', '.join(COMMANDS)}"
    )
    p.add_argument("--json", type=Path, help="also write the summary here")
    args = p.parse_args(argv)
    args.commands = [c for c in args.commands.split(",") if c]
    unknown = sorted(set(args.commands) - set(COMMANDS))
    if unknown:
        p.error(f"--commands: unknown {unknown}; known: {', '.join(COMMANDS)}")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    rounds = []
    for _ in range(args.rounds):
        one = {"baseline": time_import(BASELINE, as_script=False)}
        for name in args.commands:
            one[name] = time_import(COMMANDS[name])
        rounds.append(one)
    summary = summarize(rounds)
    print_table(summary, args.rounds)
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
