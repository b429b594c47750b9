"""The graph IR of compiler_opt: a flat, topologically ordered dataflow graph of TensorFlow ops.

Read from a ``tf.function``'s concrete function (a model's forward pass, a training step, the
serving signature of a loaded SavedModel) or from a ``GraphDef``. Calls of nested functions
(``PartitionedCall`` / ``StatefulPartitionedCall``) are inlined recursively, so the model's real
ops appear with names prefixed by the call node (``outer_call/inner_call/MatMul``). Every node
carries its op type, its op class (``compiler_opt.op_classes``: ``classify``), its data and
control inputs and the static shape and dtype of each output where TensorFlow's shape inference
knows them.

Tensor references are strings ``"node:index"`` (``"node"`` means ``"node:0"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import function_def_to_graph as _f2g
from tensorflow.python.ops import handle_data_util as _handle_data_util

from compiler_opt.op_classes import OP_CLASSES, classify

_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Static shape (``None`` for an unknown rank, ``None`` entries for unknown dims) and dtype
    name (``"float32"``...) of one output."""

    shape: tuple[int | None, ...] | None
    dtype: str

    def num_elements(self, batch: int, unknown_dim: int = 1) -> int:
        """Element count with the first unknown dimension = ``batch`` and any later unknown one
        = ``unknown_dim``; an unknown rank counts as a ``[batch]`` vector."""
        if self.shape is None:
            return batch
        n, first = 1, True
        for d in self.shape:
            if d is None:
                n *= batch if first else unknown_dim
                first = False
            else:
                n *= d
        return n

    @property
    def itemsize(self) -> int:
        """Bytes per element (strings count 8, resources and variants 0)."""
        if self.dtype in ("resource", "variant"):
            return 0
        if self.dtype == "string":
            return 8
        try:
            return tf.as_dtype(self.dtype).size
        except TypeError:
            return 0

    def nbytes(self, batch: int, unknown_dim: int = 1) -> int:
        """``num_elements * itemsize``."""
        return self.num_elements(batch, unknown_dim) * self.itemsize


@dataclasses.dataclass
class Node:
    """One op. ``inputs`` are tensor references ``"producer:index"``; ``control_inputs`` are node
    names; ``attrs`` holds what the cost model and planner read (``axes`` of a reduction when
    constant, ``func`` of an opaque call, ``table_shape`` of a gather from a variable)."""

    name: str
    op: str
    op_class: str
    inputs: list[str]
    control_inputs: list[str]
    outputs: list[TensorInfo]
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)


def split_ref(ref: str) -> tuple[str, int]:
    """``"a/b:2"`` -> ``("a/b", 2)``; ``"a"`` -> ``("a", 0)``."""
    name, sep, idx = ref.rpartition(":")
    if sep and idx.isdigit():
        return name, int(idx)
    return ref, 0


class CycleError(ValueError):
    """The graph has a cycle (a well-formed TensorFlow graph never has one)."""


