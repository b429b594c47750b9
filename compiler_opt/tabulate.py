"""Tabulation: a per-id function with constant weights, evaluated once over its id domain.

In a frozen serving graph, AMTL's mask of an id (counts -> frequency features -> twin MLPs ->
argmax -> prefix mask; ``embeddings/amtl.py``) depends on nothing but the id and constants, and
the id is bounded: the generated embedding op (``compiler_opt.embedding_op``) reads it as
``M[w(k)]`` with ``M = mask(unique(oov(ids)))`` and ``w`` the ``Unique`` index, and ``oov``
(``embeddings.full.oov_safe``: ``where(0 <= x < n, x, 0)``) maps every id into ``[0, n)``. So
``mask`` can be evaluated once for all ``n`` ids when the graph is realized, and the op reads
``T[oov(x)] * M'[oov(x)]`` with ``M' = mask(range(n))`` a constant ``[n, d]``: the ``Unique``,
the counts gather and the MLPs (~28 ops per AMTL field, each run per request) leave the serving
graph. The same rewrite a compiler does for a function over a small finite domain (a lookup
table), with the domain proven from the graph: the ``oov`` pattern, its bound a constant.

Preconditions checked per mask input of the op (``tabulate_masks``):

* the op's ``wheres`` input is output 1 (the index) of a ``Unique`` whose input is the ``oov``
  pattern with constant bound ``n``;
* the mask's ancestors are constants and that ``Unique``'s output 0 only, and no ancestor is a
  stateful op;
* the table ``n x d`` float32 stays within ``max_bytes`` (the default, 64 MiB, is twice an
  AMTL table of 1M ids x 8 dims);
* a row-wise check: the function on a sample of ids equals the table's rows for them (a
  function that mixes rows, such as a mean over the batch's unique ids, fails it).

Where one fails, that mask stays computed as before and the report says why. Memory: the table
costs ``n * d * 4`` bytes beside the embedding table; AMTL's compact serving form
(``AMTLServingEmbedding``) is the memory-lean alternative, with its per-id work.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import op_def_registry, tensor_util

from compiler_opt.embedding_op import ops as embedding_ops
from compiler_opt.graph_io import load_graph_def
from compiler_opt.ir import split_ref
from compiler_opt.toolchain import CompilerUnavailable

#: the forward op of ``compiler_opt.embedding_op`` (its gradient op is ``StitchrecFusedEmbGrad...``)
EMBEDDING_OP_PREFIX = "StitchrecFusedEmb"
DEFAULT_MAX_BYTES = 64 << 20


def _is_embedding_op(op: str) -> bool:
    return op.startswith(EMBEDDING_OP_PREFIX) and not op.startswith(EMBEDDING_OP_PREFIX + "Grad")


def _canon(ref: str) -> str:
    name, idx = split_ref(ref)
    return f"{name}:{idx}"


def _const_value(by: dict[str, Any], ref: str) -> np.ndarray | None:
    node = by.get(split_ref(ref)[0])
    if node is None or node.op != "Const":
        return None
    return tensor_util.MakeNdarray(node.attr["value"].tensor)


def oov_domain(by: dict[str, Any], ref: str) -> int | None:
    """``n`` when ``ref`` is ``where(x >= 0 and x < n, x, 0)`` (``oov_safe``) with ``n`` a
    constant scalar, so its values lie in ``[0, n)``; else None."""
    select = by.get(split_ref(ref)[0])
    if select is None or select.op not in ("SelectV2", "Select") or len(select.input) < 3:
        return None
    cond, other = by.get(split_ref(select.input[0])[0]), by.get(split_ref(select.input[2])[0])
    x_ref = _canon(select.input[1])
    if cond is None or cond.op != "LogicalAnd" or other is None:
        return None
    zero = other.op == "ZerosLike" and _canon(other.input[0]) == x_ref
    if not zero:
        v = _const_value(by, select.input[2])
        zero = v is not None and v.size >= 1 and not np.any(v)
    if not zero:
        return None
    low = high = None
    for r in cond.input[:2]:
        c = by.get(split_ref(r)[0])
        if c is None or len(c.input) < 2 or _canon(c.input[0]) != x_ref:
            return None
        v = _const_value(by, c.input[1])
        if v is None or v.size != 1:
            return None
        if c.op == "GreaterEqual":
            low = int(v.reshape(()))
        elif c.op == "Less":
            high = int(v.reshape(()))
    if low != 0 or high is None or high < 1:
        return None
    return high


def _ancestors(by: dict[str, Any], ref: str, source: str) -> tuple[set[str], str]:
    """The nodes ``ref`` is computed from, stopping at node ``source`` (output 0 allowed only),
    and ``""``; or ``(set(), reason)`` when it reads anything but constants and ``source:0``."""
    seen: set[str] = set()
    stack = [split_ref(ref)[0]]
    while stack:
        name = stack.pop()
        if name in seen or name == source:
            continue
        node = by.get(name)
        if node is None:
            return set(), f"reads {name!r}, not in the graph"
        op_def = op_def_registry.get(node.op)
        if op_def is None or op_def.is_stateful:
            return set(), f"reads the stateful op {node.name!r} ({node.op})"
        if node.op == "Placeholder":
            return set(), f"reads the input {node.name!r}"
        seen.add(name)
        for r in node.input:
            producer, idx = split_ref(r.lstrip("^"))
            if producer == source and (r.startswith("^") or idx != 0):
                return set(), f"reads {r!r} of the Unique, not its output 0"
            stack.append(producer)
    return seen, ""


def _evaluate(
    graph_def: graph_pb2.GraphDef, nodes: set[str], source: Any, ref: str, ids: np.ndarray
) -> np.ndarray:
    """The subgraph ``nodes`` computing ``ref`` from ``source:0``, run on ``ids``."""

    sub = graph_pb2.GraphDef()
    sub.versions.CopyFrom(graph_def.versions)
    sub.library.CopyFrom(graph_def.library)
    sub.node.extend(n for n in graph_def.node if n.name in nodes)
    dtype = source.attr["T"].type
    ph = node_def_pb2.NodeDef(name=source.name, op="Placeholder")
    ph.attr["dtype"].CopyFrom(attr_value_pb2.AttrValue(type=dtype))
    sub.node.append(ph)
    fn = load_graph_def(sub, [f"{source.name}:0"], [_canon(ref)])
    return fn(tf.constant(ids, tf.as_dtype(dtype)))[0].numpy()


def _tabulate_one(
    graph_def: graph_pb2.GraphDef, by: dict[str, Any], mask_ref: str, where_ref: str, max_bytes: int
) -> tuple[Any, set[str], np.ndarray | None, str]:
    """``(Unique node, nodes computing the mask, its table over the domain, "")`` for one mask
    input of the op, or the reason it cannot be tabulated in the last slot."""
    uname, uidx = split_ref(where_ref)
    unique = by.get(uname)
    if unique is None or unique.op != "Unique" or uidx != 1:
        return None, set(), None, f"the op's wheres {where_ref!r} is not a Unique's index"
    n = oov_domain(by, unique.input[0])
    if n is None:
        return unique, set(), None, "the Unique's input is not bounded (no oov pattern)"
    nodes, why = _ancestors(by, mask_ref, uname)
    if why:
        return unique, set(), None, why
    # a sample first: the width, so the size is checked before the whole domain is evaluated
    sample = np.unique(np.linspace(n - 1, 0, min(n, 9)).astype(np.int64))
    part = _evaluate(graph_def, nodes, unique, mask_ref, sample)
    if part.ndim != 2 or part.shape[0] != len(sample) or part.dtype != np.float32:
        why = f"the function gives {part.dtype}{list(part.shape)} for {len(sample)} ids"
        return unique, set(), None, why + ", not [ids, d] float32"
    size = 4 * n * int(part.shape[1])
    if size > max_bytes:
        return unique, set(), None, f"its table, {size} bytes, exceeds max_bytes={max_bytes}"
    table = _evaluate(graph_def, nodes, unique, mask_ref, np.arange(n))
    if table.shape != (n, part.shape[1]) or not np.allclose(
        part, table[sample], rtol=0.0, atol=1e-6
    ):
        return unique, set(), None, "not row-wise: on a sample of ids it differs from the table"
    return unique, nodes, table, ""


def _row_form(op_type: str) -> str | None:
    """The op type of the loaded kernel ``op_type`` in its ``mask_rows`` form (generated and
    loaded here), or None when ``op_type`` is not a kernel loaded in this process or no
    compiler is available (the caller then keeps the op and feeds it the rows as wheres)."""
    kernel = next((k for k in embedding_ops.loaded_kernels() if k.forward_name == op_type), None)
    if kernel is None:
        return None
    try:
        return embedding_ops.load(dataclasses.replace(kernel.spec, mask_rows=True)).forward_name
    except CompilerUnavailable:
        return None


@dataclasses.dataclass
class Tabulation:
    """What ``tabulate_masks`` did: ``tables`` ``{unique node: (ids, width)}`` tabulated,
    ``left`` ``{unique node or op input: reason}`` not, ``row_form`` the op nodes switched to
    the kernel's ``mask_rows`` form (every mask of theirs tabulated)."""

    tables: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    left: dict[str, str] = dataclasses.field(default_factory=dict)
    row_form: list[str] = dataclasses.field(default_factory=list)  # ops now in mask_rows form

    @property
    def bytes(self) -> int:
        return sum(4 * n * d for n, d in self.tables.values())


