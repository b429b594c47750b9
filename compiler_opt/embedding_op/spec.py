"""The spec of an embedding op: tables, fields and their row rules, read off a collection."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from embeddings.amtl import AMTLEmbedding, AMTLServingEmbedding
from embeddings.binary_hash import BinaryHashEmbedding
from embeddings.full import FullEmbedding
from embeddings.hashing import HashingEmbedding
from embeddings.qr import QREmbedding

METHODS = ("full", "hashing", "amtl", "qr", "bh", "amtl_serving")
#: methods whose op has no gradient (the layer has nothing to train): serving graphs only
FORWARD_ONLY = ("amtl_serving",)


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """A table read by the op: ``rows x cols`` float32, through its resource handle (no name:
    two blocks of the same shapes share one kernel); ``rank`` 1: a vector of ``rows``
    (``cols`` 1) of ``dtype`` (AMTL's compact values, and its int32 / int64 row offsets)."""

    rows: int
    cols: int
    dtype: str = "float32"
    rank: int = 2


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One field of the fused block.

    ``index`` holds the row rule's constants (per method: ``num_rows``; ``buckets``, ``seed``,
    ``open_vocabulary``; ``collisions``, ``operation``; ``code_bits``, ``block_bits``,
    ``split``, ``fusion``, ``block_sizes``, ``positions``, ``offsets``). ``tables``: indices into
    ``KernelSpec.tables`` (QR: quotient, remainder). ``offset``: first output column.
    """

    name: str
    method: str
    dim: int
    offset: int
    ragged: bool
    combiner: str
    tables: tuple[int, ...]
    index: tuple[tuple[str, Any], ...]
    masked: bool = False

    def param(self, key: str) -> Any:
        return dict(self.index)[key]

    @property
    def rows_per_id(self) -> int:
        """Rows read per id from each of the field's tables (BH: one per block)."""
        return len(self.param("block_sizes")) if self.method == "bh" else 1


#: the values :class:`Schedule` takes (``compiler_opt.tune`` searches over them)
SCHEDULE_SPACE: dict[str, tuple[int, ...]] = {
    "tile": (1, 8, 16, 32, 64, 128, 256, 512, 1024),
    "prefetch": (0, 1, 2, 4, 8, 16),
    "grain": (0, 16, 64, 256, 1024, 4096),
}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the forward op's CPU kernel walks its work (the same result for every schedule).

    ``tile``: examples per tile; inside a tile the fields are written one after the other
    (one table hot in the cache at a time), ``1``: example by example, every field per example.
    ``prefetch``: examples ahead whose table rows are prefetched (0: none). ``grain``: examples
    per task of the thread pool (0: TensorFlow's cost model shards the batch from the op's
    estimated cost per example).
    """

    tile: int = 128
    prefetch: int = 4
    grain: int = 0

    def __post_init__(self) -> None:
        for key, values in SCHEDULE_SPACE.items():
            if getattr(self, key) not in values:
                raise ValueError(
                    f"Schedule: {key} must be one of {list(values)}, got {getattr(self, key)!r}"
                )

    def key(self) -> str:
        """``t128-p4-g0``: a name of the schedule."""
        return f"t{self.tile}-p{self.prefetch}-g{self.grain}"


DEFAULT_SCHEDULE = Schedule()


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """The fused block: tables, fields in output order, dense columns appended at the end.

    ``mask_rows``: AMTL masks come per table row (``[num_rows, dim]``, read at the op's own row
    of each id: the tabulated serving form, ``compiler_opt.tabulate``) instead of per unique id
    with a ``wheres`` index (the training form)."""

    tables: tuple[TableSpec, ...]
    fields: tuple[FieldSpec, ...]
    dense_dim: int = 0
    mask_rows: bool = False
    schedule: Schedule = DEFAULT_SCHEDULE

    def with_schedule(self, schedule: Schedule) -> KernelSpec:
        """The same block under ``schedule`` (another op name unless it is the default)."""
        return dataclasses.replace(self, schedule=schedule)

    @property
    def emb_dim(self) -> int:
        return sum(f.dim for f in self.fields)

    @property
    def out_dim(self) -> int:
        return self.emb_dim + self.dense_dim

    @property
    def masked_fields(self) -> list[FieldSpec]:
        return [f for f in self.fields if f.masked]

    @property
    def num_id_inputs(self) -> int:
        return sum(2 if f.ragged else 1 for f in self.fields)

    @property
    def trainable(self) -> bool:
        """Whether the op has a gradient (no field of a ``FORWARD_ONLY`` method)."""
        return not any(f.method in FORWARD_ONLY for f in self.fields)

    @property
    def op_name(self) -> str:
        """The forward op's name (:func:`op_names`)."""
        return op_names(self)[0]

    @property
    def num_where_inputs(self) -> int:
        return 0 if self.mask_rows else len(self.masked_fields)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        if not self.mask_rows:  # the training form keeps the hash it had before the flag
            del d["mask_rows"]
        if self.schedule == DEFAULT_SCHEDULE:  # so does the default schedule
            del d["schedule"]
        for t in d["tables"]:  # so do float32 matrices (the fields came later)
            if t["dtype"] == "float32" and t["rank"] == 2:
                del t["dtype"], t["rank"]
        return json.dumps(d, sort_keys=True, separators=(",", ":"))