class Graph:
    """Nodes in topological order plus the graph's argument and result tensors.

    ``nodes`` maps name -> ``Node`` in a topological order (every producer and control input
    before its consumers); ``inputs`` are the argument nodes, ``outputs`` the result tensors.
    """

    def __init__(self, nodes: Iterable[Node], inputs: list[str], outputs: list[str]):
        by_name: dict[str, Node] = {}
        for n in nodes:
            if n.name in by_name:
                raise ValueError(f"duplicate node name {n.name!r}")
            by_name[n.name] = n
        for n in by_name.values():
            for dep in [split_ref(r)[0] for r in n.inputs] + n.control_inputs:
                if dep not in by_name:
                    raise ValueError(f"node {n.name!r} reads {dep!r}, which is not in the graph")
        for r in outputs:
            if split_ref(r)[0] not in by_name:
                raise ValueError(f"graph output {r!r} names no node")
        order = topological_order(by_name)
        self.nodes: dict[str, Node] = {name: by_name[name] for name in order}
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self._consumers: dict[str, list[str]] | None = None
        self.keepalive: Any = None

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def tensor(self, ref: str) -> TensorInfo:
        """The ``TensorInfo`` of a tensor reference."""
        name, idx = split_ref(ref)
        return self.nodes[name].outputs[idx]

    def consumers(self, name: str) -> list[str]:
        """Names of the nodes that read any output of ``name`` or wait on it (control)."""
        if self._consumers is None:
            cons: dict[str, list[str]] = {n: [] for n in self.nodes}
            for n in self.nodes.values():
                for dep in dict.fromkeys([split_ref(r)[0] for r in n.inputs] + n.control_inputs):
                    cons[dep].append(n.name)
            self._consumers = cons
        return self._consumers[name]

    def producers(self, name: str) -> list[str]:
        """Names of the nodes ``name`` reads from or waits on (control), without repeats."""
        n = self.nodes[name]
        return list(dict.fromkeys([split_ref(r)[0] for r in n.inputs] + n.control_inputs))

    def class_counts(self) -> dict[str, int]:
        """Number of nodes per op class."""
        out = dict.fromkeys(OP_CLASSES, 0)
        for n in self.nodes.values():
            out[n.op_class] += 1
        return out

    def kernel_count(self) -> int:
        """Nodes that run a kernel of their own: every class but ``free`` and ``source``."""
        return sum(n.op_class not in ("free", "source") for n in self.nodes.values())

    def op_counts(self) -> dict[str, int]:
        """Number of nodes per op type, most frequent first."""
        counts: dict[str, int] = {}
        for n in self.nodes.values():
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def topological_order(nodes: dict[str, Node]) -> list[str]:
    """Kahn's algorithm over data and control edges, stable in the given order.

    Raises ``CycleError`` naming some nodes on a cycle.
    """
    indeg = {name: 0 for name in nodes}
    cons: dict[str, list[str]] = {name: [] for name in nodes}
    for n in nodes.values():
        for dep in dict.fromkeys([split_ref(r)[0] for r in n.inputs] + n.control_inputs):
            indeg[n.name] += 1
            cons[dep].append(n.name)
    ready = [name for name, d in indeg.items() if d == 0]
    ready.reverse()
    order: list[str] = []
    while ready:
        name = ready.pop()
        order.append(name)
        for c in reversed(cons[name]):
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if len(order) != len(nodes):
        stuck = sorted(name for name, d in indeg.items() if d > 0)
        raise CycleError(f"graph has a cycle through {len(stuck)} node(s), e.g. {stuck[:5]}")
    return order


# --------------------------------------------------------------------------------------------
# Reading TensorFlow graphs


def _shape_of(t: tf.Tensor) -> tuple[int | None, ...] | None:
    try:
        shape = t.shape
    except ValueError:
        return None
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def _dtype_name(t: tf.Tensor) -> str:
    return t.dtype.name


def _handle_shape(t: tf.Tensor) -> tuple[int | None, ...] | None:
    """Shape of the variable a resource tensor points to, when TensorFlow recorded it."""
    try:
        data = _handle_data_util.get_resource_handle_data(t)
    except (AttributeError, TypeError, ValueError):
        return None
    if data is None or not data.is_set or not data.shape_and_type:
        return None
    shape = tf.TensorShape(data.shape_and_type[0].shape)
    return None if shape.rank is None else tuple(shape.as_list())


def _const_value(op: tf.Operation) -> Any:
    try:
        return tf.make_ndarray(op.get_attr("value")).tolist()
    except (ValueError, TypeError):
        return None


