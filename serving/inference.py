"""What every service shares: feature validation, the batched predict call and ranking.

Requests arrive in three wire formats (RankingService, TF Serving, KServe v2); each servicer turns
its tensors into ``{name: numpy array}`` and calls ``run`` or ``rank`` here, so every
protocol gets the same checks and the same errors:

- missing, extra or mistyped features, wrong shapes, NaN/Inf, empty or too-large batches, user
  features that would take too much memory once repeated over the candidates:
  INVALID_ARGUMENT, naming the feature, what was found and what the model expects;
- unknown model or version: NOT_FOUND, naming what is served;
- a full batch queue: RESOURCE_EXHAUSTED; a deadline that passed in the queue: DEADLINE_EXCEEDED.

A request is served in three steps so that the costly one can run off the event loop:
``resolve`` (the model version and signature: NOT_FOUND before anything is decoded), the
decoding and checks (``check_features``, ``prepare_rank``: plain functions a servicer runs on a
worker thread), and ``run`` (the dynamic batcher, or the signature alone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
import numpy as np

from serving import tracing
from serving.batching import BatcherClosed, DeadlineExceeded, QueueFull
from serving.calls import CallObservers, ScoredCall, current_call
from serving.config import Limits
from serving.model_version import (
    RANK_SIGNATURE,
    SERVING_SIGNATURE,
    InputSpec,
    ModelNotFound,
    ModelVersion,
)
from serving.repository import ModelRepository


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


def name_list(names: Any, most: int = 10) -> str:
    """``names`` sorted, at most ``most`` of them shown (messages echo client input)."""
    names = sorted(names)
    shown = [n if len(n) <= 64 else n[:64] + "..." for n in names[:most]]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{shown}{more}"


def check_names(specs: Mapping[str, Any], features: Any, where: str) -> None:
    """INVALID_ARGUMENT naming the missing and the unknown features, if any (``features``: the
    request's input names, checked before any value is decoded)."""
    missing = set(specs) - set(features)
    extra = set(features) - set(specs)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing feature(s) {name_list(missing)}")
        if extra:
            parts.append(f"unknown feature(s) {name_list(extra)}")
        raise invalid(f"{where}: {'; '.join(parts)}; the model expects {name_list(specs, 50)}")


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
    check_names(specs, features, where)
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


T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]


async def inline(fn: Callable[[], T]) -> T:
    """The default ``offload``: runs ``fn`` on the calling thread."""
    return fn()


@dataclasses.dataclass(frozen=True)
class Target:
    """A request's model version and signature, with the inputs the signature takes."""

    mv: ModelVersion
    signature: str
    specs: Mapping[str, InputSpec]
    where: str


def resolve(repo: ModelRepository, name: str, version: int | None, signature: str = "") -> Target:
    """The live version and signature a request names (NOT_FOUND when there is none)."""
    return target_of(repo.get(name, version), signature)


def target_of(mv: ModelVersion, signature: str = "") -> Target:
    """The ``Target`` of signature ``signature`` (default ``serving_default``) of ``mv``."""
    signature = signature or SERVING_SIGNATURE
    where = f"model {mv.name!r} version {mv.version}"
    if signature == SERVING_SIGNATURE:
        return Target(mv, signature, mv.inputs, where)
    if signature not in mv.signature_inputs:
        raise ModelNotFound(
            f"{where} has no signature {name_list([signature])}; it has {mv.signature_names}"
        )
    return Target(mv, signature, mv.signature_inputs[signature], where)


def check_inputs(
    target: Target,
    features: Mapping[str, np.ndarray],
    limits: Limits,
    strings_checked: bool = False,
) -> tuple[dict[str, np.ndarray], int]:
    """``check_features`` for the target's signature (``serving_default``: every input
    ``[rows]``; other signatures: inputs of static shape ``[1]`` take one value)."""
    if target.signature == SERVING_SIGNATURE:
        return check_features(features, target.specs, target.where, limits, strings_checked)
    return _check_shapes_free(features, target.specs, target.where, limits)


async def run(
    target: Target,
    prepare: Callable[[], tuple[dict[str, np.ndarray], int]],
    deadline: float | None,
    offload: Offload = inline,
    observers: CallObservers | None = None,
) -> dict[str, np.ndarray]:
    """Scores a request: ``prepare`` (run by ``offload``) decodes and checks its inputs, then
    ``serving_default`` goes through the dynamic batcher and other signatures run alone on a
    worker thread. ``observers`` are then told of the scored call (``serving.calls``). With
    tracing on, the call span gets the ``decode`` span and the call's model, version and rows
    (``serving.tracing``).

    The version counts the request as in flight from the start, so a hot swap that retires the
    version while the inputs are decoded waits for it instead of closing its batcher.
    """
    mv = target.mv
    inputs: list[dict[str, np.ndarray]] = []

    async def go() -> dict[str, np.ndarray]:
        checked, rows = await offload(prepare)
        inputs.append(checked)
        tracing.decoded(mv.name, mv.version, target.signature, rows)
        _check_deadline(deadline)
        if target.signature != SERVING_SIGNATURE:
            loop = asyncio.get_running_loop()
            instance = mv.next_instance()
            with tracing.span("inference", rows=rows):
                return await loop.run_in_executor(None, mv.run, instance, checked, target.signature)
        batcher = mv.batcher
        if batcher is None:
            raise ServingError(grpc.StatusCode.UNAVAILABLE, f"{target.where} is not started")
        return await batcher.submit(checked, rows, deadline)

    outputs = await mv.call(go)
    if observers:
        observers.notify(scored_call(target, inputs[0], outputs))
    return outputs


