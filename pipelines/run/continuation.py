"""Warm start by value: a run continues a finished run whose vocabularies may differ.

``[train] continue_from = RUN`` (``stitchrec train --continue RUN``) starts a new run from the
previous run's selected checkpoint (``selected_checkpoint``: the best validation one when kept)
and its optimizer state. With ``m = id_map(old_vocab, new_vocab)`` (``m[j]`` the previous id of
the value holding new id ``j``, ``-1`` for a new value, ``m[0] = 0``) each variable of the new
model ``W'`` takes, from the previous model's ``W``:

* ``full`` tables (the wide weights too) and ``amtl`` tables, rows by value:
  ``W'[j] = W[m[j]]`` for ``m[j] >= 0``, else the ``[train] new_rows`` row: ``oov`` ``W[0]``,
  ``mean`` ``mean(W[1:])``, ``zeros``, ``init`` (the new model's own initial row). AMTL's
  ``counts`` the same way (a new value keeps its count in the new window), its ``count_stats``
  recomputed from them, its length MLPs as they are;
* the optimizer slots of those tables (Adam's ``m`` / ``v`` / ``vhat``, Adagrad's and FTRL's
  ``accumulator``, FTRL's ``linear``, SGD's momentum), rows by the same ``m``; a new value's
  slots start as a fresh optimizer's (0, or the accumulator's initial value);
* ``hashing`` and bucketized-numeric tables, BH tables (fingerprint codes are independent of the
  ids; vocabulary codes are the ids) and every other variable (interaction, towers, heads, bias)
  as they are, with their slots: same shapes required. QR tables index by id: the rows both
  runs have are copied, the rows a grown vocabulary adds keep their initial values. For BH and
  QR the log says how many kept values changed id (under id-stable vocabularies: none);
* the optimizer's ``iterations`` (Adam's bias correction goes on from there).

Variables are matched per embedding field by name and otherwise by their position in
``model.variables`` (the same architecture builds them in the same order); a field present in
one run only, a layer of another class or a shape that differs is a ``ValueError`` naming it.
A table split over parameter servers (a ``ShardedVariable``, each shard with its own slots) is
gathered whole, remapped, and assigned back shard by shard.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from compiler_opt import table_fusion
from embeddings.amtl import AMTLEmbedding
from embeddings.binary_hash import BinaryHashEmbedding
from embeddings.full import FullEmbedding
from embeddings.qr import QREmbedding
from features.schema import Schema
from features.stats import DatasetStats
from pipelines.config import ConfigError, load_config
from pipelines.config_train import NEW_ROWS
from pipelines.run.model import BEST_DIR, load_trained_model, make_optimizer, trained_optimizer
from pipelines.run.paths import Log, RunPaths
from ranking.multitask import MultiTaskModel

#: the per-variable slot lists of tf-keras's optimizers, indexed like ``optimizer._index_dict``:
#: Adam ``m``, ``v`` (``vhat`` with amsgrad); Adagrad and FTRL ``accumulator``; FTRL ``linear``;
#: SGD ``m``.
SLOT_LISTS = (
    "_momentums",
    "_velocities",
    "_velocity_hats",
    "_accumulators",
    "_linears",
    "momentums",
)
#: layers whose table rows are vocabulary ids, gathered by value
_BY_VALUE = (FullEmbedding, AMTLEmbedding)


@dataclasses.dataclass(frozen=True)
class ContinueOptions:
    """How ``continue_model`` starts the new rows.

    Attributes:
      new_rows: ``oov``, ``mean``, ``zeros`` or ``init`` (module docstring).
    """

    new_rows: str = "oov"

    def __post_init__(self) -> None:
        if self.new_rows not in NEW_ROWS:
            raise ValueError(f"new_rows {self.new_rows!r} is not one of {list(NEW_ROWS)}")


@dataclasses.dataclass
class Previous:
    """A finished run restored for continuing: its model (selected checkpoint), an optimizer of
    its kind holding its optimizer state, its statistics and schema, the checkpoints they were
    read from and its ``[model]`` BH codes (``vocabulary``: the ids; or ``fingerprint``)."""

    run_dir: Path
    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    stats: DatasetStats
    schema: Schema | None
    checkpoint: str
    optimizer_checkpoint: str
    bh_codes: str = "vocabulary"


def id_map(old_vocab: list[str], new_vocab: list[str]) -> np.ndarray:
    """int64 ``[len(new_vocab) + 1]``: for each new id ``j`` the previous id of the same value
    (``old_vocab.index(new_vocab[j - 1]) + 1``), ``-1`` for a value the previous vocabulary
    lacks; id 0 (the OOV row) maps to 0."""
    old = {v: i + 1 for i, v in enumerate(old_vocab)}
    return np.array([0, *(old.get(v, -1) for v in new_vocab)], np.int64)


def load_previous(run_dir: str | Path, log: Log) -> Previous:
    """Restores the finished run ``run_dir``: its selected checkpoint into its model and the
    optimizer state of the same step (the regular checkpoint of that step; the latest one when
    it is gone, said in the log) into an optimizer of the run's kind.

    Raises:
      FileNotFoundError: ``run_dir`` is not a run with a checkpoint.
      ConfigError: the run trained with fused tables or by L-BFGS, or its checkpoint holds no
        optimizer state (a config naming a run that cannot be continued).
    """
    paths = RunPaths(Path(run_dir))
    if table_fusion.run_has_fused_tables(paths.checkpoints):
        raise ConfigError(
            f"continue_from {str(run_dir)!r}: the run trained with [fusion] tables = true; its "
            "optimizer state belongs to the fused tables (continue from a run without it)"
        )
    model, schema, ckpt = load_trained_model(run_dir)
    cfg = load_config(paths.config)
    name = trained_optimizer(cfg, paths)
    if name == "lbfgs":
        raise ConfigError(
            f"continue_from {str(run_dir)!r}: the run was fitted exactly by L-BFGS and has no "
            "optimizer state to continue; continue a run trained with optimizer = 'ftrl'"
        )
    optimizer = make_optimizer(name, cfg.train.learning_rate)
    optimizer.build(model.trainable_variables)
    opt_ckpt = _optimizer_checkpoint(paths, ckpt, log)
    names = {name for name, _ in tf.train.list_variables(opt_ckpt)}
    if not any(n.startswith("optimizer/") for n in names):
        raise ConfigError(f"continue_from {str(run_dir)!r}: {opt_ckpt} holds no optimizer state")
    tf.train.Checkpoint(optimizer=optimizer).read(opt_ckpt).expect_partial()
    stats = DatasetStats.load(paths.stats)
    bh_codes = cfg.model.bh_codes()
    return Previous(Path(run_dir), model, optimizer, stats, schema, ckpt, opt_ckpt, bh_codes)


def _optimizer_checkpoint(paths: RunPaths, selected: str, log: Log) -> str:
    """The regular checkpoint holding the optimizer state of ``selected`` (itself unless it is
    the best checkpoint, which holds the model only)."""
    if Path(selected).parent.name != BEST_DIR:
        return selected
    same = paths.checkpoints / Path(selected).name
    if Path(f"{same}.index").exists():
        return str(same)
    latest = tf.train.latest_checkpoint(str(paths.checkpoints))
    if latest is None:
        raise ValueError(f"continue_from {str(paths.root)!r}: no checkpoint holds its optimizer")
    log(f"continue: the optimizer state of {selected} is gone; taking {latest}'s")
    return latest


def continue_model(
    model: tf.keras.Model,
    optimizer: tf.keras.optimizers.Optimizer,
    run_dir: str | Path | Previous,
    new_stats: DatasetStats,
    options: ContinueOptions,
    log: Log,
) -> dict[str, Any]:
    """Fills the built ``model`` and ``optimizer`` (built on ``model.trainable_variables``) from
    the finished run ``run_dir`` (or its ``load_previous``), by value (module docstring); call it
    in the strategy's scope. Returns per field what was done (``kept``, ``new`` rows, ``moved``
    ids, ``how``)."""
    prev = run_dir if isinstance(run_dir, Previous) else load_previous(run_dir, log)
    where = f"continue_from {str(prev.run_dir)!r}"
    if isinstance(model, MultiTaskModel) != isinstance(prev.model, MultiTaskModel):
        raise ValueError(f"{where}: one model is multi-task ([model] tasks), the other not")
    copier = _Copier(optimizer, prev.optimizer, options, where)
    copier.bh_ids = prev.bh_codes == "vocabulary"
    new_cols, old_cols = _collections(model), _collections(prev.model)
    if set(new_cols) != set(old_cols):
        raise ValueError(
            f"{where}: embedding blocks {sorted(new_cols)} here, {sorted(old_cols)} there"
        )
    summary: dict[str, Any] = {}
    done_new: set[int] = set()
    done_old: set[int] = set()
    for block, coll in new_cols.items():
        old = old_cols[block].layers_by_field
        _check_fields(list(coll.layers_by_field), list(old), where)
        for name, layer in coll.layers_by_field.items():
            vocabs = (_vocab(prev.stats, prev.schema, name), _vocab(new_stats, prev.schema, name))
            key = name if block == "embedding" else f"{block}:{name}"
            summary[key] = copier.field(layer, old[name], name, vocabs)
            done_new.update(id(v) for v in layer.variables)
            done_old.update(id(v) for v in old[name].variables)
    rest_new = [g for g in _groups(model.variables) if id(g[1][0]) not in done_new]
    rest_old = [g for g in _groups(prev.model.variables) if id(g[1][0]) not in done_old]
    if len(rest_new) != len(rest_old):
        raise ValueError(
            f"{where}: the models differ outside their embeddings ({len(rest_old)} variables "
            f"there, {len(rest_new)} here)"
        )
    for new_group, old_group in zip(rest_new, rest_old, strict=True):
        copier.as_is(new_group[1], old_group[1], _base_name(new_group[1][0]))
    optimizer.iterations.assign(prev.optimizer.iterations)
    moved = {k: v["moved"] for k, v in summary.items() if v.get("moved")}
    log(
        f"continue from {prev.checkpoint} (optimizer {prev.optimizer_checkpoint}, "
        f"{int(prev.optimizer.iterations)} iterations): "
        + ", ".join(_describe(k, v) for k, v in summary.items())
        + (f"; kept values whose id changed (BH / QR rows follow ids): {moved}" if moved else "")
    )
    return summary


def _describe(field: str, done: dict[str, Any]) -> str:
    if done["kept"] or done["new"]:
        return f"{field} {done['kept']} kept / {done['new']} new"
    return f"{field} {done['how']}"


def _collections(model: tf.keras.Model) -> dict[str, Any]:
    """The model's embedding collections: ``embedding`` and the wide part's ``wide``."""
    out = {}
    if getattr(model, "embedding", None) is not None:
        out["embedding"] = model.embedding
    wide = getattr(model, "wide", None)
    if wide is not None and getattr(wide, "field_weights", None) is not None:
        out["wide"] = wide.field_weights
    return out


def _check_fields(new: list[str], old: list[str], where: str) -> None:
    only_new, only_old = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    if only_new or only_old:
        raise ValueError(
            f"{where}: the runs embed other fields: {only_new} only in this run, {only_old} only "
            "in the previous run (continue a run of the same schema fields)"
        )


def _vocab(stats: DatasetStats, schema: Schema | None, name: str) -> list[str] | None:
    """The vocabulary a field's ids index (a sequence sharing another field's embedding: that
    field's), None for a field without one (hashed, bucketized numeric)."""
    if schema is not None and name in schema.names:
        name = schema.field(name).shares_embedding_with or name
    if name not in stats.fields or not stats[name].vocab:
        return None
    return list(stats[name].vocab)


