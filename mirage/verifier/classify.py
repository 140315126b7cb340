"""The LAX classifier: which ops a graph uses, how many exps lie on a path, which guarantee applies.

Definition 5.1 of the paper (mirage-notes §2): a µGraph is LAX when it has only multi-linear ops,
division and exponentiation, and every input→output path holds at most one exp.  Square roots are
treated as in the fragment, as the paper's fingerprint does (field square roots).

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(2, 4), dtype=mi.float16)
>>> g.mark_output(g.exp(g.exp(x)))
>>> info = classify(g.freeze())
>>> info.max_exps_per_path, info.in_fragment, info.guarantee.value
(2, False, 'none')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import cast

from mirage.mugraph.graph import AccumKind, BlockGraph, KernelGraph, ThreadGraph, ThreadInput
from mirage.mugraph.ops import LAX, OPAQUE_UNARY, Op

# element-wise ops outside the fragment whose formulas go through ``Algebra.opaque``
UNINTERPRETED = frozenset(OPAQUE_UNARY) | {Op.CLAMP}
# ops that need an order (max): no finite-field meaning at all
ORDER_BASED = frozenset({Op.REDUCTION_MAX, Op.RUNNING_MAX, Op.ACCUM_RESCALE})
SQUARE_ROOTS = frozenset({Op.SQRT, Op.RMS_NORM})


class Guarantee(enum.Enum):
    """What a verification result rests on."""

    THEOREM = "theorem"  # Theorem 2 (Schwartz–Zippel when exp-free) bounds the error
    UNINTERPRETED = "uninterpreted"  # the same bound, with sqrt and opaque ops as fresh functions
    HEURISTIC = "heuristic"  # fingerprints were compared, but the theorem gives no bound < 1 here
    FLOAT = "float"  # floating-point comparison only: no probabilistic guarantee
    NONE = "none"  # the graph cannot be fingerprinted (order-based ops or nested exps)


@dataclass(frozen=True)
class LaxInfo:
    """What the classifier found in one graph."""

    in_fragment: bool  # Definition 5.1 (sqrt counted in)
    max_exps_per_path: int
    ops: frozenset[Op]
    uninterpreted_ops: frozenset[Op]
    order_based_ops: frozenset[Op]
    has_sqrt: bool
    fingerprintable: bool  # the finite-field test can run: no order-based op, ≤ 1 exp per path
    guarantee: Guarantee  # the best guarantee the field test can give for this graph
    reason: str  # why the graph is outside the fragment, or ""


def classify(graph: KernelGraph) -> LaxInfo:
    from mirage.mugraph.builder import as_graph

    graph = as_graph(graph)  # a builder is frozen (checked); anything else is a GraphError
    ops: set[Op] = set()
    order_based: set[Op] = set()
    depth = _exp_depths(graph, ops, order_based)
    uninterpreted = frozenset(ops & UNINTERPRETED)
    outside = frozenset(op for op in ops if op not in LAX and op not in UNINTERPRETED)
    has_sqrt = bool(ops & SQUARE_ROOTS)
    reasons = []
    if depth > 1:
        reasons.append(f"an input→output path holds {depth} exps (the fragment allows 1)")
    if order_based:
        reasons.append("order-based ops " + ", ".join(sorted(op.value for op in order_based)))
    if uninterpreted:
        reasons.append("ops outside the fragment " + ", ".join(sorted(op.value for op in uninterpreted))
                       + " (fingerprinted as uninterpreted functions)")
    others = outside - order_based
    if others:
        reasons.append("ops " + ", ".join(sorted(op.value for op in others)) + " outside the fragment")
    fingerprintable = depth <= 1 and not order_based
    in_fragment = fingerprintable and not outside and not uninterpreted
    if not fingerprintable:
        guarantee = Guarantee.NONE
    elif uninterpreted or has_sqrt:
        guarantee = Guarantee.UNINTERPRETED
    else:
        guarantee = Guarantee.THEOREM
    return LaxInfo(in_fragment, depth, frozenset(ops), uninterpreted, frozenset(order_based), has_sqrt,
                   fingerprintable, guarantee, "; ".join(reasons))


def _exp_depths(graph: KernelGraph, ops: set[Op], order_based: set[Op]) -> int:
    """The most exps on any input→output path of a kernel graph (recording the ops it meets)."""
    depth: dict[tuple[int, int], int] = {}
    for i, node in enumerate(graph.nodes):
        ins = [depth[(r.node, r.index)] for r in node.inputs]
        ops.add(node.op)
        if node.op is Op.INPUT:
            outs = [0]
        elif node.op is Op.CUSTOMIZED:
            outs = _block_depths(cast(BlockGraph, node.attrs), ins, ops, order_based)
        else:
            outs = [_node_depth(node, ins, ops, order_based)] * len(node.outputs)
        for j, d in enumerate(outs):
            depth[(i, j)] = d
    return max(depth.values(), default=0)


def _node_depth(node, ins: list[int], ops: set[Op], order_based: set[Op]) -> int:
    base = max(ins, default=0)
    if node.op in ORDER_BASED:
        order_based.add(node.op)
    if node.op is Op.ACCUM and node.attrs.kind is AccumKind.MAX:
        order_based.add(node.op)
    if node.op is Op.ACCUM and node.attrs.kind is AccumKind.RMS:
        ops.add(Op.SQRT)
    if node.op is Op.FUSED:
        return _thread_depth(node.attrs, ins, ops, order_based)
    return base + (node.op is Op.EXP)


def _block_depths(block: BlockGraph, ins: list[int], ops: set[Op], order_based: set[Op]) -> list[int]:
    depth: dict[tuple[int, int], int] = {}
    feed = iter(ins)
    outs = []
    for i, node in enumerate(block.nodes):
        ops.add(node.op)
        args = [depth[(r.node, r.index)] for r in node.inputs]
        if node.op is Op.INPUT:
            depth[(i, 0)] = next(feed)
        elif node.op is Op.OUTPUT:
            depth[(i, 0)] = args[0]
            outs.append(args[0])
        else:
            depth[(i, 0)] = _node_depth(node, args, ops, order_based)
    return outs


def _thread_depth(thread: ThreadGraph, ins: list[int], ops: set[Op], order_based: set[Op]) -> int:
    depth: dict[tuple[int, int], int] = {}
    for i, node in enumerate(thread.nodes):
        ops.add(node.op)
        if node.op is Op.INPUT:
            depth[(i, 0)] = ins[cast(ThreadInput, node.attrs).index]
        else:
            args = [depth[(r.node, r.index)] for r in node.inputs]
            depth[(i, 0)] = _node_depth(node, args, ops, order_based)
    (out,) = thread.outputs
    return depth[(out.node, out.index)]
