"""The axioms of abstract expressions as a table of named rewrite rules (paper Table 2).

Rules are data: a :class:`Rewrite` row has a name, a left and a right :class:`Pattern`, and says
whether it also applies right to left.  Both e-graph back ends (``egraph.py``, ``egraph_egglog.py``)
read the same table, so adding an axiom is adding one row to :data:`AXIOMS`.

The subexpression axioms ``A_sub`` need no rules: a term is a subexpression of the target iff all
its nodes are represented in the saturated e-graph of the target, because every e-node of that
e-graph is a subterm of some ``A_eq``-rewrite of the target (reflexivity and transitivity come for
free, and ``subexpr(x, op(x, ...))`` is "a child of a represented node is represented").

The paper's ``sum(i, sum(j, x)) = sum(i*j, x)`` has a computed size, so, as in Mirage's e-graph, it
is realised by *factor chains*: for every reduction size ``n`` of the target and every divisor
``d > 1`` of ``n`` that is not prime, ``sum(d, x) = sum(p, sum(d/p, x))`` with ``p`` the smallest
prime factor of ``d``; together with ``comm-sum`` this relates every split of ``n`` into factors.

>>> x, y = pattern_variables("x y")
>>> print(Rewrite("comm-add", P.add(x, y), P.add(y, x)))
comm-add: (+ ?x ?y) => (+ ?y ?x)
>>> [str(rule) for rule in factor_chain_rules([12])]
['factor-12: (sum 12 ?x) <=> (sum 2 (sum 6 ?x))', 'factor-6: (sum 6 ?x) <=> (sum 2 (sum 3 ?x))', \
'factor-4: (sum 4 ?x) <=> (sum 2 (sum 2 ?x))']
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mirage.generator.abstract_expr import TermOp


@dataclass(frozen=True)
class PatternVariable:
    """Matches any e-class (``?x``)."""

    name: str

    def __str__(self) -> str:
        return f"?{self.name}"


@dataclass(frozen=True)
class SizeVariable:
    """Matches the size of a reduction (``?i`` in ``(sum ?i ?x)``)."""

    name: str

    def __str__(self) -> str:
        return f"?{self.name}"


@dataclass(frozen=True)
class PatternNode:
    """Matches an e-node with this operator and parameter whose children match ``args``."""

    op: TermOp
    parameter: int | str | SizeVariable | None
    args: tuple[Pattern, ...]

    def __str__(self) -> str:
        match self.op:
            case TermOp.CONSTANT:
                return "c"
            case TermOp.SUM:
                parts = ["sum", str(self.parameter)]
            case TermOp.OPAQUE:
                parts = [str(self.parameter)]
            case _:
                parts = [self.op.value]
        parts.extend(str(a) for a in self.args)
        return "(" + " ".join(parts) + ")"


Pattern = PatternVariable | PatternNode


class P:
    """Typed constructors of patterns: ``P.add(x, y)``, ``P.sum(i, x)``, ``P.c``."""

    c = PatternNode(TermOp.CONSTANT, None, ())

    @staticmethod
    def add(x: Pattern, y: Pattern) -> PatternNode:
        return PatternNode(TermOp.ADD, None, (x, y))

    @staticmethod
    def mul(x: Pattern, y: Pattern) -> PatternNode:
        return PatternNode(TermOp.MUL, None, (x, y))

    @staticmethod
    def div(x: Pattern, y: Pattern) -> PatternNode:
        return PatternNode(TermOp.DIV, None, (x, y))

    @staticmethod
    def exp(x: Pattern) -> PatternNode:
        return PatternNode(TermOp.EXP, None, (x,))

    @staticmethod
    def sqrt(x: Pattern) -> PatternNode:
        return PatternNode(TermOp.SQRT, None, (x,))

    @staticmethod
    def sum(size: int | SizeVariable, x: Pattern) -> PatternNode:
        return PatternNode(TermOp.SUM, size, (x,))


def pattern_variables(names: str) -> tuple[PatternVariable, ...]:
    return tuple(PatternVariable(name) for name in names.split())


def size_variables(names: str) -> tuple[SizeVariable, ...]:
    return tuple(SizeVariable(name) for name in names.split())


@dataclass(frozen=True)
class Rewrite:
    """A named rewrite rule ``lhs => rhs`` (also ``rhs => lhs`` when ``bidirectional``)."""

    name: str
    lhs: Pattern
    rhs: Pattern
    bidirectional: bool = False

    def __str__(self) -> str:
        arrow = "<=>" if self.bidirectional else "=>"
        return f"{self.name}: {self.lhs} {arrow} {self.rhs}"

    def directions(self) -> Iterator[tuple[str, Pattern, Pattern]]:
        """The one-way rules this row stands for: ``(name, lhs, rhs)``."""
        yield self.name, self.lhs, self.rhs
        if self.bidirectional:
            yield self.name + "-rev", self.rhs, self.lhs


x, y, z = pattern_variables("x y z")
i, j = size_variables("i j")

#: The equivalence axioms A_eq (paper Table 2, and the extra rules of Mirage's e-graph).
AXIOMS: tuple[Rewrite, ...] = (
    # x + y = y + x
    Rewrite("comm-add", P.add(x, y), P.add(y, x)),
    # x * y = y * x
    Rewrite("comm-mul", P.mul(x, y), P.mul(y, x)),
    # x + (y + z) = (x + y) + z
    Rewrite("assoc-add", P.add(x, P.add(y, z)), P.add(P.add(x, y), z), bidirectional=True),
    # x * (y * z) = (x * y) * z
    Rewrite("assoc-mul", P.mul(x, P.mul(y, z)), P.mul(P.mul(x, y), z), bidirectional=True),
    # x*z + y*z = (x + y) * z
    Rewrite("distribute", P.add(P.mul(x, z), P.mul(y, z)), P.mul(P.add(x, y), z), bidirectional=True),
    # x/z + y/z = (x + y) / z
    Rewrite("div-add", P.add(P.div(x, z), P.div(y, z)), P.div(P.add(x, y), z), bidirectional=True),
    # x * (y / z) = (x * y) / z
    Rewrite("mul-div", P.mul(x, P.div(y, z)), P.div(P.mul(x, y), z), bidirectional=True),
    # (x / y) / z = x / (y * z)
    Rewrite("div-div", P.div(P.div(x, y), z), P.div(x, P.mul(y, z)), bidirectional=True),
    # sum(i, sum(j, x)) = sum(j, sum(i, x))      (with the factor chains: sum(i, sum(j, x)) = sum(i*j, x))
    Rewrite("comm-sum", P.sum(i, P.sum(j, x)), P.sum(j, P.sum(i, x))),
    # sum(i, x + y) = sum(i, x) + sum(i, y)
    Rewrite("sum-add", P.sum(i, P.add(x, y)), P.add(P.sum(i, x), P.sum(i, y)), bidirectional=True),
    # sum(i, x * y) = sum(i, x) * y
    Rewrite("sum-mul", P.sum(i, P.mul(x, y)), P.mul(P.sum(i, x), y), bidirectional=True),
    # sum(i, x / y) = sum(i, x) / y
    Rewrite("sum-div", P.sum(i, P.div(x, y)), P.div(P.sum(i, x), y), bidirectional=True),
    # exp(x) * exp(y) = exp(x + y)
    Rewrite("exp-add", P.mul(P.exp(x), P.exp(y)), P.exp(P.add(x, y)), bidirectional=True),
    # sqrt(x) * sqrt(y) = sqrt(x * y)
    Rewrite("sqrt-mul", P.mul(P.sqrt(x), P.sqrt(y)), P.sqrt(P.mul(x, y)), bidirectional=True),
    # x / y = x * (c / y)                         (a division is a product with a reciprocal)
    Rewrite("div-reciprocal", P.div(x, y), P.mul(x, P.div(P.c, y))),
    # x * c = x                                   (constants are absorbed, see abstract_expr)
    Rewrite("mul-const", P.mul(x, P.c), x),
    # x / c = x
    Rewrite("div-const", P.div(x, P.c), x),
    # exp(c) = c
    Rewrite("exp-const", P.exp(P.c), P.c),
    # sqrt(c) = c                                 (without it sqrt(x) = sqrt(x * c) grows a tower)
    Rewrite("sqrt-const", P.sqrt(P.c), P.c),
    # Deliberately absent: x + c = x and sum(i, c) = c.  With sum-mul, sum(i, c * x) = sum(i, c) * x
    # would make every sum(i, x) equal to x; the smart constructors of abstract_expr apply them to
    # terms instead, and no rule here creates a sum or a sum of a constant.
)


def smallest_prime_factor(n: int) -> int:
    factor = 2
    while factor * factor <= n:
        if n % factor == 0:
            return factor
        factor += 1
    return n


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n < 1 << 16 else _large_divisors(n)


def _large_divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


def factor_chain_rules(sizes: Iterable[int]) -> list[Rewrite]:
    """``sum(d, x) = sum(p, sum(d/p, x))`` for every composite divisor ``d`` of the given sizes."""
    composite: set[int] = set()
    for size in sizes:
        composite.update(d for d in divisors(size) if d > 1 and smallest_prime_factor(d) != d)
    rules = []
    for d in sorted(composite, reverse=True):
        p = smallest_prime_factor(d)
        # sum(d, x) = sum(p, sum(d/p, x))
        rules.append(Rewrite(f"factor-{d}", P.sum(d, x), P.sum(p, P.sum(d // p, x)), bidirectional=True))
    return rules
