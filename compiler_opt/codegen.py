"""Generated C++ kernels: one TensorFlow op per embedding block, gather + mask + pool + concat.

From an ``EmbeddingCollection`` (embeddings/collection.py) and the structure of its ids,
:func:`build_spec` derives a :class:`KernelSpec`: the tables (one per trainable table
variable), and per field the method, the row-index rule, the pooling, the mask and the output
columns. :func:`generate` turns the spec into the C++ source of one op, specialized to it
(every dimension, offset, hash constant and table shape is a compile-time constant, so the
inner loops over a row unroll and vectorize), :func:`compile_kernel` compiles it with g++
against the TensorFlow wheel and caches the library by content hash, and :func:`load`
registers the op and its gradient in the process.

Forward, for example ``b`` and field ``f`` at columns ``[o_f, o_f + d_f)`` of the output ``y``::

    v_f(i)        = the field's vector of id i, read from its table(s) through the resource
                    handle under the variable's (shared) lock, as ResourceGather does:
                      full      T[oov(i)]                 oov(i) = i if 0 <= i < rows else 0
                      hashing   T[bucket(i)]              (splitmix64, embeddings/hashing.py)
                      amtl      T[oov(i)] * M[w(i)]       M = mask per unique id, w = tf.unique's
                                                          index (the MLP mask stays in TF ops;
                                                          ``mask_rows``: M[oov(i)], tabulated)
                      amtl_serving (compact form: values V, row offsets S; forward only)
                                V[S[r] + j] for j < S[r+1] - S[r], else 0    (r = oov(i))
                      qr        Q[q] * R[r] | Q[q] + R[r] | [Q[q], R[r]]   (q, r = i // m, i % m)
                      bh        sum_j T[row_j(i)] | concat_j T[row_j(i)]   (binary_hash.py)
    y[b, o_f:o_f+d_f] = v_f(ids_f[b])                                     single-valued field
                      = sum_{k in row b} v_f(values_f[k]) / max(len_b, 1)  ragged, mean
                      = sum_{k in row b} v_f(values_f[k])                  ragged, sum
    y[b, D:]          = dense[b]                                           (optional input)

in one pass over the batch (rows split over TensorFlow's CPU thread pool). Backward (a second
generated op): per table the rows read and their gradient rows, returned as one
``tf.IndexedSlices`` per table (sparse updates, as ResourceGather's gradient), with
``g_f(k) = dy[b, o_f:o_f+d_f] / max(len_b, 1)`` (mean), ``dy[b, ...]`` (sum or single-valued):
full / hashing ``g``; amtl ``g * M[w]`` and ``dM[w] += g * T[row]``; qr mult ``g * R[r]`` /
``g * Q[q]``, add ``g`` / ``g``, concat the two halves of ``g``; bh sum ``g`` per block row,
concat block ``j``'s slice of ``g``. The dense input's gradient is ``dy[:, D:]``.

Not covered (left to the layers, reported by :func:`build_spec` in ``KernelSpec.uncovered``):
fields with an L2 penalty (``l2 > 0``, the penalty needs the rows in TF) or AMTL's
``length_penalty``, dense ids of rank > 1,
tables that are not plain resource variables (sharded or distributed).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf

from compiler_opt import cost
from embeddings.collection import EmbeddingCollection

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_U64 = (1 << 64) - 1
METHODS = ("full", "hashing", "amtl", "qr", "bh", "amtl_serving")
#: methods whose op has no gradient (the layer has nothing to train): serving graphs only
FORWARD_ONLY = ("amtl_serving",)
_C_TYPES = {
    "float32": ("float", "DT_FLOAT"),
    "int32": ("int32_t", "DT_INT32"),
    "int64": ("int64_t", "DT_INT64"),
}
ASSETS_DIR = "compiler_opt_kernels"
#: examples ahead whose table rows the forward op prefetches (0: none)
PREFETCH_DISTANCE = int(os.environ.get("STITCHREC_KERNEL_PREFETCH", "4"))
#: examples per tile of the forward op (fields are written one after the other per tile)
TILE = int(os.environ.get("STITCHREC_KERNEL_TILE", "128"))
CXX_ENV = "CXX"


class CompilerUnavailable(RuntimeError):
    """No C++ compiler, or the generated source did not compile."""


# ----------------------------------------------------------------------------------- spec


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
    def num_where_inputs(self) -> int:
        return 0 if self.mask_rows else len(self.masked_fields)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        if not self.mask_rows:  # the training form keeps the hash it had before the flag
            del d["mask_rows"]
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
    from embeddings.amtl import AMTLEmbedding, AMTLServingEmbedding
    from embeddings.binary_hash import BinaryHashEmbedding
    from embeddings.full import FullEmbedding
    from embeddings.hashing import HashingEmbedding
    from embeddings.qr import QREmbedding

    return {
        "full": FullEmbedding,
        "hashing": HashingEmbedding,
        "amtl": AMTLEmbedding,
        "qr": QREmbedding,
        "bh": BinaryHashEmbedding,
        "amtl_serving": AMTLServingEmbedding,
    }


def _plain_variable(v: Any, dtypes: tuple[Any, ...] = (tf.float32,)) -> bool:
    from tensorflow.python.ops import resource_variable_ops

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
            "positions": tuple(tuple(int(x) for x in row) for row in layer._positions),
            "offsets": tuple(layer.offsets),
        }
    return tuple(sorted(p.items()))


def _layer_tables(method: str, layer: Any) -> list[tf.Variable]:
    if method == "amtl_serving":
        return [layer.values, layer.row_splits]
    return [layer.quotient, layer.remainder] if method == "qr" else [layer.table]


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


# ----------------------------------------------------------------------------------- C++

_HEADER = """\
// Generated by stitchrec compiler_opt/codegen.py: do not edit. One op for the embedding block
// below: gather + mask + pool + concat in one pass, tables read under the variables' locks.
// spec: {spec}
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace {{
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::Var;
namespace errors = ::tensorflow::errors;

constexpr int kNumTables = {num_tables};
constexpr int kNumIds = {num_ids};
constexpr int kNumMasks = {num_masks};
constexpr int64_t kEmbDim = {emb_dim};
constexpr int64_t kOutDim = {out_dim};
constexpr int64_t kDenseDim = {dense_dim};
constexpr int64_t kTableRows[kNumTables] = {{{table_rows}}};
constexpr int64_t kTableCols[kNumTables] = {{{table_cols}}};
constexpr int kTableRank[kNumTables] = {{{table_rank}}};
constexpr ::tensorflow::DataType kTableDtype[kNumTables] = {{{table_dtype}}};
constexpr int64_t kRowsPerId[kNumTables] = {{{rows_per_id}}};
constexpr int kFieldOfTable[kNumTables] = {{{field_of_table}}};
// per id input: index of its field, 1 for ragged values, 2 for ragged row splits, 0 dense ids
constexpr int kIdField[kNumIds] = {{{id_field}}};
constexpr int kIdKind[kNumIds] = {{{id_kind}}};
constexpr int kMaskField[kNumMasks + 1] = {{{mask_field}}};

{id_helpers}
// Shared locks on every table variable, taken in address order (as the apply ops do).
class TableLocks {{
 public:
  explicit TableLocks(std::vector<Var*> vars) : vars_(std::move(vars)) {{
    std::sort(vars_.begin(), vars_.end());
    vars_.erase(std::unique(vars_.begin(), vars_.end()), vars_.end());
    for (Var* v : vars_) v->mu()->lock_shared();
  }}
  ~TableLocks() {{
    for (auto it = vars_.rbegin(); it != vars_.rend(); ++it) (*it)->mu()->unlock_shared();
  }}

 private:
  std::vector<Var*> vars_;
}};

// Looks up the table variables; checks dtype and shape against the spec.
bool ReadTables(OpKernelContext* ctx, std::vector<tensorflow::core::RefCountPtr<Var>>* refs) {{
  refs->resize(kNumTables);
  for (int t = 0; t < kNumTables; ++t) {{
    auto s = tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, t), &(*refs)[t]);
    if (!s.ok()) {{
      ctx->CtxFailure(s);
      return false;
    }}
  }}
  return true;
}}

