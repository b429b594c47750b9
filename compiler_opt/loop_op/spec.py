"""The spec of a loop op: one elementwise group as an SSA program over ``[rows, width]``."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from compiler_opt.xy_op import OPS

INPUT_KINDS = ("full", "row", "scalar")


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """One elementwise group as an SSA program over ``[rows, width]`` tensors.

    ``inputs``: the kind of each input (``INPUT_KINDS``); ``body``: ``(op, operands)`` per
    value, an operand ``k < len(inputs)`` being input ``k`` and ``k >= len(inputs)`` the body
    value ``k - len(inputs)``; ``outputs``: the body values the op returns, in order.
    """

    width: int
    inputs: tuple[str, ...]
    body: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[int, ...]
    dims: tuple[int, ...] | None = None  # the outputs' static dims after the rows (None: the
    # first ``full`` input's shape)
    matmul: tuple[int, int, bool] | None = None  # (slot, k, bias): input ``slot`` computed in
    # the op as ``A W (+ b)`` (``attach_matmuls``): the op reads ``A`` [rows, k] there and
    # ``W`` [k, width] (and ``b`` [width]) after the other inputs

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if self.dims is not None and int(np.prod(self.dims, dtype=np.int64)) != self.width:
            raise ValueError(f"dims {self.dims} must hold width={self.width} elements")
        bad = [k for k in self.inputs if k not in INPUT_KINDS]
        if bad or "full" not in self.inputs:
            raise ValueError(
                f"inputs must be kinds from {INPUT_KINDS} with at least one 'full', got "
                f"{self.inputs}"
            )
        for i, (op, operands) in enumerate(self.body):
            if op not in OPS:
                raise ValueError(f"body value {i}: op {op!r} is not one of {sorted(OPS)}")
            if len(operands) != OPS[op][0]:
                raise ValueError(f"body value {i}: {op} takes {OPS[op][0]} operands")
            if any(not 0 <= k < len(self.inputs) + i for k in operands):
                raise ValueError(f"body value {i}: operands {operands} out of range")
        if not self.outputs or any(not 0 <= o < len(self.body) for o in self.outputs):
            raise ValueError(f"outputs {self.outputs} must name body values")
        if self.matmul is not None:
            slot, k, _ = self.matmul
            if not (0 <= slot < len(self.inputs) and self.inputs[slot] == "full" and k >= 1):
                raise ValueError(f"matmul {self.matmul}: needs a 'full' input slot and k >= 1")
            if self.dims is None or len(self.dims) > 1:
                raise ValueError(f"matmul {self.matmul}: needs [rows, width] or [rows] outputs")

    @property
    def num_inputs(self) -> int:
        """Tensors the op takes: one per input, and ``W`` (and ``b``) of a matmul."""
        extra = 0 if self.matmul is None else 1 + int(self.matmul[2])
        return len(self.inputs) + extra

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        if self.matmul is None:  # specs without one keep their names
            del d["matmul"]
        return json.dumps(d, sort_keys=True)

    @property
    def op_name(self) -> str:
        h = hashlib.sha256(self.to_json().encode()).hexdigest()[:12]
        return "StitchrecLoop" + "".join(chr(ord("a") + int(c, 16)) for c in h).capitalize()
