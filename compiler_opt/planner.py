"""The fusion planner: groups the memory-bound ops of an IR graph into few large kernels.

In the spirit of FusionStitching and BladeDISC's greedy fusion, over the kernel nodes whose
class is in ``FUSIBLE_CLASSES`` (elementwise, broadcast, reduce, gather, concat; never matmul
or opaque). Free nodes (``Identity``, ``Reshape``...) and sources (arguments, constants,
variable reads) are transparent: dependencies are taken through them.

1. **Vertical** (producer -> consumer), in rounds: every edge between two fusible groups is a
   candidate; candidates are tried by estimated gain, largest first, each group at most once
   per round; rounds repeat until none merges. This fuses elementwise chains, broadcasts into
   their consumers, index computations into gathers, gathers into masks and pools, and
   **stitches across reductions**: a row reduction (over trailing axes only: LayerNorm's and
   softmax's mean / max, a per-example segment pool) may have consumers inside its group; a
   reduction over the batch axis (BatchNorm statistics in training, bias gradients, full
   reductions) or over unknown axes may only be a group's output (an *input* fusion), since a
   consumer inside would need a grid-wide barrier.
2. **Horizontal** (siblings): groups that hold gathers from tables and have no path between
   them (lookups of many tables, as in the wide part or the backward pass) are merged first-fit
   in topological order: one launch instead of many.

Every merge must:

* keep the group graph acyclic: no path from one group to the other through a third group;
* respect the resource limit: distinct kernel arguments (inputs read from outside + outputs
  used outside; small constants are inlined) at most ``max_args`` (64, as BladeDISC);
* improve the calibrated estimate: ``time(A + B) < time(A) + time(B)`` (``cost.CostModel``).

The result is a ``Plan``: groups with their kind (``loop``, ``input`` (reduction as output),
``stitch`` (row reduction with consumers inside), ``horizontal-gather``, ``concat`` (gathers
... concat in one kernel)), members, and estimated launches / bytes / time before (each node
alone) and after (the group as one kernel).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from compiler_opt.cost import Coefficients, CostModel, GroupCost
from compiler_opt.ir import Graph, Node, split_ref
from compiler_opt.op_classes import FUSIBLE_CLASSES, SEGMENT_REDUCTIONS

_AXIS_REDUCTIONS = frozenset(
    {"Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "EuclideanNorm", "All", "Any"}
)
_ROW_REDUCTIONS = frozenset({"Softmax", "LogSoftmax"}) | SEGMENT_REDUCTIONS
#: ops whose output TensorFlow's grappler remapper folds a following BiasAdd (+ activation) into
_EPILOGUE_HOSTS = frozenset({"MatMul", "Conv2D"})
#: activations the remapper folds after MatMul + BiasAdd (CPU oneDNN and GPU cuBLASLt)
_EPILOGUE_ACTIVATIONS = frozenset(
    {"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Gelu", "Softplus"}
)
GROUP_KINDS = ("loop", "input", "stitch", "horizontal-gather", "concat")


def reduction_kind(node: Node) -> str:
    """``row`` (reduces trailing axes only: one result per example), ``column`` (reduces the
    batch axis, or everything) or ``unknown`` (axes not constant); ``""`` for a non-reduction."""
    if node.op_class != "reduce":
        return ""
    if node.op in _ROW_REDUCTIONS:
        return "row"
    if node.op in _AXIS_REDUCTIONS:
        axes = node.attrs.get("axes")
        rank = node.attrs.get("input_rank")
        if axes is None or rank is None:
            return "unknown"
        if rank >= 2 and axes and 0 not in axes:
            return "row"
        return "column"
    return "column"  # FusedBatchNorm (training), BiasAddGrad, L2Loss, segment gradients...


@dataclasses.dataclass
class Group:
    """One planned kernel: ``nodes`` (kernel nodes, topological order), ``kind`` and costs."""

    id: int
    kind: str
    nodes: list[str]
    before: GroupCost
    after: GroupCost

    def to_dict(self, graph: Graph) -> dict[str, Any]:
        ops: dict[str, int] = {}
        for n in self.nodes:
            ops[graph[n].op] = ops.get(graph[n].op, 0) + 1
        return {
            "id": self.id,
            "kind": self.kind,
            "size": len(self.nodes),
            "ops": ops,
            "nodes": self.nodes,
            "launches_before": self.before.launches,
            "launches_after": self.after.launches,
            "bytes_before": self.before.bytes,
            "bytes_after": self.after.bytes,
            "time_before_s": self.before.time_s,
            "time_after_s": self.after.time_s,
            "arguments": self.after.arguments,
        }


@dataclasses.dataclass
class Plan:
    """A fusion plan of ``graph`` at ``batch``.

    ``groups``: fused groups of two or more kernels, largest saving first. ``unfused`` /
    ``fused``: the whole graph's cost with every kernel alone / under the plan (non-fusible and
    unfused kernels alone). ``memory_bound_before`` / ``_after``: the same over fusible kernels
    only. ``rejected``: merges refused, by reason. ``epilogues``: ``{node: matmul}`` left to the
    matmuls they follow (``runtime_epilogues``).
    """

    graph: Graph
    batch: int
    coefficients: Coefficients
    groups: list[Group]
    unfused: GroupCost
    fused: GroupCost
    memory_bound_before: GroupCost
    memory_bound_after: GroupCost
    kernels_total: int
    kernels_fusible: int
    rejected: dict[str, int]
    group_of: dict[str, int]
    epilogues: dict[str, str] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Totals as a JSON-able dict."""
        kinds: dict[str, int] = {}
        for g in self.groups:
            kinds[g.kind] = kinds.get(g.kind, 0) + 1
        return {
            "batch": self.batch,
            "device": self.coefficients.device,
            "nodes": len(self.graph),
            "kernels": self.kernels_total,
            "fusible_kernels": self.kernels_fusible,
            "groups": len(self.groups),
            "group_kinds": kinds,
            "launches_before": self.unfused.launches,
            "launches_after": self.fused.launches,
            "bytes_before": self.unfused.bytes,
            "bytes_after": self.fused.bytes,
            "bytes_per_example_before": self.unfused.bytes / self.batch,
            "bytes_per_example_after": self.fused.bytes / self.batch,
            "time_before_s": self.unfused.time_s,
            "time_after_s": self.fused.time_s,
            "memory_bound_launches_before": self.memory_bound_before.launches,
            "memory_bound_launches_after": self.memory_bound_after.launches,
            "memory_bound_bytes_before": self.memory_bound_before.bytes,
            "memory_bound_bytes_after": self.memory_bound_after.bytes,
            "memory_bound_time_before_s": self.memory_bound_before.time_s,
            "memory_bound_time_after_s": self.memory_bound_after.time_s,
            "rejected": dict(self.rejected),
            "matmul_epilogues": len(self.epilogues),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "coefficients": dataclasses.asdict(self.coefficients),
            "groups": [g.to_dict(self.graph) for g in self.groups],
        }

    def to_text(self, max_groups: int = 30, max_ops: int = 6) -> str:
        """A human-readable table of the groups and totals."""
        s = self.summary()
        lines = [
            f"fusion plan at batch {self.batch} on {self.coefficients.device}: "
            f"{s['nodes']} nodes, {s['kernels']} kernels ({s['fusible_kernels']} memory-bound)",
            f"{'group':>5} {'kind':<17} {'ops':>4} {'launches':>11} {'KB before':>10} "
            f"{'KB after':>9} {'saved us':>9}  main ops",
        ]
        for g in self.groups[:max_groups]:
            ops: dict[str, int] = {}
            for n in g.nodes:
                ops[self.graph[n].op] = ops.get(self.graph[n].op, 0) + 1
            top = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:max_ops]
            lines.append(
                f"{g.id:>5} {g.kind:<17} {len(g.nodes):>4} "
                f"{g.before.launches:>5} -> {g.after.launches:<2} "
                f"{g.before.bytes / 1024:>10.1f} {g.after.bytes / 1024:>9.1f} "
                f"{(g.before.time_s - g.after.time_s) * 1e6:>9.1f}  "
                + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in top)
            )
        if len(self.groups) > max_groups:
            lines.append(f"  ... {len(self.groups) - max_groups} more group(s)")
        lines += [
            "totals (whole graph, each kernel alone -> planned):",
            f"  kernel launches  {s['launches_before']:>10} -> {s['launches_after']}"
            f"  (saved {s['launches_before'] - s['launches_after']})",
            f"  bytes moved      {s['bytes_before'] / 1e6:>10.3f} MB -> "
            f"{s['bytes_after'] / 1e6:.3f} MB  ({s['bytes_per_example_before']:.0f} -> "
            f"{s['bytes_per_example_after']:.0f} B/example)",
            f"  estimated time   {s['time_before_s'] * 1e3:>10.3f} ms -> "
            f"{s['time_after_s'] * 1e3:.3f} ms",
            f"  memory-bound part: {s['memory_bound_launches_before']} -> "
            f"{s['memory_bound_launches_after']} launches, "
            f"{s['memory_bound_bytes_before'] / 1e6:.3f} -> "
            f"{s['memory_bound_bytes_after'] / 1e6:.3f} MB, "
            f"{s['memory_bound_time_before_s'] * 1e3:.3f} -> "
            f"{s['memory_bound_time_after_s'] * 1e3:.3f} ms",
        ]
        if self.rejected:
            lines.append(
                "  merges refused: "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items()))
            )
        return "\n".join(lines)


