"""Horizontal table fusion at model-build time: a group's tables as ONE variable, one gather.

``HorizontalEmbeddingCollection`` is a drop-in for ``embeddings.collection.EmbeddingCollection``
(same ``{field: ids} -> Embedded`` call, ``{field: [batch, dim]}`` in the ``fields`` form, same
values bit for bit given the same weights). Fields it covers (method ``full`` or ``hashing``, ``l2 == 0``, dense or ragged ids,
combiner ``mean``/``sum``) are grouped by ``(dim, dtype)``; each group of two or more fields
holds one variable ``T_g [R_g, dim]`` with ``R_g = sum_f rows_f`` (``rows_f``: ``num_rows`` of a
``full`` field, ``buckets`` of a ``hashing`` one) and field ``f`` owning rows
``[o_f, o_f + rows_f)``, ``o_f = sum_{f' before f} rows_f'``. A call computes, per field, the
row of each id with the field's own rule (``embeddings.full.oov_safe`` or
``HashingEmbedding.bucket``), shifts it by ``o_f``, concatenates the group's rows and reads them
with ONE ``tf.gather(T_g, rows)``; the result is split back per field and shaped / pooled by
``embeddings.common.pool_and_regularize`` exactly as the field's own layer does:

    e_f(i) = T_g[o_f + rule_f(i)]  ==  W_f[rule_f(i)]   when  T_g[o_f:o_f+rows_f] == W_f

The gradient of ``T_g`` is one ``tf.IndexedSlices`` (tf.gather's), so optimizers update it
sparsely as they update the per-field tables. Fields not covered keep their own layers
(``uncovered``: ``{field: reason}``).

Checkpoint mapping (``checkpoint_mapping()``: ``{field: (group variable, row_start, row_end)}``):
``load_unfused`` copies a plain collection's (or a plain checkpoint's) tables into the row
blocks; ``to_unfused`` builds the plain ``EmbeddingCollection`` holding the blocks, so an export
or a checkpoint of the plain model comes out of a fused training run. ``stitchrec train`` with
``[fusion] tables = true`` fuses the model (``compiler_opt.fuse``), refuses to resume a run
fused the other way (``check_resume``) and writes the mapping as
``<run>/checkpoints/table_fusion.json`` (``write_mapping``, ``MAPPING_FILE``); loading the run
maps back (``unfuse_tables``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from embeddings.collection import EmbeddingCollection
from embeddings.common import flat_ids, pool_and_regularize
from embeddings.forms import Embedded, Form
from embeddings.full import FullEmbedding, oov_safe
from embeddings.hashing import HashingEmbedding
from embeddings.table_config import TableConfig

#: the mapping a fused training run writes next to its checkpoints
MAPPING_FILE = "table_fusion.json"
FUSED_METHODS = ("full", "hashing")


class _Field:
    """One covered field: its rule layer (an unbuilt copy of its layer: rules only, no table),
    its group and row block."""

    def __init__(self, name: str, index: int, rule: tf.keras.layers.Layer, rows: int) -> None:
        self.name = name
        self.index = index  # position in ``tables``: the plain layer is ``emb_{index:03d}``
        self.rule = rule
        self.rows = rows
        self.offset = 0

    def row_ids(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        """Rows of the group table read by ``ids``' flat values: ``o_f + rule_f(id)``."""
        flat = flat_ids(ids)
        if isinstance(self.rule, HashingEmbedding):
            local = self.rule.bucket(flat)
        else:
            local = oov_safe(flat, self.rule.num_rows)
        return local + tf.constant(self.offset, tf.int64)


class _Group:
    def __init__(self, dim: int, dtype: str, fields: list[_Field]) -> None:
        self.dim = dim
        self.dtype = dtype
        self.fields = fields
        start = 0
        for f in fields:
            f.offset = start
            start += f.rows
        self.rows = start
        suffix = "" if dtype == "float32" else f"_{dtype}"
        self.weight_name = f"fused_table_d{dim}{suffix}"


