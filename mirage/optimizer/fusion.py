"""Thread-graph fusion: chains (and trees) of element-wise block ops become one ``FUSED`` node.

The rule is Mirage's ``resolve_tb_fusion`` (mirage-notes §5.4), generalised to binary ops:

* an element-wise op joins the group of the element-wise op that produces one of its operands when
  that operand has no other reader (so no intermediate of a group is needed outside it);
* the other operands of a binary op are read as extra inputs of the group: they are produced by
  earlier nodes, so they are available when the group runs;
* a group's ops all run before the accumulators or all after them (binary ops require operands on
  the same side of the for-loop, unary ops keep the side), so a group has one place in the schedule.

Each group becomes one ``FUSED`` node at the position of its last op; its attribute is a
:class:`~mirage.mugraph.graph.ThreadGraph` whose ``INPUT`` nodes (``ThreadInput(k)``) stand for the
node's k-th operand and whose single output is the group's result.  Intermediates live in registers
and never touch shared memory.  Single element-wise ops are wrapped too (``wrap_single=True``), so
the code generator sees one kind of element-wise node.

Mirage also applies such chains as the epilogue of a matmul or reduction (no shared-memory round
trip between the two); that decision depends on the schedule and is made in
:mod:`mirage.optimizer.schedule`.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> X = g.new_input(dims=(4, 8), dtype=mi.float16)
>>> tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=1)
>>> x = tb.new_input(X)
>>> tb.new_output(tb.forloop_accum(tb.sqrt(tb.mul_scalar(tb.exp(x), 2.0))))
>>> (O,) = g.customized([X], tb)
>>> g.mark_output(O)
>>> fused, result = fuse_thread_graphs(g.freeze())
>>> [n.op.value for n in fused.block_graphs()[0].nodes]
['input', 'fused', 'accum', 'output']
>>> result.groups, result.fused_ops, result.smem_bytes_saved
(1, 3, 128)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mirage.mugraph.graph import BlockGraph, KernelGraph, Node, Ref, ThreadGraph, ThreadInput
from mirage.mugraph.ops import ELEMENTWISE, Op
from mirage.optimizer.graphs import map_block_graphs, single_consumer


@dataclass(frozen=True)
class FusionResult:
    """What fusion did to one graph (summed over its block graphs)."""

    groups: int  # FUSED nodes created from two or more ops
    fused_ops: int  # element-wise ops inside those groups
    wrapped_single: int  # single element-wise ops wrapped in a FUSED node
    smem_tensors_removed: int  # intermediates that now live in registers
    smem_bytes_saved: int  # their bytes


def element_groups(graph: BlockGraph) -> list[list[int]]:
    """The fusion groups of ``graph``: sorted node lists, each of element-wise ops, in graph order."""
    uses = graph.consumers()
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, node in enumerate(graph.nodes):
        if node.op not in ELEMENTWISE:
            continue
        parent[i] = i
        for r in node.inputs:
            producer = r.node
            if producer in parent and single_consumer(uses, r) == i:
                parent[find(producer)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in parent:
        groups.setdefault(find(i), []).append(i)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[-1])


def thread_graph(graph: BlockGraph, members: list[int]) -> tuple[ThreadGraph, tuple[Ref, ...]]:
    """The thread graph of a group, and the block tensors it reads (its operands, in order)."""
    inside = set(members)
    operands: list[Ref] = []
    nodes: list[Node] = []
    local: dict[Ref, Ref] = {}
    for r in (r for i in members for r in graph.nodes[i].inputs):
        if r.node not in inside and r not in local:
            local[r] = Ref(len(nodes), 0)
            nodes.append(Node(Op.INPUT, (), ThreadInput(len(operands)), (graph.type_of(r),)))
            operands.append(r)
    for i in members:
        node = graph.nodes[i]
        local[Ref(i, 0)] = Ref(len(nodes), 0)
        nodes.append(dataclasses.replace(node, inputs=tuple(local[r] for r in node.inputs)))
    return ThreadGraph(tuple(nodes), (local[Ref(members[-1], 0)],)), tuple(operands)


def fuse_block(graph: BlockGraph, wrap_single: bool = True) -> tuple[BlockGraph, FusionResult]:
    """Replace each fusion group of ``graph`` by one FUSED node (see the module docstring)."""
    groups = element_groups(graph)
    root_of = {g[-1]: g for g in groups if len(g) > 1 or wrap_single}
    member = {i for g in root_of.values() for i in g}
    nodes: list[Node] = []
    remap: dict[Ref, Ref] = {}
    for i, node in enumerate(graph.nodes):
        if i in root_of:
            tg, operands = thread_graph(graph, root_of[i])
            nodes.append(Node(Op.FUSED, tuple(remap[r] for r in operands), tg, node.outputs))
        elif i in member:
            continue
        else:
            nodes.append(dataclasses.replace(node, inputs=tuple(remap[r] for r in node.inputs)))
        remap[Ref(i, 0)] = Ref(len(nodes) - 1, 0)
    inner = [i for g in root_of.values() for i in g[:-1]]
    big = [g for g in root_of.values() if len(g) > 1]
    result = FusionResult(
        groups=len(big), fused_ops=sum(len(g) for g in big),
        wrapped_single=sum(1 for g in root_of.values() if len(g) == 1),
        smem_tensors_removed=len(inner),
        smem_bytes_saved=sum(graph.nodes[i].outputs[0].nbytes for i in inner))
    return dataclasses.replace(graph, nodes=tuple(nodes)), result


def fuse_thread_graphs(graph: KernelGraph, wrap_single: bool = True) -> tuple[KernelGraph, FusionResult]:
    """Fuse the element-wise ops of every block graph of ``graph`` (a pass)."""
    results: list[FusionResult] = []

    def fuse(_: int, block: BlockGraph) -> BlockGraph:
        new, result = fuse_block(block, wrap_single)
        results.append(result)
        return new

    fused = map_block_graphs(graph, fuse)
    total = FusionResult(*(sum(getattr(r, f.name) for r in results)
                           for f in dataclasses.fields(FusionResult)))
    return fused, total
