"""The models bench/compiler measures: DCN-v2 built by ranking/ on the synthetic Criteo layout.

26 categorical fields (vocabularies from ``rows`` synthetic rows, Zipf; every field keeps the
values seen at least once), 13 numeric fields, embedding dim 16, 3 cross layers, MLP 256-128,
with every categorical field's embedding method ``full``, ``amtl`` or ``bh``
(``ModelConfig.embedding_method``). The model takes RAW features (strings, counts) as the
serving signature does: vocabulary lookups and numeric transforms run inside it.

The timed functions start after the vocabulary lookups: XLA cannot compile string inputs nor
hash-table ops, so ``preprocess`` (the model's ``FeaturePreprocessor``: raw features -> ids and
dense inputs) runs once per batch, outside. ``inference(ids, dense)`` is the rest of
``RankingModel.call`` (embeddings, cross network, MLP, head, wide term) with
``training=False``; ``sparse(ids, dense)`` its memory-bound half (embedding lookups through the
concat with the dense inputs); ``train_step(ids, dense, label)`` is one SGD step of the model's task loss
(as ``stitchrec train`` does, without metrics). ``serving`` is the whole model on raw features
(for the IR and plan of the serving graph).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from bench.compiler.data import write_data  # noqa: F401  (the data of every workload)
from compiler_opt import FuseSpec, fuse
from compiler_opt.embedding_op import layer as emb_layer
from compiler_opt.table_fusion import HorizontalEmbeddingCollection, load_unfused
from embeddings.forms import Embedded, Form
from features.dataset import input_signature, iter_batches, iter_record_batches, list_parquet
from features.schema import load_schema
from features.stats import compute_stats
from pipelines.config import DataConfig, PipelineConfig
from pipelines.run.model import build_run_model
from pipelines.run.step import optimizer_step
from ranking.config import ModelConfig

METHODS = ("full", "amtl", "bh")


@dataclasses.dataclass
class Workload:
    """A built model plus its input batches and traced functions."""

    method: str
    model: Any
    schema: Any
    label: str
    batches: dict[int, dict[str, tf.Tensor]]  # raw features and label
    inputs: dict[int, tuple]  # (ids, dense) per batch size: the preprocessed batch
    labels: dict[int, tf.Tensor]
    inference: Any  # python function (ids, dense) -> logits
    sparse: Any  # python function (ids, dense) -> the concatenated embeddings and dense inputs
    train_step: Any  # python function (ids, dense, label) -> loss
    serving: Any  # tf.function(raw features) -> logits
    table_rows: int


def sgd_step(model: Any, optimizer: Any, core: Any) -> Any:
    """``(ids, dense, label) -> loss``: one optimizer step of ``model`` whose logits are
    ``core(ids, dense, training=True)`` (the task's loss plus the model's own losses)."""

    def train_step(ids: dict[str, tf.Tensor], dense: tf.Tensor | None, y: tf.Tensor) -> tf.Tensor:
        loss, _ = optimizer_step(model, optimizer, y, lambda: core(ids, dense, True))
        return loss

    return train_step


def build(
    data_dir: Path,
    method: str,
    batch_sizes: tuple[int, ...],
    seed: int = 0,
    lr: float = 0.01,
    model_type: str = "dcn_v2",
    dropout: float = 0.0,
    mlp: tuple[int, ...] = (256, 128),
) -> Workload:
    """DCN-v2 (``model_type``: or ``fm``, DeepFM's FM part: the pairwise term, a row
    reduction) with ``method`` embeddings on the data in ``data_dir`` and one input batch per
    size in ``batch_sizes`` (the first rows of the training split, repeated when fewer);
    ``dropout`` after each MLP layer of sizes ``mlp``."""
    if model_type not in ("dcn_v2", "fm"):
        raise ValueError(f"model_type {model_type!r} is not one of ['dcn_v2', 'fm']")
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {list(METHODS)}")
    tf.keras.utils.set_random_seed(seed)
    schema = load_schema(data_dir / "schema.toml")
    files = list_parquet(data_dir / "train")
    stats = compute_stats(schema, iter_record_batches(schema, files))
    model_cfg = ModelConfig(
        type=model_type,
        embedding_dim=16,
        mlp=mlp,
        cross_layers=3,
        embedding_method=method,
        # BH tables ~10x smaller than full ones for fields of >= 1,000 values (others stay full)
        embedding_compression=10.0 if method == "bh" else 1.0,
        dropout=dropout,
    )
    cfg = PipelineConfig(
        output_dir=str(data_dir.parent / "unused"),
        data=DataConfig(schema=str(data_dir / "schema.toml"), train=(str(data_dir / "train"),)),
        model=model_cfg,
    )
    model = build_run_model(cfg, schema, stats)
    fields = list(schema.model_inputs)
    label = schema.label.name
    big = max(batch_sizes)
    raw = next(iter_batches(schema, files, batch_size=big, shuffle=False))
    n = len(raw[label])
    batches = {}
    for b in batch_sizes:
        idx = np.arange(b) % n
        batches[b] = {k: tf.constant(np.asarray(v)[idx]) for k, v in raw.items()}
    model(batches[min(batch_sizes)])
    optimizer = tf.keras.optimizers.SGD(lr)
    optimizer.build(model.trainable_variables)
    spec = input_signature(fields)

    def core(ids: dict[str, tf.Tensor], dense: tf.Tensor | None, training: bool) -> tf.Tensor:
        return model.logits_from(ids, dense, training)

    def inference(ids: dict[str, tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor:
        return core(ids, dense, False)

    def sparse(ids: dict[str, tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor:
        return model.embedding(ids).concat(dense)

    train_step = sgd_step(model, optimizer, core)

    preprocess = tf.function(model.preprocessor)
    inputs = {b: preprocess(batches[b]) for b in batch_sizes}
    labels = {b: batches[b][label] for b in batch_sizes}
    if model.dense_blocks:
        raise ValueError("bench/compiler models have no dense blocks (pair statistics)")
    table_rows = sum(
        int(v.shape[0])
        for v in model.trainable_variables
        if len(v.shape) == 2 and ("emb" in v.name or "embedding" in v.name)
    )
    return Workload(
        method=method,
        model=model,
        schema=schema,
        label=label,
        batches=batches,
        inputs=inputs,
        labels=labels,
        inference=inference,
        sparse=sparse,
        train_step=train_step,
        serving=tf.function(lambda f: model(f, training=False), input_signature=[spec]),
        table_rows=table_rows,
    )


def functions(w: Workload, jit: bool) -> dict[str, Any]:
    """``{"sparse": f, "inference": f, "train": f}``: tf.functions of the workload, XLA-compiled
    as a whole when ``jit`` (``jit_compile=True``), plain graph mode otherwise. ``sparse`` is the
    memory-bound half: lookups (mask, pool) through the concat with the dense inputs."""
    return {
        "sparse": tf.function(w.sparse, jit_compile=jit),
        "inference": tf.function(w.inference, jit_compile=jit),
        "train": tf.function(w.train_step, jit_compile=jit),
    }


def call_args(w: Workload, mode: str, batch: int) -> tuple:
    """Arguments of the ``mode`` function at ``batch``."""
    ids, dense = w.inputs[batch]
    return (ids, dense) if mode != "train" else (ids, dense, w.labels[batch])


def _logits_after_embedding(
    model: Any,
    embedded: Embedded,
    interaction_dense: tf.Tensor | None,
    ids: dict[str, tf.Tensor],
    dense: tf.Tensor | None,
    training: bool,
    wide_term: tf.Tensor | None = None,
) -> tf.Tensor:
    """``RankingModel.logits_from`` after its embedding lookups: interaction of ``embedded``
    (and ``interaction_dense``), tower, head, bias and the wide term of ``ids`` / ``dense``
    (``wide_term``: computed already, by a generated op outside an XLA-compiled rest)."""
    z = model.interaction(embedded, interaction_dense)
    if model.tower is not None:
        z = model.tower(z, training=training)
    logit = model.bias + model.head(z)[:, 0]
    if wide_term is not None:
        logit = logit + wide_term
    elif model.wide is not None:
        logit = logit + model.wide(ids, dense)
    return logit


def fused_functions(w: Workload, coefficients: Any = None) -> dict[str, Any]:
    """The workload with its embedding block as one generated op (``compiler_opt.codegen``).

    ``{"sparse": f, "inference": f, "train": f, "inference_xla_rest": f, "train_xla_rest": f,
    "block": BlockSpec, "kernel": Kernel}``: ``sparse`` is the op alone (lookups, masks,
    pooling and the concat with the dense inputs, one op; AMTL's mask MLPs stay TF ops in
    front of it); ``inference`` / ``train`` run the op and then the rest of the model in plain
    graph mode; the ``*_xla_rest`` variants run the rest (cross network, MLP, head) as one
    ``jit_compile`` sub-function (a custom op cannot be inside an XLA cluster). Raises
    ``compiler_opt.toolchain.CompilerUnavailable`` without a compiler. With ``coefficients``
    (``compiler_opt.cost``), the fields put in the kernel are those the fusion planner puts in
    its ``concat`` group (``emb_layer.planned_fields`` at the largest batch; ``"plan"`` in the
    result); without, every covered field.
    """
    model = w.model
    ids, dense = w.inputs[min(w.inputs)]
    # concat / cross read one x0 holding the dense inputs: they go into the op; FM reads the
    # field vectors and the dense inputs apart
    concat = model.interaction.input_form == Form.CONCAT
    dense_dim = 0 if dense is None or not concat else int(dense.shape[1])
    fields, plan = None, None
    if coefficients is not None:
        fields, plan = emb_layer.planned_fields(
            model.embedding, ids, dense, coefficients, max(w.inputs)
        )
    block, kernel = emb_layer.fused_block(model.embedding, ids, dense_dim=dense_dim, fields=fields)
    if block.uncovered:
        raise ValueError(f"fields left unfused in the {w.method} model: {block.uncovered}")
    optimizer = tf.keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)

    def sparse(ids: dict[str, tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor:
        if concat or dense is None:
            return emb_layer.fused_concat(block, kernel, ids, dense)
        return tf.concat([emb_layer.fused_concat(block, kernel, ids), dense], axis=1)

    # FM (as compiler_opt.fuse fuses it): the wide term's per-field weights as a second op,
    # summed; the fused model shares the variables, the plain one keeps the plain layers
    wide_fused = fuse(model, FuseSpec(kernels=True)).wide if not concat else None

    def wide(ids: dict[str, tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor | None:
        return wide_fused(ids, dense) if wide_fused is not None else None

    def rest(
        x0: tf.Tensor,
        ids: dict[str, tf.Tensor],
        dense: tf.Tensor | None,
        training: bool,
        wide_term: tf.Tensor | None = None,
    ):
        if concat:  # their input is the concat x0, which holds the dense inputs already
            return _logits_after_embedding(model, Embedded(block=x0), None, ids, dense, training)
        # FM: the field vectors as one [batch, F, d] block, the dense inputs apart
        fields = kernel.spec.fields
        block = tf.reshape(x0[:, : kernel.spec.emb_dim], [-1, len(fields), fields[0].dim])
        stacked = Embedded(block=block)
        return _logits_after_embedding(model, stacked, dense, ids, dense, training, wide_term)

    rest_xla = {
        t: tf.function(lambda x0, ids, dense, w, t=t: rest(x0, ids, dense, t, w), jit_compile=True)
        for t in (False, True)
    }

    def make(xla_rest: bool) -> tuple[Any, Any]:
        def core(ids: dict[str, tf.Tensor], dense: tf.Tensor | None, training: bool) -> tf.Tensor:
            x0 = sparse(ids, dense)
            w = wide(ids, dense)  # a generated op: outside any XLA cluster
            if xla_rest:
                return rest_xla[training](x0, ids, dense, w)
            return rest(x0, ids, dense, training, w)

        def inference(ids: dict[str, tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor:
            return core(ids, dense, False)

        return inference, sgd_step(model, optimizer, core)

    inference, train_step = make(False)
    inference_x, train_step_x = make(True)
    return {
        "sparse": sparse,
        "inference": inference,
        "train": train_step,
        "inference_xla_rest": inference_x,
        "train_xla_rest": train_step_x,
        "block": block,
        "kernel": kernel,
        "plan": plan,
    }


def htables_functions(w: Workload) -> dict[str, Any]:
    """The workload with horizontally fused tables (``compiler_opt.table_fusion``).

    ``{"sparse": f, "inference": f, "layer": HorizontalEmbeddingCollection, "sync": f}``:
    python functions like ``w.sparse`` / ``w.inference`` reading a
    ``HorizontalEmbeddingCollection`` built from ``w.model.embedding`` (a copy of its weights;
    the model itself is left as it is), so the plain and fused variants time side by side;
    ``sync()`` copies the model's current tables again (after a training mode moved them).
    Empty when fewer than two fields are fused (``amtl`` and ``bh``: their small fields, kept
    ``full``, are fused: 14 of 26 on the default data; the others run their own layers).
    """
    model = w.model
    emb = HorizontalEmbeddingCollection.from_collection(model.embedding)
    if len(emb.fused_fields) < 2:
        return {}

    def sparse(ids: dict[str, tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor:
        return emb(ids).concat(dense)

    def inference(ids: dict[str, tf.Tensor], dense: tf.Tensor | None) -> tf.Tensor:
        # RankingModel.logits_from with the fused collection in place of model.embedding
        return _logits_after_embedding(model, emb(ids), dense, ids, dense, False)

    return {
        "sparse": sparse,
        "inference": inference,
        "layer": emb,
        "sync": lambda: load_unfused(emb, model.embedding),
    }
