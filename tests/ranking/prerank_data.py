"""Tiny grouped data and models shared by the pre-ranking tests (two-tower, FSCD, cascade)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

import pipelines  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from features.dataset import iter_record_batches, list_parquet
from features.schema import Schema, load_schema
from features.stats import DatasetStats, compute_stats
from tests.testdata import make_tiny_table

# TINY_SCHEMA's fields with groups and costs: user and age are request-side, item, tags and
# price describe the candidate.
GROUPED_SCHEMA = """
name = "tiny_grouped"

[source]
format = "parquet"

[[fields]]
name = "user"
kind = "categorical"
group = "user"
cost = 1.0

[[fields]]
name = "item"
kind = "categorical"
dtype = "int64"
group = "item"
cost = 1.0

[[fields]]
name = "tags"
kind = "multi_categorical"
separator = "|"
group = "item"
cost = 1.0

[[fields]]
name = "price"
kind = "numeric"
transform = "log1p"
group = "item"
cost = 1.0

[[fields]]
name = "age"
kind = "numeric"
num_buckets = 4
group = "context"
cost = 1.0

[[fields]]
name = "label"
kind = "label"
"""


def write_grouped(root: Path, text: str = GROUPED_SCHEMA, rows: int = 5000) -> dict[str, Path]:
    """schema.toml, train/ (80%) and test/ (20%) of ``make_tiny_table(rows)`` under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "schema.toml").write_text(text)
    for d in ("train", "test"):
        (root / d).mkdir(exist_ok=True)
    t = make_tiny_table(rows)
    cut = rows * 4 // 5
    pq.write_table(t.slice(0, cut), root / "train" / "part-00000.parquet")
    pq.write_table(t.slice(cut), root / "test" / "part-00000.parquet")
    return {"schema": root / "schema.toml", "train": root / "train", "test": root / "test"}


def grouped_stats(paths: dict[str, Path]) -> tuple[Schema, DatasetStats]:
    schema = load_schema(paths["schema"])
    files = list_parquet(paths["train"])
    return schema, compute_stats(schema, iter_record_batches(schema, files))
