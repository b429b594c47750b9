"""Hand-checkable test data shared by the test files (``from tests.testdata import ...``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

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


def write_tiny_dataset(
    root: Path, rows: int = 5000, train_rows: int = 4000, train_shards: int = 1, seed: int = 0
) -> dict[str, Path]:
    """``TINY_SCHEMA`` as ``root/schema.toml`` plus ``root/train`` (the first ``train_rows`` rows
    of ``make_tiny_table(rows, seed)`` in ``train_shards`` equal shards) and ``root/test`` (the
    rest)."""
    root = Path(root)
    (root / "schema.toml").write_text(TINY_SCHEMA)
    (root / "train").mkdir(parents=True)
    (root / "test").mkdir()
    t = make_tiny_table(rows, seed=seed)
    per_shard = train_rows // train_shards
    for i in range(train_shards):
        pq.write_table(t.slice(i * per_shard, per_shard), root / "train" / f"part-{i:05d}.parquet")
    pq.write_table(t.slice(train_rows), root / "test" / "part-00000.parquet")
    return {
        "schema": root / "schema.toml",
        "train": root / "train",
        "test": root / "test",
        "root": root,
    }


#: ``[data]`` lines of a run without a validation split (every training row trains), for tests
#: that count the training rows or steps of the whole training input.
NO_VALIDATION = "validation_fraction = 0.0"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    return repr(value)


def write_run_config(
    path: Path,
    data: dict[str, Path],
    out: Path,
    model: dict[str, Any],
    train: dict[str, Any],
    extra: str = "",
    data_extra: str = "",
) -> Path:
    """A training config over ``data`` (``write_tiny_dataset``'s dict) writing to ``out``:
    ``[model]`` and ``[train]`` from the dicts, ``data_extra`` appended to ``[data]`` and
    ``extra`` (more sections) at the end."""
    path = Path(path)
    path.write_text(run_config_text(data, out, model, train, extra, data_extra))
    return path


def run_config_text(
    data: dict[str, Path],
    out: Path | str,
    model: dict[str, Any],
    train: dict[str, Any],
    extra: str = "",
    data_extra: str = "",
) -> str:
    """The text ``write_run_config`` writes (``out`` relative: against the config's folder)."""

    def section(name: str, values: dict[str, Any]) -> str:
        return f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())

    files = {"schema": data["schema"], "train": [data["train"]], "test": [data["test"]]}
    text = (
        f"output_dir = {_toml(out)}\n\n"
        + section("data", files)
        + (data_extra.strip() + "\n" if data_extra.strip() else "")
        + "\n"
        + section("model", model)
        + "\n"
        + section("train", train)
        + (f"\n{extra.strip()}\n" if extra.strip() else "")
    )
    return text


#: a CSV schema of a label, a categorical and a numeric field (``write_small_csv``'s files)
SMALL_CSV_FIELDS = [
    {"name": "y", "kind": "label"},
    {"name": "a", "kind": "categorical"},
    {"name": "x", "kind": "numeric"},
]


def write_small_csv(path: Path, rows: int, bad: dict[int, str] | None = None) -> Path:
    """A CSV with the header ``y,a,x`` and ``rows`` good rows (row ``i``: label ``(7 i mod 3)
    mod 2``, category ``v{i mod 11}``, number ``i / 2``); ``bad`` replaces lines (1-based line
    number -> text, the header being line 1)."""
    lines = ["y,a,x"] + [f"{(i * 7) % 3 % 2},v{i % 11},{i * 0.5}" for i in range(rows)]
    for line, text in (bad or {}).items():
        lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return path


def write_split_problem(
    root: Path, table: pa.Table, kinds: dict[str, str], train_rows: int
) -> dict[str, Path]:
    """A Parquet dataset of ``table`` (a pyarrow table): its first ``train_rows`` rows in
    ``train/``, the rest in ``test/``, and a schema of the fields ``kinds`` (name -> kind) in
    ``schema.toml``; returns ``root``, ``schema``, ``train`` and ``test``."""
    (root / "train").mkdir(parents=True)
    (root / "test").mkdir()
    pq.write_table(table.slice(0, train_rows), root / "train" / "p.parquet")
    pq.write_table(table.slice(train_rows), root / "test" / "p.parquet")
    fields = "".join(f'[[fields]]\nname = "{n}"\nkind = "{k}"\n' for n, k in kinds.items())
    (root / "schema.toml").write_text(f'name = "split"\n[source]\nformat = "parquet"\n{fields}')
    return {
        "root": root,
        "schema": root / "schema.toml",
        "train": root / "train",
        "test": root / "test",
    }


def write_categorical_problem(root: Path, rows: int = 5000, seed: int = 5) -> dict[str, Path]:
    """``write_split_problem`` of two categorical fields ``a`` and ``b`` (``b`` with rare values)
    and a planted linear logit: ``rows`` rows, four fifths of them for training."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 40, rows)
    b = np.minimum(rng.geometric(0.15, rows), 25)
    wa, wb = rng.normal(0, 0.9, 40), rng.normal(0, 0.6, 26)
    logit = -0.6 + wa[a] + wb[b]
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    table = pa.table(
        {
            "a": pa.array([f"a{v}" for v in a]),
            "b": pa.array([f"b{v}" for v in b]),
            "label": pa.array(label),
        }
    )
    kinds = {"a": "categorical", "b": "categorical", "label": "label"}
    return write_split_problem(root, table, kinds, rows * 4 // 5)
