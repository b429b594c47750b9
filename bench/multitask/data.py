"""The bench's datasets: synthetic with sequences and conversion, MovieLens with history, and
the clicked-rows subset a conversion-only model trains on."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from features.dataset import list_parquet
from features.history import HistorySpec, add_history
from features.schema import load_schema
from features.synthetic import write_dataset
from features.synthetic_config import SyntheticConfig


def synthetic(work: Path, rows: int) -> dict[str, Any]:
    """``[data]`` of the synthetic log with ``sequences`` and ``conversion`` (seed 0; 20% test
    rows), written once under ``work``."""
    out = work / "synthetic_data"
    if not (out / "schema.toml").exists():
        config = SyntheticConfig(rows=rows, seed=0, sequences=True, conversion=True)
        write_dataset(config, out, test_fraction=0.2)
    return {
        "schema": str(out / "schema.toml"),
        "train": [str(out / "train")],
        "test": [str(out / "test")],
    }


def movielens(work: Path, data_root: Path) -> dict[str, Any] | None:
    """``[data]`` of MovieLens ratings with each rating's 20 previous movies and genres
    (``features.history``; schema ``movielens_history``, random 80/20 split), or None with a
    message when ``data_root`` has no MovieLens."""
    src = data_root / "movielens-latest-small"
    if not (src / "ratings.csv").exists():
        print(f"movielens: skipped, {src / 'ratings.csv'} does not exist")
        return None
    out = work / "movielens_history.csv"
    if not out.exists():
        work.mkdir(parents=True, exist_ok=True)
        spec = HistorySpec(attributes=src / "movies.csv", attribute="genres")
        add_history(src / "ratings.csv", out, spec)
    return {"schema": "movielens_history", "raw": [str(out)], "test_fraction": 0.2}


def clicked_subset(shards: dict[str, Any], click: str, label: str, out: Path) -> dict:
    """``[data]`` of the rows of ``shards`` with ``click = 1``, trained on ``label`` alone
    (the click label dropped, ``label``'s ``defined_on`` cleared): the classic conversion
    model trained on clicked rows only."""
    if not (out / "schema.toml").exists():
        schema = load_schema(shards["schema"])
        fields = tuple(
            dataclasses.replace(f, defined_on=None) if f.name == label else f
            for f in schema.fields
            if f.name != click
        )
        for split in ("train", "validation", "test"):
            table = pa.concat_tables(pq.read_table(f) for f in list_parquet(shards[split]))
            table = table.filter(pc.equal(table[click], 1)).drop_columns([click])
            (out / split).mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out / split / "part-00000.parquet")
        dataclasses.replace(schema, fields=fields).as_parquet().save(out / "schema.toml")
    return {
        "schema": str(out / "schema.toml"),
        **{s: [str(out / s)] for s in ("train", "validation", "test")},
    }
