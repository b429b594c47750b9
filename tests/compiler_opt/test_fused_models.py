"""The fused, bucketed serving signature against the plain SavedModel for every model type and
every embedding method (issue 9's correctness check for the XLA-cluster realization)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt.fused_signature import FusedSignature, FusionSpec
from tests.compiler_opt.test_fused_signature import _features
from tests.testdata import write_tiny_dataset

CASES = [
    ("dcn_v2", "full"),
    ("dcn_v2", "hashing"),
    ("dcn_v2", "qr"),
    ("dcn_v2", "bh"),
    ("dcn_v2", "amtl"),
    ("lr", "full"),
    ("fm", "full"),
    ("dnn", "full"),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from features.dataset import iter_record_batches, list_parquet
    from features.schema import load_schema
    from features.stats import compute_stats

    d = tmp_path_factory.mktemp("fused_models")
    data = write_tiny_dataset(d, rows=600, train_rows=500)
    schema = load_schema(data["schema"])
    files = list_parquet(data["train"])
    return d, data, schema, files, compute_stats(schema, iter_record_batches(schema, files))


@pytest.mark.parametrize(("model_type", "method"), CASES)
def test_fused_serving_equals_the_saved_model(tiny, model_type, method, hand):
    from features.dataset import make_dataset
    from pipelines.config import DataConfig, PipelineConfig
    from pipelines.export import export_saved_model
    from pipelines.train import build_run_model
    from ranking.config import ModelConfig

    d, data, schema, files, stats = tiny
    cfg = PipelineConfig(
        output_dir=str(d / "run"),
        data=DataConfig(schema=str(data["schema"]), train=(str(data["train"]),)),
        model=ModelConfig(
            type=model_type, embedding_dim=4, mlp=(8,), cross_layers=1, embedding_method=method
        ),
    )
    tf.keras.utils.set_random_seed(0)
    model = build_run_model(cfg, schema, stats)
    model(next(iter(make_dataset(schema, files, batch_size=2))))
    path = export_saved_model(model, schema, d / f"sm_{model_type}_{method}")
    loaded = tf.saved_model.load(str(path))  # kept alive: the signature holds weak references
    sig = loaded.signatures["serving_default"]
    fused = FusedSignature(sig, FusionSpec(ladder=(16,), plan_batch=16), hand)
    assert fused.clusters >= 1
    assert fused.warmup(_features(sig, 4)) >= fused.clusters  # each cluster compiled
    for rows in (3, 16, 40):
        feats = _features(sig, rows, seed=rows)
        want = sig(**{k: tf.constant(v) for k, v in feats.items()})
        got = fused(feats)
        for k in want:
            np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-5, atol=1e-6)