def _groups(variables: list[tf.Variable]) -> list[tuple[Any, list[tf.Variable]]]:
    """``(variable, parts)`` per model variable: a ShardedVariable's shards (in order) as one
    entry, any other variable as its own single part."""
    out: list[tuple[Any, list[tf.Variable]]] = []
    index: dict[int, int] = {}
    for v in variables:
        ref = getattr(v, "_sharded_container", None)
        whole = ref() if ref is not None else None
        if whole is None:
            out.append((v, [v]))
        elif id(whole) in index:
            out[index[id(whole)]][1].append(v)
        else:
            index[id(whole)] = len(out)
            out.append((whole, [v]))
    return out


def _base_name(v: tf.Variable) -> str:
    return v.name.split(":")[0].rsplit("/part_", 1)[0]


def _value(parts: list[tf.Variable]) -> np.ndarray:
    return np.concatenate([p.numpy() for p in parts]) if len(parts) > 1 else parts[0].numpy()


def _assign(parts: list[tf.Variable], value: np.ndarray) -> None:
    """Assigns ``value`` to a variable given as its parts (consecutive rows of each shard)."""
    if len(parts) == 1:
        parts[0].assign(value)
        return
    start = 0
    for p in parts:
        rows = int(p.shape[0])
        p.assign(value[start : start + rows])
        start += rows


