"""Small helpers that passes share: rebuilding block graphs node by node, walking graphs, and the
early exit of pattern matchers (:class:`NoMatch`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from mirage.mugraph import build
from mirage.mugraph.graph import BlockGraph, KernelGraph, Node, Ref, TensorType
from mirage.mugraph.ops import Op


class NoMatch(Exception):
    """A pattern matcher's early exit: the block graph does not have the pattern (the reason says why)."""


def require(condition: bool, reason: str) -> None:
    """Raise :class:`NoMatch` with ``reason`` unless ``condition`` holds."""
    if not condition:
        raise NoMatch(reason)


class BlockRewriter:
    """Builds a new block graph from an old one: copy nodes (their inputs remapped) or emit new ones.

    ``ref(old)`` gives the new tensor standing for an old one; ``alias(old, new)`` redirects an old
    tensor to a new one (a replacement).  Types of copied nodes are recomputed by the op's shape rule,
    so a rewrite that changes an operand type cannot leave a stale type behind.
    """

    def __init__(self, old: BlockGraph, **header) -> None:
        self.old = old
        self.graph = dataclasses.replace(old, nodes=(), **header)
        self.remap: dict[Ref, Ref] = {}

    def ref(self, old: Ref) -> Ref:
        return self.remap[old]

    def alias(self, old: Ref, new: Ref) -> None:
        self.remap[old] = new

    def emit(self, op: Op, inputs: Iterable[Ref], attrs=None, outputs=None) -> Ref:
        self.graph, index = build.append(self.graph, op, tuple(inputs), attrs, outputs)
        return Ref(index, 0)

    def emit_input(self, node: Node, forloop_dim: int | None = None) -> Ref:
        it = node.attrs
        fmap = it.forloop_dim if forloop_dim is None else forloop_dim
        return self.emit_iterator(it.source, it.input_map, fmap)

    def emit_iterator(self, source: TensorType, input_map, forloop_dim: int) -> Ref:
        self.graph, index = build.add_input_iterator(self.graph, source, tuple(input_map), forloop_dim)
        return Ref(index, 0)

    def emit_output(self, tensor: Ref, output_map) -> Ref:
        self.graph, index = build.add_output_saver(self.graph, tensor, output_map)
        return Ref(index, 0)

    def copy(self, index: int) -> Ref:
        """Copy old node ``index`` with remapped inputs; returns (and records) its new output."""
        node = self.old.nodes[index]
        inputs = tuple(self.ref(r) for r in node.inputs)
        if node.op is Op.INPUT:
            new = self.emit_input(node)
        elif node.op is Op.OUTPUT:
            new = self.emit_output(inputs[0], node.attrs.output_map)
        elif node.op is Op.FUSED:
            new = self.emit(node.op, inputs, node.attrs, node.outputs)
        else:
            new = self.emit(node.op, inputs, node.attrs)
        self.alias(Ref(index, 0), new)
        return new


def map_block_graphs(graph: KernelGraph, fn: Callable[[int, BlockGraph], BlockGraph]) -> KernelGraph:
    """A copy of ``graph`` whose graph-defined ops carry ``fn(node_index, block_graph)``."""
    nodes = list(graph.nodes)
    for i, node in enumerate(nodes):
        if node.op is Op.CUSTOMIZED:
            block = fn(i, node.attrs)
            if block is not node.attrs:
                nodes[i] = dataclasses.replace(node, attrs=block, outputs=block.result_types)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def customized_nodes(graph: KernelGraph) -> list[int]:
    return [i for i, n in enumerate(graph.nodes) if n.op is Op.CUSTOMIZED]


def single_consumer(uses: dict[Ref, list[int]], ref: Ref) -> int | None:
    """The one node that reads ``ref`` (possibly several times), or None."""
    readers = set(uses.get(ref, ()))
    return readers.pop() if len(readers) == 1 else None


def forward_cone(graph, start: int) -> set[int]:
    """Nodes that depend on node ``start`` (``start`` excluded)."""
    cone: set[int] = set()
    reached = {start}
    for i in range(start + 1, len(graph.nodes)):
        if any(r.node in reached for r in graph.nodes[i].inputs):
            reached.add(i)
            cone.add(i)
    return cone
