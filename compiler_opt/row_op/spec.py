"""The spec of a row program: a group's values over one example, with their row shapes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence

from compiler_opt.xy_op import OPS

#: reduction -> (initial accumulator, C++ update of ``acc`` with ``x``)
REDUCTIONS: dict[str, tuple[str, str]] = {
    "Sum": ("0.0f", "acc += x"),
    "Mean": ("0.0f", "acc += x"),
    "Max": ("-INFINITY", "acc = acc > x ? acc : x"),
    "Min": ("INFINITY", "acc = acc < x ? acc : x"),
    "Prod": ("1.0f", "acc *= x"),
}
VIEWS = frozenset({"Reshape", "ExpandDims", "Squeeze", "Identity"})
#: per-row floats of all the values of one program (its locals: 64 KB)
MAX_ROW_FLOATS = 16384


def size(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """NumPy's broadcast of two static shapes, or None when they do not broadcast."""
    out = []
    for x, y in zip(
        [1] * (len(b) - len(a)) + list(a), [1] * (len(a) - len(b)) + list(b), strict=True
    ):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class RowValue:
    """One value of a row program: ``op`` of ``operands`` (input ``k`` or body value
    ``k - len(inputs)``), its row ``shape``; ``axes`` of a reduction (row axes) or softmax."""

    op: str
    operands: tuple[int, ...]
    shape: tuple[int, ...]
    axes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """A group as a program over one example's values (see the module doc): ``inputs`` are
    ``(batched, row shape)``, ``outputs`` body values, each ``[rows, *shape]``."""

    inputs: tuple[tuple[bool, tuple[int, ...]], ...]
    body: tuple[RowValue, ...]
    outputs: tuple[int, ...]

    def __post_init__(self) -> None:
        if not any(b for b, _ in self.inputs):
            raise ValueError("a row program needs a batched input")
        shapes = [s for _, s in self.inputs]
        for i, v in enumerate(self.body):
            if any(not 0 <= k < len(shapes) for k in v.operands):
                raise ValueError(f"body value {i}: operands {v.operands} out of range")
            ins = [shapes[k] for k in v.operands]
            want = _value_shape(v, ins)
            if want != v.shape:
                raise ValueError(f"body value {i} ({v.op}): shape {v.shape}, expected {want}")
            shapes.append(v.shape)
        if not self.outputs or any(not 0 <= o < len(self.body) for o in self.outputs):
            raise ValueError(f"outputs {self.outputs} must name body values")
        total = sum(size(v.shape) for v in self.body)
        if total > MAX_ROW_FLOATS:
            raise ValueError(f"{total} floats per row, more than MAX_ROW_FLOATS={MAX_ROW_FLOATS}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @property
    def op_name(self) -> str:
        h = hashlib.sha256(self.to_json().encode()).hexdigest()[:12]
        return "StitchrecRow" + "".join(chr(ord("a") + int(c, 16)) for c in h).capitalize()

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)


def _value_shape(v: RowValue, ins: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The row shape ``v`` must have, from its operands' shapes (None: not computable)."""
    if v.op in OPS:
        if len(ins) != OPS[v.op][0]:
            return None
        out: tuple[int, ...] | None = tuple(ins[0])
        for s in ins[1:]:
            out = broadcast(out, s) if out is not None else None
        return out
    if len(ins) != 1:
        return None
    (x,) = ins
    if v.op == "Softmax":
        return tuple(x) if x else None
    if v.op in REDUCTIONS:
        if not v.axes or any(not 0 <= a < len(x) for a in v.axes):
            return None
        kept = tuple(1 if a in v.axes else d for a, d in enumerate(x))
        dropped = tuple(d for a, d in enumerate(x) if a not in v.axes)
        return v.shape if v.shape in (kept, dropped) else None
    if v.op in VIEWS:
        return v.shape if size(v.shape) == size(x) else None
    return None