bool CheckTables(OpKernelContext* ctx, const std::vector<tensorflow::core::RefCountPtr<Var>>& refs,
                 const void** tables) {{
  for (int t = 0; t < kNumTables; ++t) {{
    const Tensor* p = refs[t]->tensor();
    const bool shape_ok = kTableRank[t] == 1
        ? (p->dims() == 1 && p->dim_size(0) == kTableRows[t])
        : (p->dims() == 2 && p->dim_size(0) == kTableRows[t] && p->dim_size(1) == kTableCols[t]);
    if (p->dtype() != kTableDtype[t] || !shape_ok) {{
      ctx->CtxFailure(errors::InvalidArgument(
          "table ", t, " must be ", ::tensorflow::DataTypeString(kTableDtype[t]), " [",
          kTableRows[t], kTableRank[t] == 1 ? "" : ", ",
          kTableRank[t] == 1 ? std::string() : std::to_string(kTableCols[t]),
          "] as when the kernel was generated, got ", p->DebugString()));
      return false;
    }}
    tables[t] = p->tensor_data().data();
  }}
  return true;
}}

// Batch size and the id pointers; checks that every field has the same batch.
bool ReadIds(OpKernelContext* ctx, const int64_t** ids, int64_t* id_sizes, int64_t* batch) {{
  *batch = -1;
  for (int i = 0; i < kNumIds; ++i) {{
    const Tensor& x = ctx->input(kNumTables + i);
    if (x.dims() != 1) {{
      ctx->CtxFailure(errors::InvalidArgument("ids input ", i, " (field ", kIdField[i],
                                              ") must be a vector, got ", x.shape().DebugString()));
      return false;
    }}
    ids[i] = x.flat<int64_t>().data();
    id_sizes[i] = x.dim_size(0);
    int64_t b = -1;
    if (kIdKind[i] == 0) b = x.dim_size(0);
    if (kIdKind[i] == 2) {{
      b = x.dim_size(0) - 1;
      const int64_t nnz = id_sizes[i - 1];
      if (b < 0 || ids[i][0] != 0 || ids[i][b] != nnz) {{
        ctx->CtxFailure(errors::InvalidArgument(
            "row splits of field ", kIdField[i], " must start at 0 and end at ", nnz));
        return false;
      }}
    }}
    if (b >= 0) {{
      if (*batch >= 0 && b != *batch) {{
        ctx->CtxFailure(errors::InvalidArgument("field ", kIdField[i], " has batch ", b,
                                                ", an earlier field ", *batch));
        return false;
      }}
      *batch = b;
    }}
  }}
  return true;
}}

int64_t CostPerRow() {{ return {cost_per_row}; }}
"""


# the row rules' helpers, shared with the CUDA form (``qual``: ``__host__ __device__ ``)
_ID_HELPERS = """\
{qual}inline int64_t OovSafe(int64_t id, int64_t rows) {{ return (id >= 0 && id < rows) ? id : 0; }}

