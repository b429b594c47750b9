"""The Keras side of the embedding op: ``FusedEmbeddingCollection`` (an ``EmbeddingCollection``
whose covered fields run as one generated op) and the planner's choice of fields
(``compiler_opt.fuse`` puts the collection in a model)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

import compiler_opt.cost as cost
import compiler_opt.ir as ir
import compiler_opt.planner as planner
from compiler_opt.embedding_op.ops import Kernel, gpu_fallback, load
from compiler_opt.embedding_op.spec import BlockSpec, KernelSpec, Schedule, build_spec
from compiler_opt.toolchain import CompilerUnavailable
from embeddings.collection import EmbeddingCollection
from embeddings.common import flat_ids
from embeddings.forms import Embedded, Form
from embeddings.full import oov_safe


def _amtl_mask(layer: Any, x: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """AMTL's ``(mask per unique id [u, dim], index per id [n])``, as AMTLEmbedding.call."""
    flat = oov_safe(flat_ids(x), layer.num_rows)
    unique, where = tf.unique(flat)
    return layer.mask(unique), where


def _fused_call(
    kernel: Kernel,
    variables: Sequence[tf.Variable],
    layers: dict[str, Any],
    ids: dict[str, Any],
    dense: tf.Tensor | None = None,
) -> tf.Tensor:
    inputs: list[tf.Tensor] = []
    masks, wheres = [], []
    for f in kernel.spec.fields:
        x = ids[f.name]
        if f.ragged:
            inputs += [x.values, x.row_splits]
        else:
            inputs.append(x)
        if f.masked:
            m, w = _amtl_mask(layers[f.name], x)
            masks.append(m)
            wheres.append(w)
    return kernel(variables, inputs, masks, wheres, dense)


