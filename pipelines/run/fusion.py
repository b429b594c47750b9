"""The ``[fusion]`` transformations ``stitchrec train`` applies to a model before training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from compiler_opt import FuseSpec, cost, fuse, realize, table_fusion
from pipelines.config import ConfigError, PipelineConfig
from pipelines.run.model import make_optimizer
from pipelines.run.paths import Log, RunPaths
from pipelines.run.schedules import learning_rate_of
from ranking.blocks import MLP
from ranking.multitask_heads import TaskTowers

Step = Callable[[Any], Any]


def with_gradient(model: tf.keras.Model, gradient: str) -> tf.keras.Model:
    """A new model over ``model``'s layers whose MLP tower (a multi-task model: task towers)
    computes its gradient as ``gradient`` says (``ranking.blocks.MLP.with_gradient``);
    ``model`` itself when it has no such tower."""
    for block, kind in (("tower", MLP), ("towers", TaskTowers)):
        old = getattr(model, block, None)
        if isinstance(old, kind):
            new = old.with_gradient(gradient)
            return model if new is old else model.with_blocks(**{block: new})
    return model


def fuse_for_training(
    cfg: PipelineConfig,
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    paths: RunPaths,
    build_step: Callable[[tf.keras.Model, tf.keras.optimizers.Optimizer], Step],
    *,
    distributed: bool,
    log: Log,
) -> tuple[tf.keras.Model, tf.keras.optimizers.Optimizer, Step, realize.TrainingStep | None]:
    """The model ``[fusion]`` makes of ``model`` (``compiler_opt.fuse``, after ``model.json``
    is written: export rebuilds the plain model; ``model`` itself is left as it is) and its
    training step; returns ``(model, optimizer, step, clusters step)``.

    * ``kernels``: the embedding block runs as one generated kernel (``compiler_opt.embedding_op``;
      same variables and checkpoint);
    * ``tables``: the per-field tables fused into group tables
      (``compiler_opt.table_fusion``, the mapping written next to the checkpoints), with a
      fresh optimizer (the plain tables it was built on are not trained); a run fused the
      other way is refused on resume;
    * ``activations``: the MLP towers' gradients (``with_gradient``);
    * ``clusters``: the step ``build_step(model, optimizer)`` makes runs its planned groups as XLA
      clusters (``compiler_opt.realize.TrainingStep``), returned also as the third item.

    Raises:
      ConfigError: ``tables`` or ``clusters`` with a distribution strategy (``distributed``).
    """
    fusion = cfg.fusion
    tc = cfg.train
    kernels = fusion is not None and fusion.kernels
    tables = fusion is not None and fusion.tables
    if tables and distributed:
        raise ConfigError("[fusion] tables = true: not supported with a distribution strategy yet")
    table_fusion.check_resume(paths.checkpoints, enabled=tables)
    model = fuse(model, FuseSpec(kernels=kernels, tables=tables))
    if fusion is not None and fusion.activations != "backprop":
        model = with_gradient(model, fusion.activations)
        log(f"fusion: the MLP towers' ReLU and dropout differentiated as {fusion.activations}")
    if kernels:
        log("fusion: the embedding block runs as one generated kernel (compiler_opt.embedding_op)")
    if tables:
        fused_tables = model.embedding
        table_fusion.write_mapping(paths.checkpoints, fused_tables)
        optimizer = make_optimizer(tc.optimizer, learning_rate_of(optimizer))
        optimizer.build(model.trainable_variables)
        log(
            f"fusion: {len(fused_tables.fused_fields)} tables as {len(fused_tables.group_tables)} "
            f"(compiler_opt.table_fusion); unfused: {fused_tables.uncovered or 'none'}"
        )
    step = build_step(model, optimizer)
    if fusion is None or not fusion.clusters:
        return model, optimizer, step, None
    if distributed:
        raise ConfigError("[fusion] clusters = true: not supported with a distribution strategy")
    fused_step = realize.TrainingStep(step, cost.load_or_calibrate(), tc.batch_size)
    log(
        f"fusion: the training step's planned groups as {fused_step.clusters} XLA clusters "
        "(compiler_opt.realize.TrainingStep; the first steps time them against the step "
        "without clusters and keep the faster)"
    )
    return model, optimizer, fused_step, fused_step