class _Copier:
    """Copies variables and their optimizer slots from the previous model and optimizer."""

    def __init__(
        self,
        optimizer: tf.keras.optimizers.Optimizer,
        previous: tf.keras.optimizers.Optimizer,
        options: ContinueOptions,
        where: str,
    ) -> None:
        self.optimizer, self.previous = optimizer, previous
        self.options, self.where = options, where
        if type(optimizer) is not type(previous):
            raise ValueError(
                f"{where}: the previous run trained with {type(previous).__name__}, this one "
                f"with {type(optimizer).__name__}; continue with the same [train] optimizer"
            )
        self.layers_done: set[int] = set()
        #: BH codes are vocabulary ids (not fingerprints): a kept value whose id moved matters
        self.bh_ids = True

    def field(
        self,
        layer: tf.keras.layers.Layer,
        old: tf.keras.layers.Layer,
        name: str,
        vocabs: tuple[list[str] | None, list[str] | None],
    ) -> dict[str, Any]:
        """Copies one field's layer (module docstring; the new window's AMTL counts are in the
        new layer's ``counts`` already); returns what was done."""
        if type(layer) is not type(old):
            raise ValueError(
                f"{self.where}: field {name!r} is a {type(old).__name__} there, a "
                f"{type(layer).__name__} here"
            )
        if id(layer) in self.layers_done:  # a layer two fields share
            return {"how": "shared", "kept": 0, "new": 0}
        self.layers_done.add(id(layer))
        m = id_map(*vocabs) if vocabs[0] is not None and vocabs[1] is not None else None
        by_value = m is not None and isinstance(layer, _BY_VALUE)
        new_groups, old_groups = _groups(layer.variables), _groups(old.variables)
        if len(new_groups) != len(old_groups):
            raise ValueError(f"{self.where}: field {name!r}'s layers differ in their weights")
        for (var, parts), (_, old_parts) in zip(new_groups, old_groups, strict=True):
            label = f"field {name!r} {_base_name(parts[0])}"
            if by_value and var is layer.table:
                self._check_rows(parts, old_parts, vocabs, label)
                self.gather(parts, old_parts, m, self.options.new_rows, label)
            elif by_value and var is getattr(layer, "counts", None):
                self.gather(parts, old_parts, m, "init", label)  # a new value: its window count
            elif by_value and var is getattr(layer, "count_stats", None):
                continue  # recomputed from the counts below
            elif isinstance(layer, QREmbedding) and _rows_differ(parts, old_parts):
                self.prefix(parts, old_parts, label)
            else:
                self.as_is(parts, old_parts, label)
        if by_value and isinstance(layer, AMTLEmbedding):
            logs = np.log1p(layer.counts.numpy().astype(np.float64))  # as AMTL's set_counts
            layer.count_stats.assign(np.array([logs.mean(), logs.std()], np.float32))
        ids_matter = isinstance(layer, QREmbedding) or (
            isinstance(layer, BinaryHashEmbedding) and self.bh_ids
        )
        return _field_summary(m, by_value, ids_matter)

    def _check_rows(self, parts: list, old_parts: list, vocabs: tuple, label: str) -> None:
        for p, vocab, there in ((old_parts, vocabs[0], "there"), (parts, vocabs[1], "here")):
            rows = _shape(p)[0]
            if rows != len(vocab) + 1:
                raise ValueError(
                    f"{self.where}: {label} has {rows} rows {there}, its vocabulary "
                    f"{len(vocab)} values + the OOV row"
                )

    def slots(self, optimizer: Any, parts: list[tf.Variable]) -> dict[str, list[tf.Variable]]:
        """``{slot list: the slot of each part}`` of a variable (none for a non-trainable one)."""
        out: dict[str, list[tf.Variable]] = {}
        for part in parts:
            index = optimizer._index_dict.get(optimizer._var_key(part))
            if index is None:
                return {}
            for name in SLOT_LISTS:
                slots = getattr(optimizer, name, None)
                if slots is not None and len(slots) > index:
                    out.setdefault(name, []).append(slots[index])
        return out

    def _pairs(self, parts: list, old_parts: list) -> list[tuple[list, list]]:
        """(new, previous) parts of the variable and of each of its slots."""
        new_slots = self.slots(self.optimizer, parts)
        old_slots = self.slots(self.previous, old_parts)
        if set(new_slots) != set(old_slots):
            raise ValueError(
                f"{self.where}: {_base_name(parts[0])} has optimizer slots {sorted(old_slots)} "
                f"there, {sorted(new_slots)} here"
            )
        return [(parts, old_parts)] + [(new_slots[k], old_slots[k]) for k in sorted(new_slots)]

    def as_is(self, parts: list, old_parts: list, label: str) -> None:
        """The previous value (and slots) as it is; same shape required."""
        new_shape = _shape(parts)
        old_value = _value(old_parts)
        if new_shape != tuple(old_value.shape):
            raise ValueError(
                f"{self.where}: {label} has shape {list(old_value.shape)} there, "
                f"{list(new_shape)} here"
            )
        for new, old in self._pairs(parts, old_parts):
            _assign(new, _value(old))

    def prefix(self, parts: list, old_parts: list, label: str) -> None:
        """The rows both have (rows by id); the rest keep their initial values and slots."""
        for new, old in self._pairs(parts, old_parts):
            value, previous = _value(new), _value(old)
            if value.shape[1:] != previous.shape[1:]:
                raise ValueError(
                    f"{self.where}: {label} has shape {list(previous.shape)} there, "
                    f"{list(value.shape)} here"
                )
            n = min(len(value), len(previous))
            value[:n] = previous[:n]
            _assign(new, value)

    def gather(
        self, parts: list, old_parts: list, m: np.ndarray, new_rows: str, label: str
    ) -> None:
        """Rows by value: row ``j`` takes previous row ``m[j]``; a new value (``m[j] = -1``) the
        ``new_rows`` row; its slots their fresh values."""
        if _shape(parts)[1:] != _shape(old_parts)[1:]:
            raise ValueError(
                f"{self.where}: {label} has shape {list(_shape(old_parts))} there, "
                f"{list(_shape(parts))} here"
            )
        fresh = m < 0
        for i, (new, old) in enumerate(self._pairs(parts, old_parts)):
            previous, current = _value(old), _value(new)
            value = previous[np.maximum(m, 0)]
            how = new_rows if i == 0 else "init"  # slots of a new value start fresh
            if how == "oov":
                value[fresh] = previous[0]
            elif how == "mean":
                value[fresh] = previous[1:].mean(axis=0) if len(previous) > 1 else previous[0]
            elif how == "zeros":
                value[fresh] = 0
            else:
                value[fresh] = current[fresh]
            _assign(new, value)


def _shape(parts: list[tf.Variable]) -> tuple[int, ...]:
    """The shape of a variable given as its parts (shards of consecutive rows)."""
    if len(parts) == 1:
        return tuple(int(d) for d in parts[0].shape)
    return (sum(int(p.shape[0]) for p in parts), *(int(d) for d in parts[0].shape[1:]))


def _rows_differ(parts: list, old_parts: list) -> bool:
    return _shape(parts)[:1] != _shape(old_parts)[:1]


def _field_summary(m: np.ndarray | None, by_value: bool, ids_matter: bool) -> dict[str, Any]:
    if m is None:
        return {"how": "as is", "kept": 0, "new": 0}
    kept = m[1:] >= 0
    out = {"how": "by value" if by_value else "as is", "kept": int(kept.sum())}
    out["new"] = int((~kept).sum())
    if ids_matter:
        ids = np.arange(1, len(m))
        out["moved"] = int((m[1:][kept] != ids[kept]).sum())
    return out
