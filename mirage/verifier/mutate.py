"""Small changes to µGraphs: wrong ones (mutants) to test that the verifier rejects them, and
semantics-preserving ones (commuted operands, other grid and for-loop splits) that it must accept.

A mutation edits one node (at the kernel level, or inside a graph-defined op's block graph), then
the whole graph is rebuilt through the IR's shape rules and structural checker; only mutants that
are valid µGraphs with the original's input and output types are kept.

>>> from benchmarks.mugraphs import CASES
>>> graph = CASES["lora_m16"].fused()
>>> sorted({mutation.kind.value for mutation, _ in valid_mutants(graph)})
['accum_kind', 'binary_op']
>>> sorted({mutation.detail for mutation, _ in valid_mutants(graph, equivalent=True)})
['add(b, a)', 'grid (64, 1, 1)→(128, 1, 1)', 'grid (64, 1, 1)→(32, 1, 1)']
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from mirage.errors import GraphError
from mirage.mugraph import build
from mirage.mugraph.check import check
from mirage.mugraph.graph import (
    Accum,
    AccumKind,
    BlockGraph,
    InputIterator,
    KernelGraph,
    Node,
    OutputSaver,
    Reduce,
    Ref,
    Scalar,
)
from mirage.mugraph.ops import ELEMENTWISE, UNARY, Op


class MutationKind(enum.Enum):
    INPUT_MAP = "input_map"  # a grid axis reads another dim of the input
    REPLICATE = "replicate"  # a partitioned input is replicated instead
    PARTITION = "partition"  # a replicated input is partitioned instead
    FORLOOP_DIM = "forloop_dim"  # the for-loop iterates over another dim (or none)
    OUTPUT_MAP = "output_map"  # blocks write their tiles along another dim
    SWAP_MATMUL = "swap_matmul"  # matmul(b, a) for matmul(a, b)
    SWAP_OPERANDS = "swap_operands"  # div / sub with operands swapped
    ACCUM_KIND = "accum_kind"  # another accumulator kind
    DROP_OP = "drop_op"  # an element-wise op removed
    DUPLICATE_OP = "duplicate_op"  # a unary op applied twice
    UNARY_OP = "unary_op"  # exp ↔ sqrt and other unary substitutions
    BINARY_OP = "binary_op"  # add ↔ sub ↔ mul ↔ div
    REDUCTION_DIM = "reduction_dim"  # a reduction over another dim
    SCALAR = "scalar"  # a wrong constant
    WRONG_INPUT = "wrong_input"  # an operand reads another input of the same type
    TRANSPOSED_INPUT = "transposed_input"  # an input iterator reads its tensor with two dims exchanged
    # semantics-preserving edits
    COMMUTE = "commute"  # add / mul operands swapped
    SPLIT = "split"  # another grid or for-loop split


EQUIVALENT_KINDS = frozenset({MutationKind.COMMUTE, MutationKind.SPLIT})

UNARY_SWAPS = {
    Op.EXP: (Op.SQRT, Op.SQUARE, Op.SILU),
    Op.SQRT: (Op.EXP, Op.SQUARE),
    Op.SQUARE: (Op.SQRT, Op.EXP),
    Op.SILU: (Op.GELU, Op.SIGMOID, Op.EXP),
    Op.GELU: (Op.SILU, Op.GELU_ERF),
    Op.GELU_ERF: (Op.GELU,),
    Op.SIGMOID: (Op.SILU, Op.TANH),
    Op.TANH: (Op.SIGMOID,),
    Op.LOG: (Op.EXP, Op.SQRT),
    Op.SOFTPLUS: (Op.SILU, Op.SIGMOID, Op.LOG),
    Op.LOG1P: (Op.LOG, Op.EXPM1),
    Op.EXPM1: (Op.EXP, Op.LOG1P),
    Op.ERF: (Op.TANH, Op.SIGMOID),
    Op.SIN: (Op.COS, Op.TANH),
    Op.COS: (Op.SIN, Op.EXP),
}
BINARY_SWAPS = {Op.ADD: (Op.SUB, Op.MUL), Op.SUB: (Op.ADD, Op.DIV), Op.MUL: (Op.ADD, Op.DIV),
                Op.DIV: (Op.MUL, Op.SUB)}
ACCUM_KINDS = (AccumKind.NONE, AccumKind.SUM, AccumKind.MEAN, AccumKind.RMS, AccumKind.SUM_TODIMX)


@dataclass(frozen=True)
class Mutation:
    kind: MutationKind
    site: tuple[int, int | None]  # (kernel node, block node or None)
    detail: str


# ---- rebuilding through the IR's shape rules ---------------------------------------------------


def rebuild(graph: KernelGraph) -> KernelGraph:
    """Recompute every node's output types; raises GraphError if the graph is no longer valid."""
    out = KernelGraph((), (), graph.name)
    for node in graph.nodes:
        if node.op is Op.INPUT:
            out, _ = build.append(out, Op.INPUT, (), node.attrs, node.outputs)
        elif node.op is Op.CUSTOMIZED:
            block = _rebuild_block(cast(BlockGraph, node.attrs), [out.type_of(r) for r in node.inputs])
            out, _ = build.add_customized(out, node.inputs, block)
        else:
            out, _ = build.append(out, node.op, node.inputs, node.attrs)
    out = dataclasses.replace(out, outputs=graph.outputs)
    check(out)
    return out