@dataclasses.dataclass
class BlockSpec:
    """:func:`build_spec`'s answer: the spec, the layers and variables behind it, and the fields
    left unfused with the reason (``{field: reason}``)."""

    spec: KernelSpec | None
    variables: list[tf.Variable]
    layers: dict[str, tf.keras.layers.Layer]
    uncovered: dict[str, str]


def _layer_classes() -> dict[str, type]:
    return {
        "full": FullEmbedding,
        "hashing": HashingEmbedding,
        "amtl": AMTLEmbedding,
        "qr": QREmbedding,
        "bh": BinaryHashEmbedding,
        "amtl_serving": AMTLServingEmbedding,
    }


def _plain_variable(v: Any, dtypes: tuple[Any, ...] = (tf.float32,)) -> bool:
    # a distribution strategy's variables (AggregatingVariable, ...) also subclass it: not ours
    distributed = type(v).__module__.startswith("tensorflow.python.distribute")
    return (
        isinstance(v, resource_variable_ops.BaseResourceVariable)
        and not distributed
        and v.dtype in dtypes
    )


def _layer_method(layer: Any) -> tuple[str | None, str]:
    """``(method, "")`` when the layer is covered, else ``(None, reason)``."""
    classes = _layer_classes()
    method = next((m for m, c in classes.items() if type(layer) is c), None)
    if method is None:
        return None, f"layer {type(layer).__name__} has no generated kernel"
    if getattr(layer, "l2", 0.0) > 0:
        return None, f"l2={layer.l2} > 0 (the penalty needs the rows in TensorFlow ops)"
    if method == "amtl" and layer.length_penalty > 0:
        return None, f"AMTL length_penalty={layer.length_penalty} > 0"
    return method, ""


def _index_params(method: str, layer: Any) -> tuple[tuple[str, Any], ...]:
    if method in ("full", "amtl", "amtl_serving"):
        p = {"num_rows": layer.num_rows}
    elif method == "hashing":
        p = {
            "num_rows": layer.num_rows,
            "buckets": layer.buckets,
            "seed": layer.seed,
            "open_vocabulary": layer.open_vocabulary,
        }
    elif method == "qr":
        p = {
            "num_rows": layer.num_rows,
            "collisions": layer.collisions,
            "operation": layer.operation,
        }
    else:  # bh
        p = {
            "num_rows": layer.num_rows,
            "code_bits": layer.code_bits,
            "block_bits": layer.block_bits,
            "split": layer.split,
            "fusion": layer.fusion,
            "block_sizes": tuple(layer.block_sizes),
            "positions": tuple(tuple(int(x) for x in row) for row in layer.positions),
            "offsets": tuple(layer.offsets),
        }
    return tuple(sorted(p.items()))


def _layer_tables(method: str, layer: Any) -> list[tf.Variable]:
    if method == "amtl_serving":
        return [layer.values, layer.row_splits]
    return [layer.quotient, layer.remainder] if method == "qr" else [layer.table]