class _State:
    """Groups of kernel nodes with a group-level dependency graph."""

    def __init__(self, graph: Graph, model: CostModel, fusible: set[str]):
        self.graph = graph
        self.model = model
        kernels = [n for n in graph.nodes.values() if model.is_kernel(n)]
        self.order = {n.name: i for i, n in enumerate(kernels)}
        self.group_of = {n.name: i for i, n in enumerate(kernels)}
        self.members: dict[int, list[str]] = {i: [n.name] for i, n in enumerate(kernels)}
        self.fusible = {self.group_of[n] for n in fusible}
        self.horizontal: set[int] = set()
        self.succ: dict[int, set[int]] = {i: set() for i in self.members}
        self.pred: dict[int, set[int]] = {i: set() for i in self.members}
        self._cost: dict[int, GroupCost] = {}
        frontier: dict[str, set[str]] = {}  # node -> nearest kernel ancestors (itself if kernel)
        for n in graph.nodes.values():
            deps: set[str] = set()
            for p in graph.producers(n.name):
                deps |= frontier[p]
            if model.is_kernel(n):
                g = self.group_of[n.name]
                for d in deps:
                    dg = self.group_of[d]
                    self.succ[dg].add(g)
                    self.pred[g].add(dg)
                frontier[n.name] = {n.name}
            else:
                frontier[n.name] = deps
        # direct data edges between kernels (through free / source nodes), for vertical merges
        self.edges: list[tuple[str, str]] = []
        for n in kernels:
            for p in graph.producers(n.name):
                for d in frontier[p]:
                    self.edges.append((d, n.name))

    def cost(self, g: int) -> GroupCost:
        if g not in self._cost:
            self._cost[g] = self.model.group_cost(self.members[g])
        return self._cost[g]

    def creates_cycle(self, a: int, b: int) -> bool:
        """True when some path leaves {a, b} and comes back: merging would make a cycle."""
        stack = [g for g in (self.succ[a] | self.succ[b]) if g not in (a, b)]
        seen = set(stack)
        while stack:
            g = stack.pop()
            for s in self.succ[g]:
                if s in (a, b):
                    return True
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def reaches(self, a: int, b: int) -> bool:
        """A path from group a to group b."""
        stack, seen = [a], {a}
        while stack:
            g = stack.pop()
            for s in self.succ[g]:
                if s == b:
                    return True
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def merge(self, a: int, b: int) -> int:
        for s in self.succ.pop(b):
            self.pred[s].discard(b)
            if s != a:
                self.pred[s].add(a)
                self.succ[a].add(s)
        for p in self.pred.pop(b):
            self.succ[p].discard(b)
            if p != a:
                self.succ[p].add(a)
                self.pred[a].add(p)
        self.succ[a].discard(a)
        self.pred[a].discard(a)
        for n in self.members[b]:
            self.group_of[n] = a
        self.members[a] = sorted(self.members[a] + self.members.pop(b), key=self.order.get)
        self.fusible.discard(b)
        if b in self.horizontal:
            self.horizontal.add(a)
            self.horizontal.discard(b)
        self._cost.pop(a, None)
        self._cost.pop(b, None)
        return a