class _Plan:
    """The grouping (kept out of Keras' tracking: the rule layers hold no variables)."""

    def __init__(self, groups: list[_Group], uncovered: dict[str, str]) -> None:
        self.groups = groups
        self.uncovered = uncovered
        self.fields = {f.name: f for g in groups for f in g.fields}


def _uncovered_reason(table: TableConfig, layer: tf.keras.layers.Layer) -> str | None:
    method = table.method
    if method not in FUSED_METHODS:
        return f"method {method!r}: only {list(FUSED_METHODS)} tables are fused"
    if type(layer) not in (FullEmbedding, HashingEmbedding):
        return f"layer {type(layer).__name__}: only FullEmbedding / HashingEmbedding are fused"
    if layer.l2 > 0:
        return f"l2 = {layer.l2:g} > 0: the penalty is taken on the field's own rows"
    if layer.built and not _plain_variable(layer.table):
        return f"table {type(layer.table).__name__}: not a plain resource variable"
    return None


def _plain_variable(v: Any) -> bool:
    """A plain resource variable (not sharded, not a distributed or mirrored variable)."""
    return type(v) in (
        resource_variable_ops.ResourceVariable,
        resource_variable_ops.UninitializedVariable,
    )


def _plan(tables: list[TableConfig], layers: dict[str, tf.keras.layers.Layer]) -> _Plan:
    uncovered: dict[str, str] = {}
    by_key: dict[tuple[int, str], list[_Field]] = {}
    for i, t in enumerate(tables):
        name = t.name
        layer = layers[name]
        reason = _uncovered_reason(t, layer)
        if reason is not None:
            uncovered[name] = reason
            continue
        rule = type(layer).from_config(layer.get_config())  # unbuilt: the rules, no table
        rows = rule.buckets if isinstance(rule, HashingEmbedding) else rule.num_rows
        key = (int(rule.dim), str(tf.as_dtype(rule.dtype).name))
        by_key.setdefault(key, []).append(_Field(name, i, rule, rows))
    groups = []
    for (dim, dtype), fields in by_key.items():
        if len(fields) < 2:
            uncovered[fields[0].name] = f"the only fusable field of dim {dim}: nothing to fuse with"
            continue
        groups.append(_Group(dim, dtype, fields))
    return _Plan(groups, uncovered)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class HorizontalEmbeddingCollection(tf.keras.layers.Layer):
    """An ``EmbeddingCollection`` whose ``full`` / ``hashing`` tables of one dim are one table.

    Call: ``{field: ids}`` (``[batch]`` or ragged ``[batch, None]`` int ids; every field of
    ``tables``) -> ``Embedded`` holding ``{field: [batch, dim]}`` in ``tables`` order, the values of
    ``EmbeddingCollection(tables)`` with the same weights (see the module docstring). A group's
    ``full`` fields with ``[batch]`` ids are stacked into ``[L, batch]``, so they must share the
    batch size (a model's fields do); other dense shapes ``S`` give ``S + [dim]`` as the layers.

    Args:
      tables: the per-field specs of ``EmbeddingCollection`` (``name``, ``num_rows``, ``dim``,
        ``combiner``, ``method``, ``l2``, ``options``).
      counts: ``{field: count per id}`` for uncovered methods that take counts (AMTL).
      layers: ``{field: layer}`` to use instead of building them from ``tables`` (covered
        fields' layers only lend their rules and, in ``from_collection``, their weights).

    Attributes:
      layers_by_field: the uncovered fields' own layers (same checkpoint paths as in the plain
        collection).
      uncovered: ``{field: reason}`` of the fields left to their own layers.
      group_tables: ``{group variable name: tf.Variable [rows, dim]}`` once built.
    """

    #: the form of the ``Embedded`` the call returns
    output_form: Form = Form.FIELDS

    def __init__(
        self,
        tables: list[TableConfig | dict[str, Any]],
        counts: dict[str, Sequence[int]] | None = None,
        layers: dict[str, tf.keras.layers.Layer] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        # the plain collection validates the specs and makes the layers; it is not kept
        plain = EmbeddingCollection(tables, counts=counts, layers=layers)
        self.tables = list(plain.tables)
        self._table_plan = _plan(self.tables, plain.layers_by_field)
        self.layers_by_field: dict[str, tf.keras.layers.Layer] = {
            name: layer
            for name, layer in plain.layers_by_field.items()
            if name not in self._table_plan.fields
        }
        self.group_tables: dict[str, tf.Variable] = {}

    # ------------------------------------------------------------------------- introspection

    @property
    def field_names(self) -> list[str]:
        return [t.name for t in self.tables]

    @property
    def dims(self) -> list[int]:
        return [t.dim for t in self.tables]

    @property
    def uncovered(self) -> dict[str, str]:
        """``{field: reason}`` of the fields that keep their own layers."""
        return dict(self._table_plan.uncovered)

    @property
    def fused_fields(self) -> list[str]:
        """The fields whose tables live in a group table, in ``tables`` order."""
        return [n for n in self.field_names if n in self._table_plan.fields]

    def checkpoint_mapping(self) -> dict[str, tuple[str, int, int]]:
        """``{field: (group variable name, row_start, row_end)}``: field ``f``'s plain table
        ``W_f`` is ``group_tables[name][row_start:row_end]``."""
        return {
            f.name: (g.weight_name, f.offset, f.offset + f.rows)
            for g in self._table_plan.groups
            for f in g.fields
        }

    def mapping_json(self) -> dict[str, Any]:
        """The mapping as written next to a checkpoint (``MAPPING_FILE``)."""
        return {
            "format": 1,
            "layer": self.name,
            "groups": {
                g.weight_name: {
                    "rows": g.rows,
                    "dim": g.dim,
                    "dtype": g.dtype,
                    "variable": self.group_tables[g.weight_name].name
                    if g.weight_name in self.group_tables
                    else None,
                    "fields": [f.name for f in g.fields],
                }
                for g in self._table_plan.groups
            },
            "fields": {k: list(v) for k, v in self.checkpoint_mapping().items()},
            "uncovered": self.uncovered,
        }

    # ------------------------------------------------------------------------------ build/call

    def build(self, input_shape: Any) -> None:
        for layer in self.layers_by_field.values():  # so that weights can be loaded before a call
            if not layer.built:
                with tf.name_scope(layer.name):
                    layer.build(None)
        for g in self._table_plan.groups:
            if g.weight_name in self.group_tables:
                continue
            self.group_tables[g.weight_name] = self.add_weight(
                name=g.weight_name,
                shape=(g.rows, g.dim),
                dtype=g.dtype,
                initializer=_block_initializer(g),
                trainable=True,
            )
        super().build(input_shape)

    def call(self, ids: dict[str, Any]) -> Embedded:
        missing = [n for n in self.field_names if n not in ids]
        if missing:
            raise KeyError(f"ids lack fields {missing}; got {sorted(ids)}")
        out: dict[str, tf.Tensor] = {}
        for g in self._table_plan.groups:
            out.update(self._group_call(g, ids))
        for name, layer in self.layers_by_field.items():
            out[name] = layer(ids[name])
        return Embedded(vectors={name: out[name] for name in self.field_names})

    def _group_call(self, g: _Group, ids: dict[str, Any]) -> dict[str, tf.Tensor]:
        """One group: the rows of every id, ONE gather, the vectors split back per field.

        ``full`` fields with ``[batch]`` ids (the lane) are stacked field-major to
        ``[L, batch]`` and their rows computed at once, ``oov_safe(x, rows_f) + o_f`` broadcast
        over the batch, and come back as ``[L, batch, dim]``, whose ``[batch, dim]`` slices are
        the fields' vectors without a copy (the batch-major layout first used cost two
        interleaving copies: 2.1x slower than the plain layers at batch 4096); the other fields (ragged, hashing, other
        shapes) compute their rows one by one and are pooled by ``pool_and_regularize``.
        """
        table = self.group_tables[g.weight_name]
        lane = [
            f
            for f in g.fields
            if not isinstance(f.rule, HashingEmbedding)
            and isinstance(ids[f.name], tf.Tensor)
            and ids[f.name].shape.rank == 1
        ]
        rest = [f for f in g.fields if f not in lane]
        pieces = []
        if lane:
            # field-major [L, batch]: stacking and, after the gather, taking each field's
            # [batch, dim] back are contiguous slices (no interleaving copy)
            x = tf.stack([tf.cast(ids[f.name], tf.int64) for f in lane], axis=0)
            limit = tf.constant([[f.rows] for f in lane], tf.int64)
            offset = tf.constant([[f.offset] for f in lane], tf.int64)
            pieces.append(oov_safe(x, limit) + offset)
        pieces += [f.row_ids(ids[f.name]) for f in rest]
        if len(pieces) == 1:  # [L, batch] rows -> [L, batch, dim], or one field's [n] -> [n, dim]
            parts = [tf.gather(table, pieces[0])]
        else:
            flat = [tf.reshape(p, [-1]) if p.shape.rank != 1 else p for p in pieces]
            sizes = tf.stack([tf.size(p, out_type=tf.int64) for p in flat])
            vectors = tf.gather(table, tf.concat(flat, axis=0))
            parts = tf.split(vectors, sizes, axis=0, num=len(flat))
            if lane:
                parts[0] = tf.reshape(parts[0], [len(lane), -1, g.dim])
        out: dict[str, tf.Tensor] = {}
        if lane:
            lane_vectors = parts.pop(0)
            for f, v in zip(lane, tf.unstack(lane_vectors, num=len(lane), axis=0), strict=True):
                out[f.name] = v
        for f, v in zip(rest, parts, strict=True):
            out[f.name] = pool_and_regularize(f.rule, ids[f.name], v)
        return out

    def field_lookups(self) -> dict[str, Callable[[Any], tf.Tensor]]:
        """``{field: ids -> vectors}`` for every field, as its plain layer computes them: a
        covered field reads its row block of the group table (ids of any shape: ``[batch]``,
        padded ``[batch, L]`` -> ``[batch, L, dim]``, or ragged, pooled), an uncovered field
        is its own layer. A behaviour sequence reads its shared table through these
        (``ranking.sequence_features.field_lookups``)."""
        out: dict[str, Callable[[Any], tf.Tensor]] = dict(self.layers_by_field)
        for g in self._table_plan.groups:
            for f in g.fields:
                out[f.name] = functools.partial(self._field_call, g, f)
        return out

    def _field_call(self, g: _Group, f: _Field, ids: Any) -> tf.Tensor:
        """One covered field's vectors of ``ids`` from its group table."""
        vectors = tf.gather(self.group_tables[g.weight_name], f.row_ids(ids))
        return pool_and_regularize(f.rule, ids, vectors)

    # --------------------------------------------------------------------------- conversions

    @classmethod
    def from_collection(
        cls, collection: EmbeddingCollection, copy_weights: bool = True
    ) -> HorizontalEmbeddingCollection:
        """The fused form of ``collection``: its uncovered layers shared, the covered tables
        copied into their row blocks when ``copy_weights`` and the collection is built (the
        plain tables are then no longer referenced by the fused layer)."""
        if not isinstance(collection, EmbeddingCollection):
            raise ValueError(
                f"collection must be an EmbeddingCollection, got {type(collection).__name__}"
            )
        fused = cls(
            collection.tables, layers=dict(collection.layers_by_field), name=collection.name
        )
        if copy_weights and all(
            collection.layers_by_field[n].built for n in fused._table_plan.fields
        ):
            _require_built(fused, "fused")
            load_unfused(fused, collection)
        return fused

    def serving_form(self) -> EmbeddingCollection:
        """The plain collection (``to_unfused``) in its serving form: a SavedModel of the
        model holds per-field tables, loadable and scored like an unfused run's."""
        return to_unfused(self).serving_form()

    def memory_bytes(self) -> dict[str, int]:
        totals = {"train": 0, "serve": 0}
        for v in self.group_tables.values():
            n = int(v.shape[0]) * int(v.shape[1]) * v.dtype.size
            totals["train"] += n
            totals["serve"] += n
        for layer in self.layers_by_field.values():
            for k, n in layer.memory_bytes().items():
                totals[k] += n
        return totals

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "tables": [t.to_dict() for t in self.tables]}


