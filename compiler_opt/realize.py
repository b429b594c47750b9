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
import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework import convert_to_constants
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

import compiler_opt.ir as ir
import compiler_opt.tabulate as tabulate
import compiler_opt.xy_op as xy_op
from compiler_opt.cost import Coefficients
from compiler_opt.graph_io import GraphFunction, load_graph_def, replace_nodes
from compiler_opt.loop_op import groups as loop_groups
from compiler_opt.planner import Plan, plan
from compiler_opt.row_op import groups as row_groups


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


#: readers of a variable handle that freezing turns into reads of a constant
_FOLDABLE_READERS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def _reads_handle_itself(graph_def: graph_pb2.GraphDef, placeholder: str) -> bool:
    """Whether some op reads the resource ``placeholder`` through the handle itself (not a
    variable read the converter folds), following ``Identity`` nodes and nested function
    calls into their ``FunctionDef`` bodies."""
    library = {f.signature.name: f for f in graph_def.library.function}

    def users(nodes: Any, ref_names: set[str]) -> list[tuple[Any, int]]:
        out = []
        for n in nodes:
            data = [r for r in n.input if not r.startswith("^")]
            for i, r in enumerate(data):
                if r in ref_names or (r.split(":")[0] in ref_names and r.endswith(":0")):
                    out.append((n, i))
        return out

    def walk(nodes: Any, names: set[str], depth: int) -> bool:
        if depth > 32:
            return True  # too deep to follow: keep the handle (always correct)
        for n, i in users(nodes, names):
            if n.op in _FOLDABLE_READERS:
                continue
            if n.op == "Identity":
                if walk(nodes, {n.name, f"{n.name}:output:0"}, depth + 1):
                    return True
                continue
            fn = library.get(n.attr["f"].func.name) if n.op in _CALLS else None
            if fn is None or i >= len(fn.signature.input_arg):
                return True
            if walk(fn.node_def, {fn.signature.input_arg[i].name}, depth + 1):
                return True
        return False

    return walk(graph_def.node, {placeholder}, 0)


def handles_kept(concrete_fn: Any) -> set[str]:
    """Captured variable handles that some op reads through the handle itself (a generated
    kernel of ``compiler_opt.embedding_op``, which reads its tables under the variables' locks, even
    inside nested functions): freezing must leave these as resource inputs (``Frozen.bound``)
    instead of constants."""
    resources = [p.op.name for _, p in concrete_fn.graph.captures if p.dtype == tf.resource]
    if not resources:
        return set()
    graph_def = concrete_fn.graph.as_graph_def()
    return {name for name in resources if _reads_handle_itself(graph_def, name)}


def freeze(concrete_fn: Any, *, keep_variables: bool = False) -> Frozen:
    """Variables -> constants and calls inlined, of a ``ConcreteFunction``; the handles that
    ``handles_kept`` names stay inputs, bound to the function's variables. With
    ``keep_variables`` every captured resource stays a handle (a training step: it reads the
    variables' current values and updates them), and only the calls are inlined."""
    kept = handles_kept(concrete_fn)
    if keep_variables:
        kept |= {p.op.name for _, p in concrete_fn.graph.captures if p.dtype == tf.resource}
    if kept:  # the public converter has no deny list: its data class does (TF 2.21)
        data = convert_to_constants._FunctionConverterDataInEager(
            func=concrete_fn,
            lower_control_flow=True,
            aggressive_inlining=False,
            variable_names_denylist=kept,
        )
        graph_def, converted = convert_to_constants._replace_variables_by_constants(data)
        frozen = convert_to_constants._construct_concrete_function(
            concrete_fn, graph_def, converted
        )
    else:
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
    plan: Plan
    frozen: Frozen
    tagged: graph_pb2.GraphDef
    clusters: int
    loops: int = 0  # groups run as generated loop ops (``generated_loops``)
    left: dict[int, str] = dataclasses.field(default_factory=dict)  # group -> why not generated
    tabulation: Any = None  # ``tabulate.Tabulation`` of ``generated_loops``
    matmuls: int = 0  # loop ops that took their matmul (``generated_loops``)
    rows: int = 0  # of ``loops``, the row programs with reductions (``compiler_opt.row_op``)

    @functools.cached_property
    def unfused(self) -> GraphFunction:
        """The same frozen graph without tags or generated ops (imported on first use: a
        server that only runs ``fused`` never pays for it)."""
        f = self.frozen
        return load_graph_def(f.graph_def, f.inputs, f.outputs, f.bound)


