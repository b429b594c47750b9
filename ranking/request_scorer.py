"""Scoring one request's candidates with request-side fields computed once.

``RequestScorer`` gives the logits ``[N]`` of one request (request fields ``[1]``, candidate
fields ``[N]``) of a ``RankingModel`` or ``TwoTowerModel``, equal to the model's on the request
tiled row by row; ``ranking.cascade`` chains two of them. A user history (a sequence field with
``group = "user"``) is looked up once and pooled per candidate (``ranking.cascade_history``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from embeddings.forms import Embedded
from ranking.blocks import MLP, ConcatInteraction, CrossInteraction
from ranking.cascade_history import pooled_widths, request_history, sequence_names
from ranking.fscd import FSCDRankingModel
from ranking.models import RankingModel
from ranking.two_tower import REQUEST_GROUPS, TwoTowerModel

_TF_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}


def _plans(model: tf.keras.Model) -> list[dict[str, Any]]:
    if isinstance(model, TwoTowerModel):
        return [*model.user_tower.preprocessor.plans, *model.item_tower.preprocessor.plans]
    plans = list(model.preprocessor.plans)
    residual = getattr(model, "residual", None)
    if residual is not None:  # the residual's fields too (once each)
        own = {p["name"] for p in plans}
        plans += [p for p in _plans(residual) if p["name"] not in own]
    return plans


def model_inputs(model: tf.keras.Model) -> list[str]:
    """The raw fields a RankingModel or TwoTowerModel reads."""
    return [p["name"] for p in _plans(model)]


def input_dtypes(model: tf.keras.Model) -> dict[str, tf.DType]:
    """The raw dtype of each field the model reads (from its preprocessor plans)."""
    return {p["name"]: _TF_DTYPES[p["dtype"]] for p in _plans(model)}


def request_and_item_fields(
    groups: Mapping[str, str | None], names: list[str]
) -> tuple[list[str], list[str]]:
    """Splits ``names`` by their schema groups: (user and context fields, item fields)."""
    request, items = [], []
    for name in names:
        if name not in groups:
            raise ValueError(f"no group given for field {name!r}; groups: {sorted(groups)}")
        if groups[name] is None:
            raise ValueError(
                f"field {name!r} has no `group`; a ranking request needs group = 'user', "
                f"'item' or 'context' on every model input"
            )
        (request if groups[name] in REQUEST_GROUPS else items).append(name)
    return request, items


def _split_dense(
    layer: tf.keras.layers.Dense,
    x_request: tf.Tensor,
    x_items: tf.Tensor,
    request_rows: np.ndarray,
    item_rows: np.ndarray,
) -> tf.Tensor:
    """``act([x_request, x_items] W + b)`` with ``x_request @ W_request`` computed once.

    ``x_request`` ``[1, D_r]``, ``x_items`` ``[N, D_i]``; ``request_rows`` / ``item_rows``: the
    rows of the kernel ``W`` ``[D, D']`` (positions in the layer's input) each part multiplies.
    ``W x = W_r x_r + W_i x_i`` exactly, so the result equals the layer on the tiled input up to
    float rounding: ``[N, D']``, the request part broadcast over the candidates.
    """
    kernel = layer.kernel
    out = tf.matmul(x_items, tf.gather(kernel, item_rows))
    out = out + tf.matmul(x_request, tf.gather(kernel, request_rows))  # [1, D'] broadcast
    if layer.use_bias:
        out = out + layer.bias
    return layer.activation(out) if layer.activation is not None else out


class RequestScorer(tf.Module):
    """Logits ``[N]`` of one request's ``N`` candidates, request-side fields computed once.

    With ``split_first_layer`` (default), the first layer that reads the concatenated field
    vectors ``x0 = [x_r; x_i]`` (request-side and candidate parts, in the model's column order)
    computes its request part once per request: for a ``dnn`` the tower's first Dense layer,
    ``relu(W_r x_r + W_i x_i + b)`` with ``W_r x_r`` ``[1, D']`` broadcast over the N
    candidates; for a ``dcn_v2`` the first cross layer's matmul, ``x1 = x0 * (W_r x_r + W_i x_i
    + b) + x0`` (low rank: the projection ``U^T x0 = U_r^T x_r + U_i^T x_i``). The element-wise
    product with ``x0`` needs the full width, so a ``dcn_v2`` still repeats the request vectors
    for it; later cross layers and the MLP run on full-width per-candidate inputs. The outputs
    equal the plain model's up to float rounding; ``split_first_layer=False`` runs the plain
    model on the repeated request vectors.

    Args:
      model: a ``RankingModel`` (not the FSCD stage-1 model) or a ``TwoTowerModel``.
      groups: ``{field: schema group}`` of (at least) the fields the model reads.
      split_first_layer: compute the first layer's request part once per request.

    The candidates' embedded fields are looked up by ``item_embedding``, the model's embedding
    collection restricted to them (``EmbeddingCollection.select``: of a collection computing
    its lookups in one op, one op over the candidates' fields).
    """

    def __init__(
        self,
        model: tf.keras.Model,
        groups: Mapping[str, str | None],
        name: str = "scorer",
        split_first_layer: bool = True,
    ):
        super().__init__(name=name)
        self.split_first_layer = bool(split_first_layer)
        self.item_embedding = None
        if isinstance(model, FSCDRankingModel):
            raise ValueError("score requests with the fine-tuned pre-ranking model, not stage 1")
        if not isinstance(model, RankingModel | TwoTowerModel):
            raise ValueError(f"cannot score requests with a {type(model).__name__}")
        self.model = model
        self.request_names, self.item_names = request_and_item_fields(groups, model_inputs(model))
        if not self.item_names:
            raise ValueError(f"model {model.name!r} reads no item field; it cannot rank candidates")
        if isinstance(model, RankingModel):
            if getattr(model, "dense_blocks", None):
                raise ValueError(
                    f"model {model.name!r} has dense_blocks (features computed from several raw "
                    f"fields); the cascade does not split those into request and candidate parts"
                )
            plans = model.preprocessor.plans
            own = {p["name"] for p in plans}  # without the residual's fields
            self.own_request = [n for n in self.request_names if n in own]
            self.own_items = [n for n in self.item_names if n in own]
            # sequences: ids from the model's own preprocessor (their shared tables' lookups),
            # pooled by cascade_history.request_history; the others by the side preprocessors
            sequences = sequence_names(model)
            self.request_sequences = [n for n in self.own_request if n in sequences]
            self.item_sequences = [n for n in self.own_items if n in sequences]
            self.own_request = [n for n in self.own_request if n not in sequences]
            self.own_items = [n for n in self.own_items if n not in sequences]
            if not self.own_items:
                raise ValueError(
                    f"model {model.name!r} reads no item field itself; it cannot rank candidates"
                )
            self.residual_scorer = (
                RequestScorer(model.residual, groups, name=f"{name}_residual")
                if model.residual is not None
                else None
            )
            # same plans (vocabularies, boundaries, moments) as the model's own preprocessor
            preprocessor_class = type(model.preprocessor)
            self.request_pre = (
                preprocessor_class(
                    [p for p in plans if p["name"] in self.own_request],
                    name=f"{name}_request_preprocessor",
                )
                if self.own_request
                else None
            )
            self.item_pre = preprocessor_class(
                [p for p in plans if p["name"] in self.own_items],
                name=f"{name}_item_preprocessor",
            )
            if model.embedding is not None:
                embedded_items = [n for n in model.embedding.field_names if n in self.own_items]
                if embedded_items:
                    self.item_embedding = model.embedding.select(embedded_items)

    @property
    def embedding_collections(self) -> list[tf.keras.layers.Layer]:
        """The embedding collections the scorer calls: the candidates' (``item_embedding``),
        the wide term's weights, and those of the residual's scorer."""
        found = [self.item_embedding]
        wide = getattr(self.model, "wide", None)
        found.append(getattr(wide, "field_weights", None))
        residual = getattr(self, "residual_scorer", None)
        found += residual.embedding_collections if residual is not None else []
        return [c for c in found if c is not None]

    def _first_layer(self) -> tf.keras.layers.Layer | None:
        """The layer whose request part can be computed once (None: no split)."""
        m = self.model
        if not self.split_first_layer or not self.own_request or m.interaction is None:
            return None
        if isinstance(m.interaction, CrossInteraction):
            return m.interaction.cross_layers[0]
        if isinstance(m.interaction, ConcatInteraction) and isinstance(m.tower, MLP):
            return m.tower.dense_layers[0]
        return None

    def _column_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the request-side and candidate columns in ``x0`` (embedded fields in
        table order, the pooled histories (per candidate), then dense columns in the
        preprocessor's order)."""
        m = self.model
        request = set(self.own_request)
        is_request: list[bool] = []
        for name, dim in zip(m.embedding.field_names, m.embedding.dims, strict=True):
            is_request += [name in request] * int(dim)
        for _, dim in pooled_widths(m):
            is_request += [False] * dim
        is_request += [name in request for name in m.preprocessor.dense_fields]
        flags = np.array(is_request, dtype=bool)
        return np.flatnonzero(flags).astype(np.int32), np.flatnonzero(~flags).astype(np.int32)

    def __call__(self, request: dict[str, tf.Tensor], items: dict[str, tf.Tensor]) -> tf.Tensor:
        """``request``: ``{field: [1]}``; ``items``: ``{field: [N]}`` -> logits ``[N]``."""
        if isinstance(self.model, TwoTowerModel):
            u = self.model.user_vectors(request)
            v = self.model.item_vectors(items)
            return self.model.score_candidates(u, v)
        logits = self._ranking_logits(request, items)
        if self.residual_scorer is not None:
            logits = logits + self.residual_scorer(request, items)
        return logits

    def _ranking_logits(self, request: dict[str, tf.Tensor], items: dict[str, tf.Tensor]):
        m = self.model
        n = tf.shape(items[self.own_items[0]])[0]
        repeat = tf.zeros([n], tf.int32)  # gather row 0 N times: [1, ...] -> [N, ...]
        ids_r, dense_r = ({}, None)
        if self.request_pre is not None:
            ids_r, dense_r = self.request_pre({k: request[k] for k in self.own_request})
        ids_c, dense_c = self.item_pre({k: items[k] for k in self.own_items})
        pooled = self._history(request, items, ids_r, ids_c, repeat)
        dense_cols: dict[str, tf.Tensor] = {}
        for pre, dense, tile in (
            (self.request_pre, dense_r, True),
            (self.item_pre, dense_c, False),
        ):
            if pre is None or dense is None:
                continue
            for i, name in enumerate(pre.dense_fields):
                col = dense[:, i : i + 1]
                dense_cols[name] = tf.gather(col, repeat) if tile else col
        order = m.preprocessor.dense_fields
        dense_all = tf.concat([dense_cols[k] for k in order], axis=1) if order else None
        logit = m.bias
        first = self._first_layer()
        if m.interaction is not None and first is not None:
            z = self._split_interaction(first, ids_r, ids_c, dense_r, dense_c, repeat, pooled)
            logit = logit + m.head(z)[:, 0]
        elif m.interaction is not None:
            vectors = {}
            items = self._item_vectors(ids_c)
            for name in m.embedding.field_names:
                layer = m.embedding.layers_by_field[name]
                if name in ids_r:
                    vectors[name] = tf.gather(layer(ids_r[name]), repeat)
                else:
                    vectors[name] = items[name]
            vectors.update(pooled)  # after the embedded fields, as the model places them
            z = m.interaction(Embedded(vectors=vectors), dense_all)
            if m.tower is not None:
                z = m.tower(z, training=False)
            logit = logit + m.head(z)[:, 0]
        if m.wide is not None:
            ids = {**{k: tf.gather(v, repeat) for k, v in ids_r.items()}, **ids_c}
            logit = logit + m.wide(ids, dense_all)
        return logit + tf.zeros([n])

    def _history(
        self,
        request: dict[str, tf.Tensor],
        items: dict[str, tf.Tensor],
        ids_r: dict[str, tf.Tensor],
        ids_c: dict[str, tf.Tensor],
        repeat: tf.Tensor,
    ) -> dict[str, tf.Tensor]:
        """``{sequence: [N, d]}``: the pooled histories (``ranking.cascade_history``); empty
        for a model without a pooling block."""
        if getattr(self.model, "sequences", None) is None:
            return {}
        pre = self.model.preprocessor
        seq_ids = pre.sequence_ids({k: request[k] for k in self.request_sequences})
        seq_ids.update(pre.sequence_ids({k: items[k] for k in self.item_sequences}))
        return request_history(
            self.model, seq_ids, set(self.request_sequences), ids_r, ids_c, repeat
        )

    def _item_vectors(self, ids_c: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """``{field: [N, d]}`` of the candidates' embedded fields (``item_embedding``)."""
        if self.item_embedding is None:
            return {}
        names = self.item_embedding.field_names
        return self.item_embedding({n: ids_c[n] for n in names}).fields()

    def _split_interaction(
        self,
        first: tf.keras.layers.Layer,
        ids_r: dict[str, tf.Tensor],
        ids_c: dict[str, tf.Tensor],
        dense_r: tf.Tensor | None,
        dense_c: tf.Tensor | None,
        repeat: tf.Tensor,
        pooled: dict[str, tf.Tensor],
    ) -> tf.Tensor:
        """The interaction and tower output ``[N, h]`` with the first layer split (class
        docstring): ``x_r`` ``[1, D_r]`` and ``x_i`` ``[N, D_i]`` in ``x0``'s column order."""
        m = self.model
        request_rows, item_rows = self._column_rows()
        parts_r: list[tf.Tensor] = []
        parts_c: list[tf.Tensor] = []
        full: list[tuple[tf.Tensor, bool]] = []  # x0's parts in column order, request-side?
        items = self._item_vectors(ids_c)
        for name in m.embedding.field_names:
            layer = m.embedding.layers_by_field[name]
            if name in ids_r:
                v = layer(ids_r[name])
                parts_r.append(v)
            else:
                v = items[name]
                parts_c.append(v)
            full.append((v, name in ids_r))
        for name, _ in pooled_widths(m):  # per candidate (DIN reads the candidate's target)
            parts_c.append(pooled[name])
            full.append((pooled[name], False))
        dense_index = {k: ("c", i) for i, k in enumerate(self.item_pre.dense_fields)}
        if self.request_pre is not None:
            dense_index.update({k: ("r", i) for i, k in enumerate(self.request_pre.dense_fields)})
        for name in m.preprocessor.dense_fields:
            side, i = dense_index[name]
            col = (dense_r if side == "r" else dense_c)[:, i : i + 1]
            (parts_r if side == "r" else parts_c).append(col)
            full.append((col, side == "r"))
        x_r = tf.concat(parts_r, axis=1) if len(parts_r) > 1 else parts_r[0]
        x_i = tf.concat(parts_c, axis=1) if len(parts_c) > 1 else parts_c[0]
        if isinstance(m.interaction, ConcatInteraction):
            z = _split_dense(first, x_r, x_i, request_rows, item_rows)
            for layer in m.tower.dense_layers[1:]:
                z = layer(z)
            return z
        # dcn_v2: the element-wise product and the residual need x0 at full width
        x0 = tf.concat([tf.gather(p, repeat) if r else p for p, r in full], axis=1)
        if first._projection_dim is None:
            prod = _split_dense(first._dense, x_r, x_i, request_rows, item_rows)
        else:
            low = _split_dense(first._dense_u, x_r, x_i, request_rows, item_rows)
            prod = first._dense_v(low)
        if first._diag_scale:
            prod = prod + first._diag_scale * x0
        x = x0 * prod + x0
        for layer in m.interaction.cross_layers[1:]:
            x = layer(x0, x)
        if m.tower is not None:
            x = m.tower(x, training=False)
        return x
