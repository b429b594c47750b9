"""The cost side of bench/preranking: FLOPs and measured latency per candidate of each model.

``measure_cost`` scores 1,000 candidates of one request (``RequestScorer``: request fields once,
as a serving cascade does), one request at a time (batch 1) and over 64 consecutive requests,
every model taking turns in one process, and reports each figure also as a ratio against the
two-tower model; ranking-architecture models are timed also without the first layer's request
split (``NO_SPLIT``), and the two-tower model also with its item vectors computed ahead.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
import tensorflow as tf

import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
from features.dataset import input_signature
from pipelines.config import PipelineConfig
from pipelines.preranking import field_groups
from ranking.cascade import RequestScorer, model_inputs
from ranking.config import ModelConfig
from ranking.fscd import model_flops

LATENCY_CANDIDATES = 1000
NO_SPLIT = " (no split)"


def grow(cands: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """The candidate list repeated to ``size`` rows (the latency runs score 1,000)."""
    reps = -(-size // len(next(iter(cands.values()))))
    return {k: np.concatenate([v] * reps)[:size] for k, v in cands.items()}


def request_fn(model: tf.keras.Model, schema: Any, split: bool = True):
    """(tf.function of (request tensors, candidate tensors) -> logits, numpy -> tensors);
    ``split``: the first layer's request part once per request (``RequestScorer``)."""
    scorer = RequestScorer(model, field_groups(schema), name=model.name, split_first_layer=split)
    sig = input_signature([f for f in schema.model_inputs if f.name in set(model_inputs(model))])
    req_spec = {k: tf.TensorSpec([1], sig[k].dtype, k) for k in scorer.request_names}
    item_spec = {k: tf.TensorSpec([None], sig[k].dtype, k) for k in scorer.item_names}
    fn = tf.function(lambda r, c: scorer(r, c), input_signature=[req_spec, item_spec])

    def prepare(request: dict, cands: dict) -> tuple[dict, dict]:
        r = {k: tf.constant(request[k], sig[k].dtype) for k in scorer.request_names}
        c = {k: tf.constant(cands[k], sig[k].dtype) for k in scorer.item_names}
        return r, c

    return fn, prepare


def precomputed_two_tower_fn(model: tf.keras.Model, schema: Any):
    """Two-tower with the candidates' item vectors computed ahead: user tower + dot products."""
    scorer = RequestScorer(model, field_groups(schema), name="tt_pre")
    sig = input_signature(list(schema.model_inputs))
    req_spec = {k: tf.TensorSpec([1], sig[k].dtype, k) for k in scorer.request_names}

    @tf.function(input_signature=[req_spec, tf.TensorSpec([None, model.user_tower.dim])])
    def fn(r: dict, v: tf.Tensor) -> tf.Tensor:
        return model.score_candidates(model.user_vectors(r), v)

    def prepare(request: dict, cands: dict) -> tuple[dict, tf.Tensor]:
        r = {k: tf.constant(request[k], sig[k].dtype) for k in scorer.request_names}
        items = {k: tf.constant(cands[k], sig[k].dtype) for k in scorer.item_names}
        return r, model.item_vectors(items)  # ahead of the request, not timed

    return fn, prepare