def xla_clusters(
    concrete_fn: Any,
    coefficients: Coefficients,
    batch: int,
    *,
    min_group_size: int = 2,
    keep_variables: bool = False,
    **plan_options: Any,
) -> Realized:
    """Plans ``concrete_fn`` (frozen) at ``batch`` and compiles every planned group of at least
    ``min_group_size`` kernels as one XLA cluster. Both returned callables take the function's
    inputs flattened (``tf.nest.flatten(args, expand_composites=True)``).

    ``keep_variables``: every variable stays a handle (``freeze``), for a training step: the
    realized step reads the variables and updates them as the traced one does (its planned
    groups are the training realization of jit_compile sub-functions: each group one compiled
    cluster, its gradient and optimizer arithmetic included)."""
    frozen = freeze(concrete_fn, keep_variables=keep_variables)
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    p = plan(graph, coefficients, batch, **plan_options)
    keep = {
        node: gid for node, gid in p.group_of.items() if len(p.groups[gid].nodes) >= min_group_size
    }
    assignment = cluster_assignment(graph, keep)
    tagged = tag_clusters(frozen.graph_def, assignment)
    return Realized(
        fused=load_graph_def(tagged, frozen.inputs, frozen.outputs, frozen.bound),
        plan=p,
        frozen=frozen,
        tagged=tagged,
        clusters=len(set(keep.values())),
    )


class TrainingStep:
    """A training step (a ``tf.function`` with an input signature that updates variables) run
    with its planned groups as XLA clusters: ``xla_clusters(..., keep_variables=True)``, the
    training realization. Called like the step; returns its outputs (e.g. the loss).

    The step is traced, inlined (every variable a handle) and planned at ``batch`` once; the
    realized graph reads and updates the same variables (a checkpoint restore assigns into
    them), so it can replace the step in a training loop. Whether the clusters beat the inlined
    step without them depends on the device (XLA:CPU's launches and loops against TensorFlow's
    kernels), so it is measured, as the serving warm-up does: the first
    ``2 * (warmup_steps + trial_steps)`` calls alternate between the two (both are real, equal
    training steps), the first ``warmup_steps`` of each untimed (TensorFlow compiles a cluster
    after some calls), and the faster median is kept (``choice``, ``timings_ms``);
    ``trial_steps=0`` keeps the clusters without trial. A batch of another size compiles the
    clusters for that size once (an epoch's last, smaller batch)."""

    def __init__(
        self,
        step_fn: Any,
        coefficients: Coefficients,
        batch: int,
        *,
        trial_steps: int = 3,
        warmup_steps: int = 3,
        min_group_size: int = 2,
        **plan_options: Any,
    ):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if getattr(step_fn, "input_signature", None) is None:
            raise ValueError(
                f"TrainingStep needs a tf.function with an input_signature (one trace), got "
                f"{step_fn!r}"
            )
        if trial_steps < 0 or warmup_steps < 0:
            raise ValueError(
                f"trial_steps and warmup_steps must be >= 0, got {trial_steps}, {warmup_steps}"
            )
        concrete = step_fn.get_concrete_function()
        self.realized = xla_clusters(
            concrete,
            coefficients,
            batch,
            min_group_size=min_group_size,
            keep_variables=True,
            **plan_options,
        )
        self._outputs = concrete.structured_outputs
        self.clusters = self.realized.clusters
        self.trial_steps, self.warmup_steps = trial_steps, warmup_steps
        if not self.clusters:
            self.choice = "inlined"  # nothing planned: the inlined step as it is
        else:
            self.choice = "" if trial_steps else "clusters"  # "": to be measured
        self._times: dict[str, list[float]] = {"clusters": [], "inlined": []}
        self._calls = 0

    def _step(self, name: str) -> Any:
        return self.realized.fused if name == "clusters" else self.realized.unfused

    @property
    def timings_ms(self) -> dict[str, float]:
        """Median milliseconds per trial step of each candidate (empty before the trial)."""
        return {n: 1e3 * float(np.median(t)) for n, t in self._times.items() if t}

    def __call__(self, *args: Any) -> Any:
        flat = tf.nest.flatten(args, expand_composites=True)
        if self.choice:
            out = self._step(self.choice)(*flat)
        else:
            name = ("clusters", "inlined")[self._calls % 2]
            t0 = time.perf_counter()
            out = self._step(name)(*flat)
            for t in out:
                t.numpy()
            if self._calls >= 2 * self.warmup_steps:  # compilation, allocations
                self._times[name].append(time.perf_counter() - t0)
            self._calls += 1
            if all(len(t) >= self.trial_steps for t in self._times.values()):
                timings = self.timings_ms
                self.choice = min(timings, key=timings.get)
        return tf.nest.pack_sequence_as(self._outputs, list(out))