def _reductions_ok(graph: Graph, model: CostModel, members: Iterable[str]) -> bool:
    """A non-row reduction may not have a consumer inside its group."""
    inside = set(members)
    for m in inside:
        node = graph[m]
        if node.op_class != "reduce" or reduction_kind(node) == "row":
            continue
        for i in range(len(node.outputs)):
            if model.users(f"{m}:{i}") & inside:
                return False
    return True


def runtime_epilogues(graph: Graph) -> dict[str, str]:
    """``{node: matmul}``: the ``BiasAdd`` (and the activation after it) that TensorFlow's
    grappler remapper already folds into the ``MatMul`` / ``Conv2D`` they follow
    (``_FusedMatMul`` / ``_MklNativeFusedMatMul`` run them in the matmul's epilogue, with no
    launch and no pass over memory of their own). Pattern, each link the only reader of the one
    before: ``MatMul -> BiasAdd [-> activation]``.

    The planner leaves these nodes out of its groups: taking the ``BiasAdd`` of a cross layer's
    ``x0 * (W x + b) + x`` into a fused ``mul + add`` group would cost the matmul its free
    epilogue and add the bias's pass to the group (measured on DCN-v2 on CPU: the planned XLA
    clusters ran 0.91x the unfused graph until this rule, docs/compiler_opt.md).
    """
    out: dict[str, str] = {}

    def only_reader(name: str) -> Node | None:  # data readers: control waits do not count
        readers = [
            c
            for c in graph.consumers(name)
            if any(split_ref(r)[0] == name for r in graph[c].inputs)
        ]
        return graph[readers[0]] if len(readers) == 1 else None

    for n in graph.nodes.values():
        if n.op not in _EPILOGUE_HOSTS:
            continue
        bias = only_reader(n.name)
        if bias is None or bias.op != "BiasAdd" or split_ref(bias.inputs[0])[0] != n.name:
            continue
        out[bias.name] = n.name
        act = only_reader(bias.name)
        if act is not None and act.op in _EPILOGUE_ACTIVATIONS:
            out[act.name] = n.name
    return out