def scored_call(
    target: Target,
    features: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    shadow: bool = False,
) -> ScoredCall:
    """The ``ScoredCall`` of the current call (``serving.calls.current_call``) on ``target``."""
    info = current_call()
    return ScoredCall(
        request_id=info.request_id if info else "",
        timestamp=info.started if info else time.time(),
        protocol=info.protocol if info else "",
        model=target.mv.name,
        version=target.mv.version,
        signature=target.signature,
        arm=info.arm if info else "",
        shadow=shadow,
        features=features,
        outputs=outputs,
    )


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
    check_names(specs, features, where)
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
    #: a multi-task model's ``score_<task>`` outputs at ``indices``, by task name
    tasks: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


TASK_SCORE_PREFIX = "score_"


def task_scores(
    outputs: Mapping[str, np.ndarray], indices: np.ndarray, n_cand: int, where: str
) -> dict[str, np.ndarray]:
    """``{task: [k] float32}``: each ``score_<task>`` output ``[N]`` at ``indices``."""
    tasks = {}
    for key, value in outputs.items():
        if not key.startswith(TASK_SCORE_PREFIX):
            continue
        values = np.asarray(value, dtype=np.float32).reshape(-1)
        if len(values) != n_cand:
            raise ServingError(
                grpc.StatusCode.INTERNAL,
                f"{where}: output {key!r} has {len(values)} values for {n_cand} candidates",
            )
        tasks[key[len(TASK_SCORE_PREFIX) :]] = values[indices]
    return tasks


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first (ties: lower index first); k=0: all in order."""
    if k <= 0:
        return np.arange(len(scores), dtype=np.int32)
    order = np.argsort(-scores, kind="stable")
    return order[:k].astype(np.int32)


def prepare_rank(
    target: Target,
    user: Mapping[str, np.ndarray],
    candidates: Mapping[str, np.ndarray],
    limits: Limits,
    strings_checked: bool = False,
) -> tuple[dict[str, np.ndarray], int, int]:
    """A rank request's inputs for ``target``: ``(checked inputs, rows, candidates)``.

    With a ``rank_request`` target the user features stay ``[1]``; with ``serving_default`` they
    are repeated over the candidates, refused (INVALID_ARGUMENT) when the copies would take more
    than ``limits.max_broadcast_bytes``.
    """
    where = target.where
    both = sorted(set(user) & set(candidates))
    if both:
        raise invalid(
            f"{where}: feature(s) {name_list(both)} given both as user and candidate features"
        )
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
    if n_cand > limits.max_request_rows:
        raise invalid(
            f"{where}: {n_cand} candidates in one request; the server accepts at most "
            f"{limits.max_request_rows}"
        )
    if target.signature == RANK_SIGNATURE:
        features = {**{n: a.reshape(1) for n, a in user.items()}, **candidates}
        checked, rows = check_inputs(target, features, limits)
        return checked, rows, n_cand
    bad = {n: v for n, v in lengths.items() if v != n_cand}
    if bad:
        raise invalid(
            f"{where}: candidate features differ in length: "
            f"{name_list(f'{n}: {v}' for n, v in lengths.items())}; each needs "
            f"one value per candidate"
        )
    _check_broadcast(user, n_cand, where, limits)
    tiled = {n: np.repeat(a.reshape(1), n_cand) for n, a in user.items()}
    checked, rows = check_inputs(target, {**tiled, **candidates}, limits, strings_checked)
    return checked, rows, n_cand


def _check_broadcast(
    user: Mapping[str, np.ndarray], n_cand: int, where: str, limits: Limits
) -> None:
    """INVALID_ARGUMENT when the user features repeated over ``n_cand`` candidates would take
    more than ``limits.max_broadcast_bytes`` (strings: their length; numbers: their size)."""
    one = 0
    for a in user.values():
        v = a.reshape(-1)[0]
        one += len(v) if isinstance(v, bytes | str) else a.dtype.itemsize
    if one * n_cand > limits.max_broadcast_bytes:
        raise invalid(
            f"{where}: the user features take {one} bytes; repeated over {n_cand} candidates "
            f"they would take {one * n_cand} bytes; the server accepts at most "
            f"{limits.max_broadcast_bytes} (send fewer candidates or shorter user values)"
        )


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
    offload: Offload = inline,
    observers: CallObservers | None = None,
) -> RankResult:
    """Scores N candidates for one user: user features ``[1]`` each, candidate features ``[N]``.

    With a ``rank_request`` signature the model takes them as they are; otherwise the user
    features are tiled to ``[N]`` and the request joins the dynamic batcher through
    ``serving_default``. ``offload`` runs the tiling and checks (e.g. on a worker thread).
    """
    limits = limits or Limits()
    mv = repo.get(name, version)
    target = target_of(mv, RANK_SIGNATURE if mv.rank_inputs is not None else SERVING_SIGNATURE)
    if k < 0:
        raise invalid(f"{target.where}: top_k must be >= 0, got {k}")
    counts: list[int] = []

    def prepare() -> tuple[dict[str, np.ndarray], int]:
        checked, rows, n_cand = prepare_rank(target, user, candidates, limits, strings_checked)
        counts.append(n_cand)
        return checked, rows

    outputs = await run(target, prepare, deadline, offload, observers)
    n_cand = counts[0]
    out_name = output or "score"
    if out_name not in outputs:
        raise invalid(
            f"{target.where}: no output {name_list([out_name])}; outputs: {sorted(outputs)}"
        )
    scores = np.asarray(outputs[out_name], dtype=np.float32).reshape(-1)
    if len(scores) != n_cand:
        raise ServingError(
            grpc.StatusCode.INTERNAL,
            f"{target.where}: output {out_name!r} has {len(scores)} values for {n_cand} candidates",
        )
    idx = top_k(scores, k)
    return RankResult(mv.version, scores[idx], idx, task_scores(outputs, idx, n_cand, target.where))
