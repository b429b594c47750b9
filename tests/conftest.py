"""Shared fixtures: the real datasets in ../shared/data and a small hand-made Parquet dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.testdata import write_tiny_dataset

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]


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
