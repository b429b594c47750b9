"""What every service shares: feature validation, the batched predict call and ranking.

Requests arrive in three wire formats (RankingService, TF Serving, KServe v2); each servicer turns
its tensors into ``{name: numpy array}`` and calls ``predict`` or ``rank`` here, so every
protocol gets the same checks and the same errors:

- missing, extra or mistyped features, wrong shapes, NaN/Inf, empty or too-large batches:
  INVALID_ARGUMENT, naming the feature, what was found and what the model expects;
- unknown model or version: NOT_FOUND, naming what is served;
- a full batch queue: RESOURCE_EXHAUSTED; a deadline that passed in the queue: DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import grpc
import numpy as np

from serving.batching import BatcherClosed, DeadlineExceeded, QueueFull
from serving.config import Limits
from serving.repository import (
    RANK_SIGNATURE,
    SERVING_SIGNATURE,
    InputSpec,
    ModelNotFound,
    ModelRepository,
    ModelVersion,
)


class ServingError(Exception):
    """An error answered to the client with a gRPC status code and a message."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status answered for an exception raised while serving a request."""
    if isinstance(exc, ServingError):
        return exc.code, exc.message
    if isinstance(exc, ModelNotFound):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, QueueFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, DeadlineExceeded):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)
    if isinstance(exc, BatcherClosed):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


_KIND_NAMES = {"i": "integer", "u": "unsigned integer", "f": "float", "b": "bool"}


def _type_name(arr: np.ndarray) -> str:
    if arr.dtype.kind in "OSU":
        return "string"
    return f"{_KIND_NAMES.get(arr.dtype.kind, arr.dtype.kind)} ({arr.dtype})"


def _expected(spec: InputSpec) -> str:
    return "string" if spec.dtype == np.object_ else str(spec.dtype)


def coerce(
    name: str, arr: np.ndarray, spec: InputSpec, where: str, strings_checked: bool = False
) -> np.ndarray:
    """Checks one feature array's type and values, converting to the signature's dtype.

    Strings: bytes or str values (``strings_checked``: object arrays decoded from a wire bytes
    field, known to hold only bytes, skip the per-element check). int64: any integer type.
    float32: float32/float64 (finite).
    """
    kind = arr.dtype.kind
    want = spec.dtype
    if want == np.object_:
        if kind == "O":
            if not strings_checked and not all(isinstance(v, bytes | str) for v in arr):
                bad = next(v for v in arr if not isinstance(v, bytes | str))
                raise invalid(
                    f"{where}: feature {name!r} holds {type(bad).__name__} values; expected string"
                )
            return arr
        if kind in "SU":
            return arr.astype(object)
    elif want.kind == "i":
        if kind in "iu":
            return arr.astype(want, copy=False)
    elif want.kind == "f":
        if kind == "f":
            out = arr.astype(want, copy=False)
            finite = np.isfinite(out)
            if not finite.all():
                i = int(np.argmin(finite))
                raise invalid(
                    f"{where}: feature {name!r} has a non-finite value {out[i]} at index {i}; "
                    f"expected finite {want} values"
                )
            return out
    elif kind == want.kind:
        return arr.astype(want, copy=False)
    raise invalid(
        f"{where}: feature {name!r} is {_type_name(arr)}; the model expects {_expected(spec)}"
    )


def _check_names(specs: Mapping[str, Any], features: Mapping[str, Any], where: str) -> None:
    """INVALID_ARGUMENT naming the missing and the unknown features, if any."""
    missing = sorted(set(specs) - set(features))
    extra = sorted(set(features) - set(specs))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing feature(s) {missing}")
        if extra:
            parts.append(f"unknown feature(s) {extra}")
        raise invalid(f"{where}: {'; '.join(parts)}; the model expects {sorted(specs)}")


def check_features(
    features: Mapping[str, np.ndarray],
    specs: Mapping[str, InputSpec],
    where: str,
    limits: Limits,
    strings_checked: bool = False,
) -> tuple[dict[str, np.ndarray], int]:
    """Validates a whole request against a signature; returns the converted arrays and rows.

    Every feature must be a 1-D array (``[rows, 1]`` is accepted as ``[rows]``) of the same
    length ``rows`` with ``1 <= rows <= limits.max_request_rows``.
    """
    _check_names(specs, features, where)
    out: dict[str, np.ndarray] = {}
    rows = None
    first = ""
    for name in sorted(specs):
        arr = features[name]
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if arr.ndim != 1:
            raise invalid(
                f"{where}: feature {name!r} has shape {list(arr.shape)}; expected [batch] "
                f"(one value per example)"
            )
        if rows is None:
            rows, first = len(arr), name
        elif len(arr) != rows:
            raise invalid(
                f"{where}: feature {name!r} has {len(arr)} values but {first!r} has {rows}; "
                f"every feature needs one value per example"
            )
        out[name] = coerce(name, arr, specs[name], where, strings_checked)
    if not rows:
        raise invalid(f"{where}: the request has no examples (0 rows); expected at least 1")
    if rows > limits.max_request_rows:
        raise invalid(
            f"{where}: {rows} examples in one request; the server accepts at most "
            f"{limits.max_request_rows}"
        )
    return out, rows


def deadline_from(time_remaining: float | None) -> float | None:
    """A gRPC context's remaining time -> an absolute ``time.monotonic()`` deadline."""
    if time_remaining is None:
        return None
    return time.monotonic() + time_remaining


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded before inference")


async def _run_signature(
    mv: ModelVersion, features: dict[str, np.ndarray], signature: str
) -> dict[str, np.ndarray]:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, mv.run, mv.next_instance(), features, signature)


