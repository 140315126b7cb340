"""Abstract expressions of µGraph tensors, computed op by op from the registry formulas.

Every op's meaning is written once, as a formula over an algebra (``mirage.mugraph.ops``).  Here the
algebra's values are :class:`ShapedTerm` (a shape and an abstract-expression term), so the abstract
expression of an op's output is its registry formula evaluated on the terms of its inputs: a matmul
becomes ``sum(k, x * y)``, an rms_norm ``x / sqrt(sum(n, x * x))``.  For-loop accumulators have no
formula; :func:`accumulator_term` gives them the paper's rule (``sum(R, x)`` for a plain
accumulator, ``sum(R·d, x)`` when it also reduces the last dim d).

The search calls :func:`op_term` once per candidate op, incrementally; :func:`output_terms` gives
the terms of a whole graph (the target ``E_O`` of a reference program), inlining graph-defined ops.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(2, 64), dtype=mi.float16)
>>> w = g.new_input(dims=(64, 32), dtype=mi.float16)
>>> g.mark_output(g.matmul(g.rms_norm(x), w))
>>> print(output_terms(g.freeze())[0])
(sum 64 (* (/ v0 (sqrt (sum 64 (* v0 v0)))) v1))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirage.generator import abstract_expr as ae
from mirage.mugraph.algebra import NotInterpretable
from mirage.mugraph.graph import (
    Accum,
    AccumKind,
    BlockGraph,
    KernelGraph,
    TensorType,
    ThreadGraph,
    ThreadInput,
)
from mirage.mugraph.ops import OPAQUE_UNARY, REGISTRY, Op, matmul_shape

Term = ae.Term


@dataclass(frozen=True)
class ShapedTerm:
    shape: tuple[int, ...]
    term: Term


class TermAlgebra:
    """The abstract-expression algebra: values are :class:`ShapedTerm`."""

    def const(self, value: Any, like: Any) -> ShapedTerm:
        return ShapedTerm((), ae.constant())

    def zeros(self, shape: tuple[int, ...]) -> ShapedTerm:
        return ShapedTerm(tuple(shape), ae.constant())

    def _binary(self, fn, x: ShapedTerm, y: ShapedTerm) -> ShapedTerm:
        return ShapedTerm(tuple(np.broadcast_shapes(x.shape, y.shape)), fn(x.term, y.term))

    def add(self, x, y):
        return self._binary(ae.add, x, y)

    def sub(self, x, y):
        return self._binary(ae.sub, x, y)

    def mul(self, x, y):
        return self._binary(ae.mul, x, y)

    def div(self, x, y):
        return self._binary(ae.div, x, y)

    def exp(self, x):
        return ShapedTerm(x.shape, ae.exp(x.term))

    def sqrt(self, x):
        return ShapedTerm(x.shape, ae.sqrt(x.term))

    def matmul(self, x, y):
        return ShapedTerm(matmul_shape(x.shape, y.shape), ae.sum_of(x.shape[-1], ae.mul(x.term, y.term)))

    def sum(self, x, axis: int, keepdims: bool = True):
        shape = list(x.shape)
        size = shape[axis]
        if keepdims:
            shape[axis] = 1
        else:
            del shape[axis]
        return ShapedTerm(tuple(shape), ae.sum_of(size, x.term))

    def opaque(self, name: str, x, reference):
        return ShapedTerm(x.shape, ae.opaque(name.split("[")[0], x.term))

    def max(self, x, axis: int, keepdims: bool = True):
        raise NotInterpretable("max has no abstract expression (it is outside the LAX fragment)")

    def maximum(self, x, y):
        raise NotInterpretable("max has no abstract expression (it is outside the LAX fragment)")

    def neg_inf(self, shape):
        raise NotInterpretable("max has no abstract expression (it is outside the LAX fragment)")

    def structural(self, fn, *xs):
        shapes = [np.broadcast_to(np.zeros((), np.int8), x.shape) for x in xs]
        (x,) = xs
        return ShapedTerm(tuple(fn(*shapes).shape), x.term)

    def shape(self, x) -> tuple[int, ...]:
        return x.shape


ALGEBRA = TermAlgebra()


def accumulator_term(
    attrs: Accum, term: Term, in_type: TensorType, forloop_range: int, reduction_dimx: int
) -> Term:
    """The term of a for-loop accumulator's output (paper Table 1 and Mirage's code)."""
    last = in_type.shape[-1] if in_type.shape else 1
    match attrs.kind:
        case AccumKind.NONE:
            return ae.sum_of(forloop_range, term)
        case AccumKind.SUM | AccumKind.MEAN:
            return ae.sum_of(forloop_range * last, term)
        case AccumKind.RMS:
            return ae.rms(forloop_range * last, term)
        case AccumKind.SUM_TODIMX:
            return ae.sum_of(forloop_range * last // reduction_dimx, term)
    raise NotInterpretable(f"accumulator kind {attrs.kind.value} has no abstract expression")


def op_term(
    op: Op,
    attrs: Any,
    in_types: Sequence[TensorType],
    in_terms: Sequence[Term],
    forloop_range: int = 1,
    reduction_dimx: int = 64,
) -> Term:
    """The abstract expression of one op's output, from its inputs' types and terms."""
    if op is Op.ACCUM:
        return accumulator_term(attrs, in_terms[0], in_types[0], forloop_range, reduction_dimx)
    if op in (Op.OUTPUT, Op.INPUT):
        return in_terms[0]
    if op is Op.FUSED:
        return _thread_term(attrs, in_types, in_terms)
    direct = _DIRECT.get(op)
    if direct is not None:  # the registry formula's result, without building shaped values
        return direct(in_types, *in_terms)
    row = REGISTRY[op]
    if row.formula is None:
        raise NotInterpretable(f"op {op.value} has no abstract expression")
    values = [ShapedTerm(t.shape, term) for t, term in zip(in_types, in_terms, strict=True)]
    return row.formula(ALGEBRA, attrs, tuple(in_types), *values).term


_DIRECT: dict[Op, Callable[..., Term]] = {
    Op.ADD: lambda types, x, y: ae.add(x, y),
    Op.SUB: lambda types, x, y: ae.sub(x, y),
    Op.MUL: lambda types, x, y: ae.mul(x, y),
    Op.DIV: lambda types, x, y: ae.div(x, y),
    Op.EXP: lambda types, x: ae.exp(x),
    Op.SQRT: lambda types, x: ae.sqrt(x),
    Op.SQUARE: lambda types, x: ae.mul(x, x),
    **{op: (lambda name: lambda types, x: ae.opaque(name, x))(op.value) for op in OPAQUE_UNARY},
    Op.MUL_SCALAR: lambda types, x: x,  # x * c = x
    Op.ADD_SCALAR: lambda types, x: x,  # x + c = x
    Op.MATMUL: lambda types, x, y: ae.sum_of(types[0].shape[-1], ae.mul(x, y)),
}


def _thread_term(graph: ThreadGraph, in_types: Sequence[TensorType], in_terms: Sequence[Term]) -> Term:
    terms: dict[tuple[int, int], Term] = {}
    for i, node in enumerate(graph.nodes):
        if isinstance(node.attrs, ThreadInput):
            terms[(i, 0)] = in_terms[node.attrs.index]
        else:
            args = [terms[(r.node, r.index)] for r in node.inputs]
            terms[(i, 0)] = op_term(node.op, node.attrs, graph.operand_types(node), args)
    (out,) = graph.outputs
    return terms[(out.node, out.index)]


def block_terms(graph: BlockGraph, input_terms: Sequence[Term]) -> list[Term]:
    """Terms of a block graph's output savers, given the terms of its input iterators' sources."""
    terms: dict[tuple[int, int], Term] = {}
    feed = iter(input_terms)
    for i, node in enumerate(graph.nodes):
        if node.op is Op.INPUT:
            terms[(i, 0)] = next(feed)
            continue
        args = [terms[(r.node, r.index)] for r in node.inputs]
        terms[(i, 0)] = op_term(
            node.op, node.attrs, graph.operand_types(node), args, graph.forloop_range, graph.reduction_dimx
        )
    return [terms[(i, 0)] for i in graph.output_nodes]


def output_terms(graph: KernelGraph) -> list[Term]:
    """The abstract expression of each output of a kernel graph (inputs are ``v0, v1, ...``)."""
    terms: dict[tuple[int, int], Term] = {}
    inputs = 0
    for i, node in enumerate(graph.nodes):
        args = [terms[(r.node, r.index)] for r in node.inputs]
        if node.op is Op.INPUT:
            outs = [ae.variable(inputs)]
            inputs += 1
        elif isinstance(node.attrs, BlockGraph):
            outs = block_terms(node.attrs, args)
        else:
            outs = [op_term(node.op, node.attrs, graph.operand_types(node), args)]
        for j, term in enumerate(outs):
            terms[(i, j)] = term
    return [terms[(r.node, r.index)] for r in graph.outputs]
