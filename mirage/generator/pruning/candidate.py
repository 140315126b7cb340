"""The record a pruning rule judges: one proposed op appended to a prefix graph.

The search proposes ops one at a time; a :class:`Candidate` holds what any rule may need to know
about one proposal: the level, the op and its attributes, its operands (canonical tensor indices and
types), its abstract expression, the canonical order of the prefix's last op, and the memory the
prefix already uses.  Output types are derived lazily from the op registry's shape rule.

The search fills the fields from its own incremental state; :meth:`Candidate.extend` builds one
from an actual graph (tests, docs, and the measurement script use it):

>>> import mirage as mi
>>> from mirage.mugraph.graph import Ref
>>> from mirage.mugraph.ops import Op
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(8, 64), dtype=mi.float16)
>>> w = g.new_input(dims=(64, 32), dtype=mi.float16)
>>> prefix = g.graph                       # the graph so far (no outputs yet)
>>> c = Candidate.extend(prefix, Op.MATMUL, (Ref(0), Ref(1)))
>>> print(c.term, c.output_types[0].shape, c.order)
(sum 64 (* v0 v1)) (8, 32) ((0, 1), 2)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mirage.errors import GraphError
from mirage.generator import abstract_expr as ae
from mirage.mugraph import build
from mirage.mugraph.algebra import NotInterpretable
from mirage.mugraph.graph import AccumKind, BlockGraph, KernelGraph, Level, Ref, TensorType
from mirage.mugraph.ops import REGISTRY, UNARY, Op, ShapeContext

#: Mirage's ``Order``: the operands' canonical tensor indices, then the op's rank.  Python compares
#: tuples lexicographically with a prefix smaller, exactly as Mirage does.
Order = tuple[tuple[int, ...], int]
INPUT_ORDER: Order = ((), -1)

_OP_RANKS = {op: rank for rank, op in enumerate(Op)}
_SKIPPED_IN_ORDER = frozenset({Op.INPUT, Op.OUTPUT})


def op_rank(op: Op) -> int:
    """The default rank of an op type (its position in :class:`Op`); a search may use its own."""
    return _OP_RANKS[op]


def in_place(op: Op, attrs: Any) -> bool:
    """Ops Mirage's shared-memory estimate counts as in place (no new buffer)."""
    return op in UNARY or (op is Op.ACCUM and attrs.kind is AccumKind.NONE)


@dataclass(frozen=True)
class Candidate:
    """One op proposed as the next node of a prefix graph."""

    level: Level
    op: Op
    attrs: Any
    inputs: tuple[int, ...]  # canonical tensor indices of the operands in the prefix
    input_types: tuple[TensorType, ...]
    term: ae.Term | None  # abstract expression of the output; None if it has none
    rank: int  # the op's rank in the canonical order
    last_order: Order = INPUT_ORDER  # the order of the prefix's last op
    prefix_memory_bytes: int = 0  # shared memory (block level) or device memory (kernel level)
    forloop_range: int = 1
    reduction_dimx: int = 64
    prefix: KernelGraph | BlockGraph | None = None  # the whole prefix, for rules that need it

    @property
    def order(self) -> Order:
        return (self.inputs, self.rank)

    @functools.cached_property
    def output_types(self) -> tuple[TensorType, ...] | None:
        """The registry's shape rule applied to the operands; ``None`` if the op does not fit them."""
        context = ShapeContext(self.level, self.forloop_range, self.reduction_dimx)
        try:
            return REGISTRY[self.op].shape(context, self.input_types, self.attrs)
        except GraphError:
            return None

    @property
    def memory_bytes(self) -> int:
        """The prefix's memory plus this op's outputs (Mirage's estimate: in-place ops are free)."""
        outputs = self.output_types or ()
        if self.level is Level.BLOCK and in_place(self.op, self.attrs):
            return self.prefix_memory_bytes
        return self.prefix_memory_bytes + sum(t.nbytes for t in outputs)

    @classmethod
    def extend(
        cls,
        prefix: KernelGraph | BlockGraph,
        op: Op,
        inputs: Sequence[Ref],
        attrs: Any = None,
        term: ae.Term | None = None,
        input_terms: Sequence[ae.Term] | None = None,
        rank: int | None = None,
    ) -> Candidate:
        """The candidate that appends ``op(inputs, attrs)`` to ``prefix``.

        ``term`` defaults to the op's abstract expression over the prefix's terms (kernel inputs
        are ``v0, v1, ...``; a block graph's input iterators take ``input_terms``).
        """
        refs = prefix.refs()
        index = {ref: i for i, ref in enumerate(refs)}
        operands = tuple(index[r] for r in inputs)
        input_types = tuple(prefix.type_of(r) for r in inputs)
        if term is None:
            terms = tensor_terms(prefix, input_terms)
            try:
                term = _op_term(prefix, op, attrs, input_types, [terms[r] for r in inputs])
            except (NotInterpretable, GraphError):  # no abstract expression, or the op does not fit
                term = None
        context = build.shape_context(prefix)
        return cls(
            level=prefix.level,
            op=op,
            attrs=attrs,
            inputs=operands,
            input_types=input_types,
            term=term,
            rank=op_rank(op) if rank is None else rank,
            last_order=last_order(prefix),
            prefix_memory_bytes=memory_bytes(prefix),
            forloop_range=context.forloop_range,
            reduction_dimx=context.reduction_dimx,
            prefix=prefix,
        )