def _rebuild_block(block: BlockGraph, sources) -> BlockGraph:
    out = dataclasses.replace(block, nodes=())
    feed = iter(sources)
    for node in block.nodes:
        if node.op is Op.INPUT:
            it = cast(InputIterator, node.attrs)
            out, _ = build.add_input_iterator(out, next(feed), it.input_map, it.forloop_dim)
        elif node.op is Op.OUTPUT:
            saver = cast(OutputSaver, node.attrs)
            out, _ = build.add_output_saver(out, node.inputs[0], saver.output_map, saver.forloop_dim)
        elif node.op is Op.FUSED:
            raise GraphError("mutating graphs with thread graphs is not supported")
        else:
            out, _ = build.append(out, node.op, node.inputs, node.attrs)
    return out


def _same_interface(original: KernelGraph, mutant: KernelGraph) -> bool:
    shapes = lambda ts: [(t.shape, t.dtype) for t in ts]  # noqa: E731
    return (shapes(original.input_types) == shapes(mutant.input_types)
            and shapes(original.output_types) == shapes(mutant.output_types))


# ---- node surgery --------------------------------------------------------------------------------


def _shift(ref: Ref, at: int, by: int) -> Ref:
    return Ref(ref.node + by, ref.index) if ref.node >= at else ref


def _drop(nodes: tuple[Node, ...], outputs: tuple[Ref, ...], i: int):
    """Remove node i (its uses read its first input instead)."""
    source = nodes[i].inputs[0]

    def fix(r: Ref) -> Ref:
        return _shift(source if r.node == i else r, i + 1, -1)

    new = [dataclasses.replace(n, inputs=tuple(fix(r) for r in n.inputs)) for n in nodes[:i] + nodes[i + 1:]]
    return tuple(new), tuple(fix(r) for r in outputs)


def _duplicate(nodes: tuple[Node, ...], outputs: tuple[Ref, ...], i: int):
    """Apply unary node i a second time to its own output."""

    def fix(r: Ref) -> Ref:
        return Ref(i + 1, r.index) if r.node == i else _shift(r, i + 1, 1)

    later = [dataclasses.replace(n, inputs=tuple(fix(r) for r in n.inputs)) for n in nodes[i + 1:]]
    copy = dataclasses.replace(nodes[i], inputs=(Ref(i, 0),))
    return nodes[: i + 1] + (copy,) + tuple(later), tuple(fix(r) for r in outputs)


