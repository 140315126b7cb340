"""The LAX partitioner: cut a captured program into subprograms the search can take.

A subprogram is a connected set of ops of the lowering table whose kernel graph is in the LAX
fragment (at most one exp on any input→output path, mirage-notes §2) and within a size budget the
search can handle.  Everything else stays in PyTorch; each compute op left there gets a one-line
notice with the reason.

The algorithm is greedy, in topological order: an op joins the union of the subprograms of its
operands if that union plus the op still lowers, stays LAX, fits the budget and creates no cycle
through PyTorch ops; otherwise the largest single such subprogram; otherwise it starts a new one;
otherwise it stays in PyTorch.  View-like ops join only the subprogram of their operand (outside
ones are free views that PyTorch runs).

Upcasts (float16/bfloat16 → float32 casts, :mod:`mirage.frontend.region`) are identities: casts of
outside tensors are read through, casts of computed values join as views.  With ``upcasts="exact"``
(the default), a finished subprogram that keeps a widened value live (a value torch holds in
float32 that the graph would store in float16) is not taken as it is: the upcasts behind that value
are kept in PyTorch, as plain casts, and the program is partitioned again.  Each round keeps more
casts, so the rounds end; the last one takes every subprogram as it stands.
``upcasts="input_precision"`` takes widened values at the inputs' precision (reductions and matrix
products still accumulate in float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from mirage.frontend.lowering import Kind, is_upcast, lower_node, lowering_of
from mirage.frontend.region import (
    NO_UPCASTS,
    InputBinding,
    OutputBinding,
    RegionBuilder,
    Unlowerable,
    Upcasts,
    Value,
    output_strides_of,
)
from mirage.mugraph.graph import KernelGraph, Node, Ref
from mirage.mugraph.ops import Op
from mirage.mugraph.text import to_text, type_text


@dataclass(frozen=True)
class Budget:
    """Limits on one subprogram."""

    max_ops: int = 16  # kernel-graph ops, inputs not counted
    max_exps_per_path: int = 1  # the LAX condition
    upcasts: str = "exact"  # one of UPCAST_MODES (module docstring)

    def __post_init__(self) -> None:
        if self.upcasts not in UPCAST_MODES:
            raise ValueError(f"upcasts must be one of {', '.join(map(repr, UPCAST_MODES))}, "
                             f"got {self.upcasts!r}")


# "exact": widened values stay in float32 (in PyTorch where a subprogram would store them narrower);
# "input_precision": widened values are held at the inputs' precision, accumulations stay float32
UPCAST_MODES = ("exact", "input_precision")


@dataclass(frozen=True)
class Subprogram:
    name: str
    nodes: tuple[str, ...]  # fx node names, in topological order
    ops: tuple[str, ...]  # their aten op names
    graph: KernelGraph  # the reference kernel graph
    inputs: tuple[InputBinding, ...]  # graph input i <- torch value
    outputs: tuple[OutputBinding, ...]  # torch value <- graph output
    online_softmax: tuple[int, ...]  # graph nodes: exps of softmaxes, for the online-softmax rewrite

    @property
    def num_ops(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op is not Op.INPUT)


@dataclass(frozen=True)
class PyTorchOp:
    """A compute op left in PyTorch."""

    node: str
    target: str
    reason: str

    def notice(self) -> str:
        return f"mirage: {self.target} ({self.node}) runs in PyTorch: {self.reason}"


@dataclass(frozen=True)
class Partition:
    subprograms: tuple[Subprogram, ...]
    pytorch_ops: tuple[PyTorchOp, ...]
    upcasts: tuple[str, ...] = ()  # upcasts of outside tensors that subprograms read through
    kept_upcasts: tuple[PyTorchOp, ...] = ()  # upcasts kept in PyTorch so that no value narrows

    def notices(self) -> list[str]:
        return [op.notice() for op in self.pytorch_ops + self.kept_upcasts]

    def summary(self) -> str:
        ops = sum(len(s.nodes) for s in self.subprograms)
        return (f"{len(self.subprograms)} subprogram(s) covering {ops} torch op(s); "
                f"{len(self.pytorch_ops)} compute op(s) left in PyTorch")

    def __str__(self) -> str:
        lines = [f"partition: {self.summary()}"]
        for s in self.subprograms:
            softmax = ", online softmax" if s.online_softmax else ""
            lines.append(f"subprogram {s.name}: {len(s.nodes)} torch ops -> {s.num_ops} kernel-graph "
                         f"ops{softmax}")
            lines.append(f"  torch ops: {', '.join(f'{n}={o}' for n, o in zip(s.nodes, s.ops, strict=True))}")
            for i, binding in enumerate(s.inputs):
                permute = f".permute{binding.permute}" if binding.permute else ""
                t = s.graph.input_types[i]
                lines.append(f"  input {i}: {binding.source}{permute} as {type_text(t)}")
            for out in s.outputs:
                expand = f" expanded to {list(out.expand)}" if out.expand else ""
                lines.append(f"  output {out.index} -> {out.node} {list(out.shape)}{expand}")
            lines += ["    " + line for line in to_text(s.graph).splitlines()]
        for op in self.pytorch_ops + self.kept_upcasts:
            lines.append(f"pytorch: {op.node} = {op.target}: {op.reason}")
        if self.upcasts:
            lines.append(f"upcasts read through: {', '.join(self.upcasts)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Lowered:
    graph: KernelGraph
    inputs: tuple[InputBinding, ...]
    outputs: tuple[OutputBinding, ...]
    online_softmax: tuple[int, ...]
    widened: frozenset[fx.Node] = frozenset()  # the upcasts behind widened values the graph keeps live


def lower_region(members: list[fx.Node], budget: Budget, name: str = "",
                 upcasts: Upcasts = NO_UPCASTS) -> Lowered:
    """The kernel graph of ``members`` (topologically ordered), holding outside tensors flat (2-D)
    or, when that fails or keeps widened values live, in their own shapes; raises Unlowerable
    (with the first reason)."""
    lowered: list[Lowered] = []
    first: Unlowerable | None = None
    for flat in (True, False):
        try:
            result = _lower_region(members, budget, name, flat, upcasts)
        except Unlowerable as error:
            first = first or error
            continue
        if not result.widened:
            return result
        lowered.append(result)
    if lowered:
        return lowered[0]
    assert first is not None
    raise first


def _lower_region(members: list[fx.Node], budget: Budget, name: str, flat: bool, upcasts: Upcasts) -> Lowered:
    builder = RegionBuilder(name, flat, upcasts)
    member_set = set(members)
    for node in members:
        lower_node(builder, node)
    outputs: list[OutputBinding] = []
    marked: dict[Ref, int] = {}
    for node in members:
        if all(user in member_set for user in node.users):
            continue
        value = builder.values[node]
        expand = None
        if value.expanded_from is not None:
            expand, value = value.shape, Value(value.tensor, value.expanded_from, value.reciprocal)
        t = builder.tensor(value)
        if t.ref not in marked:
            marked[t.ref] = len(marked)
            builder.builder.mark_output(t, strides=output_strides_of(node, t.dims))
        outputs.append(OutputBinding(node.name, marked[t.ref], value.shape, node.meta["val"].dtype, expand))
    graph, keep_inputs, renumber = prune(builder.builder.graph)
    inputs = tuple(builder.bindings[i] for i in keep_inputs)
    exps = tuple(renumber[i] for i in builder.softmax_exps if i in renumber)
    ops = sum(1 for n in graph.nodes if n.op is not Op.INPUT)
    if ops > budget.max_ops:
        raise Unlowerable(f"{ops} kernel-graph ops, over the budget of {budget.max_ops} per subprogram")
    if max_exps_on_a_path(graph) > budget.max_exps_per_path:
        raise Unlowerable(f"more than {budget.max_exps_per_path} exp on one path (outside the LAX fragment)")
    live_wide = {node for i, node in builder.widened.items() if i in renumber}
    return Lowered(graph, inputs, tuple(outputs), exps, _upcasts_behind(live_wide, builder.wide))


def _upcasts_behind(nodes: set[fx.Node], wide: set[fx.Node]) -> frozenset[fx.Node]:
    """The upcasts whose values flow into ``nodes`` through values torch holds wider (``wide``)."""
    found: set[fx.Node] = set()
    seen: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if is_upcast(node):
            found.add(node)
        else:
            stack.extend(p for p in node.all_input_nodes if p in wide or is_upcast(p))
    return frozenset(found)


def prune(graph: KernelGraph) -> tuple[KernelGraph, list[int], dict[int, int]]:
    """Drop nodes no output needs; returns the graph, the kept input positions and the renumbering."""
    live: set[int] = set()
    stack = [r.node for r in graph.outputs]
    while stack:
        i = stack.pop()
        if i not in live:
            live.add(i)
            stack.extend(r.node for r in graph.nodes[i].inputs)
    renumber: dict[int, int] = {}
    nodes: list[Node] = []
    kept_inputs: list[int] = []
    position = 0
    for i, node in enumerate(graph.nodes):
        if node.op is Op.INPUT:
            if i in live:
                kept_inputs.append(position)
            position += 1
        if i not in live:
            continue
        renumber[i] = len(nodes)
        nodes.append(Node(node.op, tuple(Ref(renumber[r.node], r.index) for r in node.inputs), node.attrs,
                          node.outputs))
    outputs = tuple(Ref(renumber[r.node], r.index) for r in graph.outputs)
    return KernelGraph(tuple(nodes), outputs, graph.name, graph.output_strides), kept_inputs, renumber


def max_exps_on_a_path(graph: KernelGraph) -> int:
    depth: list[int] = []
    for node in graph.nodes:
        before = max((depth[r.node] for r in node.inputs), default=0)
        depth.append(before + (1 if node.op is Op.EXP else 0))
    return max(depth, default=0)


def _creates_cycle(members: set[fx.Node], order: dict[fx.Node, int]) -> bool:
    """Is there a path member → outside op → member?  (The subprogram could then not run at once.)"""
    last = max(order[m] for m in members)
    stack = [u for m in members for u in m.users if u not in members]
    seen: set[fx.Node] = set()
    while stack:
        node = stack.pop()
        if node in members:
            return True
        if node in seen or order[node] > last:
            continue
        seen.add(node)
        stack.extend(node.users)
    return False


def _is_compute(node: fx.Node) -> bool:
    """An aten op producing a tensor or several (``var_mean``); asserts, shape queries, getitems and
    views, such as the slices of a merged product, are not worth a notice."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
            or node.target.is_view:
        return False
    value = node.meta.get("val")
    several = isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value)
    if several and node.target.overloadpacket.__name__ in _VIEW_LISTS:
        return False
    return (isinstance(value, torch.Tensor) or several) and not node.target.__name__.startswith("_assert")


