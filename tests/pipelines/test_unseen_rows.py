"""``[train] unseen_row``: the OOV row no training row reaches holds its field's count-weighted
mean row in every checkpoint, and training is otherwise the same as with ``initial``."""

from __future__ import annotations

import csv
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from features.stats import DatasetStats
from pipelines.config import ConfigError, load_config
from pipelines.run.paths import RunPaths
from pipelines.run.unseen import UnseenRows, weighted_mean_row
from pipelines.train import train


def _model(tables: list[dict]) -> types.SimpleNamespace:
    collection = EmbeddingCollection(tables)
    collection({t["name"]: tf.constant([1], tf.int64) for t in tables})  # builds the tables
    return types.SimpleNamespace(embedding=collection)


def test_weighted_mean_row_by_hand():
    table = tf.constant([[9.0, 9.0], [1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    got = weighted_mean_row(table, tf.constant([1, 1, 2]))
    np.testing.assert_allclose(got.numpy(), [(1 + 3 + 10) / 4, (2 + 4 + 12) / 4])


def test_only_full_tables_whose_oov_row_has_no_training_row_are_filled():
    model = _model(
        [
            {"name": "user", "num_rows": 4, "dim": 2},
            {"name": "rare", "num_rows": 3, "dim": 2},  # rare values trained row 0
            {
                "name": "hashed",
                "num_rows": 4,
                "dim": 2,
                "method": "hashing",
                "options": {"buckets": 4},
            },
            {"name": "uncounted", "num_rows": 3, "dim": 2},
        ]
    )
    table = model.embedding.layers_by_field["user"].table
    table.assign([[9.0, 9.0], [1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    rare = model.embedding.layers_by_field["rare"].table.numpy()
    counts = {"user": [0, 1, 1, 2], "rare": [5, 1, 1], "hashed": [0, 1, 1, 1]}
    unseen = UnseenRows.of(model, counts, "mean")
    assert unseen.fields == ["user"] and unseen.describe() == {"mean_fields": ["user"]}
    unseen.fill()
    np.testing.assert_allclose(table.numpy()[0], [3.5, 4.5])
    np.testing.assert_allclose(table.numpy()[1:], [[1, 2], [3, 4], [5, 6]])  # rows 1.. kept
    np.testing.assert_array_equal(model.embedding.layers_by_field["rare"].table.numpy(), rare)
    assert UnseenRows.of(model, counts, "initial").fields == []
    assert UnseenRows.of(types.SimpleNamespace(embedding=None), counts, "mean").fields == []
    with pytest.raises(ValueError, match=r"unseen_row must be one of \['mean', 'initial'\]"):
        UnseenRows.of(model, counts, "zero")


def test_the_config_names_the_choices(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('output_dir = "r"\n[data]\nschema = "movielens"\ntrain = ["x"]\n')
    with pytest.raises(ConfigError, match=r"\[train\] unseen_row 'zero' is not one of"):
        load_config(path, ["train.unseen_row=zero"])


@pytest.fixture(scope="module")
def by_user(shared_data, tmp_path_factory) -> Path:
    """MovieLens ratings of users 1-40 to train on, of users 41-60 to test: every test user is
    new to the model."""
    ratings = shared_data / "movielens-latest-small" / "ratings.csv"
    out = tmp_path_factory.mktemp("by_user")
    (out / "movies.csv").symlink_to(ratings.parent / "movies.csv")
    with ratings.open() as f:
        rows = list(csv.reader(f))
    for name, users in (("train.csv", range(1, 41)), ("test.csv", range(41, 61))):
        with (out / name).open("w", newline="") as f:
            csv.writer(f).writerows([rows[0], *[r for r in rows[1:] if int(r[0]) in users]])
    return out


def _run(data: Path, out: Path, unseen_row: str) -> tuple[dict, RunPaths]:
    (out.parent / f"{out.name}.toml").write_text(
        f'output_dir = "{out}"\n[data]\nschema = "movielens"\n'
        f'train = ["{data / "train.csv"}"]\ntest = ["{data / "test.csv"}"]\n'
        '[model]\ntype = "dcn_v2"\nembedding_dim = 4\nmlp = [16]\ncross_layers = 1\n'
        f'[train]\nepochs = 2\ndeterministic = true\nunseen_row = "{unseen_row}"\n'
    )
    report = train(load_config(out.parent / f"{out.name}.toml"), log=lambda _: None)
    return report, RunPaths(out)


def _variables(checkpoint: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(checkpoint)
    return {
        k: reader.get_tensor(k)
        for k in reader.get_variable_to_shape_map()
        if k.startswith("model/") and "OPTIMIZER_SLOT" not in k
    }


def _user_table(variables: dict[str, np.ndarray]) -> np.ndarray:
    (name,) = [k for k, v in variables.items() if v.shape == (41, 4)]  # 40 users + OOV
    return variables[name]


def test_checkpoints_hold_the_mean_row_and_training_is_unchanged(by_user, tmp_path):
    mean, paths = _run(by_user, tmp_path / "mean", "mean")
    initial, initial_paths = _run(by_user, tmp_path / "initial", "initial")
    assert "userId" in mean["unseen_row"]["mean_fields"]
    assert initial["unseen_row"] == {"setting": "initial", "mean_fields": []}
    assert mean["steps"] == initial["steps"]
    counts = np.array(DatasetStats.load(paths.stats)["userId"].vocab_counts, np.float64)
    for folder in (paths.checkpoints, paths.checkpoints / "best"):
        table = _user_table(_variables(tf.train.latest_checkpoint(str(folder))))
        expected = (counts[:, None] * table[1:]).sum(0) / counts.sum()
        np.testing.assert_allclose(table[0], expected, rtol=1e-5)
    # the last regular checkpoints differ in the filled rows only: the steps were the same
    a = _variables(tf.train.latest_checkpoint(str(paths.checkpoints)))
    b = _variables(tf.train.latest_checkpoint(str(initial_paths.checkpoints)))
    assert a.keys() == b.keys()
    filled = 0
    for k in a:
        if a[k].ndim == 2 and not np.array_equal(a[k][0], b[k][0]):
            filled += 1
            np.testing.assert_array_equal(a[k][1:], b[k][1:])
        else:
            np.testing.assert_array_equal(a[k], b[k])
    assert filled >= len(mean["unseen_row"]["mean_fields"])
    # every test user is new: what the model scores them with differs
    assert mean["test"]["auc"] != initial["test"]["auc"]
