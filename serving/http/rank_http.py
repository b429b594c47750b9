"""StitchRec's ranking call over HTTP: ``POST /v1/rank/{model}``.

Body::

    {"user": {"user": "u1"}, "candidates": {"item": [3, 1], "price": [0.5, 2.0]},
     "top_k": 0, "output": "score", "version": 0, "label": ""}

``user``: one value per user feature; ``candidates``: N values per candidate feature; ``top_k``
(0: all, in candidate order), ``output`` (default ``score``), ``version`` (0 or absent: the
highest ready one) and ``label`` are optional. Answer::

    {"model_name": "lin", "model_version": 2, "scores": [...], "indices": [...],
     "task_scores": {"<task>": [...]}}

the same checks, limits and answer as ``RankingService.Rank`` (``serving.inference.rank``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from aiohttp import web

from serving import inference, routing
from serving.http.endpoint import answer_headers, dumps, endpoint, json_body, state_of
from serving.http.jsonio import json_array, json_object, type_name
from serving.http.versions import resolve_version, route_version
from serving.inference import invalid

KEYS = {"user", "candidates", "top_k", "output", "version", "label"}


def _int(doc: dict, key: str, where: str) -> int:
    value = doc.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"{where}: {key} must be an integer >= 0, got {str(value)[:32]}")
    return value


def _str(doc: dict, key: str, where: str) -> str:
    value = doc.get(key, "")
    if not isinstance(value, str):
        raise invalid(f"{where}: {key} must be a string, got {type_name(value)}")
    return value


def _features(doc: dict, key: str, where: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise invalid(f"{where}: {key} must be an object of features, got {type_name(value)}")
    return value


@endpoint("Rank")
async def rank(request: web.Request) -> web.Response:
    state = state_of(request)
    model = request.match_info["model"]
    where = f"/v1/rank/{model}"
    state.repo.get(model)  # an unknown model is 404 before the body is decoded
    doc = json_object(await json_body(request, where), where)
    extra = sorted(set(doc) - KEYS)
    if extra:
        raise invalid(f"{where}: unknown key(s) {extra}; expected {sorted(KEYS)}")
    k, out_name = _int(doc, "top_k", where), _str(doc, "output", where)
    label = _str(doc, "label", where) or None
    version = resolve_version(state, model, _int(doc, "version", where) or None, label)
    mv = state.repo.get(model, version)
    specs = {**mv.inputs, **(mv.rank_inputs or {})}
    user_doc, cand_doc = _features(doc, "user", where), _features(doc, "candidates", where)
    limits = state.limits

    def arrays(values: dict[str, Any], part: str) -> dict[str, np.ndarray]:
        out = {}
        for n, v in values.items():
            spec = specs.get(n)
            here = f"{where}: {part} feature {n[:64]!r}"
            out[n] = json_array(v, here, limits, spec.dtype if spec else None).reshape(-1)
        return out

    user, cands = await state.offload(
        lambda: (arrays(user_doc, "user"), arrays(cand_doc, "candidate"))
    )
    version = route_version(
        state,
        request,
        model,
        _int(doc, "version", where) or None,
        label,
        lambda f: routing.first_value(user[f] if f in user else cands.get(f)),
    )
    result = await inference.rank(
        state.repo,
        model,
        version,
        user,
        cands,
        k=k,
        output=out_name,
        limits=limits,
        strings_checked=True,
        offload=state.offload,
        observers=state.observers,
    )
    body = {
        "model_name": model,
        "model_version": result.version,
        "scores": result.scores.tolist(),
        "indices": result.indices.tolist(),
        "task_scores": {t: v.tolist() for t, v in result.tasks.items()},
    }
    resp = web.Response(body=await dumps(request, body), content_type="application/json")
    return answer_headers(resp, result.version)