# ops returning several views of their operands (their schemas do not say so)
_VIEW_LISTS = frozenset({"broadcast_tensors", "split", "split_with_sizes", "chunk", "unbind", "tensor_split",
                         "meshgrid"})


# ops that start with a matrix product (attention with q·kᵀ)
PRODUCTS = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "scaled_dot_product_attention"})
# compute ops a part of a product-free subprogram holds when one that no µGraph beat is split by size:
# a part's one-kernel form (its inputs, ops and outputs) then fits the block budget the search raises
# for it (frontend.optimize.MOST_BLOCK_OPS), where a chain of 16 (an AdamW step) does not
SIZE_CUT_OPS = 6


def product_cuts(gm: fx.GraphModule, subprogram: Subprogram) -> frozenset[str]:
    """Where to split a subprogram that no µGraph beat: before each matrix product that reads a value
    computed in the same subprogram (the next layer: a down projection after a gated product, a
    linear after a norm).  Where there is none, after its products: each op that reads a product's
    result (through views) starts the product's epilogue as a subprogram of its own (a residual and a
    LayerNorm after a projection, BERT's output block, whose norm needs whole rows of the product).
    Each part is a smaller search (one of no product: :func:`size_segments`)."""
    members = dict(zip(subprogram.nodes, subprogram.ops, strict=True))
    nodes = {n.name: n for n in gm.graph.nodes}
    next_layers = frozenset(name for name, op in members.items()
                            if op in PRODUCTS and any(p.name in members for p in nodes[name].all_input_nodes))
    if next_layers:
        return next_layers

    def reads_a_product(node: fx.Node) -> bool:
        for p in node.all_input_nodes:
            if p.name in members and (members[p.name] in PRODUCTS or (
                    lowering_of(p).kind is Kind.LAYOUT and reads_a_product(p))):
                return True
        return False

    return frozenset(name for name, op in members.items() if op not in PRODUCTS
                     and lowering_of(nodes[name]).kind is Kind.COMPUTE and reads_a_product(nodes[name]))


