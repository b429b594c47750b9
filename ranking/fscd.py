"""FSCD: learnable feature selection by feature complexity and variational dropout.

Ma et al., "Towards a Better Tradeoff between Effectiveness and Efficiency in Pre-Ranking: A
Learnable Feature Selection based Approach", SIGIR'21 (arXiv 2105.07706).

Every model-input field j gets a keep variable z_j. Training minimizes (Eq. 3)::

    L = BCE(y, f(x * z)) + reg_weight * sum_j alpha_j * theta_j

with ``theta_j = sigmoid(delta_j)`` the learned keep probability (``delta_j`` one logit per field,
starting at ``logit(init_keep)``), and z_j a relaxed Bernoulli sample (Eq. 5)::

    z_j = sigmoid((logit(theta_j) + log(u) - log(1 - u)) / t),   u ~ U(0, 1)

at temperature t (~0.1: nearly 0/1 but differentiable). The penalty uses the expectation theta_j
of z_j (same mean as the sampled z, lower variance; see ../shared/papers.md). Its weight grows
with the field's complexity::

    c_j     = g1 * cost_j + g2 * embedding_dim_j + g3 * cardinality_j
    prior_j = 1 - sigmoid(c_j)                         (prior keep probability)
    alpha_j = log((1 - prior_j) / prior_j)  (= c_j)

so an expensive field must earn more loss reduction to stay. The paper's weight is 1/N (N the
training rows); ``reg_weight`` exposes it. Stage 2 ranks fields by theta_j and keeps the top ones
within a budget (``select_fields``): a number of fields, FLOPs per candidate of the pre-ranking
model (``model_flops``) or measured per-field latency.

Request-side fields. In a cascade a request-side field (user, context) is computed once per
request of K candidates, so ``PrerankConfig.request_fields = "free"`` (the default) charges it
``c_j / K`` in the penalty (``amortized_complexity``), keeps it regardless of the budget, and
lets only per-candidate fields compete for the budget (``select_fields(request=...)``).

Stage 3 fine-tunes the pre-ranking model on the kept fields (``pipelines.preranking``).

At inference the layer multiplies each field by theta_j (the expectation of z_j), so the trained
stage-1 model is evaluated as it was trained on average.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from embeddings.forms import Embedded
from ranking.config import BUDGET_KINDS
from ranking.models import RankingModel


def field_complexity(
    cost: Sequence[float],
    embedding_dim: Sequence[float],
    cardinality: Sequence[float],
    g1: float = 1.0,
    g2: float = 1e-2,
    g3: float = 1e-7,
) -> np.ndarray:
    """``c_j = g1 * cost_j + g2 * embedding_dim_j + g3 * cardinality_j``, shape ``[F]``."""
    cost, dim, card = (np.asarray(v, dtype=np.float64) for v in (cost, embedding_dim, cardinality))
    if not cost.shape == dim.shape == card.shape:
        raise ValueError(
            f"cost, embedding_dim and cardinality need one value per field, got shapes "
            f"{cost.shape}, {dim.shape}, {card.shape}"
        )
    return g1 * cost + g2 * dim + g3 * card


def prior_keep_probability(complexity: np.ndarray) -> np.ndarray:
    """``theta_prior_j = 1 - sigmoid(c_j)``: the costlier a field, the lower its prior."""
    return 1.0 - 1.0 / (1.0 + np.exp(-np.asarray(complexity, dtype=np.float64)))


def complexity_alpha(complexity: np.ndarray) -> np.ndarray:
    """``alpha_j = log((1 - theta_prior_j) / theta_prior_j)`` (equal to c_j), shape ``[F]``."""
    c = np.asarray(complexity, dtype=np.float64)
    # 1 - p = sigmoid(c) and p = sigmoid(-c); log sigmoid(x) = -logaddexp(0, -x), stable for any c
    return np.logaddexp(0.0, c) - np.logaddexp(0.0, -c)


def relaxed_bernoulli(keep_logit: tf.Tensor, u: tf.Tensor, temperature: float) -> tf.Tensor:
    """``z = sigmoid((keep_logit + log u - log(1 - u)) / t)``: a relaxed Bernoulli(theta) sample.

    ``keep_logit`` is ``logit(theta)`` (``[F]``), ``u`` uniform in (0, 1) (``[..., F]``).
    """
    u = tf.clip_by_value(u, 1e-7, 1.0 - 1e-7)
    return tf.sigmoid((keep_logit + tf.math.log(u) - tf.math.log1p(-u)) / temperature)


def complexity_penalty(keep_prob: tf.Tensor, alpha: tf.Tensor) -> tf.Tensor:
    """``sum_j alpha_j * theta_j`` (a scalar)."""
    return tf.reduce_sum(alpha * keep_prob)


def model_flops(
    model_type: str,
    input_width: int,
    mlp: Sequence[int],
    cross_layers: int = 0,
    cross_rank: int = 0,
    request_width: int = 0,
    candidates_per_request: int = 1,
) -> float:
    """Floating-point operations (multiply-add = 2) to score one candidate, after lookups.

    ``dnn``: the MLP on the ``input_width``-wide concatenation plus the head. ``dcn_v2``: also
    ``cross_layers`` cross layers, each ``W x + b`` (``2 D^2`` full rank, ``4 D r`` low rank) and
    the element-wise ``x0 * (.) + x`` (``3 D``).

    ``request_width`` (D_r of the D columns) are request-side columns whose part of the first
    layer that reads ``x0`` (the first cross layer's ``W`` or low-rank ``U``; a ``dnn``'s first
    MLP layer) a cascade computes once per request (``ranking.cascade.RequestScorer``):
    ``W x0 = W_r x_r + W_i x_i``, so that matmul costs ``2 (D - D_r) D' + 2 D_r D' / K`` per
    candidate, K = ``candidates_per_request``. With ``request_width = 0`` (default) every
    column is charged per candidate.
    """
    if input_width < 1:
        raise ValueError(f"input_width must be >= 1, got {input_width}")
    if not 0 <= request_width <= input_width:
        raise ValueError(
            f"request_width must be in [0, input_width={input_width}], got {request_width}"
        )
    if candidates_per_request < 1:
        raise ValueError(f"candidates_per_request must be >= 1, got {candidates_per_request}")
    d = int(input_width)
    # the first layer's matmul over x0, D' outputs: request columns once per K candidates
    share = (d - request_width) + request_width / float(candidates_per_request)
    flops = 0.0
    if model_type == "dcn_v2":
        per_layer = (4 * d * cross_rank if cross_rank else 2 * d * d) + 4 * d
        flops += cross_layers * per_layer
        if cross_layers:
            first_out = cross_rank or d
            flops -= 2 * (d - share) * first_out
    elif model_type != "dnn":
        raise ValueError(f"model_flops knows dnn and dcn_v2, got {model_type!r}")
    width = d
    for i, units in enumerate(mlp):
        flops += 2 * width * units + 2 * units  # matmul, bias and ReLU
        if i == 0 and model_type == "dnn":
            flops -= 2 * (d - share) * units
        width = units
    flops += 2 * width + 1  # head and bias
    return int(flops) if request_width == 0 else flops


def amortized_complexity(
    complexity: Sequence[float], request: Sequence[bool], candidates_per_request: int
) -> np.ndarray:
    """Per-candidate complexity: ``c_j / K`` for request-side fields, ``c_j`` otherwise.

    A cascade computes a request-side field (schema group ``user`` or ``context``) once per
    request and shares it among the request's K = ``candidates_per_request`` candidates, so its
    cost per candidate is ``c_j / K``. Shape ``[F]``.
    """
    c = np.asarray(complexity, dtype=np.float64)
    mask = np.asarray(request, dtype=bool)
    if mask.shape != c.shape:
        raise ValueError(
            f"request needs one flag per field: {mask.shape} flags for {c.shape} complexities"
        )
    if candidates_per_request < 1:
        raise ValueError(f"candidates_per_request must be >= 1, got {candidates_per_request}")
    return np.where(mask, c / float(candidates_per_request), c)


def select_fields(
    names: Sequence[str],
    keep_prob: Sequence[float],
    budget: str,
    budget_value: float,
    usage: Any = None,
    request: Sequence[str] = (),
) -> tuple[list[str], list[dict[str, Any]]]:
    """Stage 2: rank fields by keep probability, keep the top ones while the budget holds.

    Args:
      names, keep_prob: the fields and their learned theta_j.
      budget: ``fields``, ``flops`` or ``latency``.
      budget_value: the largest allowed usage.
      usage: for ``flops`` and ``latency``: a callable ``list of kept names -> usage`` (the
        model's FLOPs per candidate over those fields, or their summed latency). It receives
        every kept field, request-side ones included; it decides what they cost.
      request: request-side fields (computed once per request in a cascade): always kept, not
        ranked against the budget. ``fields`` then counts the other (per-candidate) fields only.
        Empty: every field competes for the budget.

    Returns:
      (kept names in rank order, one decision per field in rank order: ``name``, ``rank``,
      ``keep_prob``, ``side`` (``request`` or ``candidate``), ``kept``, ``usage`` (of the kept
      fields up to this one) and ``reason``). Among per-candidate fields, ranking stops at the
      first one that does not fit: the kept per-candidate fields are a prefix of their ranking.

    Raises:
      ValueError: the budget keeps no per-candidate field (it names the top one and what it
        needs), or every field is request-side.
    """
    _check_selection(names, keep_prob, budget, usage, request)
    is_request = set(request)
    order = sorted(range(len(names)), key=lambda i: (-float(keep_prob[i]), i))
    base = [names[i] for i in order if names[i] in is_request]

    def used_by(fields: list[str]) -> float:
        if budget == "fields":
            return float(sum(1 for n in fields if n not in is_request))
        return float(usage(fields))

    base_used = used_by(base) if base else 0.0
    kept: list[str] = list(base)
    decisions = []
    full = False
    for rank, i in enumerate(order, start=1):
        name, prob = names[i], float(keep_prob[i])
        if name in is_request:
            decisions.append(_request_decision(name, rank, prob, budget, base_used))
            continue
        used = used_by([*kept, name])
        decision = _candidate_decision(name, rank, prob, budget, budget_value, used, full)
        decisions.append(decision)
        if decision["kept"]:
            kept.append(name)
        full = full or not decision["kept"]
    if len(kept) == len(base):
        _raise_nothing_kept(decisions, base, budget, budget_value)
    kept = [d["name"] for d in decisions if d["kept"]]
    return kept, decisions


def _check_selection(
    names: Sequence[str],
    keep_prob: Sequence[float],
    budget: str,
    usage: Any,
    request: Sequence[str],
) -> None:
    """Raises ValueError on the arguments of ``select_fields`` it cannot select with."""
    if budget not in BUDGET_KINDS:
        raise ValueError(f"budget {budget!r} is not one of {list(BUDGET_KINDS)}")
    if len(names) != len(keep_prob):
        raise ValueError(f"{len(names)} names but {len(keep_prob)} keep probabilities")
    if not names:
        raise ValueError("no fields to select from")
    if budget != "fields" and usage is None:
        raise ValueError(f"budget {budget!r} needs a usage function")
    unknown = sorted(set(request) - set(names))
    if unknown:
        raise ValueError(f"request fields {unknown} are not among the fields {list(names)}")
    if all(n in set(request) for n in names):
        raise ValueError(
            f"every field {list(names)} is request-side: a pre-ranking model needs at least one "
            f"per-candidate (item) field to order the candidates of a request"
        )


def _request_decision(
    name: str, rank: int, keep_prob: float, budget: str, base_used: float
) -> dict[str, Any]:
    """The decision of a request-side field: always kept."""
    return {
        "name": name,
        "rank": rank,
        "keep_prob": keep_prob,
        "side": "request",
        "kept": True,
        "usage": base_used,
        "reason": (
            f"request-side: computed once per request, so always kept; the "
            f"request-side fields together use {budget} {base_used:g}"
        ),
    }


def _candidate_decision(
    name: str,
    rank: int,
    keep_prob: float,
    budget: str,
    budget_value: float,
    used: float,
    full: bool,
) -> dict[str, Any]:
    """The decision of a per-candidate field that would bring the usage to ``used``; ``full``:
    a higher-ranked field already did not fit."""
    fits = not full and used <= budget_value
    if fits:
        reason = f"rank {rank} by keep probability; {budget} {used:g} <= budget {budget_value:g}"
    elif full:
        reason = f"rank {rank}: a higher-ranked field already exhausted the budget"
    else:
        reason = f"rank {rank}: keeping it needs {budget} {used:g} > budget {budget_value:g}"
    return {
        "name": name,
        "rank": rank,
        "keep_prob": keep_prob,
        "side": "candidate",
        "kept": fits,
        "usage": used,
        "reason": reason,
    }


def _raise_nothing_kept(
    decisions: list[dict[str, Any]], base: list[str], budget: str, budget_value: float
) -> None:
    """The ValueError of a budget that keeps no per-candidate field, naming the top one."""
    top = next(d for d in decisions if d["side"] == "candidate")
    if base:
        raise ValueError(
            f"the {budget} budget {budget_value:g} keeps no per-candidate field: the top "
            f"one {top['name']!r} (keep probability {top['keep_prob']:.3f}) with the "
            f"request-side fields {base} (always kept) needs {top['usage']:g}; raise "
            f"budget_value"
        )
    raise ValueError(
        f"the {budget} budget {budget_value:g} keeps no field: the top field "
        f"{top['name']!r} (keep probability {top['keep_prob']:.3f}) alone "
        f"needs {top['usage']:g}; raise budget_value"
    )


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FieldSelection(tf.keras.layers.Layer):
    """Relaxed-Bernoulli keep gates over fields, with the complexity-weighted penalty.

    ``call(fields, training)``: a list of ``F`` tensors ``[batch, d_j]`` -> the same list, field j
    multiplied by a sample ``z_j`` (training, one sample per row and field) or by ``theta_j``
    (inference). In training it adds ``reg_weight * sum_j alpha_j * theta_j`` to the layer's
    losses.

    Args:
      field_names: the fields in input order.
      alpha: complexity weight of each field (``complexity_alpha``).
      temperature: relaxed-Bernoulli temperature t.
      reg_weight: weight of the penalty.
      init_keep: starting keep probability.
    """

    def __init__(
        self,
        field_names: Sequence[str],
        alpha: Sequence[float],
        temperature: float = 0.1,
        reg_weight: float = 0.01,
        init_keep: float = 0.5,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        field_names = [str(n) for n in field_names]
        alpha = [float(a) for a in alpha]
        if not field_names:
            raise ValueError("field_names must name at least one field")
        if len(set(field_names)) != len(field_names):
            raise ValueError(f"field_names has duplicates: {field_names}")
        if len(alpha) != len(field_names):
            raise ValueError(f"{len(field_names)} fields but {len(alpha)} alpha values")
        if any(not (a >= 0) for a in alpha):
            raise ValueError(f"alpha values must be >= 0, got {alpha}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not reg_weight >= 0:
            raise ValueError(f"reg_weight must be >= 0, got {reg_weight}")
        if not 0 < init_keep < 1:
            raise ValueError(f"init_keep must be in (0, 1), got {init_keep}")
        self.field_names = field_names
        self.alpha = alpha
        self.temperature = float(temperature)
        self.reg_weight = float(reg_weight)
        self.init_keep = float(init_keep)

    def build(self, input_shape: Any) -> None:
        self.keep_logit = self.add_weight(
            name="keep_logit",
            shape=(len(self.field_names),),
            initializer=tf.keras.initializers.Constant(
                float(np.log(self.init_keep / (1 - self.init_keep)))
            ),
        )
        super().build(input_shape)

    def keep_probability(self) -> tf.Tensor:
        """``theta``, shape ``[F]``."""
        return tf.sigmoid(self.keep_logit)

    def call(self, fields: list[tf.Tensor], training: bool | None = None) -> list[tf.Tensor]:
        if len(fields) != len(self.field_names):
            raise ValueError(f"expected {len(self.field_names)} fields, got {len(fields)}")
        theta = self.keep_probability()
        if training:
            batch = tf.shape(fields[0])[0]
            u = tf.random.uniform(tf.stack([batch, len(self.field_names)]))
            z = relaxed_bernoulli(self.keep_logit, u, self.temperature)  # [batch, F]
            alpha = tf.constant(self.alpha, tf.float32)
            self.add_loss(self.reg_weight * complexity_penalty(theta, alpha))
            return [x * z[:, j : j + 1] for j, x in enumerate(fields)]
        return [x * theta[j] for j, x in enumerate(fields)]

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "field_names": self.field_names,
            "alpha": self.alpha,
            "temperature": self.temperature,
            "reg_weight": self.reg_weight,
            "init_keep": self.init_keep,
        }


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FSCDRankingModel(RankingModel):
    """A RankingModel with a ``FieldSelection`` between the embeddings and the interaction.

    The fields gated are the embedded fields (their vectors) and the dense numeric fields (their
    columns), in ``selection.field_names`` order: embedded fields in table order, then dense.
    Only interaction-focused models (``dnn``, ``dcn_v2``: no wide term) are supported.
    """

    def __init__(self, selection: tf.keras.layers.Layer, **kwargs: Any):
        super().__init__(**kwargs)
        if self.interaction is None or self.wide is not None:
            raise ValueError("FSCD needs an interaction model without a wide term (dnn, dcn_v2)")
        if getattr(self, "dense_blocks", None):
            raise ValueError("FSCD gates schema fields; a model with dense_blocks is not supported")
        self.selection = selection

    def call(self, features: dict[str, tf.Tensor], training: bool | None = None) -> tf.Tensor:
        ids, dense = self.preprocessor(features)
        fields = self.embedding(ids).fields()
        n_emb = len(fields)
        columns = [dense[:, i : i + 1] for i in range(dense.shape[1])] if dense is not None else []
        gated = self.selection(list(fields.values()) + columns, training=training)
        dense_out = tf.concat(gated[n_emb:], axis=1) if columns else None
        z = self.interaction(
            Embedded(vectors=dict(zip(fields, gated[:n_emb], strict=True))), dense_out
        )
        if self.tower is not None:
            z = self.tower(z, training=training)
        logit = self.bias + self.head(z)[:, 0]
        if self.residual is not None:  # not gated: the towers are the pre-ranker's free part
            logit = logit + self.residual(features, training=training)
        return logit

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "selection": tf.keras.layers.serialize(self.selection)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FSCDRankingModel:
        config = dict(config)
        config["selection"] = tf.keras.layers.deserialize(config["selection"])
        return super().from_config(config)


def selection_fields(model: RankingModel) -> list[str]:
    """The gated fields of a model's inputs: embedded fields in table order, then dense."""
    emb = model.embedding.field_names if model.embedding is not None else []
    return [*emb, *model.preprocessor.dense_fields]


def add_field_selection(
    model: RankingModel,
    alpha: dict[str, float],
    temperature: float = 0.1,
    reg_weight: float = 0.01,
    init_keep: float = 0.5,
) -> FSCDRankingModel:
    """The FSCD stage-1 model: ``model``'s blocks (unbuilt) with a ``FieldSelection`` added.

    ``alpha``: complexity weight per model-input field (every gated field needs one).
    """
    names = selection_fields(model)
    missing = [n for n in names if n not in alpha]
    if missing:
        raise ValueError(f"alpha lacks fields {missing}")
    selection = FieldSelection(
        names,
        [alpha[n] for n in names],
        temperature=temperature,
        reg_weight=reg_weight,
        init_keep=init_keep,
        name="selection",
    )
    return FSCDRankingModel(
        selection=selection,
        preprocessor=model.preprocessor,
        label=model.label,
        embedding=model.embedding,
        interaction=model.interaction,
        tower=model.tower,
        wide=model.wide,
        initial_bias=model.initial_bias,
        residual=model.residual,
        name="fscd",
    )


def input_slices(model: RankingModel) -> dict[str, tuple[int, int]]:
    """Where each gated field sits in the concatenated interaction input: ``[start, end)``."""
    out, start = {}, 0
    dims = dict(zip(model.embedding.field_names, model.embedding.dims, strict=True))
    for name in selection_fields(model):
        width = dims.get(name, 1)
        out[name] = (start, start + width)
        start += width
    return out


def transfer_weights(source: RankingModel, target: RankingModel) -> dict[str, int]:
    """Initializes ``target`` (built, over a subset of ``source``'s fields) from ``source``.

    Embedding tables of shared fields are copied. Weights of the interaction, tower and head
    are copied when shapes agree; an axis as wide as the source's concatenated input (D) is
    restricted to the positions of the target's fields (the first MLP layer's rows, a cross
    layer's rows, columns and bias). The bias is copied. Returns counts of copied / sliced
    weights. FSCD's stage 3 starts from the stage-1 weights this way (papers.md, FSCD).
    """
    src_slices, dst_slices = input_slices(source), input_slices(target)
    missing = sorted(set(dst_slices) - set(src_slices))
    if missing:
        raise ValueError(f"the source model lacks fields {missing}")
    index = np.concatenate([np.arange(*src_slices[n]) for n in selection_fields(target)]).astype(
        np.int64
    )
    d_src = sum(b - a for a, b in src_slices.values())
    d_dst = index.size
    counts = {"copied": 0, "sliced": 0}
    for name, layer in target.embedding.layers_by_field.items():
        layer.set_weights(source.embedding.layers_by_field[name].get_weights())
        counts["copied"] += 1
    for part in ("interaction", "tower", "head"):
        dst, src = getattr(target, part), getattr(source, part)
        if dst is None or src is None:
            continue
        values = []
        for s, t in zip(src.get_weights(), dst.get_weights(), strict=True):
            if s.shape != t.shape and d_src != d_dst:
                for axis in range(s.ndim):
                    if s.shape[axis] == d_src and t.shape[axis] == d_dst:
                        s = np.take(s, index, axis=axis)
                counts["sliced"] += 1
            else:
                counts["copied"] += 1
            if s.shape != t.shape:
                raise ValueError(f"{part}: weight of shape {s.shape} cannot fill {t.shape}")
            values.append(s)
        dst.set_weights(values)
    target.bias.assign(source.bias)
    return counts