def _block_initializer(group: _Group) -> Any:
    """``T_g``'s initializer: each field's row block drawn by that field's own initializer
    (``shape (rows_f, dim)``), as its plain layer would draw its table."""

    def init(shape: Any, dtype: Any = None, **kwargs: Any) -> tf.Tensor:
        blocks = [f.rule.initializer(shape=(f.rows, group.dim), dtype=dtype) for f in group.fields]
        return tf.concat(blocks, axis=0)

    return init


# ----------------------------------------------------------------------------- the mapping


def _require_built(fused: HorizontalEmbeddingCollection, arg: str) -> None:
    if not isinstance(fused, HorizontalEmbeddingCollection):
        raise ValueError(
            f"{arg} must be a HorizontalEmbeddingCollection, got {type(fused).__name__}"
        )
    if not fused.built:
        with tf.name_scope(fused.name):
            fused.build(None)


def load_unfused(
    fused: HorizontalEmbeddingCollection,
    source: EmbeddingCollection | str | Path,
    prefix: str = "model/embedding",
) -> None:
    """Copies a plain collection's weights into ``fused``: each covered field's table into its
    row block, the uncovered layers' weights into the shared-by-name layers.

    Args:
      fused: the fused collection (built here if needed).
      source: a built ``EmbeddingCollection`` with the same tables, or a checkpoint (its path
        prefix, or a folder: its latest checkpoint) holding one at ``prefix``.
      prefix: where the collection sits in the checkpoint's object graph, ``/``-separated
        attribute names from the root: ``model/embedding`` for ``stitchrec train``'s
        checkpoints, ``embedding`` for ``tf.train.Checkpoint(embedding=collection)``.

    Raises:
      ValueError: the tables differ, or the checkpoint holds no such collection at ``prefix``.
    """
    _require_built(fused, "fused")
    if isinstance(source, str | Path):
        plain = EmbeddingCollection(fused.tables, name=fused.name)
        for layer in plain.layers_by_field.values():
            with tf.name_scope(layer.name):
                layer.build(None)
        _restore_at(plain, str(source), prefix)
    elif isinstance(source, EmbeddingCollection):
        plain = source
    else:
        raise ValueError(
            f"source must be an EmbeddingCollection or a checkpoint path, got "
            f"{type(source).__name__}"
        )
    if [t.name for t in plain.tables] != fused.field_names or [
        (t.num_rows, t.dim) for t in plain.tables
    ] != [(t.num_rows, t.dim) for t in fused.tables]:
        raise ValueError(
            f"source has fields {[(t.name, t.num_rows, t.dim) for t in plain.tables]}, "
            f"expected {[(t.name, t.num_rows, t.dim) for t in fused.tables]}"
        )
    for g in fused._table_plan.groups:
        blocks = []
        for f in g.fields:
            layer = plain.layers_by_field[f.name]
            if not layer.built:
                raise ValueError(f"source: the layer of field {f.name!r} is not built")
            if tuple(layer.table.shape) != (f.rows, g.dim):
                raise ValueError(
                    f"source: field {f.name!r} has a table of shape {tuple(layer.table.shape)}, "
                    f"expected {(f.rows, g.dim)}"
                )
            blocks.append(tf.convert_to_tensor(layer.table))
        fused.group_tables[g.weight_name].assign(tf.concat(blocks, axis=0))
    for name, layer in fused.layers_by_field.items():
        other = plain.layers_by_field[name]
        if other is not layer:
            layer.set_weights(other.get_weights())