def size_segments(gm: fx.GraphModule, subprogram: Subprogram) -> dict[str, tuple[str, int]]:
    """Where to split a subprogram of no matrix product that no µGraph beat (an element-wise chain such
    as an AdamW step, or two ``log_softmax``es): its compute ops in program order, about
    :data:`SIZE_CUT_OPS` kernel-graph ops a segment (torch ops that lower to several, a
    ``log_softmax``'s five, count as their mean), each op's segment (the subprogram's name and a
    count) by name; empty where it has a product or fits one segment."""
    nodes = {n.name: n for n in gm.graph.nodes}
    if any(op in PRODUCTS for op in subprogram.ops) or subprogram.num_ops <= SIZE_CUT_OPS:
        return {}
    compute = [name for name in subprogram.nodes if lowering_of(nodes[name]).kind is Kind.COMPUTE]
    per = max(1, SIZE_CUT_OPS * len(compute) // subprogram.num_ops)  # torch ops a segment
    if len(compute) <= per:
        return {}
    return {name: (subprogram.name, k // per) for k, name in enumerate(compute)}


def partition(gm: fx.GraphModule, budget: Budget | None = None, cuts: frozenset[str] = frozenset(),
              segments: dict[str, tuple[str, int]] | None = None) -> Partition:
    """Partition a captured (aten-level) program.  ``cuts``: nodes that start a subprogram of their
    own instead of joining their operands' (:func:`product_cuts`); ``segments``: compute nodes that
    join only subprograms of the same segment (:func:`size_segments`), the others only each other's."""
    budget = budget or Budget()
    kept: frozenset[fx.Node] = frozenset()
    while True:
        part, widened = _partition(gm, budget, kept, cuts, segments or {})
        if not widened - kept:
            return part
        kept |= widened


def _partition(gm: fx.GraphModule, budget: Budget, kept: frozenset[fx.Node],
               cuts: frozenset[str] = frozenset(), segments: dict[str, tuple[str, int]] | None = None
               ) -> tuple[Partition, frozenset[fx.Node]]:
    """One round: the partition keeping the upcasts ``kept`` in PyTorch, and the upcasts behind the
    widened values its subprograms keep live (to keep in the next round; none with "exact" off)."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    region_of: dict[fx.Node, int] = {}
    regions: dict[int, list[fx.Node]] = {}
    left: list[PyTorchOp] = []
    through: list[fx.Node] = []
    upcasts = Upcasts(kept=kept)
    next_id = 0
    segment_of: dict[int, tuple[str, int] | None] = {}  # each region's segment (its first compute op's)
    for node in nodes:
        row = lowering_of(node)
        if row is None:
            if _is_compute(node):
                left.append(PyTorchOp(node.name, str(node.target), "no µGraph lowering"))
            continue
        if node not in kept and is_upcast(node) and node.args[0] not in region_of:
            through.append(node)  # read through by the subprograms of its users
            upcasts = Upcasts(frozenset(through), kept)
            continue
        candidates: list[int] = []
        for producer in node.all_input_nodes:
            if producer in region_of and region_of[producer] not in candidates:
                candidates.append(region_of[producer])
        if segments and row.kind is Kind.COMPUTE:  # a compute op joins its own segment's regions only
            candidates = [c for c in candidates if segment_of.get(c) == segments.get(node.name)]
        if row.kind is Kind.LAYOUT:  # joins the subprogram of its operand, or stays a PyTorch view
            operand = node.args[0] if node.args else None
            attempts = [[region_of[operand]]] if operand in region_of else []
        elif node.name in cuts:
            attempts = [[]]
        else:
            attempts = [candidates] if len(candidates) > 1 else []
            attempts += [[c] for c in sorted(candidates, key=lambda c: -len(regions[c]))]
            attempts.append([])
        reason = "no µGraph lowering"
        for ids in attempts:
            members = sorted([m for i in ids for m in regions[i]] + [node], key=order.__getitem__)
            if ids and _creates_cycle(set(members), order):
                reason = "joining would create a cycle through PyTorch ops"
                continue
            try:
                lower_region(members, budget, upcasts=upcasts)
            except Unlowerable as error:
                reason = error.reason
                continue
            target = min(ids) if ids else next_id
            next_id += 0 if ids else 1
            if not ids and row.kind is Kind.COMPUTE:
                segment_of[target] = (segments or {}).get(node.name)
            for i in ids:
                del regions[i]
            regions[target] = members
            for m in members:
                region_of[m] = target
            break
        else:
            if row.kind is Kind.COMPUTE:
                left.append(PyTorchOp(node.name, str(node.target), reason))
    subprograms = []
    widened: frozenset[fx.Node] = frozenset()
    for k, (_, members) in enumerate(sorted(regions.items(), key=lambda item: order[item[1][0]])):
        name = f"sp{k}"
        lowered = lower_region(members, budget, name, upcasts)
        if budget.upcasts == "exact":
            widened |= lowered.widened
        if not lowered.outputs:
            continue
        ops = tuple(lowering_of(m).op for m in members)  # type: ignore[union-attr]
        subprograms.append(Subprogram(name, tuple(m.name for m in members), ops, lowered.graph,
                                      lowered.inputs, lowered.outputs, lowered.online_softmax))
    kept_notices = tuple(PyTorchOp(n.name, str(n.target), _kept_reason(n)) for n in nodes if n in kept)
    read = tuple(n.name for n in through if any(user in region_of for user in n.users))
    return Partition(tuple(subprograms), tuple(left), read, kept_notices), widened


def _kept_reason(cast: fx.Node) -> str:
    (source,) = cast.all_input_nodes[:1]
    before, after = (str(n.meta["val"].dtype).removeprefix("torch.") for n in (source, cast))
    return (f"this {after} upcast stays in PyTorch so that its users compute in {after} as written "
            f"(upcasts='input_precision' computes them in {before} inside a subprogram)")
