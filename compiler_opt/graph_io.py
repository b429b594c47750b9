"""GraphDefs in and out: a GraphDef as a callable, and nodes replaced by new ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from compiler_opt.ir import split_ref


def canonical_ref(ref: str) -> str:
    """``"node:index"`` of tensor reference ``ref`` (``"node"`` is output 0)."""
    name, idx = split_ref(ref)
    return f"{name}:{idx}"


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
        self.input_names, self.output_names = list(inputs), list(outputs)
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


def replace_nodes(
    graph_def: graph_pb2.GraphDef,
    new_nodes: Sequence[Any],
    removed: dict[str, str],
    tensors: dict[str, str],
    outputs: Sequence[str],
) -> tuple[graph_pb2.GraphDef, list[str]]:
    """A copy of ``graph_def`` without the ``removed`` nodes and with ``new_nodes`` (NodeDefs)
    added; every reference to a removed node is rewired: a data input ``"node:i"`` to
    ``tensors["node:i"]`` (a ``ValueError`` when it has no replacement), a control input
    ``"^node"`` to ``"^" + removed[node]``. Returns the GraphDef and ``outputs`` rewired."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)

    def fix(ref: str) -> str:
        if ref.startswith("^"):
            return "^" + removed.get(ref[1:], ref[1:])
        if split_ref(ref)[0] not in removed:
            return ref
        canon = canonical_ref(ref)
        if canon not in tensors:
            raise ValueError(f"{ref} is read outside the replaced nodes but has no replacement")
        return tensors[canon]

    kept = [n for n in out.node if n.name not in removed]
    for n in kept + list(new_nodes):
        data = [fix(r) for r in n.input if not r.startswith("^")]
        controls = dict.fromkeys(fix(r) for r in n.input if r.startswith("^"))
        del n.input[:]
        n.input.extend(data + list(controls))  # a control edge may now appear twice
    del out.node[:]
    out.node.extend(kept + list(new_nodes))
    return out, [fix(o) for o in outputs]