#: activations TensorFlow's CPU and GPU ``_FusedMatMul`` kernels run after the bias
_FOLDABLE_ACTIVATIONS = ("Relu", "Relu6", "Elu")


def fold_epilogues(
    graph_def: graph_pb2.GraphDef, epilogues: dict[str, str], outputs: Sequence[str]
) -> tuple[graph_pb2.GraphDef, list[str]]:
    """A copy of ``graph_def`` where each ``MatMul`` with its planned epilogue
    (``Plan.epilogues``: ``BiasAdd`` [+ ``Relu`` / ``Relu6`` / ``Elu``]) is one ``_FusedMatMul``
    node, and ``outputs`` renamed accordingly. The planner leaves epilogues to the matmul
    because Grappler's remapper folds them in a traced graph; in a frozen serving graph on
    oneDNN it does not (the ``Relu`` runs apart), so the realization folds them itself.
    Other activations (and ``Conv2D``) stay as they are."""
    by = {n.name: n for n in graph_def.node}
    chains: dict[str, list[str]] = {}
    for node, matmul in epilogues.items():
        if by.get(matmul) is not None and by[matmul].op == "MatMul" and node in by:
            chains.setdefault(matmul, []).append(node)
    new_nodes = []
    removed: dict[str, str] = {}  # matmul and epilogue nodes -> the fused node
    tensors: dict[str, str] = {}  # the last epilogue node's result -> the fused node's
    for matmul, nodes in chains.items():
        nodes.sort(key=lambda n: by[n].op != "BiasAdd")  # the bias first
        bias = by[nodes[0]]
        if bias.op != "BiasAdd":
            continue
        if len(nodes) > 1 and by[nodes[1]].op not in _FOLDABLE_ACTIVATIONS:
            nodes = nodes[:1]
        m, last = by[matmul], by[nodes[-1]]
        fused = node_def_pb2.NodeDef(name=f"{last.name}/stitch_fused_matmul", op="_FusedMatMul")
        fused.input.extend([m.input[0], m.input[1], bias.input[1]])
        fused.input.extend(i for i in m.input if i.startswith("^"))
        for key in ("T", "transpose_a", "transpose_b"):
            fused.attr[key].CopyFrom(m.attr[key])
        fused.attr["num_args"].CopyFrom(attr_value_pb2.AttrValue(i=1))
        ops = [by[n].op.encode() for n in nodes]
        fused.attr["fused_ops"].CopyFrom(
            attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=ops))
        )
        new_nodes.append(fused)
        removed.update(dict.fromkeys([matmul, *nodes], fused.name))
        tensors[f"{last.name}:0"] = f"{fused.name}:0"
    return replace_nodes(graph_def, new_nodes, removed, tensors, outputs)


def tabulated(frozen: Frozen) -> tuple[Frozen, Any]:
    """``frozen`` with the generated embedding op's per-id masks as constant tables over their
    id domain (``compiler_opt.tabulate``), and the ``Tabulation`` report."""
    graph_def, report = tabulate.tabulate_masks(
        frozen.graph_def, frozen.outputs, keep=tuple(frozen.inputs)
    )
    return (dataclasses.replace(frozen, graph_def=graph_def) if report.tables else frozen), report


@dataclasses.dataclass
class LoopPlan:
    """A frozen graph planned for generated loop ops (``plan_loops``): ``loops`` the planned
    ``loop`` groups ``compiler_opt.loop_op`` can express (``xy_op.LoopGroup``), ``left`` why the
    other loop groups cannot (group id -> reason), ``rest`` the nodes of every planned group
    not generated (node -> group id)."""

    frozen: Frozen
    graph: ir.Graph
    plan: Plan
    loops: list[Any]
    left: dict[int, str]
    rest: dict[str, int]
    matmuls: int = 0  # loop ops that took the matmul feeding them (``attach_matmuls``)


