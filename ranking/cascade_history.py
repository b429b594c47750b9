"""Behaviour sequences in a ranking request: the history comes once, its candidates N times.

A sequence field with ``group = "user"`` (the user's history; its shared target table is an
item field) is a request-side field: ``rank_request`` takes it as one ``[1]`` string. The
ranking model's pooling block (``ranking.sequence_features.SequencePooling``) reads the history
against each candidate's own target (DIN attention) or alone (masked mean, BST over target and
history), so per request::

    H_m    = table_m(pad(ids_m))        # [1, L, d_m]: the history looked up ONCE
    H_m'   = repeat(H_m, N)             # [N, L, d_m]: the looked-up vectors tiled per candidate
    t_m    = table_m(ids[target_m])     # [N, d_m]:    each candidate's own target vector
    p      = block(concat_m H_m', mask', concat_m t_m)   # [N, D]

The pooled vectors join the candidates' field vectors (``RequestScorer`` places them after the
embedded fields, where ``ranking.sequence_features.extend`` puts them), so the logits equal
the model's on the request tiled row by row. A sequence with ``group = "item"`` (a history of
the candidate itself) comes with the candidates, ``[N]``, and is not tiled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from ranking.sequence import ragged_to_padded
from ranking.sequence_features import field_lookups


def sequence_names(model: tf.keras.Model) -> set[str]:
    """The sequence fields a ranking model's preprocessor reads (empty without any)."""
    return set(getattr(model.preprocessor, "sequence_fields", None) or {})


def pooled_widths(model: tf.keras.Model) -> list[tuple[str, int]]:
    """``(member, d_m)`` of every vector the model's pooling block adds, in its output order
    (empty for a model without a pooling block)."""
    pooling = getattr(model, "sequences", None)
    if pooling is None:
        return []
    return [
        (m, int(d)) for g in pooling.groups for m, d in zip(g["members"], g["dims"], strict=True)
    ]


def history_lookup(model: tf.keras.Model) -> dict[str, Callable[[Any], tf.Tensor]]:
    """``{table field: ids -> vectors}``: the model's per-field lookups and the sequences' own
    tables (what ``ranking.sequence_features.embed_with_history`` reads)."""
    lookup = field_lookups(model.embedding)
    if model.sequence_tables is not None:
        lookup.update(model.sequence_tables.layers_by_field)
    return lookup


def request_history(
    model: tf.keras.Model,
    sequence_ids: Mapping[str, tf.RaggedTensor],
    request_members: set[str],
    ids_r: Mapping[str, tf.Tensor],
    ids_c: Mapping[str, tf.Tensor],
    repeat: tf.Tensor,
) -> dict[str, tf.Tensor]:
    """The pooled history vectors ``{member: [N, d_m]}`` of one request (module docstring).

    Args:
      model: a ``RankingModel`` with a pooling block (``model.sequences``).
      sequence_ids: ``{member: int64 ragged ids}``, ``[1, None]`` for the request-side members
        (``request_members``), ``[N, None]`` for candidate-side ones.
      ids_r: the request fields' ids ``[1]``; ``ids_c``: the candidates' ids ``[N]`` (a
        member's target is read from whichever side holds it).
      repeat: int32 ``[N]`` zeros: ``tf.gather(x, repeat)`` repeats row 0 N times.
    """
    lookup = history_lookup(model)
    histories: dict[str, tf.Tensor] = {}
    masks: dict[str, tf.Tensor] = {}
    targets: dict[str, tf.Tensor] = {}
    for g in model.sequences.groups:
        for k, (member, table) in enumerate(zip(g["members"], g["tables"], strict=True)):
            padded, mask = ragged_to_padded(sequence_ids[member], g["max_len"])
            h = lookup[table](padded)
            if member in request_members:  # looked up once, tiled as vectors
                h, mask = tf.gather(h, repeat), tf.gather(mask, repeat)
            histories[member] = h
            # real where every member has a value, as the model pools
            masks[g["name"]] = mask if k == 0 else masks[g["name"]] & mask
            target = g["targets"][k]
            if target is not None:
                ids = ids_c[target] if target in ids_c else tf.gather(ids_r[target], repeat)
                targets[member] = lookup[table](ids)
    return model.sequences(histories, masks, targets, training=False)
