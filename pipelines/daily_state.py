"""The files of one day of ``stitchrec daily``: the journal of its steps, its report, and the
versions of the model repository it reads and writes.

A day's run folder holds, beside the training run (``pipelines.train``)::

    daily_journal.json   the call (window, repo, rule, metric, the run it continues) and each
                         finished step in order: trained -> scored -> decided -> exported
    daily_report.json    the decision and its figures; written last: a day with it is finished

Both are written atomically (``pipelines.files.write_json_atomic``: a temporary file beside, fsynced, then
``os.replace``), so a kill leaves either the old or the new file, never part of one.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from features.json_files import read_json_object
from pipelines.errors import UsageError
from pipelines.files import write_json_atomic
from pipelines.run.paths import ASSETS_EXTRA
from serving.repository import version_dirs
from serving.version_files import COMPLETE, version_state

JOURNAL_FILE = "daily_journal.json"
_JOURNAL_WHAT = "the journal `stitchrec daily` keeps"
REPORT_FILE = "daily_report.json"
#: The steps of a day, in the order the journal records them.
STEPS = ("trained", "scored", "decided", "exported")
#: The flags a day's run folder belongs to: a rerun must give the same.
CALL_KEYS = ("window", "repo", "rule", "metric")


def clean_temporaries(run_dir: Path) -> None:
    """Deletes the temporary files ``write_json_atomic`` left in ``run_dir`` when killed."""
    for name in (JOURNAL_FILE, REPORT_FILE):
        for tmp in Path(run_dir).glob(f".{name}.tmp-*"):
            if tmp.name != f".{name}.tmp-{os.getpid()}":
                tmp.unlink(missing_ok=True)


class Journal:
    """The journal of one day (``<run>/daily_journal.json``): ``call`` (the flags and the run
    it continues) and ``steps`` (step name -> what it recorded), saved after every step."""

    def __init__(self, run_dir: Path, call: dict[str, Any], steps: dict[str, Any]):
        self.path = Path(run_dir) / JOURNAL_FILE
        self.call = call
        self.steps = steps

    @classmethod
    def open(cls, run_dir: Path, call: dict[str, Any]) -> Journal | None:
        """The day's journal when the run folder has one, checked against ``call`` (the
        ``CALL_KEYS``); None when it has none yet.

        Raises:
          UsageError: the run folder holds the day of another call.
        """
        path = Path(run_dir) / JOURNAL_FILE
        if not path.exists():
            return None
        saved = read_json_object(path, _JOURNAL_WHAT)
        if not isinstance(saved.get("call"), dict) or not isinstance(saved.get("steps"), dict):
            raise UsageError(
                f"{str(path)!r} has no call and steps objects: expected {_JOURNAL_WHAT} (remove "
                "it to run the day from its start)"
            )
        changed = [k for k in CALL_KEYS if saved["call"].get(k) != call.get(k)]
        if changed:
            was = ", ".join(f"--{k} {saved['call'].get(k)}" for k in changed)
            now = ", ".join(f"--{k} {call.get(k)}" for k in changed)
            raise UsageError(
                f"{run_dir} holds the day of {was}, not {now}: rerun it with the same flags, "
                "or give another --runs folder"
            )
        return cls(run_dir, saved["call"], saved["steps"])

    @classmethod
    def start(cls, run_dir: Path, call: dict[str, Any]) -> Journal:
        """A new journal of ``call`` in ``run_dir`` (created), saved before any step."""
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        journal = cls(run_dir, call, {})
        journal.save()
        return journal

    def save(self) -> None:
        write_json_atomic(self.path, {"call": self.call, "steps": self.steps})

    def done(self, step: str) -> bool:
        return step in self.steps

    def record(self, step: str, value: dict[str, Any]) -> dict[str, Any]:
        """Records ``step`` (the next one of ``STEPS``) and saves the journal."""
        expected = STEPS[len(self.steps)]
        if step != expected:
            raise RuntimeError(f"journal {self.path}: step {step!r} recorded before {expected!r}")
        self.steps[step] = value
        self.save()
        return value


def finished_day(run_dir: Path) -> bool:
    """A day whose ``daily_report.json`` is written (its last step)."""
    return (Path(run_dir) / REPORT_FILE).is_file()


def previous_day(runs: Path, run_dir: Path) -> Path | None:
    """The finished day run under ``runs`` (folders ``day-*`` with a ``daily_report.json``)
    whose name sorts last before ``run_dir``'s; None when there is none."""
    if not runs.is_dir():
        return None
    earlier = [
        p
        for p in runs.iterdir()
        if p.is_dir() and p.name.startswith("day-") and p.name < run_dir.name and finished_day(p)
    ]
    return max(earlier, key=lambda p: p.name).resolve() if earlier else None


def complete_versions(repo: Path) -> dict[int, Path]:
    """The complete version folders of the model folder ``repo`` (``version_state``)."""
    return {v: p for v, p in version_dirs(repo).items() if version_state(p)[0] == COMPLETE}


def served_version(repo: Path) -> tuple[int, Path] | None:
    """``(version, folder)`` of the highest complete version of ``repo`` (what a server with the
    default policy serves); None for an empty repository."""
    versions = complete_versions(repo)
    if not versions:
        return None
    top = max(versions)
    return top, versions[top]


def version_of_run(repo: Path, run_dir: Path) -> int | None:
    """The complete version of ``repo`` exported from ``run_dir`` (its
    ``assets.extra/stitchrec.json`` names the run); None when there is none."""
    wanted = str(Path(run_dir).resolve())
    for version, folder in sorted(complete_versions(repo).items()):
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((folder / ASSETS_EXTRA / "stitchrec.json").read_text())
            if meta.get("run") == wanted:
                return version
    return None