def tabulate_masks(
    graph_def: graph_pb2.GraphDef,
    outputs: list[str],
    *,
    keep: tuple[str, ...] = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[graph_pb2.GraphDef, Tabulation]:
    """A copy of ``graph_def`` where the per-unique-id masks that the generated embedding op
    reads are constant tables over their id domain (module docstring), and the nodes only they
    needed are gone. ``outputs`` and ``keep`` (e.g. the graph's input placeholders) are never
    removed. Returns the graph and a ``Tabulation`` report."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    by = {n.name: n for n in out.node}
    report = Tabulation()
    new_nodes: list[Any] = []
    dropped: set[str] = set()
    for op in list(out.node):
        if not _is_embedding_op(op.op) or "NM" not in op.attr:
            continue
        nt, ni, nm = (op.attr[k].i for k in ("NT", "NI", "NM"))
        found: dict[int, tuple[Any, set[str], Any, np.ndarray]] = {}
        for m in range(nm):
            mask_ref, where_ref = op.input[nt + ni + m], op.input[nt + ni + nm + m]
            unique, nodes, table, why = _tabulate_one(out, by, mask_ref, where_ref, max_bytes)
            if why:
                report.left[unique.name if unique is not None else f"{op.name}:masks{m}"] = why
                continue
            found[m] = (unique, nodes, mask_ref, table)
        if not found:
            continue
        row_op = _row_form(op.op) if len(found) == nm else None
        consts = []
        for m, (unique, nodes, _, table) in sorted(found.items()):
            const = node_def_pb2.NodeDef(name=f"{unique.name}/stitch_tabulated", op="Const")
            const.attr["dtype"].CopyFrom(attr_value_pb2.AttrValue(type=types_pb2.DT_FLOAT))
            const.attr["value"].CopyFrom(
                attr_value_pb2.AttrValue(tensor=tensor_util.make_tensor_proto(table))
            )
            new_nodes.append(const)
            consts.append(f"{const.name}:0")
            dropped |= nodes | {unique.name}
            report.tables[unique.name] = (int(table.shape[0]), int(table.shape[1]))
            if row_op is not None:
                continue
            # the op keeps its wheres input: the row itself, cast to the index's int32
            row = unique.input[0]
            if unique.attr["T"].type != types_pb2.DT_INT32:
                cast = node_def_pb2.NodeDef(
                    name=f"{unique.name}/stitch_row", op="Cast", input=[row]
                )
                cast.attr["SrcT"].CopyFrom(unique.attr["T"])
                cast.attr["DstT"].CopyFrom(attr_value_pb2.AttrValue(type=types_pb2.DT_INT32))
                cast.attr["Truncate"].CopyFrom(attr_value_pb2.AttrValue(b=False))
                new_nodes.append(cast)
                row = f"{cast.name}:0"
            op.input[nt + ni + m], op.input[nt + ni + nm + m] = consts[-1], row
        if row_op is not None:  # the op's row form: masks read at the op's own row, no wheres
            data = [r for r in op.input if not r.startswith("^")]
            controls = [r for r in op.input if r.startswith("^")]
            del op.input[:]
            op.input.extend(data[: nt + ni] + consts + data[nt + ni + 2 * nm :] + controls)
            op.op = row_op
            report.row_form.append(op.name)
    if not report.tables:
        return out, report
    out.node.extend(new_nodes)
    # control edges onto the dropped (stateless, constant-fed) nodes order nothing: remove them
    for node in out.node:
        data = [r for r in node.input if not r.startswith("^")]
        controls = [r for r in node.input if r.startswith("^") and r[1:] not in dropped]
        del node.input[:]
        node.input.extend(data + controls)
    return _prune(out, [*outputs, *keep]), report


def _prune(graph_def: graph_pb2.GraphDef, roots: list[str]) -> graph_pb2.GraphDef:
    """``graph_def`` without the nodes that no root reads (through data or control edges);
    stateful nodes stay."""
    by = {n.name: n for n in graph_def.node}
    live: set[str] = set()
    stateful = [
        n.name for n in graph_def.node if (d := op_def_registry.get(n.op)) is None or d.is_stateful
    ]
    stack = [split_ref(r.lstrip("^"))[0] for r in roots] + stateful
    while stack:
        name = stack.pop()
        if name in live or name not in by:
            continue
        live.add(name)
        stack.extend(split_ref(r.lstrip("^"))[0] for r in by[name].input)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    out.node.extend(n for n in graph_def.node if n.name in live)
    return out


__all__ = ["DEFAULT_MAX_BYTES", "Tabulation", "oov_domain", "tabulate_masks"]
