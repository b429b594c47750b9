"""Realization of a fusion plan as XLA clusters in a serving graph.

A traced function is frozen (variables become constants, nested calls inlined:
``convert_variables_to_constants_v2``); its GraphDef is read into the IR and planned; every
node of planned group ``i`` gets the attributes ``_XlaCompile = true`` and
``_XlaScope = "stitch_<i>"``; the GraphDef is imported again with ``wrap_function``, where
TensorFlow's clustering pass honours those attributes and compiles each group as one XLA
cluster (one cluster per scope; untagged ops run as before). TensorFlow ignores the attributes
on an already traced function graph, hence the round trip through a GraphDef.

Free nodes (``Identity``, ``Reshape``...) and constants whose readers all sit in one group join
that group, so that they do not cut it in two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from compiler_opt import ir
from compiler_opt.cost import Coefficients
from compiler_opt.planner import Plan, plan


@dataclasses.dataclass
class Frozen:
    """A frozen GraphDef with the names of its argument and result tensors.

    ``bound``: the values of the inputs after the function's own arguments: resources that
    freezing cannot fold into constants (a SavedModel's vocabulary hash tables) stay inputs of
    the frozen graph, and get the original function's captured handles.
    """

    graph_def: graph_pb2.GraphDef
    inputs: list[str]
    outputs: list[str]
    structured_outputs: Any = None
    bound: list[Any] = dataclasses.field(default_factory=list)


def freeze(concrete_fn: Any) -> Frozen:
    """Variables -> constants and calls inlined, of a ``ConcreteFunction``."""
    frozen = convert_variables_to_constants_v2(concrete_fn)
    inputs = [t.name for t in frozen.inputs]
    names = [t.name for t in concrete_fn.inputs]
    n_args = len(names) - len(concrete_fn.captured_inputs)
    if inputs[:n_args] != names[:n_args]:
        raise ValueError(
            f"the frozen graph's inputs {inputs[:n_args]} do not start with the function's "
            f"arguments {names[:n_args]}"
        )
    bound = [concrete_fn.captured_inputs[names.index(n) - n_args] for n in inputs[n_args:]]
    return Frozen(
        frozen.graph.as_graph_def(),
        inputs,
        [t.name for t in frozen.outputs],
        frozen.structured_outputs,
        bound,
    )


def cluster_assignment(graph: ir.Graph, group_of: dict[str, int]) -> dict[str, int]:
    """``group_of`` (kernel node -> group) extended to the free nodes and constants whose
    producers and readers all belong to one group."""
    out = dict(group_of)
    changed = True
    while changed:
        changed = False
        for n in graph.nodes.values():
            if n.name in out or n.op_class not in ("free", "source") or n.op == "Placeholder":
                continue
            if n.op_class == "source" and n.op != "Const":
                continue
            readers = graph.consumers(n.name)
            producers = [p for p in graph.producers(n.name) if graph[p].op != "Const"]
            groups = {out.get(r) for r in readers} | {out.get(p) for p in producers}
            if len(groups) == 1 and None not in groups and readers:
                out[n.name] = groups.pop()
                changed = True
    return out


def tag_clusters(graph_def: graph_pb2.GraphDef, assignment: dict[str, int]) -> graph_pb2.GraphDef:
    """A copy of ``graph_def`` with ``_XlaCompile`` / ``_XlaScope`` set on assigned nodes."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        gid = assignment.get(node.name)
        if gid is None:
            continue
        node.attr["_XlaCompile"].CopyFrom(attr_value_pb2.AttrValue(b=True))
        node.attr["_XlaScope"].CopyFrom(attr_value_pb2.AttrValue(s=f"stitch_{gid}".encode()))
    return out


class GraphFunction:
    """``f(*flat_inputs) -> [outputs]``: a GraphDef imported with ``wrap_function`` and pruned
    to ``inputs`` -> ``outputs``.

    Calls go straight to the pruned function's flat call: its structured-signature binding
    fails for positional tensors and formats every input into an error message before falling
    back, which cost ~10 ms per call on DCN-v2's 27 inputs.
    """

    def __init__(
        self,
        graph_def: graph_pb2.GraphDef,
        inputs: list[str],
        outputs: list[str],
        bound: Sequence[Any] = (),
    ):
        def _import() -> None:
            tf.graph_util.import_graph_def(graph_def, name="")

        wrapped = tf.compat.v1.wrap_function(_import, [])
        g = wrapped.graph
        self.function = wrapped.prune(
            [g.get_tensor_by_name(n) for n in inputs], [g.get_tensor_by_name(n) for n in outputs]
        )
        self.bound = list(bound)  # values of the last inputs (``Frozen.bound``)
        self.num_inputs = len(inputs) - len(self.bound)

    def __call__(self, *args: Any) -> list[tf.Tensor]:
        if len(args) != self.num_inputs:
            raise ValueError(f"expected {self.num_inputs} flat input tensors, got {len(args)}")
        tensors = [tf.convert_to_tensor(a) for a in args] + self.bound
        return self.function._call_flat(tensors, self.function.captured_inputs)


def load_graph_def(
    graph_def: graph_pb2.GraphDef, inputs: list[str], outputs: list[str], bound: Sequence[Any] = ()
) -> GraphFunction:
    """``GraphFunction(graph_def, inputs, outputs, bound)``."""
    return GraphFunction(graph_def, inputs, outputs, bound)


def single_cluster(frozen: Frozen) -> GraphFunction:
    """The frozen graph with every op but the arguments tagged into one XLA scope: whole-graph
    XLA on the same (frozen) graph, the baseline a plan's clusters are compared with."""
    everything = {n.name: 0 for n in frozen.graph_def.node if n.op != "Placeholder"}
    tagged = tag_clusters(frozen.graph_def, everything)
    return load_graph_def(tagged, frozen.inputs, frozen.outputs, frozen.bound)


@dataclasses.dataclass
class Realized:
    """The fused serving function and what it came from."""

    fused: Any  # f(*flat_inputs) -> [outputs], planned groups as XLA clusters
    unfused: Any  # the same frozen graph without tags
    plan: Plan
    frozen: Frozen
    tagged: graph_pb2.GraphDef
    clusters: int


def xla_clusters(
    concrete_fn: Any,
    coefficients: Coefficients,
    batch: int,
    *,
    min_group_size: int = 2,
    **plan_options: Any,
) -> Realized:
    """Plans ``concrete_fn`` (frozen) at ``batch`` and compiles every planned group of at least
    ``min_group_size`` kernels as one XLA cluster. Both returned callables take the function's
    inputs flattened (``tf.nest.flatten(args, expand_composites=True)``)."""
    frozen = freeze(concrete_fn)
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    p = plan(graph, coefficients, batch, **plan_options)
    keep = {
        node: gid for node, gid in p.group_of.items() if len(p.groups[gid].nodes) >= min_group_size
    }
    assignment = cluster_assignment(graph, keep)
    tagged = tag_clusters(frozen.graph_def, assignment)
    return Realized(
        fused=load_graph_def(tagged, frozen.inputs, frozen.outputs, frozen.bound),
        unfused=load_graph_def(frozen.graph_def, frozen.inputs, frozen.outputs, frozen.bound),
        plan=p,
        frozen=frozen,
        tagged=tagged,
        clusters=len(set(keep.values())),
    )
