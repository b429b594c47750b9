"""Shared fixtures: the real datasets in ../shared/data and a small hand-made Parquet dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.testdata import TINY_SCHEMA, make_tiny_table

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
    schema = tmp_path / "schema.toml"
    schema.write_text(TINY_SCHEMA)
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    t = make_tiny_table(5000)
    pq.write_table(t.slice(0, 2000), tmp_path / "train" / "part-00000.parquet")
    pq.write_table(t.slice(2000, 2000), tmp_path / "train" / "part-00001.parquet")
    pq.write_table(t.slice(4000), tmp_path / "test" / "part-00000.parquet")
    return {
        "schema": schema,
        "train": tmp_path / "train",
        "test": tmp_path / "test",
        "root": tmp_path,
    }
