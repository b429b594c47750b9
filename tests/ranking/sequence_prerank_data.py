"""A tiny synthetic dataset with a behaviour sequence, grouped for pre-ranking and cascades.

``features.synthetic`` with ``sequences=True``: the history ``hist_items`` (sharing the table of
``item``) and ``hist_cats`` (aligned, sharing ``item_cat``) are user fields, ``item`` and
``item_cat`` item fields; ``C1`` is a user field, ``C2`` / ``C3`` item fields and ``I1`` a
context field. Every model input costs 1.0.
"""

from __future__ import annotations

from pathlib import Path

import pipelines  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from features.schema import load_schema
from features.synthetic import write_dataset
from features.synthetic_config import SyntheticConfig

GROUPS = {
    "C1": "user",
    "C2": "item",
    "C3": "item",
    "I1": "context",
    "item": "item",
    "item_cat": "item",
    "hist_items": "user",
    "hist_cats": "user",
}
REQUEST = ("I1", "C1", "hist_items", "hist_cats")
ITEMS = ("C2", "C3", "item", "item_cat")


def write_sequence_data(root: Path, rows: int = 600, seed: int = 0) -> dict[str, Path]:
    """The dataset under ``root`` (train/, test/, schema.toml with groups and costs)."""
    config = SyntheticConfig(
        rows=rows,
        num_numeric=1,
        num_categorical=3,
        vocab_sizes=(10, 20, 5),
        n_single=1,
        n_pairs=1,
        n_triples=0,
        n_numeric_effects=1,
        seed=seed,
        sequences=True,
        num_clusters=3,
        items_per_cluster=10,
        hist_max_len=5,
    )
    write_dataset(config, root)
    schema = load_schema(root / "schema.toml")
    for name, group in GROUPS.items():
        schema = schema.replace_field(name, group=group)
    schema.save(root / "schema.toml")
    text = (root / "schema.toml").read_text()
    for name in GROUPS:  # FSCD reads an explicit cost per input (the TOML omits the default)
        text = text.replace(f'name = "{name}"\n', f'name = "{name}"\ncost = 1.0\n')
    (root / "schema.toml").write_text(text)
    return {"schema": root / "schema.toml", "train": root / "train", "test": root / "test"}
