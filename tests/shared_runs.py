"""Training runs shared by the tests of a pytest session, across files and xdist workers.

Many tests train the same tiny model and then check different things of the run. A shared run is
trained once per distinct config text: its folder lives in a cache folder every worker of the
session sees (the parent of the workers' base temporary folders under xdist), named by a digest
of the config text, and a file lock makes the first worker train it while the others wait. Tests
read a shared run without modifying it; a test that trains on, exports or edits a run works on
its own copy (``copy_run``)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testdata import write_tiny_dataset

#: marks a finished cache entry (a worker killed mid-training leaves an entry without it)
_DONE = ".done"


def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's cache folder: beside the xdist workers' base folders (one per session),
    or in the base folder of a run without xdist."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if base.name.startswith("popen-gw") else base
    folder = root / "stitchrec-shared"
    folder.mkdir(exist_ok=True)
    return folder


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached(root: Path, key: str, make: Callable[[Path], None]) -> Path:
    """The folder ``root/<digest of key>``, filled by ``make(folder)`` the first time any worker
    asks for ``key`` (the others wait for it)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    folder = root / digest
    with _locked(root / f"{digest}.lock"):
        if not (folder / _DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / _DONE).touch()
    return folder


def shared_tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``write_tiny_dataset(root, train_shards=2)`` (the ``tiny_data`` fixture's data) written
    once per session; tests must not modify it."""
    folder = cached(
        cache_root(tmp_path_factory),
        "tiny_data train_shards=2",
        lambda d: write_tiny_dataset(_made(d / "data"), train_shards=2),
    )
    root = folder / "data"
    return {
        "schema": root / "schema.toml",
        "train": root / "train",
        "test": root / "test",
        "root": root,
    }


@dataclass(frozen=True)
class SharedRun:
    """A finished training run: its folder, config file, report and log lines."""

    root: Path
    config: Path
    report: dict
    lines: list[str]


def shared_run(tmp_path_factory: pytest.TempPathFactory, config_text: str) -> SharedRun:
    """Trains ``config_text`` (``output_dir = "run"``, other paths absolute) with
    ``pipelines.train.train`` once per session and returns the run."""
    # imported here: tests/conftest.py imports this module, and test files that never train
    # must not pay TensorFlow's import
    from pipelines.config import load_config
    from pipelines.train import train

    def make(folder: Path) -> None:
        config = folder / "config.toml"
        config.write_text(config_text)
        lines: list[str] = []
        report = train(load_config(config), lines.append)
        (folder / "lines.json").write_text(json.dumps(lines))
        (folder / "report.json").write_text(json.dumps(report))

    if 'output_dir = "run"' not in config_text:
        raise ValueError(f'a shared run\'s config has output_dir = "run":\n{config_text}')
    folder = cached(cache_root(tmp_path_factory), config_text, make)
    return SharedRun(
        folder / "run",
        folder / "config.toml",
        json.loads((folder / "report.json").read_text()),
        json.loads((folder / "lines.json").read_text()),
    )


def copy_run(run: SharedRun, to: Path) -> Path:
    """A copy of ``run`` in ``to/run`` with its config as ``to/config.toml`` (its output_dir, the
    relative ``run``, is the copy): the config file to train or export the copy with."""
    to.mkdir(parents=True, exist_ok=True)
    shutil.copytree(run.root, to / "run")
    shutil.copy(run.config, to / "config.toml")
    return to / "config.toml"


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder
