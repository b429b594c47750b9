"""Shared fixtures (the real datasets in ../shared/data, a small hand-made Parquet dataset) and
the order the suite runs in: the slowest files first, so that ``pytest -n 2`` ends with short
tests on both workers instead of one worker finishing a long test alone."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

# Idle BLAS and OpenMP threads sleep at once instead of spinning. Under `-n 2` both cores are
# busy, and a spinning thread takes the core its partner (or the other worker) needs: an
# xgboost fit on 2 threads took 4 s spinning, 0.4 s passive; the scikit-learn fits of
# test_synthetic 34 s, 4 s. The threads and how work is split among them stay the same: only
# where they wait changes, not results. Set before numpy loads OpenBLAS (it reads them then);
# subprocesses inherit them.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # libgomp: xgboost, scikit-learn
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # OpenBLAS (numpy, scipy): 2^4 cycles

import pytest

from tests import shared_runs
from tests.testdata import write_tiny_dataset

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
#: seconds of worker time per test file, measured on a 2-core machine (a fresh checkout's order)
FILE_SECONDS = Path(__file__).with_name("durations.json")
#: the pytest cache key of the last runs' seconds per test id (setup + call + teardown)
CACHE_KEY = "stitchrec/durations"


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs the files with the most seconds first, each file's tests in their own order. The
    seconds of a file: the sum over its collected tests of the last recorded run of each (the
    pytest cache), else its share of the file's entry in durations.json, else 1 s. Every xdist
    worker sorts the same collection by the same numbers, so they agree on the order."""
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    recorded: dict[str, float] = cache.get(CACHE_KEY, {}) if cache else {}
    committed = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    per_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        per_file.setdefault(_file_of(item.nodeid), []).append(item)
    seconds = {}
    for name, tests in per_file.items():
        unknown = committed.get(name, float(len(tests))) / len(tests)  # per test not recorded
        seconds[name] = sum(recorded.get(t.nodeid, unknown) for t in tests)
    order = sorted(per_file, key=lambda name: -seconds[name])  # stable: ties keep their order
    items[:] = [t for name in order for t in per_file[name]]


_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Records each test's seconds for the next run's order (by the controller under xdist,
    which receives every worker's reports)."""
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _DURATIONS:
        return
    recorded = cache.get(CACHE_KEY, {})
    recorded.update({k: round(v, 2) for k, v in _DURATIONS.items()})
    cache.set(CACHE_KEY, recorded)


@pytest.fixture(autouse=True)
def _stitchrec_logger_restored():
    """Puts the ``stitchrec`` logger back as it was after each test. A command run in the test's
    process (``main(["serve", ...])``) configures it as the server does: its handler writes to
    the test's captured stderr, which is closed once the test ends. Left so, every later log
    line in the process would end in ``Logging error ... I/O operation on closed file``."""
    logger = logging.getLogger("stitchrec")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


def shared_data_dir() -> Path:
    """../shared/data beside the checkout, or $STITCHREC_SHARED_DATA."""
    env = os.environ.get("STITCHREC_SHARED_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = shared_data_dir()
    if not (d / "movielens-latest-small" / "ratings.csv").exists():
        pytest.skip(f"real datasets not found in {d}")
    return d


@pytest.fixture()
def tiny_data(tmp_path: Path) -> dict[str, Path]:
    """Schema file plus train (4,000 rows, 2 shards) and test (1,000 rows) Parquet folders."""
    return write_tiny_dataset(tmp_path, train_shards=2)


@pytest.fixture(scope="session")
def shared_tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``tiny_data``'s dataset, written once per session for every xdist worker: read only."""
    return shared_runs.shared_tiny_data(tmp_path_factory)
