"""Hand-checkable SavedModels with the export contract (raw features by name -> score, logit).

``logit = bias + 0.5 * price + 1.0 * [item == 3] + 2.0 * [user == "u1"]``, ``score =
sigmoid(logit)``; ``user`` is a user-group feature, ``item`` and ``price`` item-group features.
Versions differ in ``bias`` so a test can tell which version answered.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import tensorflow as tf

SCHEMA = """
name = "linear"

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
name = "price"
kind = "numeric"
group = "item"
"""


def reference_logit(bias: float, user: str, item: int, price: float) -> float:
    return bias + 0.5 * price + 1.0 * (item == 3) + 2.0 * (user == "u1")


def reference_score(bias: float, user: str, item: int, price: float) -> float:
    return 1.0 / (1.0 + math.exp(-reference_logit(bias, user, item, price)))


class _Linear(tf.Module):
    def __init__(self, bias: float):
        super().__init__()
        self.bias = tf.Variable(bias, dtype=tf.float32)

    def _logit(self, user: tf.Tensor, item: tf.Tensor, price: tf.Tensor) -> tf.Tensor:
        return (
            self.bias
            + 0.5 * price
            + tf.cast(tf.equal(item, 3), tf.float32)
            + 2.0 * tf.cast(tf.equal(user, "u1"), tf.float32)
        )

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string, name="user"),
            tf.TensorSpec([None], tf.int64, name="item"),
            tf.TensorSpec([None], tf.float32, name="price"),
        ]
    )
    def serve(self, user: tf.Tensor, item: tf.Tensor, price: tf.Tensor) -> dict[str, tf.Tensor]:
        logit = self._logit(user, item, price)
        return {"score": tf.sigmoid(logit), "logit": logit}

    @tf.function(
        input_signature=[
            tf.TensorSpec([1], tf.string, name="user"),
            tf.TensorSpec([None], tf.int64, name="item"),
            tf.TensorSpec([None], tf.float32, name="price"),
        ]
    )
    def rank(self, user: tf.Tensor, item: tf.Tensor, price: tf.Tensor) -> dict[str, tf.Tensor]:
        n = tf.shape(item)[0]
        logit = self._logit(tf.repeat(user, n), item, price)
        # a cascade would prune here; the test model marks the path with +10 on the logit
        return {"score": tf.sigmoid(logit + 10.0), "logit": logit + 10.0}


def write_linear_model(path: str | Path, bias: float, rank_signature: bool = False) -> Path:
    """Writes the SavedModel (with assets.extra like `stitchrec export`) to ``path``."""
    path = Path(path)
    module = _Linear(bias)
    sigs = {"serving_default": module.serve}
    if rank_signature:
        sigs["rank_request"] = module.rank
    tf.saved_model.save(module, str(path), signatures=sigs)
    extra = path / "assets.extra"
    extra.mkdir(exist_ok=True)
    (extra / "schema.toml").write_text(SCHEMA)
    (extra / "stitchrec.json").write_text(
        json.dumps({"model": "linear", "inputs": ["user", "item", "price"], "bias": bias})
    )
    return path


def copy_version(src: Path, dst_root: Path, version: int) -> Path:
    """Copies a SavedModel folder in as ``dst_root/<version>`` atomically (temp name + rename)."""
    import shutil

    tmp = dst_root / f".tmp-{version}"
    shutil.copytree(src, tmp)
    final = dst_root / str(version)
    tmp.rename(final)
    return final


def features(users: list[str], items: list[int], prices: list[float]) -> dict[str, np.ndarray]:
    return {
        "user": np.array([u.encode() for u in users], dtype=object),
        "item": np.array(items, dtype=np.int64),
        "price": np.array(prices, dtype=np.float32),
    }