class _FusionState:
    """What a FusedEmbeddingCollection's last call found (kept out of Keras' tracking)."""

    def __init__(self) -> None:
        self.uncovered: dict[str, str] = {}
        self.kernel: Kernel | None = None
        self.fallback_reason = ""
        # the schedule of the op of a spec (compiler_opt.tune.recorded_schedule); None: default
        self.schedule_for: Callable[[KernelSpec], Schedule] | None = None


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FusedEmbeddingCollection(EmbeddingCollection):
    """An ``EmbeddingCollection`` whose covered fields run as one generated op.

    The same per-field layers as the collection it replaces (same variables, same checkpoint
    paths: a checkpoint of the plain model restores into the fused one and back). The call
    returns ``Embedded`` (``embeddings.forms``) in ``output_form``: ``concat``, the op's
    ``[batch, sum(d_f)]`` block (for interactions that concatenate their inputs); ``stacked``,
    that block reshaped to ``[batch, F, d]`` (for FM); ``fields``, the block split back per
    field. Fields the kernel does not cover (``uncovered``: ``{field: reason}``, also warned
    once) run their own layers, and the output is then per field (as it is for ``stacked``
    over fields of several dimensions); a missing compiler warns and runs everything unfused.

    Args:
      tables, counts, layers: as ``EmbeddingCollection``.
      output_form: a ``Form`` (or its name).
    """

    def __init__(
        self,
        tables: list[dict[str, Any]],
        counts: dict[str, Sequence[int]] | None = None,
        layers: dict[str, tf.keras.layers.Layer] | None = None,
        output_form: str | Form = Form.CONCAT,
        **kwargs: Any,
    ):
        super().__init__(tables, counts=counts, layers=layers, **kwargs)
        self.output_form = Form.of(output_form)
        self._fusion_state = _FusionState()  # a plain object: not tracked, not in checkpoints

    @property
    def uncovered(self) -> dict[str, str]:
        """``{field: reason}`` of the fields the last call left unfused."""
        return self._fusion_state.uncovered

    @property
    def kernel(self) -> Kernel | None:
        """The generated op of the last call (None: unfused, see ``fallback_reason``)."""
        return self._fusion_state.kernel

    @property
    def fallback_reason(self) -> str:
        return self._fusion_state.fallback_reason

    @classmethod
    def from_collection(
        cls,
        collection: Any,
        output_form: str | Form = Form.CONCAT,
        schedule_for: Callable[[KernelSpec], Schedule] | None = None,
    ) -> FusedEmbeddingCollection:
        """The fused form of ``collection``, sharing its layers; ``schedule_for(spec)`` picks
        the op's schedule (``compiler_opt.tune.recorded_schedule``; None: the default one)."""
        fused = cls(
            collection.tables,
            layers=dict(collection.layers_by_field),
            output_form=output_form,
            name=collection.name,
        )
        fused._fusion_state.schedule_for = schedule_for
        return fused

    def select(self, names: list[str]) -> FusedEmbeddingCollection:
        """The fused collection over the fields ``names``, sharing their layers; its call
        returns the ``fields`` form (one op over those fields, split back)."""
        return FusedEmbeddingCollection.from_collection(super().select(names), Form.FIELDS)

    def build(self, input_shape: Any) -> None:
        for layer in self.layers_by_field.values():
            if not layer.built:
                with tf.name_scope(layer.name):
                    layer.build(None)
        super().build(input_shape)

    def call(self, ids: dict[str, Any]) -> Embedded:
        missing = [n for n in self.field_names if n not in ids]
        if missing:
            raise KeyError(f"ids lack fields {missing}; got {sorted(ids)}")
        block = build_spec(self, ids)
        state = self._fusion_state
        if block.uncovered and block.uncovered != state.uncovered:
            warnings.warn(
                f"compiler_opt.codegen: fields left unfused: {block.uncovered}",
                RuntimeWarning,
                stacklevel=2,
            )
        state.uncovered = dict(block.uncovered)
        kernel = None
        if block.spec is not None:
            spec = block.spec
            if state.schedule_for is not None:
                spec = spec.with_schedule(state.schedule_for(spec))
            try:
                kernel = load(spec)
            except CompilerUnavailable as e:
                if not state.fallback_reason:
                    warnings.warn(
                        "compiler_opt.codegen: generated kernels unavailable, running the "
                        f"embeddings unfused: {e}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                state.fallback_reason = str(e)
        if kernel is not None:
            reason = gpu_fallback(kernel, [v.device for v in block.variables])
            if reason:
                if state.fallback_reason != reason:
                    warnings.warn(
                        f"compiler_opt.codegen: running the embeddings unfused: {reason}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                state.fallback_reason = reason
                kernel = None
        state.kernel = kernel
        if kernel is None:
            return super().call(ids)
        fused = _fused_call(kernel, block.variables, block.layers, ids)
        rest = {
            name: layer(ids[name])
            for name, layer in self.layers_by_field.items()
            if name not in block.layers
        }
        dims = {f.dim for f in kernel.spec.fields}
        if (
            self.output_form == Form.FIELDS
            or rest
            or (self.output_form == Form.STACKED and len(dims) > 1)
        ):
            parts = tf.split(fused, [f.dim for f in kernel.spec.fields], axis=1)
            vectors = dict(zip([f.name for f in kernel.spec.fields], parts, strict=True))
            vectors.update(rest)
            return Embedded(vectors={name: vectors[name] for name in self.field_names})
        if self.output_form == Form.STACKED:  # [batch, F * d] -> [batch, F, d]: a free reshape
            return Embedded(block=tf.reshape(fused, [-1, len(kernel.spec.fields), dims.pop()]))
        return Embedded(block=fused)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "output_form": self.output_form.value}


def planned_fields(
    collection: Any,
    ids: dict[str, Any],
    dense: tf.Tensor | None,
    coefficients: cost.Coefficients,
    batch: int,
) -> tuple[list[str], dict[str, Any]]:
    """The fields whose lookups the fusion planner puts into a ``concat`` group.

    Traces ``concat([collection(ids)..., dense])`` (the memory-bound half), reads it into the
    IR, plans it (``planner.plan`` at ``batch``) and returns the fields (collection order)
    with a gather node (``ResourceGather``/``GatherV2`` under the field's layer) in a group of
    kind ``concat``, plus a summary ``{"groups", "concat_groups", "fields_planned"}``.
    """

    def half(ids: dict[str, Any], dense: tf.Tensor | None) -> tf.Tensor:
        parts = list(collection(ids).fields().values()) + ([dense] if dense is not None else [])
        return tf.concat(parts, axis=1)

    spec = tf.nest.map_structure(
        lambda t: (
            tf.TensorSpec([None, *t.shape[1:]], t.dtype)
            if isinstance(t, tf.Tensor)
            else tf.RaggedTensorSpec(
                [None, None], t.dtype, ragged_rank=1, row_splits_dtype=t.row_splits.dtype
            )
        ),
        (ids, dense),
        expand_composites=False,
    )
    graph = ir.from_concrete_function(tf.function(half).get_concrete_function(*spec))
    p = planner.plan(graph, coefficients, batch)
    kinds = {i: g.kind for i, g in enumerate(p.groups)}
    in_concat = {n for n, g in p.group_of.items() if kinds.get(g) == "concat"}
    gathers = [n for n in graph.nodes if graph[n].op in ("ResourceGather", "GatherV2")]
    fields = []
    for name, layer in collection.layers_by_field.items():
        mine = [n for n in gathers if f"/{layer.name}/" in n]
        if mine and any(n in in_concat for n in mine):
            fields.append(name)
    return fields, {
        "groups": len(p.groups),
        "concat_groups": sum(1 for k in kinds.values() if k == "concat"),
        "fields_planned": len(fields),
    }


def fused_block(
    collection: Any,
    ids: dict[str, Any],
    dense_dim: int = 0,
    fields: Sequence[str] | None = None,
) -> tuple[BlockSpec, Kernel]:
    """Spec and loaded kernel of ``collection`` (the covered ``fields``, default all;
    ``dense_dim`` dense columns appended); raises CompilerUnavailable without a compiler."""
    block = build_spec(collection, ids, dense_dim=dense_dim, fields=fields)
    if block.spec is None:
        raise ValueError(f"no field of the collection is covered: {block.uncovered}")
    return block, load(block.spec)


def fused_concat(
    block: BlockSpec, kernel: Kernel, ids: dict[str, Any], dense: tf.Tensor | None = None
) -> tf.Tensor:
    """``[batch, out_dim]``: the block's fields (and ``dense``) through ``kernel``, one op."""
    return _fused_call(kernel, block.variables, block.layers, ids, dense)
