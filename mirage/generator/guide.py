"""Reference-first expansion order: which candidate ops recompute a tensor of the reference program.

The canonical order fixes *which* op sequences are generated (each µGraph once); the order in which
a state's children are visited is free.  Depth first, it decides how soon a µGraph is reached: a
fused kernel of 13 block ops sits below children whose subtrees are far too large to exhaust.

The guide numbers the reference's values: every tensor of the reference is identified by its node
(inputs included), and an op *recomputes* reference node ``n`` when it is ``n``'s op with ``n``'s
attributes (scalar, epsilon, reduction dim) applied to tensors that recompute ``n``'s operands, in
the same order (either order for commutative ops).  Search tensors carry that value (or ``None``);
input iterators carry their source tensor's value (a tile holds part of the same tensor).  This is
the reference's expression with its constants kept, where abstract expressions absorb them: the
guide tells ``sqrt(mean + eps)`` from ``sqrt(mean)``, which the pruning cannot.

At every block state the search visits first the children that recompute a reference value not yet
computed in the state (in canonical order), then the others (in canonical order).  Nothing is cut:
a search run to the end visits the same states and finds the same µGraphs, in another order.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(8, 64), dtype=mi.float16)
>>> g.mark_output(g.exp(g.mul_scalar(g.square(x), 0.5)))
>>> guide = ReferenceGuide.of(g.freeze())
>>> from mirage.generator.space import OpChoice, parse_op
>>> guide.inputs
(0,)
>>> guide.value(parse_op("square"), (0,)), guide.value(parse_op("mul_scalar=0.5"), (1,))
(1, 2)
>>> guide.value(parse_op("mul_scalar=0.25"), (1,)) is None      # another constant: not the reference's
True
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from mirage.generator.candidates import order_key
from mirage.generator.space import OpChoice
from mirage.mugraph.graph import Accum, Clamp, KernelGraph, Reduce, RmsNorm, Scalar
from mirage.mugraph.ops import COMMUTATIVE, Op

Value = int | None  # the reference node a search tensor recomputes


@dataclass(frozen=True)
class Signature:
    """Reference node ``value`` is ``choice`` applied to the values ``operands``."""

    choice: OpChoice
    operands: tuple[int, ...]
    value: int


@dataclass(frozen=True)
class ReferenceGuide:
    inputs: tuple[int, ...]  # the values of the reference's inputs, in input order
    signatures: tuple[Signature, ...]

    @classmethod
    def of(cls, reference: KernelGraph) -> ReferenceGuide:
        """The values of a reference's pre-defined ops (its graph-defined kernels are not followed)."""
        signatures = []
        for index, node in enumerate(reference.nodes):
            attrs = node.attrs
            if attrs is not None and not isinstance(attrs, (Accum, Clamp, Reduce, RmsNorm, Scalar)):
                continue  # inputs, graph-defined kernels, fused thread graphs
            if node.op is Op.OUTPUT or len(node.outputs) != 1:
                continue
            operands = tuple(r.node for r in node.inputs)
            if node.op in COMMUTATIVE:
                operands = tuple(sorted(operands))
            signatures.append(Signature(OpChoice(node.op, attrs), operands, index))
        return cls(tuple(reference.input_nodes), tuple(signatures))

    def value(self, choice: OpChoice, operands: Sequence[Value]) -> Value:
        """The reference node that ``choice`` on tensors of these values recomputes, if any."""
        if None in operands:
            return None
        key = tuple(sorted(operands)) if choice.op in COMMUTATIVE else tuple(operands)  # type: ignore[type-var]
        for signature in self.signatures:
            if signature.choice == choice and signature.operands == key:
                return signature.value
        return None

    def for_ops(self, ops: Sequence[OpChoice]) -> SpaceGuide:
        """The signatures whose op is in ``ops``, with the op's rank there."""
        ranks = {choice: rank for rank, choice in enumerate(ops)}
        rows = tuple(
            (ranks[s.choice], s.operands, s.value, s.choice.op in COMMUTATIVE)
            for s in self.signatures
            if s.choice in ranks
        )
        return SpaceGuide(rows)


@dataclass(frozen=True)
class SpaceGuide:
    """The guide for one op set: rows ``(rank, operand values, value, commutative)``."""

    rows: tuple[tuple[int, tuple[int, ...], int, bool], ...]

    def first(self, values: Sequence[Value], proposals: Sequence[tuple], complete: bool) -> dict[int, int]:
        """``{index in proposals: value}`` for the proposals that recompute a reference value not yet
        in ``values``.  ``proposals`` are sorted by their canonical key (their first item)."""
        found: dict[int, int] = {}
        if not self.rows or not proposals:
            return found
        where = {v: i for i, v in enumerate(values) if v is not None}
        for rank, operands, value, commutative in self.rows:
            if value in where:
                continue
            try:
                inputs = tuple(where[v] for v in operands)
            except KeyError:
                continue
            if commutative:
                inputs = tuple(sorted(inputs))
            key = order_key(complete, inputs, rank)
            k = bisect.bisect_left(proposals, (key,))
            if k < len(proposals) and proposals[k][0] == key and proposals[k][1] == rank:
                found[k] = value
        return found
