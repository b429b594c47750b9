"""One served model version: its instances (one per device), signatures, warm-up and batcher.

``ModelVersion(name, version, path, devices)`` records what the version is (state ``START``);
``load()`` reads the SavedModel onto each device (after the generated kernels it uses, and
with its fusion plan when it has one), ``warmup()`` runs it on dummy batches, ``start()``
creates its dynamic batcher, ``call()`` counts a request in flight and ``close()`` waits for
them and stops the batcher. ``serving.repository`` decides which versions exist and swaps them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from compiler_opt.cost import load_or_calibrate
from compiler_opt.embedding_op import assets as emb_assets
from compiler_opt.embedding_op import ops as emb_ops
from compiler_opt.fused_signature import FusedSignature, read_spec
from serving.batching import DynamicBatcher
from serving.config import BatchingConfig, VersionState

log = logging.getLogger("stitchrec.serving.repository")

SERVING_SIGNATURE = "serving_default"
RANK_SIGNATURE = "rank_request"

_NP_DTYPES = {tf.string: np.object_, tf.int64: np.int64, tf.float32: np.float32}


class ModelNotFound(KeyError):
    """Unknown model or version (NOT_FOUND)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One signature input: name, numpy dtype (object for strings) and static shape."""

    name: str
    dtype: np.dtype
    tf_dtype: tf.DType
    shape: tuple[int | None, ...]


@dataclasses.dataclass
class VersionStatus:
    """A version's state and, for a version that failed to load, the error."""

    state: VersionState
    error: str = ""


def available_devices() -> list[str]:
    """One model instance per GPU when GPUs exist, else one on the CPU."""
    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in gpus] if gpus else ["/device:CPU:0"]


def kernel_devices(kernels: list[str], devices: list[str]) -> tuple[list[str], str]:
    """The devices a version with generated ops ``kernels`` (forward op names, loaded) can run
    on, and why when that is fewer than ``devices``: a generated op without a GPU kernel
    (``compiler_opt``'s CUDA forms: no nvcc, or a form it does not cover) would read tables in
    device memory as host memory, so such a version serves on the CPU."""
    gpus = [d for d in devices if "GPU" in d.upper()]
    if not gpus:
        return devices, ""
    reasons = []
    for name in kernels:
        why = emb_ops.gpu_fallback(emb_ops.kernel_named(name), gpus)
        if why:
            reasons.append(why)
    if not reasons:
        return devices, ""
    return ["/device:CPU:0"], "served on the CPU: " + "; ".join(reasons)


def _signature_inputs(fn: Any) -> dict[str, InputSpec]:
    _, kwargs = fn.structured_input_signature
    out = {}
    for name, spec in kwargs.items():
        if spec.dtype not in _NP_DTYPES:
            np_dtype = np.dtype(spec.dtype.as_numpy_dtype)
        else:
            np_dtype = np.dtype(_NP_DTYPES[spec.dtype])
        out[name] = InputSpec(name, np_dtype, spec.dtype, tuple(spec.shape.as_list()))
    return out


def _dummy(spec: InputSpec, rows: int) -> np.ndarray:
    if spec.dtype == np.object_:
        return np.array([b""] * rows, dtype=object)
    return np.zeros(rows, dtype=spec.dtype)


