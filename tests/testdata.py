"""Hand-checkable test data shared by the test files (``from tests.testdata import ...``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

TINY_SCHEMA = """
name = "tiny"

[source]
format = "parquet"

[[fields]]
name = "user"
kind = "categorical"
group = "user"

[[fields]]
name = "item"
kind = "categorical"
dtype = "int64"
group = "item"

[[fields]]
name = "tags"
kind = "multi_categorical"
separator = "|"

[[fields]]
name = "price"
kind = "numeric"
transform = "log1p"

[[fields]]
name = "age"
kind = "numeric"
num_buckets = 4

[[fields]]
name = "label"
kind = "label"
"""


def make_tiny_table(rows: int, seed: int = 0) -> pa.Table:
    """A click log with a learnable signal: user u{k} for k < 10 and item 3 click more."""
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 40, rows)
    item = rng.integers(0, 20, rows)
    tags = np.array(["a|b", "b", "", "c|a|d", "d"])[rng.integers(0, 5, rows)]
    price = rng.exponential(20.0, rows).astype(np.float32)
    age = rng.integers(18, 70, rows).astype(np.float32)
    logit = -1.0 + 1.5 * (user < 10) + 1.0 * (item == 3) + 0.5 * np.char.startswith(tags, "c")
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return pa.table(
        {
            "user": pa.array([f"u{u}" for u in user]),
            "item": pa.array(item, pa.int64()),
            "tags": pa.array(tags.tolist()),
            "price": pa.array(price),
            "age": pa.array(age),
            "label": pa.array(label),
        }
    )
