"""The ``scalar_chain`` check: a product (sum) by a number does not take the result of another.

Abstract expressions drop constants (``x · c`` is ``x``), so the abstract-expression rule cannot tell
where a reference's ``mul_scalar`` or ``add_scalar`` goes: every placement passes it, twice on a path
as well as once, and each placement multiplies the candidates the verifier then rejects one by one
(``log_softmax(x / 0.7)`` over 32,000 logits: 2 of 2,243 candidates verified in 15 s).

``c₁ · (c₂ · x)`` is ``(c₁c₂) · x``. The search offers only the reference's own numbers, so a chain of
two is never the only way to a µGraph unless the reference itself applies two such ops on one path
from an input to an output (its product is then a number of its own): where it does not, the check
cuts a scalar op whose operand comes from one of the same kind. "Comes from" sees through the
accumulators that keep the factor (``Σ c·x = c·Σ x``; for a sum by a number only the element-wise
accumulator) and, at the kernel level, through a graph-defined op's output saver into its block graph.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(8, 64), dtype=mi.float16)
>>> g.mark_output(g.mul_scalar(g.exp(g.mul_scalar(x, 0.5)), 2.0))
>>> sorted(op.value for op in chained_scalars(g.freeze()))
['mul_scalar']
"""

from __future__ import annotations

from collections.abc import Sequence

from mirage.mugraph.graph import AccumKind, BlockGraph, KernelGraph, Node, Ref
from mirage.mugraph.ops import Op

SCALAR_OPS = frozenset({Op.MUL_SCALAR, Op.ADD_SCALAR})
# accumulators through which each scalar op's factor (or offset) reaches the result unchanged
_KEEPING = {
    Op.MUL_SCALAR: frozenset({AccumKind.NONE, AccumKind.SUM, AccumKind.MEAN, AccumKind.SUM_TODIMX}),
    Op.ADD_SCALAR: frozenset({AccumKind.NONE}),
}


def chained_scalars(reference: KernelGraph) -> frozenset[Op]:
    """The scalar ops that ``reference`` applies twice on one path (any ops between); a reference
    with graph-defined ops gets all of them (the check then cuts nothing)."""
    if any(isinstance(n.attrs, BlockGraph) for n in reference.nodes):
        return SCALAR_OPS
    chained = set()
    for op in SCALAR_OPS:
        depth: list[int] = []
        for node in reference.nodes:
            depth.append(max((depth[r.node] for r in node.inputs), default=0) + (node.op is op))
        if max(depth, default=0) >= 2:
            chained.add(op)
    return frozenset(chained)


def block_source(nodes: Sequence[Node], index: int, op: Op, inputs: int = 0) -> Op:
    """The op that computed block tensor ``index``, seen through accumulators that keep ``op``'s
    factor. ``nodes``: one a tensor, or (the search's block states) the ops after ``inputs`` input
    tensors, which have no node there."""
    while index >= inputs:
        node = nodes[index - inputs]
        if node.op is not Op.ACCUM or node.attrs.kind not in _KEEPING[op]:
            return node.op
        index = node.inputs[0].node
    return Op.INPUT


def kernel_source(graph: KernelGraph, ref: Ref, op: Op) -> Op:
    """The op that computed kernel tensor ``ref``; for a graph-defined op's output, the op of its
    block graph that the output saver reads (through accumulators, as :func:`block_source`)."""
    node = graph.nodes[ref.node]
    if not isinstance(node.attrs, BlockGraph):
        return node.op
    block = node.attrs
    saver = block.nodes[block.output_nodes[ref.index]]
    return block_source(block.nodes, saver.inputs[0].node, op)


def cuts(op: Op, source: Op, chained: frozenset[Op]) -> bool:
    """Whether the check cuts ``op`` applied to a tensor computed by ``source``."""
    return op in SCALAR_OPS and op not in chained and source is op


def scalar_chains(graph: KernelGraph, chained: frozenset[Op] = frozenset()) -> list[str]:
    """Where a µGraph has scalar ops that the check cuts (``chained``: the reference's, see
    :func:`chained_scalars`), as ``"%k"`` (kernel level) or ``"%k/%b"`` (node b of kernel node k's
    block graph)."""
    found = []
    for k, node in enumerate(graph.nodes):
        if isinstance(node.attrs, BlockGraph):
            block = node.attrs
            found += [f"%{k}/%{b}" for b, inner in enumerate(block.nodes) if inner.op in SCALAR_OPS
                      and cuts(inner.op, block_source(block.nodes, inner.inputs[0].node, inner.op), chained)]
        elif node.op in SCALAR_OPS and cuts(node.op, kernel_source(graph, node.inputs[0], node.op), chained):
            found.append(f"%{k}")
    return found