class ModelVersion:
    """One version of a model: an instance per device, its signatures and its batcher.

    Construction only records what the version is (name, number, folder, devices, state
    ``START``); ``load()`` reads the SavedModel onto each device, ``warmup()`` runs it on dummy
    batches, ``start()`` creates its batcher, ``close()`` drains it.
    """

    def __init__(
        self, name: str, version: int, path: Path, devices: list[str], fusion: bool = True
    ):
        self.name = name
        self.version = version
        self.path = Path(path)
        self.devices = list(devices)
        self.fusion = fusion
        self.state = VersionState.START
        self.error = ""
        # filled by load()
        self.kernels: list[str] = []
        self.placement_note = ""
        self.instances: list[Any] = []
        self.signature_names: list[str] = []
        self.inputs: dict[str, InputSpec] = {}
        self.outputs: dict[str, tf.TensorSpec] = {}
        self.rank_inputs: dict[str, InputSpec] | None = None
        self.signature_inputs: dict[str, dict[str, InputSpec]] = {}
        self.groups: dict[str, str] = {}
        self.fused: list[FusedSignature] = []
        # filled by start()
        self.batcher: DynamicBatcher | None = None
        self._round_robin = itertools.cycle([0])
        self.inflight = 0
        self._idle: asyncio.Event | None = None

    @functools.cached_property
    def signature_defs(self) -> dict[str, meta_graph_pb2.SignatureDef]:
        """The SignatureDefs of the version's ``saved_model.pb`` (read on first use)."""
        sm = saved_model_pb2.SavedModel()
        sm.ParseFromString((self.path / "saved_model.pb").read_bytes())
        return dict(sm.meta_graphs[0].signature_def)

    def load(self) -> ModelVersion:
        """Loads the SavedModel once per device (after the generated kernels it uses), reads its
        signatures, feature groups and fusion plan; returns ``self``."""
        self.state = VersionState.LOADING
        # Generated kernels an export uses (compiler_opt.embedding_op) must be loaded first.
        self.kernels = emb_assets.load_for_saved_model(self.path)
        self.devices, self.placement_note = kernel_devices(self.kernels, self.devices)
        if self.placement_note:
            log.warning("%s v%d: %s", self.name, self.version, self.placement_note)
        self.instances = []
        for dev in self.devices:
            with tf.device(dev):
                self.instances.append(tf.saved_model.load(str(self.path)))
        self._read_signatures(self.instances[0].signatures)
        self.groups = self._read_groups()
        self.fused = self._fuse() if self.fusion else []
        self._round_robin = itertools.cycle(range(len(self.instances)))
        return self

    def _read_signatures(self, sigs: Any) -> None:
        if SERVING_SIGNATURE not in sigs:
            raise ValueError(
                f"{self.path}: the SavedModel has no {SERVING_SIGNATURE!r} signature "
                f"(it has {sorted(sigs)})"
            )
        self.signature_names = sorted(sigs)
        self.inputs = _signature_inputs(sigs[SERVING_SIGNATURE])
        self.outputs = dict(sigs[SERVING_SIGNATURE].structured_outputs.items())
        self.rank_inputs = (
            _signature_inputs(sigs[RANK_SIGNATURE]) if RANK_SIGNATURE in sigs else None
        )
        self.signature_inputs = {n: _signature_inputs(sigs[n]) for n in sigs}

    def _fuse(self) -> list[FusedSignature]:
        """One ``FusedSignature`` per instance when the export asks for fusion
        (``assets.extra/fusion.json``, written by ``stitchrec export --fuse``); planned on each
        instance's device with that device's calibrated cost coefficients."""
        spec = read_spec(self.path)
        if spec is None:
            return []
        if spec.signature not in self.signature_names:
            raise ValueError(
                f"{self.path}: fusion.json names signature {spec.signature!r}; the SavedModel "
                f"has {self.signature_names}"
            )
        fused = []
        for dev, model in zip(self.devices, self.instances, strict=True):
            with tf.device(dev):
                coefficients = load_or_calibrate(dev)
                fused.append(FusedSignature(model.signatures[spec.signature], spec, coefficients))
        return fused

    def _read_groups(self) -> dict[str, str]:
        schema = self.path / "assets.extra" / "schema.toml"
        if not schema.exists():
            return {}
        try:
            fields = tomllib.loads(schema.read_text()).get("fields", [])
        except tomllib.TOMLDecodeError as e:
            log.warning("%s: unreadable schema (%s); feature groups unknown", schema, e)
            return {}
        return {f["name"]: f["group"] for f in fields if "name" in f and f.get("group")}

    def next_instance(self) -> int:
        """The instance for a call outside the batcher (round robin)."""
        return next(self._round_robin)

    def run(self, instance: int, features: dict[str, np.ndarray], signature: str = "") -> dict:
        """Runs one signature on one instance: ``{name: [B]}`` -> ``{output: [B, ...]}``."""
        signature = signature or SERVING_SIGNATURE
        with tf.device(self.devices[instance]):
            if self.fused and signature == self.fused[instance].spec.signature:
                out = self.fused[instance](features)
            else:
                fn = self.instances[instance].signatures[signature]
                out = fn(**{k: tf.constant(v) for k, v in features.items()})
        return {k: v.numpy() for k, v in out.items()}

    def warmup(self, sizes: Iterable[int]) -> None:
        """Runs every instance on dummy batches so the first real request pays no tracing."""
        for i in range(len(self.instances)):
            for rows in sizes:
                out = self.run(i, {n: _dummy(s, rows) for n, s in self.inputs.items()})
                for k, v in out.items():
                    if v.shape[:1] != (rows,):
                        raise ValueError(
                            f"{self.path}: output {k!r} has shape {v.shape} for a batch of "
                            f"{rows}; expected [{rows}, ...]"
                        )
            if self.rank_inputs is not None:
                feats = {
                    n: _dummy(s, 1 if s.shape == (1,) else 2) for n, s in self.rank_inputs.items()
                }
                self.run(i, feats, RANK_SIGNATURE)
            if self.fused:
                fused = self.fused[i]
                inputs = self.signature_inputs[fused.spec.signature]
                with tf.device(self.devices[i]):
                    fused.warmup({n: _dummy(s, 8) for n, s in inputs.items()})
                log.info(
                    json.dumps(
                        {
                            "event": "fused",
                            "model": self.name,
                            "version": self.version,
                            "device": self.devices[i],
                            **fused.describe(),
                        }
                    )
                )

    def start(self, config: BatchingConfig, on_batch: Callable | None) -> None:
        """Creates the batcher (on the running event loop)."""
        self.batcher = DynamicBatcher(
            self.run,
            len(self.instances),
            config,
            on_batch=on_batch,
            name=f"{self.name}-v{self.version}",
        )
        self._idle = asyncio.Event()
        self._idle.set()

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` (a coroutine factory) counting it as in flight, for draining."""
        if self._idle is None:
            raise RuntimeError(f"model {self.name!r} version {self.version} is not started")
        self.inflight += 1
        self._idle.clear()
        try:
            return await fn()
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def close(self) -> None:
        """Waits for every in-flight request, then stops the batcher."""
        if self._idle is not None:
            await self._idle.wait()
        if self.batcher is not None:
            await self.batcher.close()