def _fusible_node(node: Node) -> bool:
    if node.op_class not in FUSIBLE_CLASSES:
        return False
    # string tensors are never in a generated kernel
    return all(t.dtype != "string" for t in node.outputs)


def _kind(graph: Graph, model: CostModel, members: list[str], horizontal: bool) -> str:
    ops = [graph[m] for m in members]
    gathers = sum(n.op_class == "gather" for n in ops)
    concats = sum(n.op_class == "concat" and n.op != "ConcatOffset" for n in ops)
    inside = set(members)
    stitched = False
    reduce_out = False
    for n in ops:
        if n.op_class != "reduce":
            continue
        used_inside = any(model.users(f"{n.name}:{i}") & inside for i in range(len(n.outputs)))
        stitched |= used_inside
        reduce_out |= not used_inside
    if gathers and concats:
        return "concat"
    if horizontal and gathers >= 2:
        return "horizontal-gather"
    if stitched:
        return "stitch"
    if reduce_out:
        return "input"
    return "loop"


def plan(
    graph: Graph,
    coefficients: Coefficients,
    batch: int,
    *,
    unknown_dim: int = 1,
    max_args: int = 64,
    vertical: bool = True,
    horizontal: bool = True,
    stitch: bool = True,
    epilogues: bool = True,
) -> Plan:
    """Plans the fusion of ``graph``'s memory-bound ops at ``batch`` examples per step.

    Args:
      graph: the IR (``ir.from_concrete_function`` ...).
      coefficients: the device's cost coefficients (``cost.load_or_calibrate``).
      batch: size of the first unknown dimension of every tensor.
      unknown_dim: size of later unknown dimensions.
      max_args: most kernel arguments of one group (inputs + outputs).
      vertical / horizontal / stitch: switch the merge kinds (stitch off: no reduction may
        have a consumer inside its group).
      epilogues: leave the matmuls' runtime epilogues (``runtime_epilogues``) out of the groups.
    """
    if max_args < 2:
        raise ValueError(f"max_args must be >= 2 (one input, one output), got {max_args}")
    model = CostModel(graph, coefficients, batch, unknown_dim)
    absorbed = runtime_epilogues(graph) if epilogues else {}
    fusible = {
        n.name
        for n in graph.nodes.values()
        if model.is_kernel(n) and _fusible_node(n) and n.name not in absorbed
    }
    merger = _Merger(_State(graph, model, fusible), max_args, stitch)
    if vertical:
        _merge_vertical(merger)
    if horizontal:
        _merge_horizontal(merger)
    return _plan_of(merger, batch, coefficients, len(fusible), absorbed)