# plain Python on static shapes, run while a model traces: AutoGraph need not convert it
@tf.autograph.experimental.do_not_convert
def build_spec(
    collection: Any,
    ids: dict[str, Any],
    dense_dim: int = 0,
    fields: Sequence[str] | None = None,
) -> BlockSpec:
    """The fused-kernel spec of ``collection`` (an ``EmbeddingCollection``, built) for ``ids``.

    Args:
      collection: the embedding block; its layers must be built (variables exist).
      ids: ``{field: ids}`` as the collection is called (``[batch]`` tensors or ragged
        ``[batch, None]``); only their structure (ragged or not, rank) is used.
      dense_dim: columns of a dense input appended after the embeddings (0: none).
      fields: the fields the fusion plan puts in the kernel (default: every field); the others
        are reported as uncovered ("not in the planned group").

    Returns:
      A :class:`BlockSpec`; ``spec`` is None when no field is covered. Output columns follow the
      collection's field order over the covered fields.
    """
    wanted = set(collection.field_names if fields is None else fields)
    tables: list[TableSpec] = []
    variables: list[tf.Variable] = []
    out: list[FieldSpec] = []
    layers: dict[str, Any] = {}
    uncovered: dict[str, str] = {}
    offset = 0
    for name, layer in collection.layers_by_field.items():
        if name not in wanted:
            uncovered[name] = "not in the planned concat group"
            continue
        method, reason = _layer_method(layer)
        x = ids.get(name)
        if method is not None:
            if isinstance(x, tf.RaggedTensor):
                if x.ragged_rank != 1 or x.shape.rank != 2:
                    method, reason = None, f"ragged ids of shape {x.shape} (expected [batch, None])"
            elif x is None or x.shape.rank != 1:
                shape = None if x is None else x.shape
                method, reason = None, f"ids of shape {shape} (expected [batch] or ragged)"
        if method is not None:
            tvars = _layer_tables(method, layer)
            ints = (tf.int32, tf.int64) if method == "amtl_serving" else ()
            kinds = [(tf.float32,)] + [(tf.float32, *ints)] * (len(tvars) - 1)
            if not all(_plain_variable(v, k) for v, k in zip(tvars, kinds, strict=True)):
                method, reason = None, "a table is not a plain float32 resource variable"
        if method is None:
            uncovered[name] = reason
            continue
        first = len(tables)
        for v in tvars:
            if v.shape.rank == 1:
                tables.append(TableSpec(int(v.shape[0]), 1, v.dtype.name, 1))
            else:
                rows, cols = (int(d) for d in v.shape)
                tables.append(TableSpec(rows, cols))
            variables.append(v)
        out.append(
            FieldSpec(
                name=name,
                method=method,
                dim=int(layer.dim),
                offset=offset,
                ragged=isinstance(x, tf.RaggedTensor),
                combiner=layer.combiner,
                tables=tuple(range(first, len(tables))),
                index=_index_params(method, layer),
                masked=method == "amtl",
            )
        )
        layers[name] = layer
        offset += int(layer.dim)
    spec = KernelSpec(tuple(tables), tuple(out), dense_dim) if out else None
    return BlockSpec(spec, variables, layers, uncovered)


def op_names(spec: KernelSpec) -> tuple[str, str]:
    """``(forward op, gradient op)`` names: a prefix and the spec's hash (letters only, so that
    TensorFlow's generated Python function names stay simple)."""
    h = hashlib.sha256(spec.to_json().encode()).hexdigest()[:12]
    letters = "".join(chr(ord("a") + int(c, 16)) for c in h)
    return (
        f"StitchrecFusedEmb{letters.capitalize()}",
        f"StitchrecFusedEmbGrad{letters.capitalize()}",
    )


def spec_from_json(text: str) -> KernelSpec:
    raw = json.loads(text)

    def tup(x: Any) -> Any:
        return tuple(tup(v) for v in x) if isinstance(x, list) else x

    tables = tuple(TableSpec(**t) for t in raw["tables"])
    fields = tuple(
        FieldSpec(**{**f, "tables": tuple(f["tables"]), "index": tup(f["index"])})
        for f in raw["fields"]
    )
    schedule = Schedule(**raw["schedule"]) if "schedule" in raw else DEFAULT_SCHEDULE
    return KernelSpec(tables, fields, raw["dense_dim"], raw.get("mask_rows", False), schedule)