class _Reader:
    """Inlines a tf.Graph and its nested function calls into a list of ``Node``."""

    def __init__(self, library: dict[str, Any], max_depth: int):
        self.library = library
        self.max_depth = max_depth
        self.nodes: list[Node] = []

    def read(
        self, graph: tf.Graph, prefix: str, arg_map: dict[str, str], depth: int
    ) -> dict[str, str]:
        """Adds ``graph``'s ops (names prefixed) to ``self.nodes``; ``arg_map`` maps a placeholder
        tensor name of ``graph`` to the outer tensor reference it stands for. Returns the map of
        every tensor name of ``graph`` to its reference in the flat IR."""
        ref: dict[str, str] = dict(arg_map)
        # ops whose only role is an argument placeholder that has been mapped: skip
        mapped_ops = {split_ref(name)[0] for name in arg_map}
        ctrl_alias: dict[str, list[str]] = {}  # inlined call op -> the names its control deps use
        for op in graph.get_operations():
            if op.name in mapped_ops:
                ctrl_alias[op.name] = []
                continue
            inputs = [ref[t.name] for t in op.inputs]
            controls: list[str] = []
            for c in op.control_inputs:
                controls.extend(ctrl_alias.get(c.name, [prefix + c.name]))
            fname = self._called_function(op)
            if fname is not None and depth < self.max_depth and fname in self.library:
                sub = self._function_graph(fname, op)
                inner_args = {ph.name: r for ph, r in zip(sub.inputs, inputs, strict=True)}
                sub_prefix = prefix + op.name + "/"
                start = len(self.nodes)
                if controls:  # the call waits on `controls`: make its first inlined ops wait
                    self.nodes.append(
                        Node(sub_prefix + "_control_entry", "NoOp", "free", [], controls, [])
                    )
                    inner_args_ctrl = [sub_prefix + "_control_entry"]
                else:
                    inner_args_ctrl = []
                inner = self.read(sub, sub_prefix, inner_args, depth + 1)
                if inner_args_ctrl:
                    for n in self.nodes[start + 1 :]:
                        if not n.inputs and not n.control_inputs:
                            n.control_inputs.append(inner_args_ctrl[0])
                for i, t in enumerate(op.outputs):
                    ref[t.name] = inner[sub.outputs[i].name]
                # control dependencies on the call: wait for every inlined op
                ctrl_alias[op.name] = [n.name for n in self.nodes[start:]] or controls
                continue
            attrs: dict[str, Any] = {}
            if fname is not None:
                attrs["func"] = fname
            if op.type in ("MatMul", "_FusedMatMul"):
                attrs["transpose_a"] = bool(op.get_attr("transpose_a"))
                attrs["transpose_b"] = bool(op.get_attr("transpose_b"))
            elif op.type in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
                attrs["transpose_a"] = bool(op.get_attr("adj_x"))
                attrs["transpose_b"] = bool(op.get_attr("adj_y"))
            if op.type == "Const":
                t = op.outputs[0]
                if t.shape.num_elements() is not None and t.shape.num_elements() <= 16:
                    attrs["value"] = _const_value(op)
            if op.type in ("Placeholder", "VarHandleOp") and op.outputs[0].dtype == tf.resource:
                hs = _handle_shape(op.outputs[0])
                if hs is not None:
                    attrs["variable_shape"] = hs
            outputs = [TensorInfo(_shape_of(t), _dtype_name(t)) for t in op.outputs]
            cls = "opaque" if fname is not None else classify(op.type)
            if op.type.startswith("FusedBatchNorm") and "Grad" not in op.type:
                attrs["is_training"] = bool(op.get_attr("is_training"))
                if not attrs["is_training"]:
                    cls = "elementwise"  # inference: a per-channel scale and shift
            node = Node(prefix + op.name, op.type, cls, inputs, controls, outputs, attrs)
            self.nodes.append(node)
            for i, t in enumerate(op.outputs):
                ref[t.name] = f"{node.name}:{i}"
            ctrl_alias[op.name] = [node.name]
        return ref

    @staticmethod
    def _called_function(op: tf.Operation) -> str | None:
        if op.type not in _CALLS:
            return None
        try:
            return op.get_attr("f").name
        except ValueError:
            return None

    def _function_graph(self, fname: str, call: tf.Operation) -> tf.Graph:
        fdef = self.library[fname]
        shapes = []
        for arg, t in zip(fdef.signature.input_arg, call.inputs, strict=True):
            if t.dtype == tf.resource and arg.handle_data:
                shapes.append(None)
            else:
                shapes.append(t.shape)
        return _f2g.function_def_to_graph(fdef, input_shapes=shapes)


def _library_of(graph_def: graph_pb2.GraphDef) -> dict[str, Any]:
    return {f.signature.name: f for f in graph_def.library.function}


def _attach_variable_shapes(nodes: list[Node]) -> None:
    """Records the variable shape behind each gather's resource input (``table_shape``)."""
    by_name = {n.name: n for n in nodes}
    for n in nodes:
        if n.op in ("ResourceGather", "ResourceGatherNd") and n.inputs:
            src = by_name.get(split_ref(n.inputs[0])[0])
            if src is not None and "variable_shape" in src.attrs:
                n.attrs["table_shape"] = src.attrs["variable_shape"]
        elif n.op in ("GatherV2", "Gather", "GatherNd") and n.inputs:
            src = by_name.get(split_ref(n.inputs[0])[0])
            if src is not None and src.outputs:
                shape = src.outputs[split_ref(n.inputs[0])[1]].shape
                if shape is not None:
                    n.attrs["table_shape"] = shape