# ---- candidate edits -----------------------------------------------------------------------------


Edit = tuple[MutationKind, str, Node]


def _node_edits(node: Node, rank: int, grid=None, forloop_range: int = 1) -> Iterator[Edit]:
    """Single-node edits (same position, same inputs count)."""
    op, attrs = node.op, node.attrs
    if op is Op.MATMUL:
        yield MutationKind.SWAP_MATMUL, "matmul(b, a)", dataclasses.replace(node, inputs=node.inputs[::-1])
    if op in (Op.DIV, Op.SUB):
        swapped = dataclasses.replace(node, inputs=node.inputs[::-1])
        yield MutationKind.SWAP_OPERANDS, f"{op.value}(b, a)", swapped
    if op in (Op.ADD, Op.MUL):
        yield MutationKind.COMMUTE, f"{op.value}(b, a)", dataclasses.replace(node, inputs=node.inputs[::-1])
    for other in UNARY_SWAPS.get(op, ()):
        yield MutationKind.UNARY_OP, f"{op.value}→{other.value}", dataclasses.replace(node, op=other)
    for other in BINARY_SWAPS.get(op, ()):
        yield MutationKind.BINARY_OP, f"{op.value}→{other.value}", dataclasses.replace(node, op=other)
    if isinstance(attrs, Reduce):
        for dim in range(rank):
            if dim != attrs.dim:
                new = dataclasses.replace(node, attrs=Reduce(dim))
                yield MutationKind.REDUCTION_DIM, f"dim {attrs.dim}→{dim}", new
    if isinstance(attrs, Scalar):
        for value in (attrs.value * 2, attrs.value + 1, -attrs.value):
            new = dataclasses.replace(node, attrs=Scalar(value))
            yield MutationKind.SCALAR, f"{attrs.value}→{value}", new
    if op is Op.ACCUM and isinstance(attrs, Accum):
        for kind in ACCUM_KINDS:
            if kind is not attrs.kind:
                eps = attrs.eps or 1e-6 * (kind is AccumKind.RMS)
                new = dataclasses.replace(node, attrs=Accum(kind, eps))
                yield MutationKind.ACCUM_KIND, f"{attrs.kind.value}→{kind.value}", new
    if op is Op.INPUT and isinstance(attrs, InputIterator):
        yield from _input_edits(node, attrs, grid, forloop_range)
    if op is Op.OUTPUT and isinstance(attrs, OutputSaver):
        yield from _output_edits(node, attrs)


def _output_edits(node: Node, saver: OutputSaver):
    def edit(detail, output_map):
        return (MutationKind.OUTPUT_MAP, detail,
                dataclasses.replace(node, attrs=OutputSaver(tuple(output_map), saver.forloop_dim)))

    for axis, dim in enumerate(saver.output_map):
        if dim < 0:
            continue
        for other in range(node.outputs[0].rank):
            if other != dim:
                omap = list(saver.output_map)
                omap[axis] = other
                yield edit(f"axis {'xyz'[axis]}: {dim}→{other}", omap)
        for second in range(axis + 1, 3):
            if saver.output_map[second] >= 0:
                omap = list(saver.output_map)
                omap[axis], omap[second] = omap[second], omap[axis]
                yield edit(f"axes {'xyz'[axis]}{'xyz'[second]} swapped", omap)


