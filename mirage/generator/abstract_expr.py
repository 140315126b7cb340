"""Abstract expressions: the symbolic summary of what a tensor computes, used for pruning.

An abstract expression (paper §4.3) forgets indices and keeps the *shape* of a computation: which
inputs are combined, by which operators, and how many elements every reduction sums.  Terms are
immutable and hash-consed: building the same term twice returns the same object, so equality is
identity and a term is a cheap dictionary key.

Grammar (``Term.op``)::

    E ::= v<i>                  one variable per input tensor of the reference program
        | c                     every constant (see "constants" below)
        | (+ E E) | (* E E) | (/ E E) | (exp E) | (sqrt E)
        | (sum n E)             a reduction that sums n elements (n > 1)
        | (<name> E)            an opaque function outside the LAX fragment: silu, gelu, relu, ...

Abstraction choices (they apply equally to the target and to every candidate, which is what the
soundness argument, Theorem 1, needs):

* **Constants** (scales, epsilons, the ``1/n`` of a mean, the sign of a subtraction) all become
  the single leaf ``c``, and ``c`` is absorbed by ``+``, ``*`` and as a divisor: ``x + c = x``,
  ``x * c = x``, ``x / c = x``, ``x - y = x + y``.  Where the scale of a softmax is applied, or
  whether an RMS norm adds an epsilon, thus never prunes a candidate.  ``c / x`` (a reciprocal)
  stays, and functions of constants fold to ``c``.
* ``sum(1, x)`` is ``x`` and ``sum(i, sum(j, x))`` is ``sum(i*j, x)``, structurally (axioms 9 and
  10 of the paper's Table 2).
* ``rms(n, x)`` is written out as ``sqrt(sum(n, x * x))``: an accumulator that computes an RMS, a
  block-level ``rms_norm`` and a reference that squares, sums and takes a square root all agree.

>>> x, w = variable(0), variable(1)
>>> rms_x = rms(4096, x)
>>> print(sum_of(4096, mul(div(x, rms_x), w)))
(sum 4096 (* (/ v0 (sqrt (sum 4096 (* v0 v0)))) v1))
>>> mul(x, constant()) is x
True
>>> parse("(sum 64 (* v0 v1))") is sum_of(64, mul(x, w))
True
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

from mirage.errors import MirageError


class AbstractExpressionError(MirageError, ValueError):
    """A term or an s-expression is malformed (bad reduction size, unknown operator, syntax)."""


class TermOp(enum.Enum):
    """Operators of the abstract-expression language; the value is the s-expression head."""

    VARIABLE = "v"
    CONSTANT = "c"
    ADD = "+"
    MUL = "*"
    DIV = "/"
    EXP = "exp"
    SQRT = "sqrt"
    SUM = "sum"
    OPAQUE = "fn"


#: Operators whose term has exactly two children / one child.
BINARY_OPS = frozenset({TermOp.ADD, TermOp.MUL, TermOp.DIV})
UNARY_OPS = frozenset({TermOp.EXP, TermOp.SQRT, TermOp.SUM, TermOp.OPAQUE})
LEAF_OPS = frozenset({TermOp.VARIABLE, TermOp.CONSTANT})

#: Heads that ``parse`` and the printer reserve; an opaque function cannot use them as a name.
RESERVED_HEADS = frozenset({"+", "*", "/", "exp", "sqrt", "sum", "c"})


@dataclass(frozen=True, eq=False)
class Term:
    """One hash-consed node of an abstract expression.  Build terms with the functions below.

    ``parameter`` is the input index of a variable, the size of a reduction, the name of an opaque
    function, and ``None`` otherwise.  ``exp_depth`` is the largest number of ``exp`` on a path from
    the root to a leaf.
    """

    op: TermOp
    parameter: int | str | None
    args: tuple[Term, ...]
    exp_depth: int = field(repr=False)
    _hash: int = field(repr=False)

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return to_sexpr(self)

    def __reduce__(self):
        # Re-intern on unpickling (terms travel to search worker processes).
        return (_make, (self.op, self.parameter, self.args))

    @property
    def is_constant(self) -> bool:
        return self.op is TermOp.CONSTANT

    def subterms(self) -> Iterator[Term]:
        """Every distinct node of the term, children before parents."""
        seen: set[int] = set()
        stack: list[tuple[Term, bool]] = [(self, False)]
        while stack:
            term, expanded = stack.pop()
            if expanded:
                yield term
                continue
            if id(term) in seen:
                continue
            seen.add(id(term))
            stack.append((term, True))
            stack.extend((arg, False) for arg in reversed(term.args))

    def variables(self) -> frozenset[int]:
        return frozenset(t.parameter for t in self.subterms() if t.op is TermOp.VARIABLE)  # type: ignore


_TABLE: weakref.WeakValueDictionary[tuple, Term] = weakref.WeakValueDictionary()


def _make(op: TermOp, parameter: int | str | None, args: tuple[Term, ...]) -> Term:
    """Return the unique term with this operator, parameter and children."""
    key = (op, parameter, *map(id, args))
    term = _TABLE.get(key)
    if term is None:
        exp_depth = max((a.exp_depth for a in args), default=0) + (op is TermOp.EXP)
        term = Term(op, parameter, args, exp_depth, hash(key))
        _TABLE[key] = term
    return term


# ---------------------------------------------------------------------------------------------
# Smart constructors (they implement the abstraction choices of the module docstring)
# ---------------------------------------------------------------------------------------------


def variable(index: int) -> Term:
    """The variable of the ``index``-th input of the reference program."""
    if not isinstance(index, int) or index < 0:
        raise AbstractExpressionError(f"variable index must be a non-negative int, got {index!r}")
    return _make(TermOp.VARIABLE, index, ())


def constant() -> Term:
    """The single constant leaf ``c``."""
    return _make(TermOp.CONSTANT, None, ())


def add(x: Term, y: Term) -> Term:
    """``x + y``; a constant summand is absorbed (``x + c = x``)."""
    if y.is_constant:
        return x
    if x.is_constant:
        return y
    return _make(TermOp.ADD, None, (x, y))


def sub(x: Term, y: Term) -> Term:
    """``x - y``, abstracted as ``x + y`` (the sign is a constant factor)."""
    return add(x, y)


def mul(x: Term, y: Term) -> Term:
    """``x * y``; a constant factor is absorbed (``x * c = x``)."""
    if y.is_constant:
        return x
    if x.is_constant:
        return y
    return _make(TermOp.MUL, None, (x, y))


def div(x: Term, y: Term) -> Term:
    """``x / y``; a constant divisor is absorbed (``x / c = x``), ``c / x`` is kept."""
    if y.is_constant:
        return x
    return _make(TermOp.DIV, None, (x, y))


def exp(x: Term) -> Term:
    return x if x.is_constant else _make(TermOp.EXP, None, (x,))


def sqrt(x: Term) -> Term:
    return x if x.is_constant else _make(TermOp.SQRT, None, (x,))


def sum_of(size: int, x: Term) -> Term:
    """A reduction summing ``size`` elements of ``x``.

    ``sum(1, x) = x``, ``sum(n, c) = c`` and ``sum(i, sum(j, x)) = sum(i*j, x)``: reductions are
    merged, so a tiled reduction (a matmul over a tile, then a for-loop accumulator) and the whole
    reduction of the reference have the same shape of term.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise AbstractExpressionError(f"a reduction size must be a positive int, got {size!r}")
    if size == 1 or x.is_constant:
        return x
    if x.op is TermOp.SUM:
        return _make(TermOp.SUM, size * x.parameter, x.args)  # type: ignore[operator]
    return _make(TermOp.SUM, size, (x,))


