"""Behaviour sequences inside a ranking model: history lookups, pooling, and the extra field
vectors they give the interaction.

A schema's ``sequence`` fields arrive from the preprocessor as ragged ids ``[batch, None]``
(newest first, at most ``max_len`` per row; ``FeaturePreprocessor.sequence_fields``). A
*group* is one sequence and the side sequences ``aligned_with`` it (e.g. the items of the
history and their categories); each member is looked up in its table (the table of the field it
``shares_embedding_with``, or its own), so per group::

    H_m    = table_m(pad(ids_m))            # [batch, L, d_m], one per member m
    H      = concat_m H_m                   # [batch, L, D],   D = sum_m d_m
    t      = concat_m table_m(ids[target_m])  # [batch, D], the candidate's own fields (zeros
                                            # for a member without a target field)
    p      = block(H, mask, t)              # [batch, D]: DIN attention, masked mean or BST
    extra  = split(p, d_m)                  # one [batch, d_m] vector per member

The member vectors join the embedded fields as fields named by the sequence fields, so every
interaction (concat, FM, DCN-v2 cross) reads the pooled history as it reads any field. The
target ``t`` is looked up again from the raw ids (one row per example next to ``L`` rows of
history), so the pooling does not depend on the form the embedding block returns (per-field,
concatenated or stacked, as a fused block gives).

``SequencePooling`` is the Keras layer of the blocks (``ranking.sequence``); ``history_inputs``
and ``extend`` are the plain functions the models call around it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from embeddings.collection import EmbeddingCollection
from embeddings.forms import Embedded
from embeddings.table_config import TableConfig
from ranking.sequence import ragged_to_padded, sequence_block

POOLINGS = ("mean", "din", "bst")


class SequenceOptionsError(ValueError):
    """``sequence_options`` the pooling block does not take (a config error)."""


def sequence_groups(
    sequence_fields: Mapping[str, Mapping[str, Any]],
    dims: Mapping[str, int],
    targets: Sequence[str],
) -> list[dict[str, Any]]:
    """The groups of ``sequence_fields`` (``FeaturePreprocessor.sequence_fields``), JSON-able.

    Each group: ``name`` (the main sequence), ``members`` (the main sequence, then the
    sequences aligned with it, in field order), ``tables`` (the table field of each member),
    ``dims`` (each member's embedding dimension, from ``dims`` by table field), ``max_len``,
    and ``targets``: for each member, the table field when it is one of the model's embedded
    inputs ``targets`` (the candidate's own value of the shared field), else None.
    """
    groups = []
    for name, info in sequence_fields.items():
        if info.get("aligned_with"):
            continue
        members = [name] + [n for n, i in sequence_fields.items() if i.get("aligned_with") == name]
        tables = [sequence_fields[m]["table"] for m in members]
        groups.append(
            {
                "name": name,
                "members": members,
                "tables": tables,
                "dims": [int(dims[t]) for t in tables],
                "max_len": int(info["max_len"]),
                "targets": [t if t in targets else None for t in tables],
            }
        )
    return groups


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class SequencePooling(tf.keras.layers.Layer):
    """One pooling block per sequence group: histories ``[batch, L, D]`` -> ``[batch, D]``,
    split back into one vector per member (see the module docstring).

    Args:
      groups: ``sequence_groups(...)``.
      pooling: ``din`` (DIN target attention), ``mean`` (masked mean) or ``bst`` (one
        self-attention layer over the target and the history).
      options: the block's own arguments (``ranking.sequence``), e.g. ``{"hidden": [80, 40]}``.
    """

    def __init__(
        self,
        groups: Sequence[Mapping[str, Any]],
        pooling: str = "din",
        options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")
        if not groups:
            raise ValueError("groups must hold at least one sequence group")
        self.groups = [dict(g) for g in groups]
        self.pooling = pooling
        self.options = dict(options or {})
        self.blocks = []
        for i, g in enumerate(self.groups):
            extra = {"max_len": g["max_len"]} if pooling in ("bst", "din") else {}
            try:
                block = sequence_block(pooling, **extra, **self.options, name=f"{pooling}_{i:02d}")
            except (TypeError, ValueError) as e:
                detail = e.args[0] if isinstance(e, TypeError) and e.args else e
                raise SequenceOptionsError(
                    f"sequence_options {self.options} for pooling {pooling!r}: {detail}"
                    + (f" {e.args[1]!r}" if isinstance(e, TypeError) and len(e.args) > 1 else "")
                ) from None
            self.blocks.append(block)

    @property
    def output_fields(self) -> list[str]:
        """The names of the vectors the call returns: every member of every group."""
        return [m for g in self.groups for m in g["members"]]

    def call(
        self,
        histories: Mapping[str, tf.Tensor],
        masks: Mapping[str, tf.Tensor],
        targets: Mapping[str, tf.Tensor],
        training: bool | None = None,
    ) -> dict[str, tf.Tensor]:
        """``histories``: ``{member: [batch, L, d_m]}``; ``masks``: ``{group name: bool
        [batch, L]}``; ``targets``: ``{member: [batch, d_m]}`` (the members with a target) ->
        ``{member: [batch, d_m]}``."""
        out = {}
        for g, block in zip(self.groups, self.blocks, strict=True):
            h = tf.concat([histories[m] for m in g["members"]], axis=-1)
            t = tf.concat(
                [
                    targets[m] if m in targets else tf.zeros_like(histories[m][:, 0, :])
                    for m in g["members"]
                ],
                axis=-1,
            )
            pooled = block(h, masks[g["name"]], t, training=training)
            for m, v in zip(g["members"], tf.split(pooled, g["dims"], axis=-1), strict=True):
                out[m] = v
        return out

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "groups": self.groups,
            "pooling": self.pooling,
            "options": self.options,
        }


def history_inputs(
    ids: Mapping[str, tf.Tensor],
    groups: Sequence[Mapping[str, Any]],
    lookup: Mapping[str, Callable[[Any], tf.Tensor]],
) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor], dict[str, tf.Tensor]]:
    """(histories, masks, targets) for ``SequencePooling`` from the preprocessor's ``ids``;
    a group's mask marks the positions where every member has a value.

    ``lookup``: the lookup of each table field (``{field: ids -> vectors}``, e.g. an
    ``EmbeddingCollection``'s ``layers_by_field`` plus the sequences' own tables;
    ``field_lookups``).
    """
    histories, masks, targets = {}, {}, {}
    for g in groups:
        for k, (member, table) in enumerate(zip(g["members"], g["tables"], strict=True)):
            padded, mask = ragged_to_padded(ids[member], g["max_len"])
            histories[member] = lookup[table](padded)
            # a position is real where every member has a value (the reader refuses aligned
            # sequences of different lengths; a served request is pooled over the shorter)
            masks[g["name"]] = mask if k == 0 else masks[g["name"]] & mask
            target = g["targets"][k]
            if target is not None:
                targets[member] = lookup[table](ids[target])
    return histories, masks, targets


def extend(embedded: Embedded, extra: Mapping[str, tf.Tensor]) -> Embedded:
    """``embedded`` with the vectors ``extra`` (``{name: [batch, d]}``) after its fields: added
    to the per-field form, concatenated to a concat block, stacked onto a stacked block."""
    if not extra:
        return embedded
    if embedded.vectors is not None:
        return Embedded(vectors={**embedded.vectors, **extra})
    parts = list(extra.values())
    if embedded.block.shape.rank == 3:
        return Embedded(block=embedded.stacked(tf.stack(parts, axis=1)))
    return Embedded(block=tf.concat([embedded.block, *parts], axis=1))


def field_lookups(embedding: tf.keras.layers.Layer) -> dict[str, Callable[[Any], tf.Tensor]]:
    """``{field: ids -> vectors}`` of an embedding block's fields: its own ``field_lookups()``
    when it has them (a block holding several tables in one variable,
    ``compiler_opt.table_fusion.HorizontalEmbeddingCollection``), else its
    ``layers_by_field`` (an ``EmbeddingCollection``, its fused-kernel and quantized forms)."""
    own = getattr(embedding, "field_lookups", None)
    return dict(own()) if callable(own) else dict(embedding.layers_by_field)


def embed_with_history(
    embedding: tf.keras.layers.Layer,
    ids: Mapping[str, tf.Tensor],
    sequences: SequencePooling | None,
    sequence_tables: tf.keras.layers.Layer | None,
    training: bool | None = None,
) -> Embedded:
    """``embedding(ids)`` extended with the pooled histories of ``sequences`` (if any); the
    history and target lookups use ``embedding``'s per-field layers and the sequences' own
    tables ``sequence_tables`` (an ``EmbeddingCollection``)."""
    embedded = embedding(ids)
    if sequences is None:
        return embedded
    lookup = field_lookups(embedding)
    if sequence_tables is not None:
        lookup.update(sequence_tables.layers_by_field)
    histories, masks, targets = history_inputs(ids, sequences.groups, lookup)
    return extend(embedded, sequences(histories, masks, targets, training=training))


def sequence_blocks(
    preprocessor: tf.keras.layers.Layer,
    pooling: str,
    options: Mapping[str, Any],
    dim_of: Callable[[str], int],
    l2: float = 0.0,
) -> tuple[SequencePooling | None, EmbeddingCollection | None]:
    """The pooling block over ``preprocessor.sequence_fields`` and the collection of the
    sequences' own tables (None when every sequence shares a model input's table); (None,
    None) without sequences or with ``pooling = "none"``. ``dim_of(field)``: the embedding
    dimension of a table field."""
    specs = getattr(preprocessor, "sequence_fields", None) or {}
    if not specs or pooling == "none":
        return None, None
    own = [
        TableConfig(name=n, num_rows=int(i["num_rows"]), dim=dim_of(n), combiner="mean", l2=l2)
        for n, i in specs.items()
        if i["table"] == n
    ]
    dims = {i["table"]: dim_of(i["table"]) for i in specs.values()}
    groups = sequence_groups(specs, dims, list(preprocessor.embedded_fields))
    pool = SequencePooling(groups, pooling, options, name="sequences")
    tables = EmbeddingCollection(own, name="sequence_embedding") if own else None
    return pool, tables
