"""The fused, bucketed serving signature against the plain SavedModel for every model type and
every embedding method (issue 9's correctness check for the XLA-cluster realization)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from compiler_opt.fused_signature import FusedSignature, FusionSpec
from compiler_opt.transform import FuseSpec, fuse, fused_collections
from embeddings.collection import EmbeddingCollection
from features.dataset import make_dataset
from pipelines.config import DataConfig, PipelineConfig
from pipelines.export import export_saved_model
from pipelines.run.model import build_run_model
from ranking.config import ModelConfig
from serving.model_version import ModelVersion
from tests.compiler_opt.conftest import need_compiler
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


def _logits_and_grads(model, batch, variables):
    with tf.GradientTape() as tape:
        logits = model(batch, training=False)
        loss = tf.reduce_sum(logits * tf.range(17, dtype=tf.float32))
    grads = tape.gradient(loss, variables)
    return logits.numpy(), [tf.convert_to_tensor(g).numpy() for g in grads]


@pytest.fixture(scope="module")
def fm_fused(tiny, tmp_path_factory):
    """An FM model fused with ``--fuse-kernels``, its logits and gradients before and after,
    its plain export and its export with the kernels served by a ``ModelVersion``: built once
    for the two tests below, which check the same objects."""
    need_compiler()
    d, data, schema, files, stats = tiny
    out = tmp_path_factory.mktemp("fm_kernels")
    cfg = PipelineConfig(
        output_dir=str(d / "run"),
        data=DataConfig(schema=str(data["schema"]), train=(str(data["train"]),)),
        model=ModelConfig(type="fm", embedding_dim=4),
    )
    tf.keras.utils.set_random_seed(1)
    model = build_run_model(cfg, schema, stats)
    batch = next(iter(make_dataset(schema, files, batch_size=17)))
    model(batch)
    plain_path = export_saved_model(model, schema, out / "plain")
    variables = list(model.trainable_variables)  # the same objects after fusion
    want, want_grads = _logits_and_grads(model, batch, variables)
    blocks = (model.embedding, model.interaction, model.wide, model.wide.field_weights)
    fused_model = fuse(model, FuseSpec(kernels=True))
    fused = fused_model.embedding
    collections = fused_collections(fused_model)
    got, got_grads = _logits_and_grads(fused_model, batch, variables)
    after_fuse = {  # the model fused, as it is right after fuse
        "blocks": (model.embedding, model.interaction, model.wide, model.wide.field_weights),
        "logits": model(batch, training=False).numpy(),
    }
    path = export_saved_model(model, schema, out / "kernels", kernels=True)
    version = ModelVersion("fm", 1, path, ["/device:CPU:0"], fusion=False).load()
    return SimpleNamespace(
        model=model,
        fused_model=fused_model,
        fused=fused,
        collections=collections,
        batch=batch,
        blocks=blocks,
        after_fuse=after_fuse,
        want=want,
        want_grads=want_grads,
        got=got,
        got_grads=got_grads,
        plain_path=plain_path,
        path=path,
        version=version,
    )


@pytest.mark.parametrize("model_type", ["fm", "lr_embedded"])
def test_fm_and_wide_weights_run_as_generated_ops(fm_fused, model_type):
    """FM with ``--fuse-kernels``: the field vectors as one op read as a ``[batch, F, d]``
    block (``stacked``), the wide term's per-field weights as a second op (``concat``, summed);
    logits and gradients equal the plain model's, the export ships both ops and a
    ``ModelVersion`` serves the plain export's scores. (``lr_embedded``: FM's wide term alone is
    what an LR model has; checked through the same FM model's ``wide``.)"""
    r = fm_fused
    model, fused_model, collections, batch = r.model, r.fused_model, r.collections, r.batch
    assert [c.output_form for c in collections] == ["stacked", "concat"]
    # the forms the consumers declare are the forms fuse gives them
    assert collections[0].output_form == model.interaction.input_form
    assert collections[1].output_form == model.wide.input_form
    assert all(c.kernel is not None and not c.uncovered for c in collections)
    # the model fused is left as it was: its blocks, its output, no generated op in its graph
    assert r.after_fuse["blocks"] == r.blocks
    np.testing.assert_allclose(r.after_fuse["logits"], r.want, rtol=0, atol=0)
    assert type(model.embedding) is EmbeddingCollection and fused_collections(model) == []
    np.testing.assert_allclose(model(batch, training=False).numpy(), r.want, rtol=0, atol=0)
    graph = tf.function(lambda f: model(f, training=False)).get_concrete_function(batch).graph
    ops = {op.type for op in graph.get_operations()}
    ops |= {n.op for f in graph.as_graph_def().library.function for n in f.node_def}
    assert not ops & {c.kernel.forward_name for c in collections}
    if model_type == "lr_embedded":  # the wide term alone, through its op
        ids, dense = fused_model.preprocessor(batch)
        np.testing.assert_allclose(
            fused_model.wide(ids, dense).numpy(),
            tf.add_n(
                [layer(ids[n])[:, 0] for n, layer in collections[1].layers_by_field.items()]
                + ([model.wide._dense(dense)[:, 0]] if dense is not None else [])
            ).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )
    np.testing.assert_allclose(r.got, r.want, rtol=1e-5, atol=1e-6)
    for g, w in zip(r.got_grads, r.want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert r.fused is collections[0]

    assert type(model.embedding) is EmbeddingCollection  # the export fuses a new model
    manifest = (r.path / "assets" / "compiler_opt_kernels" / "manifest.json").read_text()
    assert manifest.count('"forward"') == 2
    plain = tf.saved_model.load(str(r.plain_path)).signatures["serving_default"]
    feats = {k: v for k, v in batch.items() if k in plain.structured_input_signature[1]}
    served = r.version.instances[0].signatures["serving_default"](**feats)
    for k, v in plain(**feats).items():
        np.testing.assert_allclose(served[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6)