def _restore_at(obj: tf.Module, path: str, prefix: str) -> None:
    names = [p for p in prefix.split("/") if p]
    if not names:
        raise ValueError(f"prefix must name at least one attribute, got {prefix!r}")
    node: Any = obj
    for name in reversed(names):
        node = tf.train.Checkpoint(**{name: node})
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise ValueError(f"source {path!r} is a folder without a checkpoint")
        path = latest
    status = node.read(path)
    try:
        status.expect_partial().assert_existing_objects_matched()
    except AssertionError as e:
        raise ValueError(
            f"source {path!r} holds no plain collection with these tables at prefix {prefix!r}: "
            f"{str(e).splitlines()[0]}"
        ) from None


def to_unfused(fused: HorizontalEmbeddingCollection) -> EmbeddingCollection:
    """The plain ``EmbeddingCollection`` of ``fused``: each covered field a layer of its
    method (named ``emb_<index>`` as in the plain model) whose table is its row block (a copy),
    the uncovered layers shared. Its checkpoint or SavedModel is the plain model's."""
    _require_built(fused, "fused")
    layers: dict[str, tf.keras.layers.Layer] = dict(fused.layers_by_field)
    for g in fused._table_plan.groups:
        table = fused.group_tables[g.weight_name]
        for f in g.fields:
            layer = type(f.rule).from_config({**f.rule.get_config(), "name": f"emb_{f.index:03d}"})
            with tf.name_scope(layer.name):
                layer.build(None)
            layer.table.assign(table[f.offset : f.offset + f.rows])
            layers[f.name] = layer
    plain = EmbeddingCollection(fused.tables, layers=layers, name=fused.name)
    plain.built = True
    return plain