def _input_edits(node: Node, it: InputIterator, grid, forloop_range: int):
    rank = it.source.rank

    def edit(kind, detail, input_map, forloop_dim):
        return kind, detail, dataclasses.replace(node, attrs=InputIterator(it.source, tuple(input_map),
                                                                           forloop_dim))

    for axis, dim in enumerate(it.input_map):
        if grid[axis] == 1:
            continue
        for other in [*range(rank), -1]:
            if other != dim:
                imap = list(it.input_map)
                imap[axis] = other
                kind = (MutationKind.REPLICATE if other == -1 else
                        MutationKind.PARTITION if dim == -1 else MutationKind.INPUT_MAP)
                yield edit(kind, f"axis {'xyz'[axis]}: {dim}→{other}", imap, it.forloop_dim)
        for second in range(axis + 1, 3):
            if grid[second] > 1 and it.input_map[second] != dim:
                imap = list(it.input_map)
                imap[axis], imap[second] = imap[second], imap[axis]
                yield edit(MutationKind.INPUT_MAP, f"axes {'xyz'[axis]}{'xyz'[second]} swapped", imap,
                           it.forloop_dim)
    if forloop_range > 1:
        for other in [*range(rank), -1]:
            if other != it.forloop_dim:
                detail = f"forloop_dim {it.forloop_dim}→{other}"
                yield edit(MutationKind.FORLOOP_DIM, detail, it.input_map, other)
    for first in range(rank):
        for second in range(first + 1, rank):
            swap = {first: second, second: first}
            imap = [swap.get(d, d) for d in it.input_map]
            forloop_dim = swap.get(it.forloop_dim, it.forloop_dim)
            if (imap, forloop_dim) != (list(it.input_map), it.forloop_dim):
                detail = f"dims {first}, {second} exchanged"
                yield edit(MutationKind.TRANSPOSED_INPUT, detail, imap, forloop_dim)


def _graph_edits(nodes, outputs, level_inputs) -> Iterator[tuple[MutationKind, str, tuple, tuple]]:
    """Edits that change the node list: drop, duplicate, read another input."""
    for i, node in enumerate(nodes):
        if node.op in ELEMENTWISE:
            new_nodes, new_outputs = _drop(nodes, outputs, i)
            yield MutationKind.DROP_OP, f"drop %{i} {node.op.value}", new_nodes, new_outputs
        if node.op in UNARY:
            new_nodes, new_outputs = _duplicate(nodes, outputs, i)
            yield MutationKind.DUPLICATE_OP, f"duplicate %{i} {node.op.value}", new_nodes, new_outputs
        for position, ref in enumerate(node.inputs):
            if ref.node not in level_inputs:
                continue
            for other in level_inputs:
                if other != ref.node and nodes[other].outputs[0] == nodes[ref.node].outputs[0]:
                    inputs = list(node.inputs)
                    inputs[position] = Ref(other, 0)
                    changed = nodes[:i] + (dataclasses.replace(node, inputs=tuple(inputs)),) + nodes[i + 1:]
                    detail = f"%{i} operand {position}: %{ref.node}→%{other}"
                    yield MutationKind.WRONG_INPUT, detail, changed, outputs


def single_edits(graph: KernelGraph) -> Iterator[tuple[Mutation, KernelGraph]]:
    """Every single-node edit of ``graph`` (not yet checked for validity)."""
    kernel_inputs = set(graph.input_nodes)
    for k, node in enumerate(graph.nodes):
        rank = max((graph.type_of(r).rank for r in node.inputs), default=0)
        for kind, detail, new in _node_edits(node, rank):
            yield Mutation(kind, (k, None), detail), _replace_kernel_node(graph, k, new)
        if isinstance(node.attrs, BlockGraph):
            yield from _block_edits(graph, k, node.attrs)
    for kind, detail, nodes, outputs in _graph_edits(graph.nodes, graph.outputs, kernel_inputs):
        yield Mutation(kind, (-1, None), detail), dataclasses.replace(graph, nodes=nodes, outputs=outputs)