def plan_loops(
    frozen: Frozen,
    coefficients: Coefficients,
    batch: int,
    *,
    min_group_size: int = 2,
    matmuls: bool = True,
    rows: bool = True,
    **plan_options: Any,
) -> LoopPlan:
    """Plans ``frozen`` at ``batch`` and sorts its groups into generated loop ops and the rest
    (no compiler needed: ``stitchrec fuse explain`` prints it); with ``matmuls`` a loop op
    also takes the matmul that feeds it (``loop_groups.attach_matmuls``); with ``rows`` the
    groups with reductions, and such pieces of other groups, become row programs
    (``compiler_opt.row_op``)."""
    graph = ir.from_graph_def(frozen.graph_def, outputs=frozen.outputs)
    p = plan(graph, coefficients, batch, **plan_options)
    loops, left, rest = [], {}, {}
    for g in p.groups:
        if len(g.nodes) < min_group_size:
            continue
        if g.kind in ("loop", "input", "stitch"):
            # a loop group as a loop op; reductions (and a loop group over mixed row shapes)
            # as a row program
            group, reason = (
                loop_groups.loop_spec(graph, g.nodes, frozen.outputs)
                if g.kind == "loop"
                else (None, "")
            )
            if group is None and rows:
                group, row_reason = row_groups.row_spec(graph, g.nodes, frozen.outputs)
                reason = reason or row_reason
            if group is not None:
                loops.append(group)
                continue
            left[g.id] = reason
        # what cannot be generated whole may hold row programs (the FM term in a concat
        # group with the lookups): those pieces are generated, the rest stays as planned
        pieces = (
            row_groups.expressible_parts(graph, g.nodes, frozen.outputs, min_group_size)
            if rows and g.kind != "horizontal-gather"
            else []
        )
        loops += pieces
        taken = {n for piece in pieces for n in piece.nodes}
        if pieces:
            left[g.id] = (
                f"{left.get(g.id) or 'not generated whole'}; {len(pieces)} part(s) generated"
            )
        rest.update({n: g.id for n in g.nodes if n not in taken})
    attached = 0
    if matmuls:
        loops, attached = loop_groups.attach_matmuls(graph, frozen.graph_def, loops, frozen.outputs)
    return LoopPlan(frozen, graph, p, loops, left, rest, attached)


def generated_loops(
    concrete_fn: Any,
    coefficients: Coefficients,
    batch: int,
    *,
    frozen: Frozen | None = None,
    xla_rest: bool = False,
    min_group_size: int = 2,
    tabulate_masks: bool = True,
    matmuls: bool = True,
    rows: bool = True,
    **plan_options: Any,
) -> Realized:
    """Plans ``concrete_fn`` (frozen; ``frozen`` when the caller has frozen it already) at
    ``batch`` and runs every planned ``loop`` group that ``loop_groups.loop_spec`` can express
    as one generated C++ op (``plan_loops``, ``compiler_opt.loop_op``); with ``xla_rest`` the other
    planned groups become XLA clusters, as in ``xla_clusters``. The matmul epilogues the plan
    left out of its groups are folded into ``_FusedMatMul`` nodes (``fold_epilogues``).
    ``Realized.loops`` counts the generated ops, ``Realized.left`` says why a loop group was
    not generated. With ``tabulate_masks`` the per-id masks the generated embedding op reads
    become constant tables first (``compiler_opt.tabulate``; ``Realized.tabulation``). With
    ``matmuls`` a loop op takes the matmul feeding it (``loop_groups.attach_matmuls``;
    ``Realized.matmuls``); with ``rows`` the row programs (``compiler_opt.row_op``; ``Realized.rows``).
    Raises ``toolchain.CompilerUnavailable`` without a compiler."""
    frozen = frozen if frozen is not None else freeze(concrete_fn)
    original, tabulation = frozen, None
    if tabulate_masks:
        frozen, tabulation = tabulated(frozen)
    lp = plan_loops(
        frozen,
        coefficients,
        batch,
        min_group_size=min_group_size,
        matmuls=matmuls,
        rows=rows,
        **plan_options,
    )
    graph, p, loops, left, rest = lp.graph, lp.plan, lp.loops, lp.left, lp.rest
    graph_def, outputs = xy_op.rewrite(frozen.graph_def, loops, frozen.outputs)
    if p.epilogues:  # make the planner's assumption true: each matmul runs its epilogue
        graph_def, outputs = fold_epilogues(graph_def, p.epilogues, outputs)
    tagged = graph_def
    clusters = 0
    if xla_rest and rest:
        tagged = tag_clusters(graph_def, cluster_assignment(graph, rest))
        clusters = len(set(rest.values()))
    return Realized(
        fused=load_graph_def(tagged, frozen.inputs, outputs, frozen.bound),
        plan=p,
        frozen=original,
        tagged=tagged,
        clusters=clusters,
        loops=len(loops),
        left=left,
        tabulation=tabulation,
        matmuls=lp.matmuls,
        rows=sum(g.kind is row_groups.ROW for g in loops),
    )