# ------------------------------------------------------------------------------ models, runs


def unfuse_tables(model: Any) -> Any:
    """A new model (``model.with_blocks``) whose embedding is ``to_unfused`` of ``model``'s
    ``HorizontalEmbeddingCollection``; ``model`` is left as it is."""
    emb = getattr(model, "embedding", None)
    if not isinstance(emb, HorizontalEmbeddingCollection):
        raise ValueError(
            f"model.embedding must be a HorizontalEmbeddingCollection, got {type(emb).__name__}"
        )
    return model.with_blocks(embedding=to_unfused(emb))


def check_resume(checkpoints: str | Path, enabled: bool) -> None:
    """``stitchrec train``'s ``[fusion] tables``: refuses to resume a run whose checkpoints in
    ``checkpoints`` were written with the other setting.

    Raises:
      ValueError: the run folder's checkpoints were written with the other setting (a fused
        checkpoint does not restore into the plain model, nor the reverse).
    """
    d = Path(checkpoints)
    has_mapping = (d / MAPPING_FILE).exists()
    if tf.train.latest_checkpoint(str(d)) is not None and has_mapping != enabled:
        was = "with" if has_mapping else "without"
        raise ValueError(
            f"[fusion] tables = {str(enabled).lower()}, but the checkpoints in {str(d)!r} were "
            f"written {was} fused tables; resume with the same setting or train into a new "
            f"output_dir"
        )


def write_mapping(checkpoints: str | Path, fused: HorizontalEmbeddingCollection) -> Path:
    """Writes ``fused``'s mapping to ``<checkpoints>/table_fusion.json`` and returns the file."""
    d = Path(checkpoints)
    d.mkdir(parents=True, exist_ok=True)
    mapping = d / MAPPING_FILE
    mapping.write_text(json.dumps(fused.mapping_json(), indent=1))
    return mapping


def run_has_fused_tables(checkpoints: str | Path) -> bool:
    """True when a run's checkpoints hold fused tables (``MAPPING_FILE`` next to them)."""
    return (Path(checkpoints) / MAPPING_FILE).exists()