{qual}inline int64_t HashBucket(int64_t id, uint64_t seed_add, int64_t buckets, bool oov) {{
  uint64_t z = static_cast<uint64_t>(id) + seed_add;
  z ^= z >> 30;
  z *= 0x{mix1:X}ULL;
  z ^= z >> 27;
  z *= 0x{mix2:X}ULL;
  z ^= z >> 31;
  const int64_t h = static_cast<int64_t>(z >> 1);
  return oov ? 0 : 1 + h % (buckets - 1);
}}
"""


#: C++ of a kernel's Compute: the table variables through their handles, read-locked, their
#: dtypes and shapes checked, their data pointers in ``tables`` (CPU and GPU kernels)
TABLE_READS = (
    "    std::vector<tensorflow::core::RefCountPtr<Var>> refs;",
    "    if (!ReadTables(ctx, &refs)) return;",
    "    std::vector<Var*> raw;",
    "    for (auto& r : refs) raw.push_back(r.get());",
    "    TableLocks locks(raw);",
    "    const void* tables[kNumTables];",
    "    if (!CheckTables(ctx, refs, tables)) return;",
)


def id_helpers(qual: str = "") -> str:
    """C++ of ``OovSafe`` and ``HashBucket`` (splitmix64, as embeddings/hashing.py)."""
    return _ID_HELPERS.format(qual=qual, mix1=_MIX1, mix2=_MIX2)


def _c_list(values: Sequence[Any]) -> str:
    return ", ".join(str(int(v)) for v in values) if values else "0"


def _row_code(f: FieldSpec, var: str) -> list[str]:
    """C++ statements computing the table row(s) of id ``var`` of field ``f``: ``r0``.. (one per
    table or block)."""
    p = dict(f.index)
    n = p["num_rows"]
    if f.method in ("full", "amtl"):
        return [f"const int64_t r0 = OovSafe({var}, {n}LL);"]
    if f.method == "amtl_serving":  # the row's first n0_ entries start at values[s0_]
        s = f"T{f.tables[1]}"
        return [
            f"const int64_t r0 = OovSafe({var}, {n}LL);",
            f"const int64_t s0_ = static_cast<int64_t>({s}[r0]);",
            f"const int64_t n0_ = static_cast<int64_t>({s}[r0 + 1]) - s0_;",
        ]
    if f.method == "hashing":
        buckets = p["buckets"]
        if buckets == 1:
            return ["const int64_t r0 = 0;"]
        seed_add = ((p["seed"] + 1) * _GOLDEN) & _U64
        oov = f"{var} <= 0" + ("" if p["open_vocabulary"] else f" || {var} >= {n}LL")
        return [f"const int64_t r0 = HashBucket({var}, 0x{seed_add:X}ULL, {buckets}LL, {oov});"]
    if f.method == "qr":
        m = p["collisions"]
        return [
            f"const int64_t q_ = OovSafe({var}, {n}LL);",
            f"const int64_t r0 = q_ / {m}LL;",
            f"const int64_t r1 = q_ % {m}LL;",
        ]
    # bh
    bits = p["code_bits"]
    lines = [f"int64_t c_ = {var} < 0 ? 0 : {var};"]
    space = (1 << bits) - n
    if bits < 63 and space > 0:
        lines.append(f"if (c_ >= {n}LL) c_ = {n}LL + (c_ - {n}LL) % {space}LL;")
    lines.append(f"c_ &= {(1 << bits) - 1}LL;")
    for j, size in enumerate(p["block_sizes"]):
        if p["split"] == "succession":
            shift = j * p["block_bits"]
            v = f"((c_ >> {shift}) & {(1 << size) - 1}LL)"
        else:
            pos = p["positions"][j][:size]
            v = " | ".join(f"(((c_ >> {q}) & 1LL) << {k})" for k, q in enumerate(pos))
            v = f"({v})"
        lines.append(f"const int64_t r{j} = {p['offsets'][j]}LL + {v};")
    return lines


def _ptr_code(f: FieldSpec, spec: KernelSpec) -> list[str]:
    """Pointers ``p0``.. to the rows read for the current id (after :func:`_row_code`)."""
    if f.method == "amtl_serving":
        return [f"const float* p0 = T{f.tables[0]} + s0_;"]
    if f.method == "bh":
        t = f.tables[0]
        cols = spec.tables[t].cols
        return [f"const float* p{j} = T{t} + r{j} * {cols};" for j in range(f.rows_per_id)]
    return [
        f"const float* p{j} = T{t} + r{j} * {spec.tables[t].cols};" for j, t in enumerate(f.tables)
    ]


def _segments(f: FieldSpec) -> list[tuple[int, int, str]]:
    """``(start, width, expression in j)`` pieces of the field's vector."""
    d = f.dim
    if f.method in ("full", "hashing"):
        return [(0, d, "p0[j]")]
    if f.method == "amtl":
        return [(0, d, "p0[j] * m_[j]")]
    if f.method == "amtl_serving":
        return [(0, d, "(j < n0_ ? p0[j] : 0.0f)")]
    if f.method == "qr":
        op = f.param("operation")
        if op == "mult":
            return [(0, d, "p0[j] * p1[j]")]
        if op == "add":
            return [(0, d, "p0[j] + p1[j]")]
        return [(0, d // 2, "p0[j]"), (d // 2, d // 2, "p1[j]")]
    n = f.rows_per_id
    if f.param("fusion") == "sum":
        return [(0, d, " + ".join(f"p{j}[j]" for j in range(n)))]
    bd = d // n
    return [(j * bd, bd, f"p{j}[j]") for j in range(n)]


def _grad_components(f: FieldSpec) -> list[tuple[int, int, int, int, str]]:
    """Per row read: ``(table, slot within the id's rows, grad column start, width, factor)``;
    the gradient row is ``g[start + j] * factor[j]`` (factor ``""``: 1)."""
    d = f.dim
    if f.method in ("full", "hashing"):
        return [(f.tables[0], 0, 0, d, "")]
    if f.method == "amtl":
        return [(f.tables[0], 0, 0, d, "m_")]
    if f.method == "qr":
        q, r = f.tables
        op = f.param("operation")
        if op == "mult":
            return [(q, 0, 0, d, "p1"), (r, 0, 0, d, "p0")]
        if op == "add":
            return [(q, 0, 0, d, ""), (r, 0, 0, d, "")]
        return [(q, 0, 0, d // 2, ""), (r, 0, d // 2, d // 2, "")]
    n = f.rows_per_id
    t = f.tables[0]
    if f.param("fusion") == "sum":
        return [(t, j, 0, d, "") for j in range(n)]
    bd = d // n
    return [(t, j, j * bd, bd, "") for j in range(n)]


def _id_layout(spec: KernelSpec) -> tuple[list[int], list[int], dict[str, int]]:
    """(field index per id input, kind per id input, first id input per field)."""
    fields, kinds, first = [], [], {}
    for i, f in enumerate(spec.fields):
        first[f.name] = len(fields)
        if f.ragged:
            fields += [i, i]
            kinds += [1, 2]
        else:
            fields.append(i)
            kinds.append(0)
    return fields, kinds, first


def _prefetch(f: FieldSpec, spec: KernelSpec, first_id: int, distance: int) -> str:
    """Prefetch of the rows the field reads ``distance`` examples ahead (single-valued ids)."""
    if f.ragged or distance <= 0:
        return ""
    rows = _row_code(f, "id_")
    ptrs = [p.split("=", 1)[1].rstrip(";").strip() for p in _ptr_code(f, spec)]
    body = " ".join(rows + [f"__builtin_prefetch({q});" for q in ptrs])
    return f"      {{ const int64_t id_ = I{first_id}[b + {distance}]; {body} }}"


def _mask_row(spec: KernelSpec, m: int, k: str) -> str:
    """The mask row read for id ``k`` of masked field ``m``: its ``wheres`` entry, or the table
    row ``r0`` the id reads (``mask_rows``)."""
    return "r0" if spec.mask_rows else f"static_cast<int64_t>(W{m}[{k}])"


def _field_forward(f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int | None) -> str:
    lines = [f"    {{  // field {f.name!r}: {f.method}, dim {f.dim}, columns {f.offset}.."]
    segs = _segments(f)
    body_ptr = _row_code(f, "id_") + _ptr_code(f, spec)
    if mask_index is not None:
        body_ptr.append(
            f"const float* m_ = M{mask_index} + {_mask_row(spec, mask_index, 'k_')} * {f.dim};"
        )
    if not f.ragged:
        lines.append(f"      const int64_t k_ = b; const int64_t id_ = I{first_id}[b];")
        lines += [f"      {s}" for s in body_ptr]
        lines.append(f"      float* dst = y + {f.offset};")
        for start, width, expr in segs:
            lines.append(f"      for (int j = 0; j < {width}; ++j) dst[{start} + j] = {expr};")
    else:
        vals, splits = f"I{first_id}", f"I{first_id + 1}"
        lines.append(f"      const int64_t s_ = {splits}[b], e_ = {splits}[b + 1];")
        lines.append(f"      float acc[{f.dim}] = {{}};")
        lines.append("      for (int64_t k_ = s_; k_ < e_; ++k_) {")
        lines.append(f"        const int64_t id_ = {vals}[k_];")
        lines += [f"        {s}" for s in body_ptr]
        for start, width, expr in segs:
            lines.append(f"        for (int j = 0; j < {width}; ++j) acc[{start} + j] += {expr};")
        lines.append("      }")
        lines.append(f"      float* dst = y + {f.offset};")
        if f.combiner == "mean":
            lines.append(
                "      const float n_ = static_cast<float>(std::max<int64_t>(e_ - s_, 1));"
            )
            lines.append(f"      for (int j = 0; j < {f.dim}; ++j) dst[j] = acc[j] / n_;")
        else:
            lines.append(f"      for (int j = 0; j < {f.dim}; ++j) dst[j] = acc[j];")
    lines.append("    }")
    return "\n".join(lines)


def _field_backward(f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int | None) -> str:
    lines = [f"    {{  // field {f.name!r}"]
    body = _row_code(f, "id_") + _ptr_code(f, spec)
    if mask_index is not None:
        body.append(
            f"const float* m_ = M{mask_index} + {_mask_row(spec, mask_index, 'k_')} * {f.dim};"
        )
    comps = _grad_components(f)
    per_id = []
    nrow = f.rows_per_id
    for ci, (t, slot, start, width, factor) in enumerate(comps):
        pos = f"k_ * {nrow} + {slot}" if nrow > 1 else "k_"
        row = f"r{slot}" if f.method == "bh" else f"r{ci}"
        mult = f" * {factor}[j]" if factor else ""
        per_id.append(f"R{t}[{pos}] = {row};")
        per_id.append(
            f"{{ float* v_ = V{t} + ({pos}) * {width}; "
            f"for (int j = 0; j < {width}; ++j) v_[j] = g_[{start} + j]{mult}; }}"
        )
    if not f.ragged:
        lines.append(f"      const int64_t k_ = b; const int64_t id_ = I{first_id}[b];")
        lines.append(f"      const float* g_ = dy + {f.offset};")
        lines += [f"      {s}" for s in body + per_id]
    else:
        vals, splits = f"I{first_id}", f"I{first_id + 1}"
        lines.append(f"      const int64_t s_ = {splits}[b], e_ = {splits}[b + 1];")
        if f.combiner == "mean":
            lines.append(
                "      const float n_ = static_cast<float>(std::max<int64_t>(e_ - s_, 1));"
            )
            lines.append(f"      float g_[{f.dim}];")
            lines.append(
                f"      for (int j = 0; j < {f.dim}; ++j) g_[j] = dy[{f.offset} + j] / n_;"
            )
        else:
            lines.append(f"      const float* g_ = dy + {f.offset};")
        lines.append("      for (int64_t k_ = s_; k_ < e_; ++k_) {")
        lines.append(f"        const int64_t id_ = {vals}[k_];")
        lines += [f"        {s}" for s in body + per_id]
        lines.append("      }")
    lines.append("    }")
    return "\n".join(lines)


def _mask_backward(f: FieldSpec, spec: KernelSpec, first_id: int, mask_index: int) -> str:
    """Serial accumulation ``dM[w(k)] += g(k) * T[row(k)]`` of one AMTL field."""
    t = f.tables[0]
    d = f.dim
    lines = [f"  if (m == {mask_index}) {{  // field {f.name!r}"]
    lines.append(f"    float* dm = DM{mask_index};")
    if f.ragged:
        vals, splits = f"I{first_id}", f"I{first_id + 1}"
        lines.append("    for (int64_t b = 0; b < batch; ++b) {")
        lines.append(f"      const int64_t s_ = {splits}[b], e_ = {splits}[b + 1];")
        scale = (
            "static_cast<float>(std::max<int64_t>(e_ - s_, 1))" if f.combiner == "mean" else "1.0f"
        )
        lines.append(f"      const float n_ = {scale};")
        lines.append("      for (int64_t k_ = s_; k_ < e_; ++k_) {")
        lines.append(f"        const int64_t id_ = {vals}[k_];")
        lines.append(f"        const int64_t r0 = OovSafe(id_, {f.param('num_rows')}LL);")
        lines.append(f"        const float* p0 = T{t} + r0 * {d};")
        lines.append(f"        float* o_ = dm + {_mask_row(spec, mask_index, 'k_')} * {d};")
        lines.append(f"        const float* g_ = dy + b * kOutDim + {f.offset};")
        lines.append(f"        for (int j = 0; j < {d}; ++j) o_[j] += g_[j] / n_ * p0[j];")
        lines.append("      }")
        lines.append("    }")
    else:
        lines.append("    for (int64_t b = 0; b < batch; ++b) {")
        lines.append(f"      const int64_t r0 = OovSafe(I{first_id}[b], {f.param('num_rows')}LL);")
        lines.append(f"      const float* p0 = T{t} + r0 * {d};")
        lines.append(f"      float* o_ = dm + {_mask_row(spec, mask_index, 'b')} * {d};")
        lines.append(f"      const float* g_ = dy + b * kOutDim + {f.offset};")
        lines.append(f"      for (int j = 0; j < {d}; ++j) o_[j] += g_[j] * p0[j];")
        lines.append("    }")
    lines.append("  }")
    return "\n".join(lines)


def op_names(spec: KernelSpec) -> tuple[str, str]:
    """``(forward op, gradient op)`` names: a prefix and the spec's hash (letters only, so that
    TensorFlow's generated Python function names stay simple)."""
    h = hashlib.sha256(spec.to_json().encode()).hexdigest()[:12]
    letters = "".join(chr(ord("a") + int(c, 16)) for c in h)
    return (
        f"StitchrecFusedEmb{letters.capitalize()}",
        f"StitchrecFusedEmbGrad{letters.capitalize()}",
    )


def generate(spec: KernelSpec, cuda: bool = False) -> str:
    """C++ source of the forward and gradient ops specialized to ``spec`` (see module doc);
    with ``cuda`` also their GPU kernels, which call the device code of
    ``codegen_cuda.embedding_source(spec)``."""
    source = _generate_cpu(spec)
    if not cuda:
        return source
    from compiler_opt import codegen_cuda

    return source + codegen_cuda.embedding_gpu_kernels(spec)


def _generate_cpu(spec: KernelSpec) -> str:
    fwd_name, grad_name = op_names(spec)
    id_field, id_kind, first_id = _id_layout(spec)
    masked = spec.masked_fields
    mask_of = {f.name: i for i, f in enumerate(masked)}
    field_of_table = [0] * len(spec.tables)
    rows_per_id = [1] * len(spec.tables)
    for i, f in enumerate(spec.fields):
        for t in f.tables:
            field_of_table[t] = i
            rows_per_id[t] = f.rows_per_id
    reads = sum(len(f.tables) * f.rows_per_id for f in spec.fields)
    src = [
        _HEADER.format(
            spec=spec.to_json().replace("\n", " "),
            num_tables=len(spec.tables),
            num_ids=len(id_field),
            num_masks=len(masked),
            emb_dim=spec.emb_dim,
            out_dim=spec.out_dim,
            dense_dim=spec.dense_dim,
            table_rows=_c_list([t.rows for t in spec.tables]),
            table_cols=_c_list([t.cols for t in spec.tables]),
            table_rank=_c_list([t.rank for t in spec.tables]),
            table_dtype=", ".join(f"::tensorflow::{_C_TYPES[t.dtype][1]}" for t in spec.tables),
            rows_per_id=_c_list(rows_per_id),
            field_of_table=_c_list(field_of_table),
            id_field=_c_list(id_field),
            id_kind=_c_list(id_kind),
            mask_field=_c_list([spec.fields.index(f) for f in masked] + [0]),
            id_helpers=id_helpers(),
            cost_per_row=200 * reads + 4 * spec.out_dim,
        )
    ]
    where_in = "" if spec.mask_rows else '    .Input("wheres: NM * int32")\n'
    mask_in = (
        f'    .Input("masks: NM * float")\n{where_in}    .Attr("NM: int >= 1")\n' if masked else ""
    )
    dense_in = '    .Input("dense: float")\n' if spec.dense_dim else ""
    # ---------------------------------------------------------------- registrations
    src.append(
        f'REGISTER_OP("{fwd_name}")\n'
        '    .Input("tables: NT * resource")\n'
        '    .Input("ids: NI * int64")\n'
        f"{mask_in}{dense_in}"
        '    .Output("y: float")\n'
        '    .Attr("NT: int >= 1")\n'
        '    .Attr("NI: int >= 1")\n'
        "    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {\n"
        "      auto batch = c->UnknownDim();\n"
        f"      if (kIdKind[0] == 0) batch = c->Dim(c->input({len(spec.tables)}), 0);\n"
        "      c->set_output(0, c->Matrix(batch, kOutDim));\n"
        "      return ::absl::OkStatus();\n"
        "    });\n"
    )
    src.append(
        ""
        if not spec.trainable  # a serving-only block: no gradient op
        else f'REGISTER_OP("{grad_name}")\n'
        '    .Input("tables: NT * resource")\n'
        '    .Input("ids: NI * int64")\n'
        f"{mask_in}"
        '    .Input("dy: float")\n'
        '    .Output("rows: NT * int64")\n'
        '    .Output("values: NT * float")\n'
        + ('    .Output("dmasks: NM * float")\n' if masked else "")
        + '    .Attr("NT: int >= 1")\n'
        '    .Attr("NI: int >= 1")\n'
        "    .SetShapeFn(::tensorflow::shape_inference::UnknownShape);\n"
    )

    def inputs_block(with_dense: bool) -> list[str]:
        lines = [
            *TABLE_READS,
            "    const int64_t* ids[kNumIds];",
            "    int64_t id_sizes[kNumIds];",
            "    int64_t batch = 0;",
            "    if (!ReadIds(ctx, ids, id_sizes, &batch)) return;",
        ]
        for t, table in enumerate(spec.tables):
            ctype = _C_TYPES[table.dtype][0]
            lines.append(f"    const {ctype}* T{t} = static_cast<const {ctype}*>(tables[{t}]);")
        for i in range(len(id_field)):
            lines.append(f"    const int64_t* I{i} = ids[{i}];")
        base = len(spec.tables) + len(id_field)
        for m, f in enumerate(masked):
            if spec.mask_rows:
                rows = f.param("num_rows")
                lines += [
                    f"    const Tensor& mask{m} = ctx->input({base + m});",
                    f"    OP_REQUIRES(ctx, mask{m}.dims() == 2 && mask{m}.dim_size(0) == {rows} && mask{m}.dim_size(1) == {f.dim},",
                    f'                errors::InvalidArgument("mask table of field {f.name} must be [{rows}, {f.dim}], got ", mask{m}.shape().DebugString()));',
                    f"    const float* M{m} = mask{m}.flat<float>().data();",
                ]
                continue
            lines += [
                f"    const Tensor& mask{m} = ctx->input({base + m});",
                f"    const Tensor& where{m} = ctx->input({base + len(masked) + m});",
                f"    OP_REQUIRES(ctx, mask{m}.dims() == 2 && mask{m}.dim_size(1) == {f.dim},",
                f'                errors::InvalidArgument("mask of field {f.name} must be [n, {f.dim}], got ", mask{m}.shape().DebugString()));',
                f"    OP_REQUIRES(ctx, where{m}.NumElements() == id_sizes[{first_id[f.name]}],",
                f'                errors::InvalidArgument("wheres of field {f.name} must have one entry per id"));',
                f"    const float* M{m} = mask{m}.flat<float>().data();",
                f"    const int32_t* W{m} = where{m}.flat<int32_t>().data();",
                f"    {{ const int64_t u_ = mask{m}.dim_size(0);",
                f"      for (int64_t k = 0; k < where{m}.NumElements(); ++k)",
                f"        OP_REQUIRES(ctx, W{m}[k] >= 0 && W{m}[k] < u_,",
                f'                    errors::InvalidArgument("wheres of field {f.name} out of range")); }}',
            ]
        if with_dense and spec.dense_dim:
            d = base + len(masked) + spec.num_where_inputs
            lines += [
                f"    const Tensor& dense_t = ctx->input({d});",
                "    OP_REQUIRES(ctx, dense_t.dims() == 2 && dense_t.dim_size(0) == batch &&",
                "                dense_t.dim_size(1) == kDenseDim,",
                '                errors::InvalidArgument("dense must be [batch, ", kDenseDim, "], got ",',
                "                                        dense_t.shape().DebugString()));",
                "    const float* dense = dense_t.flat<float>().data();",
            ]
        return lines

    fwd = [
        f"class {fwd_name}Op : public OpKernel {{",
        " public:",
        f"  explicit {fwd_name}Op(OpKernelConstruction* c) : OpKernel(c) {{}}",
        "  void Compute(OpKernelContext* ctx) override {",
        *inputs_block(True),
        "    Tensor* out = nullptr;",
        "    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, kOutDim}), &out));",
        "    float* Y = out->flat<float>().data();",
        "    auto body = [&](int64_t begin, int64_t end) {",
        f"  for (int64_t t0 = begin; t0 < end; t0 += {max(TILE, 1)}) {{",
        f"  const int64_t t1 = std::min<int64_t>(end, t0 + {max(TILE, 1)});",
    ]
    # tiles of TILE examples, field by field inside a tile: one table at a time is hot in the
    # cache and the tile's output rows stay in L2 while every field writes its columns
    for f in spec.fields:
        ahead = _prefetch(f, spec, first_id[f.name], PREFETCH_DISTANCE)
        fwd.append("  for (int64_t b = t0; b < t1; ++b) {")
        fwd.append("    float* y = Y + b * kOutDim;")
        if ahead:
            fwd += [f"    if (b + {PREFETCH_DISTANCE} < t1) {{", ahead, "    }"]
        fwd.append(_field_forward(f, spec, first_id[f.name], mask_of.get(f.name)))
        fwd.append("  }")
    if spec.dense_dim:
        fwd += [
            "  for (int64_t b = t0; b < t1; ++b)",
            "    std::memcpy(Y + b * kOutDim + kEmbDim, dense + b * kDenseDim,",
            "                sizeof(float) * kDenseDim);",
        ]
    fwd += [
        "  }",
        "    };",
        "    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(",
        "        batch, CostPerRow(), body);",
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{fwd_name}").Device(::tensorflow::DEVICE_CPU), {fwd_name}Op);',
        "",
    ]
    src.append("\n".join(fwd))
    if not spec.trainable:
        src.append("}  // namespace\n")
        return "\n".join(src)

    bwd = [
        f"class {grad_name}Op : public OpKernel {{",
        " public:",
        f"  explicit {grad_name}Op(OpKernelConstruction* c) : OpKernel(c) {{}}",
        "  void Compute(OpKernelContext* ctx) override {",
        *inputs_block(False),
        f"    const Tensor& dy_t = ctx->input({len(spec.tables) + len(id_field) + len(masked) + spec.num_where_inputs});",
        "    OP_REQUIRES(ctx, dy_t.dims() == 2 && dy_t.dim_size(0) == batch && dy_t.dim_size(1) == kOutDim,",
        '                errors::InvalidArgument("dy must be [batch, ", kOutDim, "], got ",',
        "                                        dy_t.shape().DebugString()));",
        "    const float* DY = dy_t.flat<float>().data();",
    ]
    for t in range(len(spec.tables)):
        f = spec.fields[field_of_table[t]]
        n_ids = f"id_sizes[{first_id[f.name]}]"
        bwd += [
            f"    Tensor* rows_t{t} = nullptr;",
            f"    Tensor* vals_t{t} = nullptr;",
            f"    OP_REQUIRES_OK(ctx, ctx->allocate_output({t}, TensorShape({{{n_ids} * kRowsPerId[{t}]}}), &rows_t{t}));",
            f"    OP_REQUIRES_OK(ctx, ctx->allocate_output({len(spec.tables) + t}, TensorShape({{{n_ids} * kRowsPerId[{t}], kTableCols[{t}]}}), &vals_t{t}));",
            f"    int64_t* R{t} = rows_t{t}->flat<int64_t>().data();",
            f"    float* V{t} = vals_t{t}->flat<float>().data();",
        ]
    for m in range(len(masked)):
        bwd += [
            f"    Tensor* dmask_t{m} = nullptr;",
            f"    OP_REQUIRES_OK(ctx, ctx->allocate_output({2 * len(spec.tables) + m}, mask{m}.shape(), &dmask_t{m}));",
            f"    float* DM{m} = dmask_t{m}->flat<float>().data();",
            f"    std::fill(DM{m}, DM{m} + dmask_t{m}->NumElements(), 0.0f);",
        ]
    bwd += [
        "    auto body = [&](int64_t begin, int64_t end) {",
        "  for (int64_t b = begin; b < end; ++b) {",
        "    const float* dy = DY + b * kOutDim;",
    ]
    for f in spec.fields:
        bwd.append(_field_backward(f, spec, first_id[f.name], mask_of.get(f.name)))
    bwd += [
        "  }",
        "    };",
        "    auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;",
        "    pool->ParallelFor(batch, CostPerRow(), body);",
    ]
    if masked:
        bwd += [
            "    const float* dy = DY;",
            "    auto masks_body = [&](int64_t begin, int64_t end) {",
            "  for (int64_t m = begin; m < end; ++m) {",
        ]
        for m, f in enumerate(masked):
            bwd.append(_mask_backward(f, spec, first_id[f.name], m))
        bwd += [
            "  }",
            "    };",
            "    pool->ParallelFor(kNumMasks, 1000000, masks_body);",
            "    (void)dy;",
        ]
    bwd += [
        "  }",
        "};",
        f'REGISTER_KERNEL_BUILDER(Name("{grad_name}").Device(::tensorflow::DEVICE_CPU), {grad_name}Op);',
        "",
        "}  // namespace",
        "",
    ]
    src.append("\n".join(bwd))
    return "\n".join(src)


# ----------------------------------------------------------------------------------- compile


def kernels_dir() -> Path:
    """``$STITCHREC_CACHE/compiler_opt/kernels`` (``~/.cache/stitchrec/...`` by default)."""
    return cost.cache_dir() / "kernels"


def compiler() -> str | None:
    """The C++ compiler: ``$CXX`` or ``g++`` on the PATH, None when there is none."""
    return shutil.which(os.environ.get(CXX_ENV) or "g++")


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """What the library depends on besides its source (part of the cache key)."""

    cxx: str
    cxx_version: str
    flags: tuple[str, ...]
    tf_version: str
    cpu: str

    def key(self, source: str) -> str:
        h = hashlib.sha256()
        for part in (source, self.cxx_version, " ".join(self.flags), self.tf_version, self.cpu):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]


def _cpu_flags() -> str:
    """The CPU's feature flags (``-march=native`` makes the library depend on them)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


_TOOLCHAIN: Toolchain | None = None


def toolchain() -> Toolchain:
    """The compiler, its version and the flags; raises CompilerUnavailable without a compiler."""
    global _TOOLCHAIN
    if _TOOLCHAIN is None:
        cxx = compiler()
        if cxx is None:
            raise CompilerUnavailable(
                f"no C++ compiler: ${CXX_ENV} is {os.environ.get(CXX_ENV)!r} and g++ is not on "
                "the PATH"
            )
        version = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[:1]
        flags = (
            "-O3",
            "-march=native",
            "-shared",
            "-fPIC",
            "-fno-math-errno",
            "-fopenmp-simd",  # `#pragma omp simd`: vectorized reductions (codegen_row)
            "-Wno-deprecated-declarations",
            *tf.sysconfig.get_compile_flags(),
            *tf.sysconfig.get_link_flags(),
        )
        _TOOLCHAIN = Toolchain(
            cxx, version[0] if version else "", flags, tf.__version__, _cpu_flags()
        )
    return _TOOLCHAIN


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled library: its path, the cache key and whether this call compiled it."""

    path: Path
    key: str
    compiled: bool
    seconds: float


def compile_kernel(
    source: str, directory: str | Path | None = None, cuda_source: str | None = None
) -> Compiled:
    """The shared library of ``source``: ``<kernels_dir()>/<key>.so``, compiled first when absent.

    ``key`` hashes the source, the compiler's version, the flags, TensorFlow's version and the
    CPU flags (the library is built with ``-march=native``). Concurrent processes wait on a
    file lock and the library appears by an atomic rename, so it is compiled once. Raises
    CompilerUnavailable without a compiler or when the compiler fails (its output attached).
    With ``cuda_source`` (``codegen_cuda``), nvcc compiles it into an object linked into the
    library with CUDA's static runtime; the key then also hashes it and nvcc's toolchain.
    """
    import time

    from compiler_opt import codegen_cuda

    tc = toolchain()
    cuda_tc = codegen_cuda.toolchain() if cuda_source is not None else None
    key = tc.key(
        source if cuda_tc is None else f"{source}\0cuda\0{cuda_source}\0{cuda_tc.signature()}"
    )
    d = Path(directory) if directory is not None else kernels_dir()
    d.mkdir(parents=True, exist_ok=True)
    so = d / f"{key}.so"
    if so.exists():
        return Compiled(so, key, False, 0.0)
    t0 = time.perf_counter()
    with open(d / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if so.exists():  # another process compiled it while this one waited
            return Compiled(so, key, False, time.perf_counter() - t0)
        cc = d / f"{key}.cc"
        cc.write_text(source)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
        os.close(fd)
        cmd = [tc.cxx, str(cc), "-o", tmp, *tc.flags]
        if cuda_tc is not None:
            cu, obj = d / f"{key}.cu", d / f"{key}.cu.o"
            cu.write_text(cuda_source or "")
            try:
                codegen_cuda.compile_object(cu, obj)
            except codegen_cuda.CudaUnavailable:
                Path(tmp).unlink(missing_ok=True)
                raise
            cmd = [tc.cxx, str(cc), str(obj), "-o", tmp, *tc.flags, *cuda_tc.link]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            Path(tmp).unlink(missing_ok=True)  # a failed link removes it itself
            errs = [ln for ln in r.stderr.splitlines() if "error" in ln] or [r.stderr[-2000:]]
            raise CompilerUnavailable(
                f"{tc.cxx} failed (exit {r.returncode}) on {cc}:\n" + "\n".join(errs[:20])
            )
        os.replace(tmp, so)
    return Compiled(so, key, True, time.perf_counter() - t0)


# ----------------------------------------------------------------------------------- load


@dataclasses.dataclass
class Kernel:
    """A loaded fused op: ``kernel(tables, ids, masks, wheres, dense) -> [batch, out_dim]``."""

    spec: KernelSpec
    source: str
    library: Compiled
    forward_name: str
    gradient_name: str
    module: Any
    gpu: bool = False  # the library holds the ops' GPU kernels (codegen_cuda)

    def _fn(self, op: str) -> Any:
        snake = "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")
        return getattr(self.module, snake)

    def __call__(
        self,
        tables: Sequence[Any],
        ids: Sequence[tf.Tensor],
        masks: Sequence[tf.Tensor] = (),
        wheres: Sequence[tf.Tensor] = (),
        dense: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """``tables``: the table variables (or their handles) in ``spec.tables`` order; ``ids``:
        per field ``[batch]`` int64, or ragged values ``[nnz]`` then row splits ``[batch + 1]``;
        ``masks``/``wheres``: per AMTL field ``[unique, dim]`` float and ``[ids]`` int32;
        ``dense``: ``[batch, dense_dim]`` float when the spec has dense columns."""
        from tensorflow.python.ops import resource_variable_ops

        handles = []
        for t in tables:
            if hasattr(t, "handle"):
                resource_variable_ops.variable_accessed(t)  # the tape watches it
                handles.append(t.handle)
            else:
                handles.append(t)
        args: dict[str, Any] = {"tables": handles, "ids": [tf.cast(x, tf.int64) for x in ids]}
        if self.spec.masked_fields:
            args["masks"] = list(masks)
            if not self.spec.mask_rows:
                args["wheres"] = [tf.cast(w, tf.int32) for w in wheres]
        if self.spec.dense_dim:
            if dense is None:
                raise ValueError(f"dense must be a [batch, {self.spec.dense_dim}] tensor, got None")
            args["dense"] = dense
        return self._fn(self.forward_name)(**args)


_LOCK = threading.Lock()
_KERNELS: dict[str, Kernel] = {}


def _register_gradient(spec: KernelSpec, forward: str, gradient: str, module: Any) -> None:
    nt, nm, nw = len(spec.tables), len(spec.masked_fields), spec.num_where_inputs
    ni = spec.num_id_inputs
    snake = "".join("_" + c.lower() if c.isupper() else c for c in gradient).lstrip("_")
    grad_fn = getattr(module, snake)
    # Python ints: a tensor made here would belong to whatever graph loaded the op first
    shapes = [(t.rows, t.cols) for t in spec.tables]

    @tf.RegisterGradient(forward)
    def _grad(op: tf.Operation, dy: tf.Tensor) -> list[Any]:
        inputs = list(op.inputs)
        tables = inputs[:nt]
        ids = inputs[nt : nt + ni]
        args: dict[str, Any] = {"tables": tables, "ids": ids, "dy": dy}
        if nm:
            args["masks"] = inputs[nt + ni : nt + ni + nm]
            if nw:
                args["wheres"] = inputs[nt + ni + nm : nt + ni + nm + nw]
        outs = grad_fn(**args)
        rows, values = outs[0], outs[1]
        grads: list[Any] = [
            tf.IndexedSlices(values[t], rows[t], dense_shape=tf.constant(shapes[t], tf.int64))
            for t in range(nt)
        ]
        grads += [None] * ni
        if nm:
            grads += list(outs[2]) + [None] * nw
        if spec.dense_dim:
            grads.append(dy[:, spec.emb_dim :])
        return grads

    del _grad


def load(spec: KernelSpec, directory: str | Path | None = None) -> Kernel:
    """The op of ``spec`` in this process: generated, compiled (or found in the cache), loaded
    with ``tf.load_op_library`` and its gradient registered, once per process and spec."""
    from compiler_opt import codegen_cuda

    source = generate(spec)
    with _LOCK:
        forward, gradient = op_names(spec)
        if forward in _KERNELS:
            return _KERNELS[forward]
        cuda = codegen_cuda.enabled() and codegen_cuda.embedding_unsupported(spec) is None
        lib = compile_kernel(
            generate(spec, cuda=True) if cuda else source,
            directory,
            cuda_source=codegen_cuda.embedding_source(spec) if cuda else None,
        )
        module = tf.load_op_library(str(lib.path))
        if spec.trainable:
            _register_gradient(spec, forward, gradient, module)
        kernel = Kernel(spec, source, lib, forward, gradient, module, cuda)
        _KERNELS[forward] = kernel
        return kernel


def gpu_fallback(kernel: Kernel, devices: Sequence[str]) -> str:
    """Why ``kernel`` cannot read tables placed on ``devices`` (variables' device strings), or
    "": tables on a GPU need the op's GPU kernel (``codegen_cuda``); its CPU kernel would read
    device memory as host memory."""
    on_gpu = [d for d in devices if "GPU" in d.upper().rsplit("/", 1)[-1]]
    if not on_gpu or kernel.gpu:
        return ""
    from compiler_opt import codegen_cuda

    why = codegen_cuda.embedding_unsupported(kernel.spec) or (
        "its CUDA form was not built (no nvcc, or $STITCHREC_CUDA=0)"
    )
    return f"tables on {on_gpu[0]} but op {kernel.forward_name} has no GPU kernel: {why}"


def kernel_named(forward_name: str) -> Kernel:
    """The loaded kernel whose forward op is ``forward_name``."""
    if forward_name not in _KERNELS:
        raise KeyError(f"no generated kernel {forward_name!r} is loaded in this process")
    return _KERNELS[forward_name]


def loaded_kernels() -> list[Kernel]:
    """The kernels loaded in this process (for exports)."""
    return list(_KERNELS.values())


# ----------------------------------------------------------------------------------- layers


def _amtl_mask(layer: Any, x: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """AMTL's ``(mask per unique id [u, dim], index per id [n])``, as AMTLEmbedding.call."""
    from embeddings.common import flat_ids
    from embeddings.full import oov_safe

    flat = oov_safe(flat_ids(x), layer.num_rows)
    unique, where = tf.unique(flat)
    return layer._mask(unique), where


def _fused_call(
    kernel: Kernel,
    variables: Sequence[tf.Variable],
    layers: dict[str, Any],
    ids: dict[str, Any],
    dense: tf.Tensor | None = None,
) -> tf.Tensor:
    inputs: list[tf.Tensor] = []
    masks, wheres = [], []
    for f in kernel.spec.fields:
        x = ids[f.name]
        if f.ragged:
            inputs += [x.values, x.row_splits]
        else:
            inputs.append(x)
        if f.masked:
            m, w = _amtl_mask(layers[f.name], x)
            masks.append(m)
            wheres.append(w)
    return kernel(variables, inputs, masks, wheres, dense)


class _FusionState:
    """What a FusedEmbeddingCollection's last call found (kept out of Keras' tracking)."""

    def __init__(self) -> None:
        self.uncovered: dict[str, str] = {}
        self.kernel: Kernel | None = None
        self.fallback_reason = ""


#: what a FusedEmbeddingCollection returns: ``concat`` ``{"__fused__": [batch, sum(d_f)]}``,
#: ``stacked`` ``{"__fused__": [batch, F, d]}`` (fields of one dimension, for FM), ``fields``
#: the per-field dict of the plain collection
OUTPUT_FORMS = ("concat", "stacked", "fields")


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class FusedEmbeddingCollection(EmbeddingCollection):
    """An ``EmbeddingCollection`` whose covered fields run as one generated op.

    The same per-field layers as the collection it replaces (same variables, same checkpoint
    paths: a checkpoint of the plain model restores into the fused one and back). The call
    returns ``{"__fused__": [batch, sum(d_f)]}`` with ``output_form="concat"`` (for interactions that
    only concatenate their inputs: ``concat``, ``cross``), or the per-field dict of the plain
    collection with ``output_form="fields"`` (the fused block split back). Fields the kernel does not
    cover (``uncovered``: ``{field: reason}``, also warned once) run their own layers, and the
    output is then per field; a missing compiler warns and runs everything unfused.

    Args:
      tables, counts, layers: as ``EmbeddingCollection``.
      output_form: ``concat``, ``stacked`` (``[batch, F, d]``, for FM; fields of several
        dimensions fall back to ``fields``) or ``fields`` (see ``OUTPUT_FORMS``).
    """

    def __init__(
        self,
        tables: list[dict[str, Any]],
        counts: dict[str, Sequence[int]] | None = None,
        layers: dict[str, tf.keras.layers.Layer] | None = None,
        output_form: str = "concat",
        **kwargs: Any,
    ):
        super().__init__(tables, counts=counts, layers=layers, **kwargs)
        if output_form not in OUTPUT_FORMS:
            raise ValueError(f"output_form must be one of {OUTPUT_FORMS}, got {output_form!r}")
        self.output_form = output_form
        self._fusion_state = _FusionState()  # a plain object: not tracked, not in checkpoints

    @property
    def uncovered(self) -> dict[str, str]:
        """``{field: reason}`` of the fields the last call left unfused."""
        return self._fusion_state.uncovered

    @property
    def kernel(self) -> Kernel | None:
        """The generated op of the last call (None: unfused, see ``fallback_reason``)."""
        return self._fusion_state.kernel

    @property
    def fallback_reason(self) -> str:
        return self._fusion_state.fallback_reason

    @classmethod
    def from_collection(
        cls, collection: Any, output_form: str = "concat"
    ) -> FusedEmbeddingCollection:
        """The fused form of ``collection``, sharing its layers."""
        return cls(
            collection.tables,
            layers=dict(collection.layers_by_field),
            output_form=output_form,
            name=collection.name,
        )

    def build(self, input_shape: Any) -> None:
        for layer in self.layers_by_field.values():
            if not layer.built:
                with tf.name_scope(layer.name):
                    layer.build(None)
        super().build(input_shape)

    def call(self, ids: dict[str, Any]) -> dict[str, tf.Tensor]:
        missing = [n for n in self.field_names if n not in ids]
        if missing:
            raise KeyError(f"ids lack fields {missing}; got {sorted(ids)}")
        block = build_spec(self, ids)
        state = self._fusion_state
        if block.uncovered and block.uncovered != state.uncovered:
            warnings.warn(
                f"compiler_opt.codegen: fields left unfused: {block.uncovered}",
                RuntimeWarning,
                stacklevel=2,
            )
        state.uncovered = dict(block.uncovered)
        kernel = None
        if block.spec is not None:
            try:
                kernel = load(block.spec)
            except CompilerUnavailable as e:
                if not state.fallback_reason:
                    warnings.warn(
                        "compiler_opt.codegen: generated kernels unavailable, running the "
                        f"embeddings unfused: {e}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                state.fallback_reason = str(e)
        if kernel is not None:
            reason = gpu_fallback(kernel, [v.device for v in block.variables])
            if reason:
                if state.fallback_reason != reason:
                    warnings.warn(
                        f"compiler_opt.codegen: running the embeddings unfused: {reason}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                state.fallback_reason = reason
                kernel = None
        state.kernel = kernel
        if kernel is None:
            return super().call(ids)
        fused = _fused_call(kernel, block.variables, block.layers, ids)
        rest = {
            name: layer(ids[name])
            for name, layer in self.layers_by_field.items()
            if name not in block.layers
        }
        dims = {f.dim for f in kernel.spec.fields}
        if (
            self.output_form == "fields"
            or rest
            or (self.output_form == "stacked" and len(dims) > 1)
        ):
            parts = tf.split(fused, [f.dim for f in kernel.spec.fields], axis=1)
            vectors = dict(zip([f.name for f in kernel.spec.fields], parts, strict=True))
            vectors.update(rest)
            return {name: vectors[name] for name in self.field_names}
        if self.output_form == "stacked":  # [batch, F * d] -> [batch, F, d]: a free reshape
            return {"__fused__": tf.reshape(fused, [-1, len(kernel.spec.fields), dims.pop()])}
        return {"__fused__": fused}

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "output_form": self.output_form}


def fuse_embeddings(model: Any) -> FusedEmbeddingCollection:
    """Replaces ``model.embedding`` (an ``EmbeddingCollection``) by a FusedEmbeddingCollection
    over the same layers and returns it. ``output_form="concat"`` when the interaction
    concatenates its inputs (``ConcatInteraction``, ``CrossInteraction``), ``"stacked"`` for
    FM (``FMInteraction`` reads the ``[batch, F, d]`` block), else ``"fields"``. The wide
    term's per-field weights (``LinearTerm``, FM and LR) become one op too (``"concat"``: the
    term sums them); :func:`fused_collections` lists both."""
    emb = model.embedding
    if isinstance(emb, FusedEmbeddingCollection):
        return emb
    if not isinstance(emb, EmbeddingCollection):
        raise ValueError(
            f"model.embedding must be an EmbeddingCollection, got {type(emb).__name__}"
        )
    kind = type(model.interaction).__name__
    form = (
        "concat"
        if kind in ("ConcatInteraction", "CrossInteraction")
        else "stacked"
        if kind == "FMInteraction"
        else "fields"
    )
    fused = FusedEmbeddingCollection.from_collection(emb, form)
    model.embedding = fused
    wide = getattr(model, "wide", None)
    weights = getattr(wide, "field_weights", None)
    if isinstance(weights, EmbeddingCollection) and not isinstance(
        weights, FusedEmbeddingCollection
    ):
        wide.field_weights = FusedEmbeddingCollection.from_collection(weights, "concat")
    return fused


def fused_collections(model: Any) -> list[FusedEmbeddingCollection]:
    """The FusedEmbeddingCollections of ``model`` (its embedding, its wide term's weights)."""
    found = [getattr(model, "embedding", None)]
    found.append(getattr(getattr(model, "wide", None), "field_weights", None))
    return [c for c in found if isinstance(c, FusedEmbeddingCollection)]


def planned_fields(
    collection: Any,
    ids: dict[str, Any],
    dense: tf.Tensor | None,
    coefficients: cost.Coefficients,
    batch: int,
) -> tuple[list[str], dict[str, Any]]:
    """The fields whose lookups the fusion planner puts into a ``concat`` group.

    Traces ``concat([collection(ids)..., dense])`` (the memory-bound half), reads it into the
    IR, plans it (``planner.plan`` at ``batch``) and returns the fields (collection order)
    with a gather node (``ResourceGather``/``GatherV2`` under the field's layer) in a group of
    kind ``concat``, plus a summary ``{"groups", "concat_groups", "fields_planned"}``.
    """
    from compiler_opt import ir, planner

    def half(ids: dict[str, Any], dense: tf.Tensor | None) -> tf.Tensor:
        parts = list(collection(ids).values()) + ([dense] if dense is not None else [])
        return tf.concat(parts, axis=1)

    spec = tf.nest.map_structure(
        lambda t: (
            tf.TensorSpec([None, *t.shape[1:]], t.dtype)
            if isinstance(t, tf.Tensor)
            else tf.RaggedTensorSpec(
                [None, None], t.dtype, ragged_rank=1, row_splits_dtype=t.row_splits.dtype
            )
        ),
        (ids, dense),
        expand_composites=False,
    )
    graph = ir.from_concrete_function(tf.function(half).get_concrete_function(*spec))
    p = planner.plan(graph, coefficients, batch)
    kinds = {i: g.kind for i, g in enumerate(p.groups)}
    in_concat = {n for n, g in p.group_of.items() if kinds.get(g) == "concat"}
    gathers = [n for n in graph.nodes if graph[n].op in ("ResourceGather", "GatherV2")]
    fields = []
    for name, layer in collection.layers_by_field.items():
        mine = [n for n in gathers if f"/{layer.name}/" in n]
        if mine and any(n in in_concat for n in mine):
            fields.append(name)
    return fields, {
        "groups": len(p.groups),
        "concat_groups": sum(1 for k in kinds.values() if k == "concat"),
        "fields_planned": len(fields),
    }


def fused_block(
    collection: Any,
    ids: dict[str, Any],
    dense_dim: int = 0,
    fields: Sequence[str] | None = None,
) -> tuple[BlockSpec, Kernel]:
    """Spec and loaded kernel of ``collection`` (the covered ``fields``, default all;
    ``dense_dim`` dense columns appended); raises CompilerUnavailable without a compiler."""
    block = build_spec(collection, ids, dense_dim=dense_dim, fields=fields)
    if block.spec is None:
        raise ValueError(f"no field of the collection is covered: {block.uncovered}")
    return block, load(block.spec)


def fused_concat(
    block: BlockSpec, kernel: Kernel, ids: dict[str, Any], dense: tf.Tensor | None = None
) -> tf.Tensor:
    """``[batch, out_dim]``: the block's fields (and ``dense``) through ``kernel``, one op."""
    return _fused_call(kernel, block.variables, block.layers, ids, dense)


# ----------------------------------------------------------------------------------- export


def write_saved_model_assets(
    export_dir: str | Path, kernels: Sequence[Kernel] | None = None
) -> Path:
    """Writes the kernels' sources and a manifest under ``<export_dir>/assets/<ASSETS_DIR>/``.

    ``manifest.json``: ``{"kernels": [{"forward", "gradient", "key", "source", "library"}]}``,
    ``library`` the absolute path of the .so on this machine (a hint: the loader recompiles
    from the source when it is missing or built for another toolchain).
    """
    kernels = loaded_kernels() if kernels is None else list(kernels)
    d = Path(export_dir) / "assets" / ASSETS_DIR
    d.mkdir(parents=True, exist_ok=True)
    entries = []
    for k in kernels:
        src = f"{k.forward_name}.cc"
        (d / src).write_text(k.source)
        (d / f"{k.forward_name}.spec.json").write_text(k.spec.to_json())
        entries.append(
            {
                "forward": k.forward_name,
                "gradient": k.gradient_name,
                "key": k.library.key,
                "source": src,
                "spec": f"{k.forward_name}.spec.json",
                "library": str(k.library.path),
            }
        )
    (d / "manifest.json").write_text(json.dumps({"kernels": entries}, indent=1))
    return d


def _spec_from_json(text: str) -> KernelSpec:
    raw = json.loads(text)

    def tup(x: Any) -> Any:
        return tuple(tup(v) for v in x) if isinstance(x, list) else x

    tables = tuple(TableSpec(**t) for t in raw["tables"])
    fields = tuple(
        FieldSpec(**{**f, "tables": tuple(f["tables"]), "index": tup(f["index"])})
        for f in raw["fields"]
    )
    return KernelSpec(tables, fields, raw["dense_dim"], raw.get("mask_rows", False))


def load_for_saved_model(path: str | Path) -> list[str]:
    """Loads the generated ops a SavedModel needs (call before ``tf.saved_model.load``).

    Reads ``<path>/assets/<ASSETS_DIR>/manifest.json`` (nothing to do without one), compiles
    each kernel's source when this machine's cache lacks it, loads it and registers its
    gradient. Returns the forward op names. Raises CompilerUnavailable when a kernel is neither
    cached nor compilable, ValueError when a source does not match its spec.
    """
    d = Path(path) / "assets" / ASSETS_DIR
    manifest = d / "manifest.json"
    if not manifest.exists():
        return []
    names = []
    for entry in json.loads(manifest.read_text())["kernels"]:
        spec = _spec_from_json((d / entry["spec"]).read_text())
        source = (d / entry["source"]).read_text()
        if generate(spec) != source:
            raise ValueError(
                f"{d / entry['source']}: the source does not match its spec (generated by another "
                "version of compiler_opt.codegen?)"
            )
        names.append(load(spec).forward_name)
    return names


if __name__ == "__main__":  # pragma: no cover
    print(toolchain(), file=sys.stderr)
