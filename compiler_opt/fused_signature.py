"""A SavedModel's serving signature, fused and bucketed: what the gRPC server runs when an
export asks for fusion.

`stitchrec export --fuse` writes ``assets.extra/fusion.json`` (a ``FusionSpec``) beside the
SavedModel. A server that loads the version and finds the spec builds a ``FusedSignature`` per
model instance, on that instance's device:

1. the serving signature is frozen, read into the IR and planned with the cost coefficients
   calibrated on the serving machine's device (``cost.load_or_calibrate``): the plan is made
   where it runs, not where the model was exported;
2. with ``realization = "xla_clusters"`` every planned group becomes one XLA cluster
   (``realize.xla_clusters``); with ``"generated"`` every planned elementwise ``loop`` group
   that ``compiler_opt.loop_op`` can express becomes one generated C++ op and the rest stays
   TensorFlow ops (``realize.generated_loops``): shape-generic, so batches run unpadded and
   nothing compiles per shape; on a GPU the generated ops run their CUDA form
   (their CUDA form), and where it cannot be built (no nvcc) ``"generated"`` falls back to
   ``"xla_clusters"`` (``describe()`` says which ran);
3. with XLA clusters, every batch is padded to the next size of the spec's ladder
   (``buckets.Bucketed``), so at most ``len(ladder)`` shapes ever reach the clusters, and
   ``warmup`` compiles them all before the version turns ready: no request pays a compilation.

The export itself stays an ordinary SavedModel (TensorFlow drops ``_XlaCompile`` tags from a
traced function, so a tagged graph cannot be saved as one); a server without fusion, or
TF Serving, serves it unfused.

Shapes: every input ``[n]`` (or ``[n, ...]``), every output ``[n, ...]``; ``n`` any batch size
(batches larger than the top bucket run in chunks of it).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

import compiler_opt.realize as realize
from compiler_opt.buckets import Bucketed, count_compilations, powers_of_two, validate_ladder
from compiler_opt.cost import Coefficients
from compiler_opt.toolchain import cuda_enabled

FUSION_FILE = "fusion.json"
ASSETS_EXTRA = "assets.extra"
REALIZATIONS = ("xla_clusters", "generated")
_PROFILER_LOCK = threading.Lock()


class FusionSpecError(ValueError):
    """A ``fusion.json`` that cannot be used; names the file, the key and what was expected."""


@dataclasses.dataclass(frozen=True)
class FusionSpec:
    """What an export asks of the server.

    realization: how planned groups run (``xla_clusters``: one XLA cluster per group;
      ``generated``: elementwise loop groups as generated C++ ops, the rest TensorFlow ops,
      unpadded).
    ladder: batch-size buckets (strictly increasing); every batch is padded to the next one.
    plan_batch: the batch size the cost model plans at.
    signature: the signature that is fused (the others run unfused).
    loop_matmuls: with ``generated``, also realize the plan with each loop op taking the
      matmul that feeds it (``loop_op.groups.attach_matmuls``: fewer ops, Eigen's GEMM) and keep
      it if the warm-up times it faster. Off by default: slower than the runtime's matmuls on
      the CPUs measured, and its GEMM ops take ~15 s each to compile on first load.
    """

    realization: str = "xla_clusters"
    ladder: tuple[int, ...] = powers_of_two(8, 512)
    plan_batch: int = 256
    signature: str = "serving_default"
    loop_matmuls: bool = False

    def __post_init__(self) -> None:
        if self.realization not in REALIZATIONS:
            raise FusionSpecError(
                f"fusion: realization={self.realization!r}: expected one of {list(REALIZATIONS)}"
            )
        try:
            ladder = validate_ladder(tuple(self.ladder))
        except (TypeError, ValueError) as e:
            raise FusionSpecError(f"fusion: {e}") from None
        object.__setattr__(self, "ladder", ladder)
        pb = self.plan_batch
        if isinstance(pb, bool) or not isinstance(pb, int) or pb < 1:
            raise FusionSpecError(f"fusion: plan_batch={pb!r}: expected an int >= 1")
        if not isinstance(self.loop_matmuls, bool):
            raise FusionSpecError(
                f"fusion: loop_matmuls={self.loop_matmuls!r}: expected true or false"
            )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ladder": list(self.ladder)}


def write_spec(saved_model: str | Path, spec: FusionSpec) -> Path:
    """Writes ``<saved_model>/assets.extra/fusion.json``; returns its path."""
    path = Path(saved_model) / ASSETS_EXTRA / FUSION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_dict(), indent=1) + "\n")
    return path


def read_spec(saved_model: str | Path) -> FusionSpec | None:
    """The export's ``FusionSpec``, or None when it has no ``fusion.json``.

    Raises:
      FusionSpecError: the file is not JSON, not an object, has unknown keys or bad values.
    """
    path = Path(saved_model) / ASSETS_EXTRA / FUSION_FILE
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise FusionSpecError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise FusionSpecError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    known = {f.name for f in dataclasses.fields(FusionSpec)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise FusionSpecError(f"{path}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    try:
        return FusionSpec(**{k: tuple(v) if k == "ladder" else v for k, v in raw.items()})
    except FusionSpecError as e:
        raise FusionSpecError(f"{path}: {e}") from None
    except TypeError as e:
        raise FusionSpecError(f"{path}: {e}") from None


class FusedSignature:
    """``features -> outputs`` (dicts of arrays) through the planned XLA clusters, bucketed.

    Args:
      signature_fn: a SavedModel signature (keyword inputs, a dict of outputs). The loaded
        SavedModel must stay alive as long as this object: its tables and variables are
        referenced, not owned.
      spec: the export's ``FusionSpec``.
      coefficients: cost coefficients of the device it runs on.
    """

    def __init__(self, signature_fn: Any, spec: FusionSpec, coefficients: Coefficients):
        kwargs = signature_fn.structured_input_signature[1]
        if signature_fn.structured_input_signature[0] or not kwargs:
            raise ValueError("fusion: the signature must take its inputs as named tensors")
        # A signature's flat inputs are its keyword arguments in sorted order.
        self.input_names = sorted(kwargs)
        self.spec = spec
        self.realization = spec.realization
        on_gpu = coefficients.device.startswith("gpu")
        if self.realization == "generated" and on_gpu and not cuda_enabled():
            self.realization = "xla_clusters"  # the generated ops get no GPU kernel here
        # candidate realizations, chosen between by timing them in ``warmup``
        self._candidates: dict[str, realize.Realized] = {}
        tabulation = None
        if self.realization == "generated":
            # frozen and its masks tabulated once, for every candidate
            frozen, tabulation = realize.tabulated(realize.freeze(signature_fn))
            options = {"frozen": frozen, "tabulate_masks": False}

            def candidate(**plan_options: Any) -> realize.Realized:
                return realize.generated_loops(
                    signature_fn, coefficients, spec.plan_batch, **options, **plan_options
                )

            first = candidate(matmuls=False)
            self._candidates["epilogues_to_matmul"] = first
            if first.plan.epilogues:  # the other guess: the runtime does not fold them
                self._candidates["epilogues_generated"] = candidate(epilogues=False, matmuls=False)
            if first.rows:  # a row program is not faster than TensorFlow's ops everywhere
                # (bench/compiler/rows: a softmax over 39 columns is not, on this CPU)
                self._candidates["no_row_programs"] = candidate(matmuls=False, rows=False)
            if spec.loop_matmuls and not on_gpu:  # fewer ops, but Eigen's GEMM against the
                # runtime's (oneDNN); a loop op with its matmul has no CUDA form
                inside = candidate()
                if inside.matmuls:
                    self._candidates["matmuls_inside"] = inside
            realized = first
        else:
            realized = realize.xla_clusters(signature_fn, coefficients, spec.plan_batch)
        self.choice = next(iter(self._candidates), "")
        self.timings_ms: dict[str, float] = {}
        outputs = signature_fn.structured_outputs
        if not isinstance(outputs, Mapping):
            raise ValueError("fusion: the signature must return a dict of tensors")
        self._outputs = outputs
        self.clusters = realized.clusters
        self.loops = realized.loops
        self.rows = realized.rows
        self.tabulation = tabulation
        self.matmuls = realized.matmuls
        self.plan = realized.plan
        self._fused = realized.fused
        # shape-generic when nothing is left to XLA: no padding, nothing to compile
        self.bucketed = Bucketed(realized.fused, spec.ladder) if self.clusters else None
        self.compilations_at_load: int | None = None

    def __call__(self, features: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        missing = [n for n in self.input_names if n not in features]
        if missing:
            raise ValueError(f"fusion: missing input(s) {missing}; expected {self.input_names}")
        args = [features[n] for n in self.input_names]
        flat = self.bucketed(*args) if self.bucketed is not None else self._fused(*args)
        return dict(tf.nest.pack_sequence_as(self._outputs, list(flat)))

    def warmup(self, features: Mapping[str, np.ndarray], calls: int = 3) -> int | None:
        """Runs every bucket ``calls`` times on rows of ``features`` (repeated) so that every
        cluster is compiled for every bucket; returns the XLA compilations that took (None
        when another profiler session of the process was running: then they are not
        counted, and the warm-up runs all the same)."""
        args = [tf.constant(features[n]) for n in self.input_names]
        if self.bucketed is None:  # generated ops only: shape-generic, nothing compiles
            if len(self._candidates) > 1:
                self._choose(features)
            for _ in range(calls):
                self._fused(*args)
            self.compilations_at_load = 0
            return 0
        # One profiler session per process: warm-ups of several instances take turns.
        with _PROFILER_LOCK:
            try:
                with count_compilations() as counter:
                    self.bucketed.warmup(args, calls=calls)
            except tf.errors.AlreadyExistsError:
                self.bucketed.warmup(args, calls=calls)
                self.compilations_at_load = None
                return None
        self.compilations_at_load = counter.count
        return counter.count

    def _choose(self, features: Mapping[str, np.ndarray], rounds: int = 3, calls: int = 3) -> None:
        """Times every candidate on ``features`` tiled to ``plan_batch`` rows (interleaved
        rounds, the median) and keeps the fastest: whether the runtime folds a matmul's
        ``BiasAdd`` and activation into it depends on the graph and the device (a frozen
        graph on oneDNN runs the ``Relu`` apart), so it is measured, not assumed."""
        pb = self.spec.plan_batch
        args = [
            tf.constant(np.resize(features[n], (pb, *np.shape(features[n])[1:])))
            for n in self.input_names
        ]
        times: dict[str, list[float]] = {name: [] for name in self._candidates}
        for r in self._candidates.values():
            r.fused(*args)  # first calls: allocations, oneDNN primitives
        for _ in range(rounds):
            for name, r in self._candidates.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    out = r.fused(*args)
                out[0].numpy()
                times[name].append((time.perf_counter() - t0) / calls)
        self.timings_ms = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
        self.choice = min(self.timings_ms, key=self.timings_ms.get)
        chosen = self._candidates[self.choice]
        self._fused, self.loops, self.plan = chosen.fused, chosen.loops, chosen.plan
        self.rows = chosen.rows
        self.matmuls = chosen.matmuls

    def describe(self) -> dict[str, Any]:
        return {
            "realization": self.realization,
            "choice": self.choice,
            "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
            "clusters": self.clusters,
            "generated_loops": self.loops,
            "row_programs": self.rows,
            "tabulated_masks": len(self.tabulation.tables) if self.tabulation else 0,
            "matmuls_in_loop_ops": self.matmuls,
            "ladder": list(self.spec.ladder),
            "plan_batch": self.spec.plan_batch,
            "compilations_at_load": self.compilations_at_load,
        }
