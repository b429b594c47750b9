"""``stitchrec export``: a trained run -> a SavedModel that scores RAW features.

The SavedModel's ``serving_default`` signature takes one 1-D tensor per model input, named by
field (``tf.string`` for string fields, ``tf.int64`` for int64 fields, ``tf.float32`` for numeric
fields), and returns ``score`` (click probability, ``[batch]``) and ``logit``. Vocabulary lookup,
hashing, bucketizing and numeric transforms run inside it, so a client sends what is in the logs.

Layout: ``<run>/export/<version>/`` (version = 1, 2, ... as TF Serving expects) with
``assets.extra/schema.toml`` (the fields the signature takes) and
``assets.extra/stitchrec.json`` (model name, training run, input names) and
``assets.extra/stats.json`` (the training statistics, without the vocabularies the model holds).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import tensorflow as tf
from tf_keras.src.saving.legacy.saved_model.utils import keras_option_scope

from embeddings.protocols import HasServingForm
from features.dataset import field_tf_dtype, input_signature
from features.schema import FeatureSpec, Schema, load_schema
from pipelines.train import RunPaths
from ranking.models import RankingModel

ASSETS_EXTRA = "assets.extra"


class ServingModule(tf.Module):
    """Wraps a RankingModel with a raw-feature signature."""

    def __init__(self, model: RankingModel, fields: list[FeatureSpec]):
        super().__init__(name="stitchrec_serving")
        self.model = model
        self.serve = tf.function(self._serve, input_signature=[input_signature(fields)])

    def _serve(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        logits = self.model(features, training=False)
        return {"score": tf.sigmoid(logits), "logit": logits}


def _dummy_batch(fields: list[FeatureSpec]) -> dict[str, tf.Tensor]:
    out = {}
    for f in fields:
        dtype = field_tf_dtype(f)
        value = "" if dtype == tf.string else 0
        out[f.name] = tf.constant([value], dtype=dtype)
    return out


def load_trained_model(run_dir: str | Path) -> tuple[RankingModel, Schema, str]:
    """Rebuilds the run's model from ``model.json`` and restores its latest checkpoint (a run
    trained with ``[fusion] tables = true`` is restored fused, then mapped back to the plain
    model's per-field tables: ``compiler_opt.table_fusion``)."""
    paths = RunPaths(Path(run_dir))
    if not paths.model_json.exists():
        raise FileNotFoundError(
            f"{str(paths.root)!r} is not a training run: it has no model.json "
            f"(run `stitchrec train` first)"
        )
    latest = tf.train.latest_checkpoint(str(paths.checkpoints))
    if latest is None:
        raise FileNotFoundError(f"training run {str(paths.root)!r} has no checkpoint yet")
    model = tf.keras.layers.deserialize(json.loads(paths.model_json.read_text()))
    schema = load_schema(paths.schema)
    model(_dummy_batch(list(schema.model_inputs)))
    from compiler_opt import table_fusion

    fused = table_fusion.run_has_fused_tables(paths.checkpoints)  # [fusion] tables = true
    if fused:
        table_fusion.fuse_tables(model)
    tf.train.Checkpoint(model=model).restore(
        latest
    ).expect_partial().assert_existing_objects_matched()
    if fused:  # back to the plain model's per-field tables (the mapping's row blocks)
        table_fusion.unfuse_tables(model)
    return model, schema, latest


def next_version(base: Path) -> Path:
    versions = [int(p.name) for p in base.glob("*") if p.is_dir() and p.name.isdigit()]
    return base / str(max(versions, default=0) + 1)


def export_saved_model(
    model: RankingModel,
    schema: Schema,
    output: str | Path,
    extra: dict[str, Any] | None = None,
    kernels: bool = False,
) -> Path:
    """Writes the SavedModel of ``model`` to ``output`` (replacing it).

    The model is first put in its serving form: embedding layers with a more compact inference
    form (AMTL rows truncated to their learned lengths) are replaced by it, so the SavedModel
    holds only what serving needs. With ``kernels``, the embedding block then runs as one
    generated op (``compiler_opt.codegen``; fields it does not cover keep their layers) and the
    op's source ships in ``assets/`` so that a server loads (or compiles) it before the model.

    Raises:
      ValueError: ``kernels`` and no generated op could be built (no compiler, or no field
        covered): the export would not hold what was asked for.
    """
    if isinstance(getattr(model, "embedding", None), HasServingForm):
        model.embedding = model.embedding.serving_form()
    fused = None
    if kernels:
        from compiler_opt import codegen

        fused = codegen.fuse_embeddings(model)
    out = Path(output)
    if out.exists():
        shutil.rmtree(out)
    fields = list(schema.model_inputs)
    module = ServingModule(model, fields)
    # Only the serving signature is traced: Keras would also trace every layer's call for
    # `load_model`, hundreds of functions that a serving process would load and never run.
    with keras_option_scope(save_traces=False, in_tf_saved_model_scope=True):
        tf.saved_model.save(module, str(out), signatures={"serving_default": module.serve})
    if fused is not None:
        from compiler_opt import codegen

        if fused.kernel is None:
            shutil.rmtree(out)
            raise ValueError(
                f"export --fuse-kernels: no generated op for {model.name}'s embeddings "
                f"({fused.fallback_reason or f'no field covered: {fused.uncovered}'})"
            )
        kernels = [c.kernel for c in codegen.fused_collections(model) if c.kernel is not None]
        codegen.write_saved_model_assets(out, kernels)
    assets = out / ASSETS_EXTRA
    assets.mkdir(exist_ok=True)
    schema.select([f.name for f in fields]).save(assets / "schema.toml")
    meta = {"model": model.name, "inputs": [f.name for f in fields], **(extra or {})}
    (assets / "stitchrec.json").write_text(json.dumps(meta, indent=1))
    return out


def export_run(
    run_dir: str | Path, output: str | Path | None = None, kernels: bool = False
) -> Path:
    """Exports the latest checkpoint of a training run; returns the SavedModel folder
    (``kernels``: the embedding block as a generated op, see ``export_saved_model``)."""
    model, schema, ckpt = load_trained_model(run_dir)
    paths = RunPaths(Path(run_dir))
    out = Path(output) if output else next_version(paths.exports)
    out = export_saved_model(
        model,
        schema,
        out,
        extra={"run": str(paths.root.resolve()), "checkpoint": ckpt},
        kernels=kernels,
    )
    shutil.copy(paths.stats / "stats.json", out / ASSETS_EXTRA / "stats.json")
    return out


def saved_model_bytes(path: str | Path) -> dict[str, int]:
    """Bytes on disk of a SavedModel: variables, graph, total."""
    p = Path(path)
    variables = sum(f.stat().st_size for f in (p / "variables").rglob("*") if f.is_file())
    total = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return {"variables": variables, "total": total}
