"""Scale degrees: how a value depends on the factor that a stable softmax divides out.

Replacing ``e = exp(x)`` by ``p = exp(x − m)`` (m a row maximum of x) multiplies e by ``s⁻¹`` with
``s = exp(m)``, one factor per row.  Every value computed from e then carries a power of s: its
*scale degree*.  A rewrite is exact when each saved result has degree 0 (the factors cancel, as in
``Σ e·v / Σ e``) or degree 1 with the row maxima saved beside it, so that a later kernel can combine
partial results.  Degrees are dicts ``{site: power}``, one site per rewritten exp; ``{}`` is degree 0.

The table :data:`RULES` gives, per op, the degree of the result from the degrees of the operands
(the identity it relies on is in each row's comment) or ``None`` when the op does not commute with a
per-row factor (``exp(s·x)``, a reduction over rows, …).  A per-row factor commutes only with values
whose shape keeps the rows: :func:`keeps_rows` checks that.
"""

from __future__ import annotations

from collections.abc import Callable

from mirage.mugraph.graph import Node, TensorType
from mirage.mugraph.ops import Op

Degree = dict[int, int]


def plus(a: Degree, b: Degree, sign: int = 1) -> Degree:
    out = dict(a)
    for site, power in b.items():
        out[site] = out.get(site, 0) + sign * power
    return {k: v for k, v in out.items() if v}


def times(a: Degree, factor: int) -> Degree:
    return {k: v * factor for k, v in a.items() if v * factor}


def _halve(a: Degree) -> Degree | None:
    if any(v % 2 for v in a.values()):
        return None
    return {k: v // 2 for k, v in a.items()}


def _equal(a: Degree, b: Degree) -> Degree | None:
    return a if a == b else None


def _last_dim(node: Node, types: tuple[TensorType, ...]) -> bool:
    return node.attrs.dim == types[0].rank - 1


Rule = Callable[[Node, tuple[TensorType, ...], list[Degree]], "Degree | None"]

RULES: dict[Op, Rule] = {
    # c·(s·x) = s·(c·x)
    Op.MUL_SCALAR: lambda n, t, d: d[0],
    # (s^a·x)·(s^b·y) = s^(a+b)·x·y
    Op.MUL: lambda n, t, d: plus(d[0], d[1]),
    # (s^a·x)/(s^b·y) = s^(a−b)·x/y
    Op.DIV: lambda n, t, d: plus(d[0], d[1], -1),
    # s^a·x ± s^a·y = s^a·(x ± y); unequal powers do not factor
    Op.ADD: lambda n, t, d: _equal(d[0], d[1]),
    Op.SUB: lambda n, t, d: _equal(d[0], d[1]),
    # (s·x)² = s²·x²;  √(s²·x) = s·√x
    Op.SQUARE: lambda n, t, d: times(d[0], 2),
    Op.SQRT: lambda n, t, d: _halve(d[0]),
    # Σ_j s·x[i, j] = s·Σ_j x[i, j] when s is constant along the reduced (last) dim
    Op.REDUCTION: lambda n, t, d: d[0] if _last_dim(n, t) or not d[0] else None,
    Op.REDUCTION_TO_DIMX: lambda n, t, d: d[0] if _last_dim(n, t) or not d[0] else None,
    # (s·A) @ B = s·(A @ B) for a per-row s of A; A @ (s·B) mixes rows of B
    Op.MATMUL: lambda n, t, d: d[0] if not d[1] else None,
    # rms_norm(s·x) = rms_norm(x) for s > 0 constant along the last dim (not with eps > 0)
    Op.RMS_NORM: lambda n, t, d: {} if not d[0] or n.attrs.eps == 0 else None,
}


def propagate(node: Node, types: tuple[TensorType, ...], degrees: list[Degree]) -> Degree | None:
    """The degree of ``node``'s output, or None when the op does not commute with the factor."""
    if not any(degrees):
        return {}
    rule = RULES.get(node.op)
    return None if rule is None else rule(node, types, degrees)


def keeps_rows(t: TensorType, rows: tuple[int, ...]) -> bool:
    """True when a factor of shape ``rows`` (…, 1) multiplies ``t`` row by row."""
    return t.shape[:-1] == rows[:-1]