def _attach_reduce_axes(nodes: list[Node]) -> None:
    """Records constant reduction axes (``axes``, normalised to >= 0 where the rank is known)."""
    by_name = {n.name: n for n in nodes}
    for n in nodes:
        if n.op not in ("Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "EuclideanNorm"):
            continue
        if len(n.inputs) < 2:
            continue
        src = by_name.get(split_ref(n.inputs[1])[0])
        # see through Identity of a constant
        while src is not None and src.op == "Identity" and src.inputs:
            src = by_name.get(split_ref(src.inputs[0])[0])
        if src is None or src.op != "Const" or src.attrs.get("value") is None:
            continue
        value = src.attrs["value"]
        axes = value if isinstance(value, list) else [value]
        in_shape = by_name[split_ref(n.inputs[0])[0]].outputs[split_ref(n.inputs[0])[1]].shape
        if in_shape is not None:
            axes = [a % len(in_shape) if len(in_shape) else a for a in axes]
            n.attrs["input_rank"] = len(in_shape)
        n.attrs["axes"] = sorted(int(a) for a in axes)


def from_tf_graph(
    graph: tf.Graph,
    outputs: list[tf.Tensor] | None = None,
    inputs: list[tf.Tensor] | None = None,
    library: dict[str, Any] | None = None,
    max_depth: int = 32,
) -> Graph:
    """The IR of a ``tf.Graph`` (a ``FuncGraph`` or an imported GraphDef), calls inlined.

    Args:
      graph: the graph.
      outputs / inputs: its result and argument tensors (default: ``graph.outputs`` /
        ``graph.inputs`` of a FuncGraph; for a plain Graph, no declared outputs).
      library: function name -> ``FunctionDef`` for the calls (default: ``graph``'s library).
      max_depth: calls nested deeper than this stay as ``opaque`` call nodes.
    """
    if library is None:
        library = _library_of(graph.as_graph_def())
    outputs = list(
        graph.outputs if outputs is None and hasattr(graph, "outputs") else outputs or []
    )
    inputs = list(graph.inputs if inputs is None and hasattr(graph, "inputs") else inputs or [])
    reader = _Reader(library, max_depth)
    ref = reader.read(graph, "", {}, 0)
    nodes = reader.nodes
    _attach_variable_shapes(nodes)
    _attach_reduce_axes(nodes)
    return Graph(
        nodes,
        inputs=[split_ref(ref[t.name])[0] for t in inputs],
        outputs=[ref[t.name] for t in outputs],
    )


def from_concrete_function(fn: Any, max_depth: int = 32) -> Graph:
    """The IR of a ``ConcreteFunction`` (e.g. ``f.get_concrete_function(...)`` or
    ``loaded.signatures["serving_default"]``), nested calls inlined."""
    graph = getattr(fn, "graph", None)
    if graph is None:
        raise TypeError(
            f"expected a ConcreteFunction (with a .graph), got {type(fn).__name__}; call "
            f"get_concrete_function(...) on a tf.function first"
        )
    return from_tf_graph(graph, max_depth=max_depth)


def from_graph_def(
    graph_def: graph_pb2.GraphDef,
    outputs: list[str] | None = None,
    max_depth: int = 32,
) -> Graph:
    """The IR of a ``GraphDef`` (e.g. a frozen serving graph), imported into a fresh graph so that
    TensorFlow infers the shapes; ``outputs`` are tensor names (``"node:0"``) to mark as results.
    """
    if not isinstance(graph_def, graph_pb2.GraphDef):
        raise TypeError(
            f"graph_def must be a tf.compat.v1.GraphDef, got {type(graph_def).__name__}"
        )
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    outs = []
    for name in outputs or []:
        node, idx = split_ref(name)
        try:
            outs.append(g.get_tensor_by_name(f"{node}:{idx}"))
        except (KeyError, ValueError):
            raise ValueError(
                f"outputs names {name!r}, which is not a tensor of the graph"
            ) from None
    args = [op.outputs[0] for op in g.get_operations() if op.type == "Placeholder"]
    return from_tf_graph(
        g, outputs=outs, inputs=args, library=_library_of(graph_def), max_depth=max_depth
    )


def from_saved_model(path: str | Path, signature: str = "serving_default") -> Graph:
    """The IR of signature ``signature`` of the SavedModel in folder ``path``.

    Raises ``FileNotFoundError`` when ``path`` holds no SavedModel and ``ValueError`` naming the
    signatures it has when ``signature`` is not one of them.
    """
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"SavedModel path {str(p)!r} is not a folder")
    if not (p / "saved_model.pb").exists() and not (p / "saved_model.pbtxt").exists():
        raise FileNotFoundError(
            f"{str(p)!r} is not a SavedModel: it has no saved_model.pb "
            f"(expected the folder `stitchrec export` or tf.saved_model.save wrote)"
        )
    loaded = tf.saved_model.load(str(p))
    sigs = dict(loaded.signatures)
    if signature not in sigs:
        raise ValueError(
            f"signature {signature!r} is not in SavedModel {str(p)!r}; it has {sorted(sigs)}"
        )
    graph = from_concrete_function(sigs[signature])
    graph.keepalive = loaded  # the functions' captured variables live as long as the IR
    return graph
