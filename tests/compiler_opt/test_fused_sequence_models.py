"""Fusion and quantization of models with behaviour sequences: a RankingModel with DIN pooling
and a multi-task model. Their scores equal the plain model's."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import pipelines  # noqa: F401
from compiler_opt.embedding_op import assets as emb_assets
from compiler_opt.table_fusion import HorizontalEmbeddingCollection
from compiler_opt.transform import FuseSpec, fuse
from embeddings.quantize import QuantizedEmbedding, quantized_model
from features.dataset import iter_batches, iter_record_batches, list_parquet
from features.preprocessing import build_preprocessor
from features.schema import load_schema
from features.stats import compute_stats
from pipelines.export import export_saved_model
from ranking.config import ModelConfig, TaskConfig
from ranking.models import build_model
from ranking.multitask import build_multitask_model
from tests.compiler_opt.test_fuse_cli import ROOT, _seed_cache
from tests.ranking.sequence_prerank_data import write_sequence_data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused_seq")
    paths = write_sequence_data(root / "data", rows=300)
    schema = load_schema(paths["schema"])
    files = list_parquet(paths["train"])
    stats = compute_stats(schema, iter_record_batches(schema, files))
    batch = next(iter_batches(schema, files, batch_size=16, shuffle=False))
    feats = {k: tf.constant(v) for k, v in batch.items() if k != "label"}
    return root, schema, stats, feats


def _model(schema, stats, kind):
    tf.keras.utils.set_random_seed(0)
    pre = build_preprocessor(schema, stats)
    if kind == "ranking":
        config = ModelConfig(type="dnn", embedding_dim=4, mlp=(8,), sequence_pooling="din")
        return build_model(config, pre, "label")
    tasks = (TaskConfig("click", "label"), TaskConfig("again", "label"))
    config = ModelConfig(
        type="dcn_v2", embedding_dim=4, mlp=(8,), cross_layers=1, tasks=tasks, tower_mlp=(4,)
    )
    return build_multitask_model(config, pre)


@pytest.mark.parametrize("kind", ["ranking", "multitask"])
@pytest.mark.parametrize("spec", [FuseSpec(tables=True), FuseSpec(kernels=True)])
def test_fused_sequence_models_score_as_the_plain_model(data, kind, spec):
    _, schema, stats, feats = data
    model = _model(schema, stats, kind)
    want = model(feats).numpy()
    fused = fuse(model, spec)
    assert fused.sequences is model.sequences
    np.testing.assert_allclose(fused(feats).numpy(), want, rtol=0, atol=1e-6)


def test_table_fusion_trains_the_history_through_the_group_table(data):
    _, schema, stats, feats = data
    model = _model(schema, stats, "ranking")
    model(feats)
    fused = fuse(model, FuseSpec(tables=True))
    assert isinstance(fused.embedding, HorizontalEmbeddingCollection)
    lookups = fused.embedding.field_lookups()
    padded = tf.constant([[1, 2, 0], [3, 0, 0]], tf.int64)  # [B, L] history ids
    np.testing.assert_allclose(
        lookups["item"](padded).numpy(),
        model.embedding.layers_by_field["item"](padded).numpy(),
        atol=1e-7,
    )
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fused(feats))
    grads = tape.gradient(loss, list(fused.embedding.group_tables.values()))
    assert all(g is not None for g in grads)


def _own_history(data):
    """``data`` with ``hist_items`` reading a table of its own (not ``item``'s)."""
    root, schema, _, feats = data
    schema = schema.replace_field("hist_items", shares_embedding_with=None, min_count=1)
    files = list_parquet(root / "data" / "train")
    return root, schema, compute_stats(schema, iter_record_batches(schema, files)), feats


@pytest.mark.parametrize("kind", ["ranking", "multitask", "own_table"])
def test_int8_history_reads_the_quantized_tables(data, kind):
    if kind == "own_table":
        data, kind = _own_history(data), "ranking"
    root, schema, stats, feats = data
    model = _model(schema, stats, kind)
    model(feats)
    quantized, record = quantized_model(model, "int8", min_rows=0)
    own = model.sequence_tables is not None
    assert {t["field"] for t in record["tables"]} >= {"item", "item_cat"} | (
        {"hist_items"} if own else set()
    )
    # the float model with every table set to its dequantized rows scores as the int8 model:
    # the history (padded [B, L] ids into the item / item_cat tables) reads the int8 rows
    reference = _model(schema, stats, kind)
    reference(feats)
    reference.set_weights(model.get_weights())
    for block in ("embedding", "sequence_tables"):
        if getattr(model, block) is None:
            continue
        for name, layer in getattr(quantized, block).layers_by_field.items():
            assert isinstance(layer, QuantizedEmbedding), name
            plain = getattr(reference, block).layers_by_field[name]
            plain.table.assign(layer(tf.range(plain.table.shape[0])))
    got = quantized(feats).numpy()
    np.testing.assert_allclose(got, reference(feats).numpy(), rtol=0, atol=1e-5)
    assert np.abs(got - model(feats).numpy()).max() > 0
    if kind == "ranking" and not own:  # the export of `stitchrec export --quantize int8`
        path = export_saved_model(
            model, schema, root / "int8", quantize="int8", quantize_min_rows=0
        )
        loaded = tf.saved_model.load(str(path))
        inputs = {k: v for k, v in feats.items()}
        out = loaded.signatures["serving_default"](**inputs)["logit"].numpy()
        np.testing.assert_allclose(out, got, rtol=0, atol=1e-5)


def test_fuse_kernels_export_of_a_sequence_model_scores_and_explains(
    data, tmp_path, monkeypatch, hand
):
    root, schema, stats, feats = data
    _seed_cache(tmp_path, monkeypatch, hand)
    model = _model(schema, stats, "ranking")
    want = model(feats).numpy()
    path = export_saved_model(model, schema, root / "kernels", kernels=True)
    emb_assets.load_for_saved_model(str(path))
    loaded = tf.saved_model.load(str(path))
    got = loaded.signatures["serving_default"](**feats)["logit"].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # a fresh process: explain loads the export's generated op before reading its graph
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "fuse", "explain", str(path), "--batch", "8"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "STITCHREC_CACHE": str(tmp_path / "cache")},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[serving_default]" in proc.stdout