def last_order(graph: KernelGraph | BlockGraph) -> Order:
    """The canonical order of the last op of ``graph`` (inputs and outputs do not count)."""
    index = {ref: i for i, ref in enumerate(graph.refs())}
    for node in reversed(graph.nodes):
        if node.op not in _SKIPPED_IN_ORDER:
            return (tuple(index[r] for r in node.inputs), op_rank(node.op))
    return INPUT_ORDER


def memory_bytes(graph: KernelGraph | BlockGraph) -> int:
    """Device memory of a kernel graph's tensors, or Mirage's shared-memory estimate of a block graph."""
    if isinstance(graph, BlockGraph):
        return sum(
            t.nbytes
            for node in graph.nodes
            if node.op is not Op.OUTPUT and not in_place(node.op, node.attrs)
            for t in node.outputs
        )
    return sum(t.nbytes for node in graph.nodes for t in node.outputs)


def _op_term(graph, op: Op, attrs: Any, input_types, input_terms) -> ae.Term:
    from mirage.generator.expressions import op_term

    if isinstance(graph, BlockGraph):
        return op_term(op, attrs, input_types, input_terms, graph.forloop_range, graph.reduction_dimx)
    if op is Op.CUSTOMIZED:
        raise NotInterpretable("a graph-defined op has one term per output; use tensor_terms")
    return op_term(op, attrs, input_types, input_terms)


def tensor_terms(
    graph: KernelGraph | BlockGraph, input_terms: Sequence[ae.Term] | None = None
) -> dict[Ref, ae.Term]:
    """The abstract expression of every tensor of ``graph`` (graph-defined ops are inlined)."""
    from mirage.generator.expressions import block_terms

    terms: dict[Ref, ae.Term] = {}
    inputs = 0
    for i, node in enumerate(graph.nodes):
        args = [terms[r] for r in node.inputs]
        if node.op is Op.INPUT:
            outs = [ae.variable(inputs) if input_terms is None else input_terms[inputs]]
            inputs += 1
        elif isinstance(node.attrs, BlockGraph):  # a graph-defined op
            outs = block_terms(node.attrs, args)
        else:
            outs = [_op_term(graph, node.op, node.attrs, graph.operand_types(node), args)]
        for j, term in enumerate(outs):
            terms[Ref(i, j)] = term
    return terms


def prefix_terms(graph: KernelGraph) -> list[tuple[str, ae.Term]]:
    """Every tensor's term at every level, named ``%3`` or ``%3/%5`` (kernel node / block node).

    These are the abstract expressions of all prefixes of ``graph`` in its node order, which is
    what Theorem 1 is about: an equivalent µGraph survives pruning iff all of them do.
    """
    kernel_terms = tensor_terms(graph)
    named = []
    for i, node in enumerate(graph.nodes):
        if isinstance(node.attrs, BlockGraph):  # a graph-defined op
            block_terms_ = tensor_terms(node.attrs, [kernel_terms[r] for r in node.inputs])
            named += [(f"%{i}/%{ref.node}", term) for ref, term in block_terms_.items()]
        for j in range(len(node.outputs)):
            named.append((f"%{i}" + (f".{j}" if j else ""), kernel_terms[Ref(i, j)]))
    return named
