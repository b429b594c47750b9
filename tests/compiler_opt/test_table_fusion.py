"""compiler_opt.table_fusion: horizontally fused tables against the per-field layers.

Outputs bit-identical to ``EmbeddingCollection`` (full and hashing, single-valued and ragged
mean/sum, out-of-range ids) eager and in a ``tf.function``; one IndexedSlices per group table;
training steps (SGD, Adagrad, Adam) equal to the plain layers' per field; each row block
initialised by its field's initializer; the checkpoint mapping both ways (a plain checkpoint
restored into the fused layer, the fused layer written as the plain collection); config and
SavedModel round trips; errors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf  # tests/conftest.py sets TF_USE_LEGACY_KERAS first

from compiler_opt import FuseSpec, fuse, table_fusion
from compiler_opt.table_fusion import (
    HorizontalEmbeddingCollection,
    load_unfused,
    to_unfused,
)
from embeddings.collection import EmbeddingCollection
from embeddings.forms import Embedded
from embeddings.table_config import TableConfig
from ranking.blocks import MLP, ConcatInteraction
from ranking.models import RankingModel

TABLES = [
    {"name": "a", "num_rows": 50, "dim": 4},
    {"name": "tags", "num_rows": 40, "dim": 4},  # ragged, mean
    {"name": "tags_sum", "num_rows": 30, "dim": 4, "combiner": "sum"},  # ragged, sum
    {
        "name": "hash",
        "num_rows": 1000,
        "dim": 4,
        "method": "hashing",
        "options": {"buckets": 17, "seed": 3},
    },
    {
        "name": "hash_closed",
        "num_rows": 100,
        "dim": 4,
        "method": "hashing",
        "options": {"buckets": 9, "open_vocabulary": False},
    },
    {"name": "wide_a", "num_rows": 20, "dim": 8},
    {"name": "wide_b", "num_rows": 25, "dim": 8, "method": "hashing", "options": {"buckets": 6}},
    {"name": "lonely", "num_rows": 12, "dim": 3},  # the only field of dim 3
    {"name": "penalized", "num_rows": 15, "dim": 4, "l2": 0.01},
    {"name": "qr", "num_rows": 60, "dim": 4, "method": "qr", "options": {"collisions": 4}},
]
B = 6


def make_ids(seed: int = 0) -> dict[str, tf.Tensor | tf.RaggedTensor]:
    rng = np.random.default_rng(seed)
    ids: dict[str, tf.Tensor | tf.RaggedTensor] = {}
    for t in TABLES:
        n = t["num_rows"]
        if t["name"].startswith("tags"):
            lengths = [2, 0, 3, 1, 4, 2]  # an empty row
            values = rng.integers(-3, n + 5, sum(lengths))  # out-of-range ids too
            ids[t["name"]] = tf.RaggedTensor.from_row_lengths(
                tf.constant(values, tf.int64), tf.constant(lengths, tf.int64)
            )
        else:
            values = rng.integers(0, n, B)
            values[0], values[1] = -1, n + 100  # the OOV path / open vocabulary
            ids[t["name"]] = tf.constant(values, tf.int64)
    return ids


def plain_and_fused() -> tuple[EmbeddingCollection, HorizontalEmbeddingCollection]:
    tf.keras.utils.set_random_seed(1)
    plain = EmbeddingCollection(TABLES, name="embedding")
    plain(make_ids())
    return plain, HorizontalEmbeddingCollection.from_collection(plain)


def assert_same(a: Embedded | dict, b: Embedded | dict) -> None:
    a, b = (x.fields() if isinstance(x, Embedded) else x for x in (a, b))
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k].numpy(), b[k].numpy(), err_msg=k)


def test_groups_mapping_and_uncovered_fields():
    plain, fused = plain_and_fused()
    assert set(fused.uncovered) == {"lonely", "penalized", "qr"}
    assert "dim 3" in fused.uncovered["lonely"]
    assert "l2" in fused.uncovered["penalized"] and "'qr'" in fused.uncovered["qr"]
    mapping = fused.checkpoint_mapping()
    assert mapping == {
        "a": ("fused_table_d4", 0, 50),
        "tags": ("fused_table_d4", 50, 90),
        "tags_sum": ("fused_table_d4", 90, 120),
        "hash": ("fused_table_d4", 120, 137),  # buckets, not num_rows
        "hash_closed": ("fused_table_d4", 137, 146),
        "wide_a": ("fused_table_d8", 0, 20),
        "wide_b": ("fused_table_d8", 20, 26),
    }
    shapes = {k: tuple(v.shape) for k, v in fused.group_tables.items()}
    assert shapes == {"fused_table_d4": (146, 4), "fused_table_d8": (26, 8)}
    # 2 group tables + the 3 uncovered layers' tables (QR: two) are all it holds
    assert len(fused.trainable_variables) == 2 + 1 + 1 + 2
    assert sorted(fused.layers_by_field) == ["lonely", "penalized", "qr"]
    assert fused.layers_by_field["qr"] is plain.layers_by_field["qr"]  # shared
    for name, (var, start, end) in mapping.items():
        np.testing.assert_array_equal(
            fused.group_tables[var][start:end].numpy(), plain.layers_by_field[name].table.numpy()
        )
    info = json.loads(json.dumps(fused.mapping_json()))
    assert info["fields"]["hash"] == ["fused_table_d4", 120, 137]
    assert info["groups"]["fused_table_d8"]["fields"] == ["wide_a", "wide_b"]
    assert info["groups"]["fused_table_d4"]["variable"] == "embedding/fused_table_d4:0"
    assert fused.memory_bytes()["train"] == plain.memory_bytes()["train"]
    assert fused.fused_fields == [
        "a",
        "tags",
        "tags_sum",
        "hash",
        "hash_closed",
        "wide_a",
        "wide_b",
    ]


def test_outputs_bit_identical_eager_and_in_a_function():
    plain, fused = plain_and_fused()
    ids = make_ids(5)
    assert_same(plain(ids), fused(ids))
    assert_same(tf.function(plain)(ids), tf.function(fused)(ids))
    # hand check: row o_f + rule_f(i) of the group table; an OOV id reads the field's row 0
    t = fused.group_tables["fused_table_d4"].numpy()
    a = fused(ids).fields()["a"].numpy()
    np.testing.assert_array_equal(a[0], t[0])  # id -1 -> row 0 of field a
    np.testing.assert_array_equal(a[2], t[int(ids["a"][2])])
    tags_sum = fused(ids).fields()["tags_sum"].numpy()
    np.testing.assert_array_equal(tags_sum[1], np.zeros(4))  # the empty row
    bucket = plain.layers_by_field["hash"].bucket(ids["hash"]).numpy()
    np.testing.assert_array_equal(fused(ids).fields()["hash"].numpy(), t[120 + bucket])
    # the L2 penalty of the uncovered field is still added
    assert len(fused.losses) == 1


def test_one_indexed_slices_per_group_table():
    _, fused = plain_and_fused()
    ids = make_ids(2)
    with tf.GradientTape() as tape:
        out = fused(ids).fields()
        loss = tf.add_n([tf.reduce_sum(v * (i + 1)) for i, v in enumerate(out.values())])
    grads = tape.gradient(loss, list(fused.group_tables.values()))
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)
    n_ids = sum(int(tf.size(ids[f])) for f in ["a", "tags", "tags_sum", "hash", "hash_closed"])
    assert int(grads[0].indices.shape[0]) == n_ids  # one gather: every id of the group


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
def test_training_steps_equal_the_plain_layers(opt):
    plain, _ = plain_and_fused()
    fused = HorizontalEmbeddingCollection(TABLES)  # its own uncovered layers: not shared
    fused(make_ids())
    load_unfused(fused, plain)
    before = {n: layer.get_weights()[0] for n, layer in plain.layers_by_field.items()}
    make = {
        "sgd": lambda: tf.keras.optimizers.SGD(0.1),
        "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1),
        "adam": lambda: tf.keras.optimizers.Adam(0.01),
    }[opt]
    weights = {t["name"]: tf.constant(np.linspace(-1, 1, t["dim"]), tf.float32) for t in TABLES}

    def step_fn(layer, optimizer):
        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                out = layer(ids).fields()
                loss = tf.add_n([tf.reduce_sum(tf.square(out[k] - weights[k])) for k in out])
                loss += tf.add_n(layer.losses)
            grads = tape.gradient(loss, layer.trainable_variables)
            optimizer.apply_gradients(zip(grads, layer.trainable_variables, strict=True))
            return loss

        return step

    steps = [step_fn(plain, make()), step_fn(fused, make())]
    for s in range(3):
        ids = make_ids(10 + s)
        losses = [float(step(ids)) for step in steps]
        assert abs(losses[0] - losses[1]) <= 1e-6 * max(1.0, abs(losses[0]))
    back = to_unfused(fused)
    for name, layer in plain.layers_by_field.items():
        for w_plain, w_fused in zip(
            layer.get_weights(), back.layers_by_field[name].get_weights(), strict=True
        ):
            np.testing.assert_allclose(w_fused, w_plain, atol=1e-6, rtol=0, err_msg=name)
    for name in ("a", "tags", "hash", "wide_b"):  # the steps moved the fused fields' rows
        assert not np.array_equal(before[name], plain.layers_by_field[name].table.numpy())


def test_row_blocks_use_each_fields_initializer():
    tables = [
        {"name": "ones", "num_rows": 5, "dim": 3, "options": {"initializer": "ones"}},
        {"name": "zeros", "num_rows": 4, "dim": 3, "options": {"initializer": "zeros"}},
        {
            "name": "uniform",
            "num_rows": 300,
            "dim": 3,
            "method": "hashing",
            "options": {
                "buckets": 200,
                "initializer": {
                    "class_name": "RandomUniform",
                    "config": {"minval": 2.0, "maxval": 3.0},
                },
            },
        },
        {"name": "normal", "num_rows": 4000, "dim": 3},  # truncated_normal, stddev 0.05
    ]
    fused = HorizontalEmbeddingCollection(tables)
    fused.build(None)
    t = fused.group_tables["fused_table_d3"].numpy()
    np.testing.assert_array_equal(t[:5], np.ones((5, 3)))
    np.testing.assert_array_equal(t[5:9], np.zeros((4, 3)))
    u = t[9:209]
    assert u.min() >= 2.0 and u.max() < 3.0 and abs(u.mean() - 2.5) < 0.05
    n = t[209:]
    assert n.shape == (4000, 3)
    # TruncatedNormal(0.05) cut at 2 sigma: std 0.05 * 0.88, nothing beyond 0.1
    assert abs(n.mean()) < 0.003 and abs(n.std() - 0.044) < 0.003 and np.abs(n).max() <= 0.1
    plain = EmbeddingCollection(tables)
    plain({t["name"]: tf.constant([1]) for t in tables})
    pn = plain.layers_by_field["normal"].table.numpy()
    assert abs(pn.std() - n.std()) < 0.003  # the same distribution as the plain layer's


def test_checkpoint_mapping_both_ways(tmp_path):
    plain, _ = plain_and_fused()
    ids = make_ids(7)
    expected = plain(ids).fields()
    path = tf.train.Checkpoint(embedding=plain).write(str(tmp_path / "plain" / "ckpt"))
    # a plain checkpoint restores into a fresh fused layer (different random init) ...
    tf.keras.utils.set_random_seed(99)
    fused = HorizontalEmbeddingCollection(TABLES, name="embedding")
    fused(ids)
    assert not np.array_equal(fused(ids).fields()["a"].numpy(), expected["a"].numpy())
    load_unfused(fused, path, prefix="embedding")
    assert_same(expected, fused(ids))
    # ... and the fused layer's weights come back out as a plain collection and checkpoint
    fused_path = tf.train.Checkpoint(embedding=fused).write(str(tmp_path / "fused" / "ckpt"))
    names = [n for n, _ in tf.train.list_variables(fused_path)]
    assert any("fused_table_d4" in n for n in names)
    assert not any("layers_by_field/a/" in n for n in names)
    back = to_unfused(fused)
    assert type(back) is EmbeddingCollection
    assert_same(expected, back(ids))
    plain_path = tf.train.Checkpoint(embedding=back).write(str(tmp_path / "back" / "ckpt"))
    fresh = EmbeddingCollection(TABLES, name="embedding")
    fresh(ids)
    tf.train.Checkpoint(embedding=fresh).read(plain_path).assert_consumed()
    assert_same(expected, fresh(ids))
    # a fused checkpoint restores into a fused layer of the same tables
    other = HorizontalEmbeddingCollection(TABLES)
    other(ids)
    tf.train.Checkpoint(embedding=other).read(fused_path).assert_existing_objects_matched()
    assert_same(expected, other(ids))
    # a folder: its latest checkpoint; a training run's layout: prefix model/embedding
    model = tf.train.Checkpoint(embedding=plain)
    tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), str(tmp_path / "run"), max_to_keep=1
    ).save()
    again = HorizontalEmbeddingCollection(TABLES)
    load_unfused(again, str(tmp_path / "run"))  # prefix model/embedding by default
    assert_same(expected, again(ids))


def test_config_and_saved_model_round_trip(tmp_path):
    _, fused = plain_and_fused()
    ids = make_ids(3)
    config = fused.get_config()
    assert config["tables"] == [TableConfig.from_dict(t).to_dict() for t in TABLES]
    clone = tf.keras.layers.deserialize(json.loads(json.dumps(tf.keras.layers.serialize(fused))))
    assert type(clone) is HorizontalEmbeddingCollection
    assert clone.checkpoint_mapping() == fused.checkpoint_mapping()
    assert clone.uncovered == fused.uncovered and clone.name == fused.name
    clone(ids)
    load_unfused(clone, to_unfused(fused))
    assert_same(fused(ids), clone(ids))

    names = list(ids)

    class Module(tf.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        @tf.function(
            input_signature=[
                {
                    n: (
                        tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)
                        if isinstance(ids[n], tf.RaggedTensor)
                        else tf.TensorSpec([None], tf.int64)
                    )
                    for n in names
                }
            ]
        )
        def f(self, x):
            return self.layer(x).fields()

    tf.saved_model.save(Module(fused), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    out = loaded.f(ids)
    for k, v in fused(ids).fields().items():
        np.testing.assert_array_equal(out[k].numpy(), v.numpy(), err_msg=k)
    # serving_form: the plain collection (what an export holds), same values
    assert_same(fused(ids), fused.serving_form()(ids))


def _model_over(collection: EmbeddingCollection) -> RankingModel:
    """A DNN over ``collection`` whose preprocessor passes the ids through."""

    class Ids(tf.keras.layers.Layer):
        def call(self, features):
            return dict(features), None

    return RankingModel(
        Ids(),
        "label",
        embedding=collection,
        interaction=ConcatInteraction(),
        tower=MLP([4]),
    )


def test_fuse_and_unfuse_a_model():
    plain, _ = plain_and_fused()
    model = _model_over(plain)
    ids = make_ids(4)
    want = model(ids).numpy()
    fused_model = fuse(model, FuseSpec(tables=True))
    fused = fused_model.embedding
    assert isinstance(fused, HorizontalEmbeddingCollection) and model.embedding is plain
    assert fused_model.interaction is model.interaction and fused_model.bias is model.bias
    assert_same(plain(ids), fused(ids))
    np.testing.assert_allclose(fused_model(ids).numpy(), want, rtol=1e-6)
    back_model = table_fusion.unfuse_tables(fused_model)
    back = back_model.embedding
    assert fused_model.embedding is fused and isinstance(back, EmbeddingCollection)
    assert_same(plain(ids), back(ids))
    np.testing.assert_allclose(back_model(ids).numpy(), want, rtol=1e-6)


def test_errors_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="collection must be an EmbeddingCollection, got dict"):
        HorizontalEmbeddingCollection.from_collection({"a": 1})
    with pytest.raises(ValueError, match="duplicate field names"):
        HorizontalEmbeddingCollection([TABLES[0], TABLES[0]])
    with pytest.raises(ValueError, match="embedding method 'nope'"):
        HorizontalEmbeddingCollection([{"name": "x", "num_rows": 3, "dim": 2, "method": "nope"}])
    fused = HorizontalEmbeddingCollection(TABLES)
    with pytest.raises(KeyError, match=r"ids lack fields \['a'"):
        fused({k: v for k, v in make_ids().items() if k != "a"})
    other = EmbeddingCollection(TABLES[:3])
    other({k: v for k, v in make_ids().items() if k in ("a", "tags", "tags_sum")})
    with pytest.raises(ValueError, match="source has fields"):
        load_unfused(fused, other)
    with pytest.raises(ValueError, match="source must be an EmbeddingCollection or a checkpoint"):
        load_unfused(fused, 3)
    plain, _ = plain_and_fused()
    path = tf.train.Checkpoint(embedding=plain).write(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="at prefix 'model/embedding'"):
        load_unfused(fused, path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="folder without a checkpoint"):
        load_unfused(fused, str(tmp_path / "empty"), prefix="embedding")
    with pytest.raises(ValueError, match="must be a HorizontalEmbeddingCollection, got"):
        to_unfused(plain)
    holder = tf.Module()
    holder.embedding = None
    with pytest.raises(ValueError, match=r"model\.embedding must be an EmbeddingCollection"):
        fuse(holder, FuseSpec(tables=True))
    with pytest.raises(ValueError, match=r"model\.embedding must be a HorizontalEmbedding"):
        table_fusion.unfuse_tables(holder)


def test_resume_guard(tmp_path):
    plain, _ = plain_and_fused()
    holder = tf.Module()
    holder.embedding = plain
    d = tmp_path / "checkpoints"
    assert table_fusion.check_resume(d, enabled=False) is None
    table_fusion.check_resume(d, enabled=True)  # no checkpoint yet: either setting
    fused = fuse(_model_over(plain), FuseSpec(tables=True)).embedding
    assert isinstance(fused, HorizontalEmbeddingCollection)
    assert table_fusion.write_mapping(d, fused) == d / table_fusion.MAPPING_FILE
    assert table_fusion.run_has_fused_tables(d)
    mapping = json.loads((d / table_fusion.MAPPING_FILE).read_text())
    assert mapping["fields"] == {k: list(v) for k, v in fused.checkpoint_mapping().items()}
    tf.train.CheckpointManager(tf.train.Checkpoint(model=holder), str(d), max_to_keep=1).save()
    with pytest.raises(ValueError, match="written with fused tables; resume with the same"):
        table_fusion.check_resume(d, enabled=False)
    (d / table_fusion.MAPPING_FILE).unlink()
    with pytest.raises(ValueError, match="written without fused tables"):
        table_fusion.check_resume(d, enabled=True)


def test_stitchrec_train_with_fused_tables(tmp_path, capsys):
    """``[fusion] tables = true``: same seed and data as the plain run, the same test AUC; the
    export (mapped back to per-field tables) scores like the fused in-memory model."""
    from pipelines import cli
    from pipelines.config import ConfigError, load_config
    from pipelines.run.model import dummy_batch as _dummy_batch
    from pipelines.run.paths import RunPaths
    from pipelines.run.scoring import make_scorer, predict
    from pipelines.train import train
    from tests.testdata import write_run_config, write_tiny_dataset

    (tmp_path / "data").mkdir()
    data = write_tiny_dataset(tmp_path / "data", rows=2000, train_rows=1600)
    model_cfg = {"type": "dcn_v2", "embedding_dim": 4, "mlp": [16], "cross_layers": 1}
    opts = {"batch_size": 200, "epochs": 1, "learning_rate": 0.05, "deterministic": True}
    reports, logs, cfgs = {}, {}, {}
    for fused in (False, True):
        out = data["root"] / f"run-{fused}"
        extra = "[fusion]\ntables = true\n" if fused else ""
        cfgs[fused] = write_run_config(out.with_suffix(".toml"), data, out, model_cfg, opts, extra)
        lines: list[str] = []
        reports[fused] = train(load_config(cfgs[fused]), log=lines.append)
        logs[fused] = lines
    assert any("compiler_opt.table_fusion" in line for line in logs[True])
    assert not any("table_fusion" in line for line in logs[False])
    a, b = reports[False]["test"]["auc"], reports[True]["test"]["auc"]
    assert a > 0.55 and abs(a - b) < 1e-3, (a, b)  # learned something; the same AUC
    assert abs(reports[False]["test"]["logloss"] - reports[True]["test"]["logloss"]) < 1e-3
    run = RunPaths(data["root"] / "run-True")
    mapping = json.loads((run.checkpoints / table_fusion.MAPPING_FILE).read_text())
    assert len(mapping["groups"]) == 1 and len(mapping["fields"]) >= 3
    ckpt = tf.train.latest_checkpoint(str(run.checkpoints))
    assert any("fused_table_d4" in n for n, _ in tf.train.list_variables(ckpt))
    # the selected checkpoint: the best one, which holds the weight average of the run
    ckpt = reports[True]["selected"]["checkpoint"]
    assert any("fused_table_d4" in n for n, _ in tf.train.list_variables(ckpt))

    # the fused model in memory, restored by hand from the run's selected checkpoint
    from features.schema import load_schema

    schema = load_schema(run.schema)
    model = tf.keras.layers.deserialize(json.loads(run.model_json.read_text()))
    model(_dummy_batch(list(schema.model_inputs)))
    model = fuse(model, FuseSpec(tables=True))
    tf.train.Checkpoint(model=model).read(ckpt).expect_partial().assert_existing_objects_matched()
    test_files = sorted(data["test"].glob("*.parquet"))
    y, in_memory = predict(make_scorer(model, schema), schema, test_files)
    from ranking import metrics

    assert abs(metrics.auc(y, in_memory) - b) < 1e-9  # the report's AUC is this model's

    # the export: per-field tables only, the same scores
    assert cli.main(["export", "--run", str(run.root), "--output", str(tmp_path / "sm")]) == 0
    names = [
        n for n, _ in tf.train.list_variables(str(tmp_path / "sm" / "variables" / "variables"))
    ]
    assert not any("fused_table" in n for n in names)
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    serve = loaded.signatures["serving_default"]
    _, exported = predict(lambda f: serve(**f)["score"], schema, test_files)
    np.testing.assert_allclose(exported, in_memory, atol=1e-6, rtol=0)

    # config errors, and a fused run does not resume unfused
    bad = cfgs[True].read_text().replace("tables = true", "tables = 1")
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(ConfigError, match="tables must be true or false, got 1"):
        load_config(tmp_path / "bad.toml")
    both = cfgs[True].read_text().replace("tables = true", "tables = true\nkernels = true")
    (tmp_path / "both.toml").write_text(both)
    with pytest.raises(ConfigError, match="kernels = true and tables = true: choose one"):
        load_config(tmp_path / "both.toml")
    unfused = load_config(cfgs[True], overrides=["fusion.tables=false"])
    with pytest.raises(ValueError, match="written with fused tables"):
        train(unfused, log=lambda _: None)
    # continuing the fused run is a config error: one line from the CLI, not a traceback
    cont = write_run_config(
        tmp_path / "cont.toml",
        data,
        tmp_path / "cont",
        model_cfg,
        {**opts, "continue_from": str(run.root)},
    )
    assert cli.main(["train", "--config", str(cont)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the run trained with [fusion] tables = true" in err[0]


def test_lane_only_and_rest_only_groups():
    """A group of ``[batch]`` full fields only (stacked, one gather of ``[batch, L]`` rows), a
    group of hashing fields and ``[batch, 2]`` full ids only (rows concatenated): same values."""
    tables = [
        {"name": "x", "num_rows": 9, "dim": 2},
        {"name": "y", "num_rows": 5, "dim": 2},
        {"name": "z", "num_rows": 7, "dim": 2},
        {"name": "h1", "num_rows": 50, "dim": 3, "method": "hashing", "options": {"buckets": 4}},
        {"name": "h2", "num_rows": 50, "dim": 3, "method": "hashing", "options": {"buckets": 5}},
        {"name": "pair", "num_rows": 6, "dim": 3},
    ]
    ids = {
        "x": tf.constant([0, 8, 9, -2], tf.int64),
        "y": tf.constant([4, 1, 2, 3], tf.int32),  # another int dtype
        "z": tf.constant([6, 0, 100, 1], tf.int64),
        "h1": tf.constant([3, 0, 49, 1000], tf.int64),
        "h2": tf.constant([7, 8, 9, -1], tf.int64),
        "pair": tf.constant([[1, 2], [5, 6], [0, 0], [3, -1]], tf.int64),
    }
    plain = EmbeddingCollection(tables)
    plain(ids)
    fused = HorizontalEmbeddingCollection.from_collection(plain)
    assert fused.uncovered == {}
    assert sorted(fused.group_tables) == ["fused_table_d2", "fused_table_d3"]
    assert fused(ids).fields()["pair"].shape == (4, 2, 3)
    assert_same(plain(ids), fused(ids))
    assert_same(plain(ids), tf.function(fused, jit_compile=True)(ids))  # XLA: same rows