def time_requests(
    calls: dict[str, Any], requests: list, cands: list, repeats: int
) -> dict[str, dict[str, float]]:
    """Microseconds per candidate of each ``(fn, prepare)``: one request (median of
    ``repeats``) and 64 different requests in a row (median of ``max(repeats // 10, 5)``
    rounds). Inputs are converted to tensors before timing; the models take turns in every
    round (in rotating order), so load from other processes hits them alike."""
    n = len(next(iter(cands[0].values())))
    ready = {
        label: [prepare(r, c) for r, c in zip(requests[:64], cands[:64], strict=True)]
        for label, (_, prepare) in calls.items()
    }
    labels = list(calls)
    for label in labels:
        calls[label][0](*ready[label][0]).numpy()
    one: dict[str, list[float]] = {label: [] for label in labels}
    many: dict[str, list[float]] = {label: [] for label in labels}
    for rep in range(repeats):
        for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
            fn, args = calls[label][0], ready[label][0]
            t0 = time.perf_counter()
            fn(*args).numpy()
            one[label].append(time.perf_counter() - t0)
    for rep in range(max(repeats // 10, 5)):
        for label in labels[rep % len(labels) :] + labels[: rep % len(labels)]:
            fn = calls[label][0]
            t0 = time.perf_counter()
            for args in ready[label]:
                fn(*args).numpy()
            many[label].append(time.perf_counter() - t0)
    return {
        label: {
            "batch1_us_per_candidate": statistics.median(one[label]) / n * 1e6,
            "requests64_us_per_candidate": statistics.median(many[label])
            / (len(ready[label]) * n)
            * 1e6,
        }
        for label in labels
    }


def two_tower_flops(model: tf.keras.Model, candidates: int) -> dict[str, float]:
    """Per candidate: the dot product (+ user tower / candidates), and with the item tower."""

    def tower(t: Any) -> int:
        width = sum(t.embedding.dims) if t.embedding is not None else 0
        width += len(t.preprocessor.dense_fields)
        flops = 0
        for units in [*t.mlp_units, t.dim]:
            flops += 2 * width * units + units
            width = units
        return flops

    dot = 2 * model.user_tower.dim
    user = tower(model.user_tower) / candidates
    return {"precomputed": dot + user, "online": dot + user + tower(model.item_tower)}


def ranking_flops(
    model: tf.keras.Model, cfg: ModelConfig, schema: Any, candidates: int = 1
) -> float:
    """FLOPs per candidate; with ``candidates`` > 1 the first layer's request columns are
    charged once per request of that many candidates (``RequestScorer``'s split)."""
    width = sum(model.embedding.dims) + len(model.preprocessor.dense_fields)
    groups = field_groups(schema)
    dims = dict(zip(model.embedding.field_names, model.embedding.dims, strict=True))
    dims.update({n: 1 for n in model.preprocessor.dense_fields})
    request = sum(w for n, w in dims.items() if groups.get(n) in ("user", "context"))
    residual = getattr(model, "residual", None)  # the towers, computed online as the base's
    extra = two_tower_flops(residual, candidates)["online"] if residual is not None else 0.0
    return extra + model_flops(
        cfg.type,
        width,
        cfg.mlp,
        cfg.cross_layers,
        cfg.cross_rank,
        request_width=request if candidates > 1 else 0,
        candidates_per_request=candidates,
    )


def measure_cost(
    models: dict[str, tuple[tf.keras.Model, Any]],
    tt: tf.keras.Model,
    schema: Any,
    cfg: PipelineConfig,
    pcfg: PipelineConfig,
    requests: list,
    cands: list,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """FLOPs and latency per candidate (1,000 candidates a request) of every model, in one
    process with the models taking turns; ranking-architecture models twice: with the first
    layer's request part once per request (the label) and without (``" (no split)"``)."""
    big = [grow(c, LATENCY_CANDIDATES) for c in cands]
    calls = {}
    for label, (model, _) in models.items():
        calls[label] = request_fn(model, schema)
        if label != "two_tower":
            calls[label + NO_SPLIT] = request_fn(model, schema, split=False)
    calls["two_tower(precomputed items)"] = precomputed_two_tower_fn(tt, schema)
    load_before = os.getloadavg()
    cost: dict[str, Any] = time_requests(calls, requests, big, args.repeats)
    cost["load_average"] = [load_before, os.getloadavg()]
    tt_flops = two_tower_flops(tt, LATENCY_CANDIDATES)
    for label, (model, _) in models.items():
        if label == "two_tower":
            cost[label]["flops_per_candidate"] = tt_flops["online"]
            continue
        mcfg = cfg.model if label == "rank" else pcfg.model
        cost[label]["flops_per_candidate"] = ranking_flops(model, mcfg, schema, LATENCY_CANDIDATES)
        cost[label + NO_SPLIT]["flops_per_candidate"] = ranking_flops(model, mcfg, schema)
    cost["two_tower(precomputed items)"]["flops_per_candidate"] = tt_flops["precomputed"]
    base = cost["two_tower"]
    for entry in (v for k, v in cost.items() if k != "load_average"):
        for k in ("batch1_us_per_candidate", "requests64_us_per_candidate", "flops_per_candidate"):
            entry[k.replace("_per_candidate", "_x_two_tower").replace("_us", "")] = (
                entry[k] / base[k]
            )
    return cost