async def predict(
    repo: ModelRepository,
    name: str,
    version: int | None,
    features: Mapping[str, np.ndarray],
    *,
    signature: str = "",
    deadline: float | None = None,
    limits: Limits | None = None,
    strings_checked: bool = False,
) -> tuple[ModelVersion, dict[str, np.ndarray]]:
    """Scores one request: ``{feature: [rows]}`` -> ``{output: [rows, ...]}``.

    ``serving_default`` requests go through the dynamic batcher; other signatures run alone.
    """
    limits = limits or Limits()
    mv = repo.get(name, version)
    signature = signature or SERVING_SIGNATURE
    where = f"model {name!r} version {mv.version}"
    if signature != SERVING_SIGNATURE:
        if signature not in mv.signature_inputs:
            raise ModelNotFound(
                f"{where} has no signature {signature!r}; it has {mv.signature_names}"
            )
        specs = mv.signature_inputs[signature]
        checked, _ = _check_shapes_free(features, specs, where, limits)
        _check_deadline(deadline)
        return mv, await mv.call(lambda: _run_signature(mv, checked, signature))
    checked, rows = check_features(features, mv.inputs, where, limits, strings_checked)
    _check_deadline(deadline)
    batcher = mv.batcher
    if batcher is None:
        raise ServingError(grpc.StatusCode.UNAVAILABLE, f"{where} is not started")
    return mv, await mv.call(lambda: batcher.submit(checked, rows, deadline))


def _check_shapes_free(
    features: Mapping[str, np.ndarray],
    specs: Mapping[str, InputSpec],
    where: str,
    limits: Limits,
) -> tuple[dict[str, np.ndarray], int]:
    """Like ``check_features`` for signatures whose inputs differ in length (``rank_request``):

    inputs with static shape ``[1]`` take exactly one value; the others ``[n]`` values, the
    same ``n >= 1`` for all of them.
    """
    _check_names(specs, features, where)
    once = {n for n, s in specs.items() if s.shape == (1,)}
    per_row = {n: features[n] for n in specs if n not in once}
    single = {n: features[n] for n in once}
    for n, a in single.items():
        if a.size != 1:
            raise invalid(
                f"{where}: feature {n!r} takes exactly one value (a user or context feature); "
                f"got shape {list(a.shape)}"
            )
    out1, _ = (
        check_features(
            {n: a.reshape(1) for n, a in single.items()},
            {n: specs[n] for n in once},
            where,
            limits,
        )
        if single
        else ({}, 1)
    )
    out2, rows = (
        check_features(per_row, {n: specs[n] for n in per_row}, where, limits)
        if per_row
        else ({}, 1)
    )
    return {**out1, **out2}, rows


@dataclasses.dataclass
class RankResult:
    version: int
    scores: np.ndarray  # [k] float32
    indices: np.ndarray  # [k] int32, candidate indices


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first (ties: lower index first); k=0: all in order."""
    if k <= 0:
        return np.arange(len(scores), dtype=np.int32)
    order = np.argsort(-scores, kind="stable")
    return order[:k].astype(np.int32)


async def rank(
    repo: ModelRepository,
    name: str,
    version: int | None,
    user: Mapping[str, np.ndarray],
    candidates: Mapping[str, np.ndarray],
    *,
    k: int = 0,
    output: str = "",
    deadline: float | None = None,
    limits: Limits | None = None,
    strings_checked: bool = False,
) -> RankResult:
    """Scores N candidates for one user: user features ``[1]`` each, candidate features ``[N]``.

    With a ``rank_request`` signature the model takes them as they are; otherwise the user
    features are tiled to ``[N]`` and the request joins the dynamic batcher through
    ``serving_default``.
    """
    limits = limits or Limits()
    mv = repo.get(name, version)
    where = f"model {name!r} version {mv.version}"
    if k < 0:
        raise invalid(f"{where}: top_k must be >= 0, got {k}")
    both = sorted(set(user) & set(candidates))
    if both:
        raise invalid(f"{where}: feature(s) {both} given both as user and candidate features")
    for n, a in user.items():
        if a.size != 1:
            raise invalid(
                f"{where}: user feature {n!r} has {a.size} values; a user feature takes exactly one"
            )
    if not candidates:
        raise invalid(f"{where}: no candidate features; expected [N] values per candidate feature")
    lengths = {n: len(a) for n, a in candidates.items()}
    n_cand = max(lengths.values())
    if n_cand == 0:
        raise invalid(f"{where}: empty candidate list; expected at least one candidate")
    out_name = output or "score"
    if mv.rank_inputs is not None:
        features = {**{n: a.reshape(1) for n, a in user.items()}, **candidates}
        _, outputs = await predict(
            repo,
            name,
            mv.version,
            features,
            signature=RANK_SIGNATURE,
            deadline=deadline,
            limits=limits,
        )
    else:
        bad = {n: v for n, v in lengths.items() if v != n_cand}
        if bad:
            raise invalid(
                f"{where}: candidate features differ in length: {lengths}; each needs one value "
                f"per candidate"
            )
        tiled = {n: np.repeat(a.reshape(1), n_cand) for n, a in user.items()}
        _, outputs = await predict(
            repo,
            name,
            mv.version,
            {**tiled, **candidates},
            deadline=deadline,
            limits=limits,
            strings_checked=strings_checked,
        )
    if out_name not in outputs:
        raise invalid(f"{where}: no output {out_name!r}; outputs: {sorted(outputs)}")
    scores = np.asarray(outputs[out_name], dtype=np.float32).reshape(-1)
    if len(scores) != n_cand:
        raise ServingError(
            grpc.StatusCode.INTERNAL,
            f"{where}: output {out_name!r} has {len(scores)} values for {n_cand} candidates",
        )
    idx = top_k(scores, k)
    return RankResult(mv.version, scores[idx], idx)