@dataclasses.dataclass
class _Merger:
    """Merges of two groups under the planner's rules (see module doc), counting refusals."""

    st: _State
    max_args: int
    stitch: bool
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)

    def _refuse(self, reason: str) -> bool:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return False

    def try_merge(self, a: int, b: int, is_horizontal: bool) -> bool:
        """Merges groups ``a`` and ``b`` when every rule allows it; True when merged."""
        st, graph, model = self.st, self.st.graph, self.st.model
        members = st.members[a] + st.members[b]
        stitch_ok = _reductions_ok if self.stitch else _no_inner_reduce_use
        if not stitch_ok(graph, model, members) or not _reductions_ok(graph, model, members):
            return self._refuse("reduction")
        merged = model.group_cost(members)
        if merged.arguments > self.max_args:
            return self._refuse("max_args")
        if merged.time_s >= st.cost(a).time_s + st.cost(b).time_s:
            return self._refuse("no_gain")
        if st.creates_cycle(a, b):
            return self._refuse("cycle")
        g = st.merge(a, b)
        if is_horizontal:
            st.horizontal.add(g)
        return True


def _merge_vertical(merger: _Merger) -> None:
    """Producer -> consumer merges in rounds, largest estimated gain first, each group at most
    once per round, until a round merges nothing."""
    st, model = merger.st, merger.st.model
    while True:
        cands: list[tuple[float, int, int]] = []
        seen: set[tuple[int, int]] = set()
        for u, v in st.edges:
            a, b = st.group_of[u], st.group_of[v]
            if a == b or a not in st.fusible or b not in st.fusible or (a, b) in seen:
                continue
            seen.add((a, b))
            merged = model.group_cost(st.members[a] + st.members[b])
            gain = st.cost(a).time_s + st.cost(b).time_s - merged.time_s
            cands.append((gain, a, b))
        cands.sort(key=lambda c: -c[0])
        touched: set[int] = set()
        merged_any = False
        for _, a, b in cands:
            if a in touched or b in touched:
                continue
            if merger.try_merge(a, b, False):
                touched.update((a, b))
                merged_any = True
        if not merged_any:
            return


def _merge_horizontal(merger: _Merger) -> None:
    """First-fit merges, in topological order, of gather groups with no path between them."""
    st, graph = merger.st, merger.st.graph
    gather_groups = sorted(
        (g for g in st.fusible if any(graph[m].op_class == "gather" for m in st.members[g])),
        key=lambda g: st.order[st.members[g][0]],
    )
    open_groups: list[int] = []
    for g in gather_groups:
        placed = False
        for h in open_groups:
            if h not in st.members or st.reaches(h, g) or st.reaches(g, h):
                continue
            if merger.try_merge(h, g, True):
                placed = True
                break
        if not placed:
            open_groups.append(g)


def _plan_of(
    merger: _Merger,
    batch: int,
    coefficients: Coefficients,
    kernels_fusible: int,
    absorbed: dict[str, str],
) -> Plan:
    """The ``Plan`` of the merged groups: the fused ones of two or more kernels, largest
    saving first, and the totals."""
    st, graph, model = merger.st, merger.st.graph, merger.st.model
    groups: list[Group] = []
    mb_before = GroupCost()
    mb_after = GroupCost()
    fused_total = GroupCost()
    for g, members in st.members.items():
        after = st.cost(g)
        fused_total = fused_total + after
        if g not in st.fusible:
            continue
        before = GroupCost()
        for m in members:
            before = before + model.node_cost(m)
        mb_before = mb_before + before
        mb_after = mb_after + after
        if len(members) >= 2:
            kind = _kind(graph, model, members, g in st.horizontal)
            groups.append(Group(-1, kind, members, before, after))
    groups.sort(key=lambda grp: -(grp.before.time_s - grp.after.time_s))
    group_of: dict[str, int] = {}
    for i, grp in enumerate(groups):
        grp.id = i
        for m in grp.nodes:
            group_of[m] = i
    return Plan(
        graph=graph,
        batch=batch,
        coefficients=coefficients,
        groups=groups,
        unfused=model.unfused(),
        fused=fused_total,
        memory_bound_before=mb_before,
        memory_bound_after=mb_after,
        kernels_total=len(st.order),
        kernels_fusible=kernels_fusible,
        rejected=merger.rejected,
        group_of=group_of,
        epilogues=absorbed,
    )


def _no_inner_reduce_use(graph: Graph, model: CostModel, members: Iterable[str]) -> bool:
    inside = set(members)
    for m in inside:
        node = graph[m]
        if node.op_class == "reduce":
            for i in range(len(node.outputs)):
                if model.users(f"{m}:{i}") & inside:
                    return False
    return True


__all__ = ["GROUP_KINDS", "Group", "Plan", "plan", "reduction_kind", "runtime_epilogues"]
