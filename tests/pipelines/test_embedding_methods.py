"""Every embedding method, selected per field from the training config, trains in every model
and exports a SavedModel that scores like the trained model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from features.dataset import list_parquet
from pipelines.config import load_config
from pipelines.export import export_run
from pipelines.run.model import load_trained_model
from pipelines.run.scoring import make_scorer, predict
from pipelines.train import train
from tests.testdata import NO_VALIDATION, write_run_config


def _cfg(data, method, model="dcn_v2", ratio=2.0, name=None):
    model_section = {
        "type": model,
        "embedding_dim": 4,
        "mlp": [16],
        "cross_layers": 1,
        "embedding_method": method,
        "embedding_compression": ratio,
        "compress_min_rows": 10,
    }
    train = {"batch_size": 256, "epochs": 2, "learning_rate": 0.02}
    path = write_run_config(
        data["root"] / f"{name or method + model}.toml",
        data,
        data["root"] / (name or f"run-{method}-{model}"),
        model_section,
        train,
        data_extra=NO_VALIDATION,
    )
    return load_config(path)


@pytest.mark.parametrize("method", ["hashing", "qr", "bh", "amtl"])
def test_method_trains_exports_and_serves_the_same_scores(tiny_data, method):
    cfg = _cfg(tiny_data, method)
    report = train(cfg, log=lambda _: None)
    assert report["test"]["auc"] > 0.6
    model, schema, _ = load_trained_model(cfg.output_dir)
    methods = {t.name: t.method for t in model.embedding.tables}
    assert methods["user"] == method and methods["age"] == "full"  # numeric buckets stay full
    files = list_parquet(tiny_data["test"])
    _, expected = predict(make_scorer(model, schema), schema, files)
    out = export_run(cfg.output_dir)
    fn = tf.saved_model.load(str(out)).signatures["serving_default"]
    t = pq.read_table(files[0])
    got = fn(
        user=tf.constant(t.column("user").to_pylist()),
        item=tf.constant(t.column("item").to_numpy(), tf.int64),
        tags=tf.constant(t.column("tags").to_pylist()),
        price=tf.constant(t.column("price").to_numpy(), tf.float32),
        age=tf.constant(t.column("age").to_numpy(), tf.float32),
    )["score"].numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("model", ["lr", "fm", "dnn", "dcn_v2"])
def test_per_field_method_in_every_model(tiny_data, model):
    cfg = _cfg(tiny_data, "full", model=model, name=f"mixed-{model}")
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(
            cfg.model,
            embedding_methods={"user": "bh", "item": "qr", "tags": "hashing"},
            embedding_compression=2.0,
            compress_min_rows=2,
            wide=model == "dnn",  # dnn with lr's wide term (dcn_v2 without)
        ),
    )
    report = train(cfg, log=lambda _: None)
    assert report["test"]["auc"] > 0.6
    trained, _, _ = load_trained_model(cfg.output_dir)
    assert (trained.wide is not None) == (model != "dcn_v2")
    if trained.embedding is not None:
        methods = {t.name: t.method for t in trained.embedding.tables}
        assert methods == {"user": "bh", "item": "qr", "tags": "hashing", "age": "full"}
    wide = trained.wide.field_weights if trained.wide is not None else None
    if wide is not None:
        assert {t.name: t.method for t in wide.tables}["user"] == "bh"


def test_config_names_every_registered_method_and_sizes_with_explicit_options(tiny_data):
    from embeddings.collection import EMBEDDING_METHODS
    from ranking.config import EMBEDDING_METHOD_NAMES, ModelConfig
    from ranking.models import embedding_tables

    assert set(EMBEDDING_METHOD_NAMES) == set(EMBEDDING_METHODS)
    cfg = _cfg(tiny_data, "bh", ratio=2.0)
    from features.preprocessing import build_preprocessor
    from features.schema import load_schema
    from features.stats import compute_stats

    schema = load_schema(tiny_data["schema"])
    stats = compute_stats(schema, pq.read_table(tiny_data["train"]).to_batches())
    pre = build_preprocessor(schema, stats, {"user": "vocabulary", "item": "vocabulary"})
    config = ModelConfig(
        embedding_method="qr",
        embedding_methods={"user": "bh"},
        embedding_options={"qr": {"operation": "concat"}, "bh": {"fusion": "concat"}},
        embedding_compression=4.0,
        compress_min_rows=10,
        embedding_dim=8,
    )
    tables = {t.name: t for t in embedding_tables(config, pre, lambda _: 8, {})}
    assert tables["item"].options["operation"] == "concat"
    assert tables["user"].options["fusion"] == "concat"
    assert tables["tags"].method == "full"  # 5 rows < compress_min_rows
    del cfg


def test_warm_start_puts_amtl_behind_the_trained_full_tables(tiny_data):
    full = _cfg(tiny_data, "full", name="warm-source")
    train(full, log=lambda _: None)
    cfg = _cfg(tiny_data, "amtl", name="warm-amtl")
    cfg = dataclasses.replace(
        cfg,
        train=dataclasses.replace(
            cfg.train, warm_start=full.output_dir, learning_rate=1e-12, max_steps=1
        ),
    )
    lines: list[str] = []
    train(cfg, log=lines.append)
    assert any(line.startswith("warm start from") for line in lines)
    source, schema, _ = load_trained_model(full.output_dir)
    amtl, _, _ = load_trained_model(cfg.output_dir)
    assert {t.method for t in amtl.embedding.tables} == {"amtl", "full"}
    files = list_parquet(tiny_data["test"])
    _, a = predict(make_scorer(source, schema), schema, files)
    _, b = predict(make_scorer(amtl, schema), schema, files)
    # AMTL starts at full length on the trained tables: the same model, before it learns
    np.testing.assert_allclose(a, b, atol=1e-4)
    bad = dataclasses.replace(cfg, output_dir=str(tiny_data["root"] / "warm-bad"))
    bad = dataclasses.replace(bad, model=dataclasses.replace(bad.model, type="dnn"))
    with pytest.raises(ValueError, match="warm_start"):
        train(bad, log=lambda _: None)