def _block_edits(graph: KernelGraph, k: int, block: BlockGraph):
    for b, node in enumerate(block.nodes):
        rank = max((block.type_of(r).rank for r in node.inputs), default=0)
        for kind, detail, new in _node_edits(node, rank, block.grid_dim, block.forloop_range):
            nodes = block.nodes[:b] + (new,) + block.nodes[b + 1:]
            new_block = dataclasses.replace(block, nodes=nodes)
            yield Mutation(kind, (k, b), detail), _replace_block(graph, k, new_block)
    block_inputs = set(block.input_nodes)
    outputs = tuple(Ref(i, 0) for i in block.output_nodes)
    for kind, detail, nodes, _ in _graph_edits(block.nodes, outputs, block_inputs):
        new_block = dataclasses.replace(block, nodes=nodes)
        yield Mutation(kind, (k, -1), detail), _replace_block(graph, k, new_block)


def _replace_kernel_node(graph: KernelGraph, k: int, node: Node) -> KernelGraph:
    return dataclasses.replace(graph, nodes=graph.nodes[:k] + (node,) + graph.nodes[k + 1:])


def _replace_block(graph: KernelGraph, k: int, block: BlockGraph) -> KernelGraph:
    return _replace_kernel_node(graph, k, dataclasses.replace(graph.nodes[k], attrs=block))


def split_edits(graph: KernelGraph) -> Iterator[tuple[Mutation, KernelGraph]]:
    """Other grid and for-loop splits: each grid axis and the loop range halved or doubled.

    These are equivalent when the maps partition every tensor the change touches; a loop over an
    unsplit input that feeds an accumulator is not, so callers confirm with the float check.
    """
    for k, node in enumerate(graph.nodes):
        if not isinstance(node.attrs, BlockGraph):
            continue
        block = node.attrs
        for axis in range(3):
            for factor in (2, 0.5):
                grid = list(block.grid_dim)
                grid[axis] = int(grid[axis] * factor)
                if grid[axis] >= 1 and grid[axis] != block.grid_dim[axis]:
                    new = dataclasses.replace(block, grid_dim=(grid[0], grid[1], grid[2]))
                    yield Mutation(MutationKind.SPLIT, (k, None), f"grid {block.grid_dim}→{tuple(grid)}"), \
                        _replace_block(graph, k, new)
        if all(cast(InputIterator, block.nodes[i].attrs).forloop_dim < 0 for i in block.input_nodes):
            continue  # nothing is split along the loop: more iterations would add copies
        for factor in (2, 0.5):
            r = int(block.forloop_range * factor)
            if r >= 1 and r != block.forloop_range:
                new = dataclasses.replace(block, forloop_range=r)
                yield Mutation(MutationKind.SPLIT, (k, None), f"forloop_range {block.forloop_range}→{r}"), \
                    _replace_block(graph, k, new)


def valid_mutants(graph: KernelGraph, equivalent: bool = False) -> list[tuple[Mutation, KernelGraph]]:
    """Single edits that leave a valid µGraph with the same interface.

    With ``equivalent`` the semantics-preserving edits (commutes, splits), otherwise the wrong ones.
    """
    out = []
    edits = itertools.chain(single_edits(graph), split_edits(graph))
    for mutation, mutant in edits:
        if (mutation.kind in EQUIVALENT_KINDS) != equivalent:
            continue
        try:
            rebuilt = rebuild(mutant)
        except (GraphError, NotImplementedError, ValueError, ZeroDivisionError):
            continue
        if _same_interface(graph, rebuilt) and rebuilt != graph:
            out.append((mutation, rebuilt))
    return out


def random_mutant(graph: KernelGraph, chooser: random.Random, depth: int = 1,
                  base_variants: int = 0) -> tuple[list[Mutation], KernelGraph] | None:
    """Up to ``base_variants`` equivalent edits, then ``depth`` wrong ones, each chosen at random."""
    applied: list[Mutation] = []
    for _ in range(base_variants):
        options = valid_mutants(graph, equivalent=True)
        if not options:
            break
        mutation, graph = chooser.choice(options)
        applied.append(mutation)
    for _ in range(depth):
        options = valid_mutants(graph)
        if not options:
            return None
        mutation, graph = chooser.choice(options)
        applied.append(mutation)
    return applied, graph