def rms(size: int, x: Term) -> Term:
    """Root mean square over ``size`` elements, written out as ``sqrt(sum(size, x * x))``."""
    return sqrt(sum_of(size, mul(x, x)))


def opaque(name: str, x: Term) -> Term:
    """An uninterpreted unary function (``silu``, ``gelu``, ``relu``, ``sigmoid``, ``clamp``...)."""
    if not name or not name.replace("_", "").isalnum() or name in RESERVED_HEADS:
        raise AbstractExpressionError(
            f"opaque function name {name!r} must be a non-empty identifier "
            f"other than {sorted(RESERVED_HEADS)}"
        )
    return x if x.is_constant else _make(TermOp.OPAQUE, name, (x,))


# ---------------------------------------------------------------------------------------------
# Printing and parsing
# ---------------------------------------------------------------------------------------------


def to_sexpr(term: Term) -> str:
    """The s-expression of a term, e.g. ``(sum 64 (* v0 v1))``."""
    memo: dict[Term, str] = {}
    for node in term.subterms():
        match node.op:
            case TermOp.VARIABLE:
                text = f"v{node.parameter}"
            case TermOp.CONSTANT:
                text = "c"
            case TermOp.SUM:
                text = f"(sum {node.parameter} {memo[node.args[0]]})"
            case TermOp.OPAQUE:
                text = f"({node.parameter} {memo[node.args[0]]})"
            case _:
                text = "(" + " ".join([node.op.value, *(memo[a] for a in node.args)]) + ")"
        memo[node] = text
    return memo[term]


def _tokens(text: str) -> list[str]:
    return text.replace("(", " ( ").replace(")", " ) ").split()


def parse(text: str) -> Term:
    """Parse the s-expression form printed by :func:`to_sexpr` (inverse of printing)."""
    tokens = _tokens(text)
    if not tokens:
        raise AbstractExpressionError("empty abstract expression")
    position = 0

    def fail(message: str) -> AbstractExpressionError:
        return AbstractExpressionError(f"{message} at token {position} of {text!r}")

    def read() -> Term:
        nonlocal position
        if position >= len(tokens):
            raise fail("unexpected end of expression")
        token = tokens[position]
        position += 1
        if token == ")":
            raise fail("unexpected ')'")
        if token != "(":
            if token == "c":
                return constant()
            if token.startswith("v") and token[1:].isdigit():
                return variable(int(token[1:]))
            raise fail(f"unknown leaf {token!r} (expected v<index> or c)")
        if position >= len(tokens):
            raise fail("unexpected end of expression")
        head = tokens[position]
        position += 1
        if head == "sum":
            size_token = tokens[position] if position < len(tokens) else ""
            if not size_token.isdigit():
                raise fail(f"reduction size must be an integer, got {size_token!r}")
            position += 1
            args: list[Term | int] = [int(size_token), read()]
        else:
            args = []
            while position < len(tokens) and tokens[position] != ")":
                args.append(read())
        if position >= len(tokens):
            raise fail("missing ')'")
        position += 1
        return _build(head, args, fail)

    term = read()
    if position != len(tokens):
        raise fail("trailing tokens")
    return term


_BINARY_BUILDERS = {"+": add, "*": mul, "/": div}
_UNARY_BUILDERS = {"exp": exp, "sqrt": sqrt}


def _build(head: str, args: list, fail) -> Term:
    if head == "sum":
        return sum_of(args[0], args[1])
    if head in _BINARY_BUILDERS:
        if len(args) != 2:
            raise fail(f"{head!r} takes 2 arguments, got {len(args)}")
        return _BINARY_BUILDERS[head](*args)
    if len(args) != 1:
        raise fail(f"{head!r} takes 1 argument, got {len(args)}")
    if head in _UNARY_BUILDERS:
        return _UNARY_BUILDERS[head](args[0])
    return opaque(head, args[0])
