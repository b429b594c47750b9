"""``stitchrec export``: a trained run -> a SavedModel that scores RAW features.

The SavedModel's ``serving_default`` signature takes one 1-D tensor per model input, named by
field (``tf.string`` for string fields, ``tf.int64`` for int64 fields, ``tf.float32`` for numeric
fields), and returns ``score`` (click probability, ``[batch]``) and ``logit``. Vocabulary lookup,
hashing, bucketizing and numeric transforms run inside it, so a client sends what is in the logs.

Layout: ``<run>/export/<version>/`` (version = 1, 2, ... as TF Serving expects) with
``assets.extra/schema.toml`` (the fields the signature takes) and
``assets.extra/stitchrec.json`` (model name, training run, input names) and
``assets.extra/stats.json`` (the training statistics, without the vocabularies the model holds).
Every version folder is written under a hidden name (``.<version>.tmp-<pid>``), marked complete
(``assets.extra/stitchrec.done``, written last) and renamed into place
(``serving.version_files.atomic_dir``): a killed export leaves only a hidden folder, which
servers and ``next_version`` ignore and the next export deletes.
``export_cascade_saved_model`` writes a pre-ranking -> ranking cascade (``ranking.cascade``);
``export_ensemble`` writes several checkpoints of one run as one model of the same signature,
its outputs averaged over the members, and ``export_run_ensemble`` the selected checkpoints of
several runs (docs/ensembles.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import tensorflow as tf
from tf_keras.src.saving.legacy.saved_model.utils import keras_option_scope

from compiler_opt.embedding_op import assets as emb_assets
from compiler_opt.transform import FuseSpec, fuse, fused_collections, kernels_of
from compiler_opt.tune import recorded_schedule
from embeddings.protocols import HasServingForm
from embeddings.quantize import DEFAULT_MIN_ROWS, quantized_model
from features.dataset import input_signature
from features.schema import FeatureSpec, Schema, load_schema
from features.stats_types import STATS_FILE, DatasetStats
from pipelines.evaluation.tasks import task_logits, tasks_of_model
from pipelines.run.ensemble import COMBINES
from pipelines.run.model import load_trained_model, restore_run_model
from pipelines.run.paths import ASSETS_EXTRA, RunPaths
from ranking.cascade import CascadeModule
from ranking.models import RankingModel
from ranking.multitask import MultiTaskModel
from serving.version_files import atomic_dir


class ServingModule(tf.Module):
    """Wraps a RankingModel with a raw-feature signature."""

    def __init__(self, model: RankingModel, fields: list[FeatureSpec]):
        super().__init__(name="stitchrec_serving")
        self.model = model
        self.serve = tf.function(
            self._serve, input_signature=[input_signature(fields)], autograph=False
        )

    def _serve(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        if not isinstance(self.model, MultiTaskModel):
            logits = self.model(features, training=False)
            return serving_outputs(logits, tf.sigmoid(logits), [])
        logits = task_logits(self.model, features)
        primary = logits[self.model.task_names[0]]
        out = {"score": tf.sigmoid(primary), "logit": primary}
        for key, logit in logits.items():
            out[f"score_{key}"] = tf.sigmoid(logit)
            out[f"logit_{key}"] = logit
        return out


def joint_logits(model: tf.keras.Model, features: dict[str, tf.Tensor]) -> tf.Tensor:
    """A model's logits of each task's label over every row: ``[batch]`` for one task,
    ``[batch, T]`` for a ``MultiTaskModel`` (``serving_logits``)."""
    if isinstance(model, MultiTaskModel):
        return model.serving_logits(features)[0]
    return model(features, training=False)


def task_records(model: tf.keras.Model, conditional: bool = True) -> list[dict[str, Any]]:
    """The ``tasks`` of ``stitchrec.json`` (``pipelines.evaluation.tasks``): none for a
    single-task model (``conditional``: see ``tasks_of_model``)."""
    if not isinstance(model, MultiTaskModel):
        return []
    return [t.to_dict() for t in tasks_of_model(model, conditional)]


def serving_outputs(logits: tf.Tensor, scores: tf.Tensor, tasks: list[str]) -> dict[str, tf.Tensor]:
    """The signature's outputs from logits and probabilities ``[batch]`` (one task) or
    ``[batch, T]`` (columns in task order): ``score`` and ``logit`` of the primary (first)
    task, and for a multi-task model ``score_<task>`` and ``logit_<task>`` of every task."""
    if logits.shape.rank == 1:
        return {"score": scores, "logit": logits}
    out = {"score": scores[:, 0], "logit": logits[:, 0]}
    for i, task in enumerate(tasks):
        out[f"score_{task}"] = scores[:, i]
        out[f"logit_{task}"] = logits[:, i]
    return out


def next_version(base: Path) -> Path:
    """``base/<N + 1>``, N the highest version folder name under ``base`` (hidden temporary
    folders of unfinished exports are not versions)."""
    versions = [int(p.name) for p in base.glob("*") if p.is_dir() and p.name.isdigit()]
    return base / str(max(versions, default=0) + 1)


def export_saved_model(
    model: RankingModel,
    schema: Schema,
    output: str | Path,
    extra: dict[str, Any] | None = None,
    kernels: bool = False,
    quantize: str | None = None,
    quantize_min_rows: int = DEFAULT_MIN_ROWS,
) -> Path:
    """Writes the SavedModel of ``model`` to ``output`` (replacing it).

    The model is first put in its serving form: embedding layers with a more compact inference
    form (AMTL rows truncated to their learned lengths) are replaced by it, so the SavedModel
    holds only what serving needs. With ``kernels``, the embedding block then runs as one
    generated op (``compiler_opt.codegen``; fields it does not cover keep their layers) and the
    op's source ships in ``assets/`` so that a server loads (or compiles) it before the model.
    With ``quantize`` (``int8`` or ``fp16``), the embedding tables of at least
    ``quantize_min_rows`` rows are stored row-wise quantized (``embeddings.quantize``) and
    ``stitchrec.json`` records them under ``quantization``.

    Raises:
      ValueError: ``kernels`` and no generated op could be built (no compiler, or no field
        covered): the export would not hold what was asked for; ``kernels`` with ``quantize``
        (the generated op reads float32 tables); an unknown ``quantize`` mode.
    """
    model = serving_form(model)
    if quantize is not None:
        if kernels:
            raise ValueError("export: quantize and kernels: the generated op reads fp32 tables")
        model, record = quantized_model(model, quantize, quantize_min_rows)
        extra = {**(extra or {}), "quantization": record}
    fused = None
    if kernels:
        # the op under this device's tuned schedule (stitchrec fuse tune), when recorded
        model = fuse(model, FuseSpec(kernels=True, schedule_for=recorded_schedule))
        fused = model.embedding
    out = Path(output)
    fields = list(schema.model_inputs)
    module = ServingModule(model, fields)
    with atomic_dir(out) as tmp:
        # Only the serving signature is traced: Keras would also trace every layer's call for
        # `load_model`, hundreds of functions that a serving process would load and never run.
        with keras_option_scope(save_traces=False, in_tf_saved_model_scope=True):
            tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})
        if fused is not None:
            if fused.kernel is None:
                raise ValueError(
                    f"export --fuse-kernels: no generated op for {model.name}'s embeddings "
                    f"({fused.fallback_reason or f'no field covered: {fused.uncovered}'})"
                )
            emb_assets.write_saved_model_assets(tmp, kernels_of(fused_collections(model)))
        meta = {"model": model.name, "inputs": [f.name for f in fields], **(extra or {})}
        records = task_records(model)
        if records:
            meta["tasks"] = records
        write_assets_extra(tmp, schema, fields, meta)
    return out


def serving_form(model: RankingModel) -> RankingModel:
    """``model`` with its embedding block in its serving form (when it has a more compact
    one: AMTL rows truncated to their learned lengths)."""
    if isinstance(getattr(model, "embedding", None), HasServingForm):
        return model.with_blocks(embedding=model.embedding.serving_form())
    return model


def write_assets_extra(
    out: Path, schema: Schema, fields: list[FeatureSpec], meta: dict[str, Any]
) -> None:
    """``assets.extra/schema.toml`` (the fields the signature takes) and
    ``assets.extra/stitchrec.json`` (``meta``) of the SavedModel at ``out``."""
    assets = out / ASSETS_EXTRA
    assets.mkdir(exist_ok=True)
    schema.select([f.name for f in fields]).save(assets / "schema.toml")
    (assets / "stitchrec.json").write_text(json.dumps(meta, indent=1))


def export_cascade_saved_model(
    prerank: tf.keras.Model,
    rank: RankingModel,
    groups: dict[str, str | None],
    output: str | Path,
    keep: int,
    extra: dict[str, Any] | None = None,
    kernels: bool = False,
) -> Path:
    """Writes the cascade SavedModel of ``prerank`` and ``rank`` (``ranking.cascade``).

    With ``kernels``, ``rank_request`` scores with the models' fused forms
    (``compiler_opt.fuse``: each ``RankingModel``'s candidate lookups as one generated op,
    ``RequestScorer``), whose sources ship in ``assets/`` (the server loads them first);
    ``serving_default`` runs ``rank`` as it is.

    Raises:
      ValueError: ``kernels`` and no generated op could be built for the cascade's lookups.
    """
    if not kernels:
        with atomic_dir(output) as tmp:
            CascadeModule(prerank, rank, groups, keep).save(tmp, extra)
        return Path(output)
    spec = FuseSpec(kernels=True)
    scored = tuple(
        fuse(m, spec) if isinstance(m, RankingModel) and m.embedding is not None else m
        for m in (prerank, rank)
    )
    module = CascadeModule(prerank, rank, groups, keep, request_models=scored)
    with atomic_dir(output) as tmp:
        module.save(tmp, extra)
        used = kernels_of(
            module.prerank_scorer.embedding_collections + module.rank_scorer.embedding_collections
        )
        if not used:
            raise ValueError("export --fuse-kernels: no generated op for the cascade's lookups")
        emb_assets.write_saved_model_assets(tmp, used)
    return Path(output)


def export_run(
    run_dir: str | Path,
    output: str | Path | None = None,
    kernels: bool = False,
    quantize: str | None = None,
    quantize_min_rows: int = DEFAULT_MIN_ROWS,
) -> Path:
    """Exports the latest checkpoint of a training run; returns the SavedModel folder
    (``kernels``: the embedding block as a generated op; ``quantize``: its tables quantized;
    see ``export_saved_model``)."""
    model, schema, ckpt = load_trained_model(run_dir)
    paths = RunPaths(Path(run_dir))
    stats = DatasetStats.check(paths.stats)  # unreadable statistics stop it before any work
    out = Path(output) if output else next_version(paths.exports)
    with atomic_dir(out) as tmp:
        export_saved_model(
            model,
            schema,
            tmp,
            extra={"run": str(paths.root.resolve()), "checkpoint": ckpt},
            kernels=kernels,
            quantize=quantize,
            quantize_min_rows=quantize_min_rows,
        )
        shutil.copy(stats, tmp / ASSETS_EXTRA / STATS_FILE)
    return out


def saved_model_bytes(path: str | Path) -> dict[str, int]:
    """Bytes on disk of a SavedModel: variables, graph, total."""
    p = Path(path)
    variables = sum(f.stat().st_size for f in (p / "variables").rglob("*") if f.is_file())
    total = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return {"variables": variables, "total": total}


class EnsembleError(ValueError):
    """Runs or checkpoints that cannot make one ensemble (a user error)."""


class EnsembleServingModule(tf.Module):
    """Several RankingModels behind one raw-feature signature, their outputs averaged.

    ``combine = "logits"``: ``logit`` is the members' mean logit, ``score`` its sigmoid.
    ``"probabilities"``: ``score`` is the members' mean probability, ``logit`` its logit
    (``pipelines.run.ensemble.average``, from log-sigmoids).
    """

    def __init__(self, models: list[RankingModel], fields: list[FeatureSpec], combine: str):
        super().__init__(name="stitchrec_ensemble")
        if combine not in COMBINES:
            raise ValueError(f"combine = {combine!r}: expected one of {list(COMBINES)}")
        self.members = list(models)
        self.combine = combine
        self.serve = tf.function(
            self._serve, input_signature=[input_signature(fields)], autograph=False
        )

    def _serve(self, features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        # [members, batch] (or [members, batch, T] for multi-task members)
        x = tf.stack([joint_logits(m, features) for m in self.members])
        tasks = self.members[0].task_names
        if self.combine == "logits":
            logits = tf.reduce_mean(x, axis=0)
            return serving_outputs(logits, tf.sigmoid(logits), tasks)
        top = tf.reduce_logsumexp(tf.math.log_sigmoid(x), axis=0)
        bottom = tf.reduce_logsumexp(tf.math.log_sigmoid(-x), axis=0)
        return serving_outputs(top - bottom, tf.reduce_mean(tf.sigmoid(x), axis=0), tasks)


def load_checkpoint_model(run_dir: str | Path, checkpoint: str) -> RankingModel:
    """The run's model (``model.json``) restored from ``checkpoint``, a checkpoint prefix
    (absolute, or relative to the run folder: ``snapshots/snapshot-3``; a snapshot written by
    ``Checkpoint.write`` or a ``CheckpointManager`` checkpoint of the run), as
    ``load_trained_model`` restores the latest one (fused tables mapped back included).

    Raises:
      FileNotFoundError: ``checkpoint`` has no ``.index`` file.
    """
    paths = RunPaths(Path(run_dir))
    prefix = Path(checkpoint) if Path(checkpoint).is_absolute() else paths.root / checkpoint
    if not Path(f"{prefix}.index").exists():
        raise FileNotFoundError(
            f"checkpoint {checkpoint!r} of run {str(paths.root)!r}: no {prefix}.index"
        )
    return restore_run_model(paths, prefix, load_schema(paths.schema))


def export_ensemble(
    run_dir: str | Path,
    checkpoints: list[str],
    output: str | Path | None = None,
    combine: str = "logits",
    extra: dict[str, Any] | None = None,
    quantize: str | None = None,
    quantize_min_rows: int = DEFAULT_MIN_ROWS,
) -> Path:
    """Writes one SavedModel averaging the run's models at ``checkpoints`` (see
    ``EnsembleServingModule``; ``quantize``: each member's tables quantized, as
    ``export_saved_model`` does); returns its folder (``output``, replaced, or the run's next
    export version).

    Its ``serving_default`` takes the raw-feature signature of a single model's export and
    returns ``score`` and ``logit``; ``assets.extra/`` holds ``schema.toml``, ``stats.json``
    and ``stitchrec.json``, which names the members (``ensemble.members``, in order) and the
    rule (``ensemble.combine``). Every member runs on every request: N members cost N times
    one model's work.

    Raises:
      ValueError: no checkpoint, a checkpoint given twice, or an unknown ``combine``.
      FileNotFoundError: a checkpoint does not exist.
    """
    if not checkpoints:
        raise ValueError("export_ensemble: checkpoints = []: expected at least one checkpoint")
    if len(set(checkpoints)) != len(checkpoints):
        raise ValueError(f"export_ensemble: checkpoints = {checkpoints!r}: each at most once")
    if combine not in COMBINES:
        raise ValueError(f"export_ensemble: combine = {combine!r}: expected one of {COMBINES}")
    paths = RunPaths(Path(run_dir))
    models = [serving_form(load_checkpoint_model(run_dir, c)) for c in checkpoints]
    models, quantization = _quantized(models, quantize, quantize_min_rows)
    out = Path(output) if output else next_version(paths.exports)
    meta = {
        "run": str(paths.root.resolve()),
        "ensemble": {"combine": combine, "members": list(checkpoints)},
        **quantization,
        **(extra or {}),
    }
    return _save_ensemble(models, paths, out, combine, meta)


def export_run_ensemble(
    runs: list[str | Path],
    output: str | Path | None = None,
    combine: str = "logits",
    quantize: str | None = None,
    quantize_min_rows: int = DEFAULT_MIN_ROWS,
) -> Path:
    """Writes one SavedModel averaging the selected checkpoints of several training runs
    (``load_trained_model``: each run's best validation checkpoint, else its latest), e.g.
    runs of one config with different seeds; returns its folder (``output``, replaced, or the
    first run's next export version). ``quantize``: each member's tables quantized.

    The runs must take the same model inputs (names, kinds and raw types of the fields): each
    member keeps its own preprocessing and weights, so their vocabularies, statistics and
    architectures may differ. ``assets.extra/`` holds the first run's schema and statistics; ``stitchrec.json``
    names the runs and their checkpoints (``ensemble.members``: ``<run>:<checkpoint>``).

    Raises:
      EnsembleError: fewer than two runs, a run given twice, runs of different model inputs, or
        an unknown ``combine``.
      FileNotFoundError: a run has no model or no checkpoint.
    """
    folders = [Path(r).resolve() for r in runs]
    if len(folders) < 2 or len(set(folders)) != len(folders):
        raise EnsembleError(f"export: runs = {[str(r) for r in runs]}: expected two or more runs")
    if combine not in COMBINES:
        raise EnsembleError(f"export: combine = {combine!r}: expected one of {COMBINES}")
    loaded = [load_trained_model(r) for r in folders]
    first = _inputs(loaded[0][1])
    for run, (_, schema, _) in zip(folders[1:], loaded[1:], strict=True):
        if _inputs(schema) != first:
            raise EnsembleError(
                f"export: run {str(run)!r} takes the inputs {_inputs(schema)}, the run "
                f"{str(folders[0])!r} {first}: an ensemble's members must take the same fields"
            )
    paths = RunPaths(folders[0])
    out = Path(output) if output else next_version(paths.exports)
    members = [f"{run}:{ckpt}" for run, (_, _, ckpt) in zip(folders, loaded, strict=True)]
    meta = {
        "run": str(folders[0]),
        "runs": [str(r) for r in folders],
        "ensemble": {"combine": combine, "members": members},
    }
    models = [serving_form(m) for m, _, _ in loaded]
    models, quantization = _quantized(models, quantize, quantize_min_rows)
    return _save_ensemble(models, paths, out, combine, {**meta, **quantization})


def _quantized(
    models: list[RankingModel], quantize: str | None, min_rows: int
) -> tuple[list[RankingModel], dict[str, Any]]:
    """The members with their tables quantized (``quantize`` None: as they are) and
    ``{"quantization": {"mode", "min_rows", "members": [record, ...]}}`` (or ``{}``)."""
    if quantize is None:
        return models, {}
    pairs = [quantized_model(m, quantize, min_rows) for m in models]
    record = {"mode": quantize, "min_rows": min_rows, "members": [r for _, r in pairs]}
    return [m for m, _ in pairs], {"quantization": record}


def _inputs(schema: Schema) -> list[str]:
    """The model inputs of ``schema`` as ``name (kind dtype)``."""
    return [f"{f.name} ({f.kind.value} {f.dtype})" for f in schema.model_inputs]


def _save_ensemble(
    models: list[RankingModel], paths: RunPaths, out: Path, combine: str, meta: dict[str, Any]
) -> Path:
    """The SavedModel of ``EnsembleServingModule(models)`` at ``out`` (replaced), with the
    assets of run ``paths`` and ``meta`` in ``stitchrec.json``."""
    schema = load_schema(paths.schema)
    stats = DatasetStats.check(paths.stats)
    fields = list(schema.model_inputs)
    module = EnsembleServingModule(models, fields, combine)
    with atomic_dir(out) as tmp:
        with keras_option_scope(save_traces=False, in_tf_saved_model_scope=True):
            tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})
        meta = {"model": models[0].name, "inputs": [f.name for f in fields], **meta}
        records = task_records(models[0], conditional=False)  # the members' mean per task
        if records:
            meta["tasks"] = records
        write_assets_extra(tmp, schema, fields, meta)
        shutil.copy(stats, tmp / ASSETS_EXTRA / STATS_FILE)
    return out
