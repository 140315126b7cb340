"""The parameters of the error bound (degree d, exponential terms k) and the bound itself.

Theorem 2 of mirage-notes §3.1: if a non-zero exponential polynomial
``P = Σ_{i≤k} f_i · exp(g_i / h_i)`` has polynomials f, g, h of degree ≤ d (integer coefficients
in [-w, w], q > 2w), one random test (inputs uniform in Z_p × Z_q, ω uniform of order q) finds
``P = 0`` with probability at most ``8·d·k⁴/q + q^(-1/k²)``.  Independent tests multiply.

:class:`SummaryAlgebra` computes d and k of every tensor of a graph by running the graph's own
formulas (through the generic interpreter) on *summaries*: each value is written ``N / D`` with
``N = Σ_{i≤T} f_i exp(g_i/h_i)`` and ``D = Σ_{i≤U} f'_i exp(...)``, and a summary bounds, for every
element at once, the degree of all these polynomials and the term counts T and U.  To keep the
counts finite through reductions, a summary carries an array of *denominator ids*: elements whose
ids agree share one denominator polynomial, so summing them adds numerators only.

Square roots and uninterpreted functions are abstracted as fresh variables (degree 1, one term);
each application is recorded so that :func:`per_test_bound` can add the probability that two
different arguments collide.  ``docs/verifier.md`` states every rule and the resulting numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mirage.mugraph.algebra import Scalar
from mirage.verifier.errors import ExpNestingError, OrderedOpError
from mirage.verifier.field import FieldPair

HUGE = 10**30  # term counts and degrees are capped here: the bound is vacuous long before


ID_BITS = 40  # a denominator id is (analysis-wide counter) << ID_BITS | (index within one array)


def _dense_codes(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes 0..n-1 for the distinct ids of an array (same shape), and n."""
    distinct, inverse = np.unique(ids, return_inverse=True)
    return inverse.reshape(ids.shape).astype(np.int64), len(distinct)


def _cap(value: int) -> int:
    return min(int(value), HUGE)


@dataclass(frozen=True, eq=False)
class Summary:
    """Bounds that hold for every element of a tensor written as N / D (see the module docstring)."""

    shape: tuple[int, ...]
    degree: int
    terms: int  # T: exponential terms of N
    den_terms: int  # U: exponential terms of D
    exp_free: bool  # no exponential terms, and both residue parts are defined
    den: np.ndarray | None  # denominator ids, broadcastable to shape; None: D is a constant
    constant: bool = False
    uid: int = 0


@dataclass
class Application:
    """Uninterpreted applications (sqrt, silu, ...) of one op node: how many, and their arguments."""

    name: str
    count: int
    degree: int
    terms: int
    exp_free: bool


@dataclass
class Division:
    count: int
    degree: int
    terms: int
    exp_free: bool


@dataclass
class SummaryAlgebra:
    """The Algebra protocol over :class:`Summary` values (shapes and bounds, no data)."""

    applications: list[Application] = field(default_factory=list)
    divisions: list[Division] = field(default_factory=list)
    counter: itertools.count = field(default_factory=lambda: itertools.count(1))

    # helpers
    def make(self, shape, degree, terms, den_terms, exp_free, den, constant=False) -> Summary:
        if exp_free:  # a rational function is one term f·exp(0)
            terms = den_terms = 1
        return Summary(tuple(shape), _cap(degree), _cap(terms), _cap(den_terms), exp_free, den, constant,
                       next(self.counter))

    def input(self, shape: tuple[int, ...]) -> Summary:
        return self.make(shape, 1, 1, 1, True, None)

    def _fresh_ids(self, shape: tuple[int, ...]) -> np.ndarray:
        return (next(self.counter) << ID_BITS) + np.arange(math.prod(shape), dtype=np.int64).reshape(shape)

    def _combine(self, a: np.ndarray | None, b: np.ndarray | None, shape) -> np.ndarray | None:
        """Ids of the product of two denominators: equal exactly where both pairs of ids are equal."""
        if a is None or b is None:
            return b if a is None else a
        codes_a, count_a = _dense_codes(a)
        codes_b, count_b = _dense_codes(b)
        if count_a * count_b < 1 << ID_BITS:
            return (next(self.counter) << ID_BITS) + codes_a * count_b + codes_b
        a, b = np.broadcast_arrays(a, b)
        pairs = np.stack([a.ravel(), b.ravel()], axis=1)
        _, inverse = np.unique(pairs, axis=0, return_inverse=True)
        return (next(self.counter) << ID_BITS) + inverse.reshape(a.shape).astype(np.int64)

    @staticmethod
    def _same_den(x: Summary, y: Summary) -> bool:
        if x.den is None or y.den is None:
            return x.den is None and y.den is None
        if x.den is y.den:
            return True
        shape = np.broadcast_shapes(x.den.shape, y.den.shape)
        return bool(np.array_equal(np.broadcast_to(x.den, shape), np.broadcast_to(y.den, shape)))

    @staticmethod
    def _shape(x: Summary, y: Summary) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(x.shape, y.shape))

    # constants and creation
    def const(self, value: Scalar, like: Any) -> Summary:
        return self.make((), 0, 1, 1, True, None, constant=True)

    def zeros(self, shape: tuple[int, ...]) -> Summary:
        return self.make(shape, 0, 1, 1, True, None, constant=True)

    # field operations
    def add(self, x: Summary, y: Summary) -> Summary:
        shape = self._shape(x, y)
        exp_free = x.exp_free and y.exp_free
        if x.constant and y.constant:
            return self.make(shape, 0, 1, 1, True, None, constant=True)
        if y.constant or x.constant:
            v = x if y.constant else y  # v + c = (N + c·D) / D
            return self.make(shape, v.degree, v.terms + v.den_terms, v.den_terms, v.exp_free, v.den)
        if self._same_den(x, y):
            return self.make(shape, max(x.degree, y.degree), x.terms + y.terms,
                             max(x.den_terms, y.den_terms), exp_free, x.den)
        return self.make(shape, x.degree + y.degree, x.terms * y.den_terms + y.terms * x.den_terms,
                         x.den_terms * y.den_terms, exp_free, self._combine(x.den, y.den, shape))

    sub = add

    def mul(self, x: Summary, y: Summary) -> Summary:
        shape = self._shape(x, y)
        constant = x.constant and y.constant
        return self.make(shape, x.degree + y.degree, x.terms * y.terms, x.den_terms * y.den_terms,
                         x.exp_free and y.exp_free, self._combine(x.den, y.den, shape), constant)

    def div(self, x: Summary, y: Summary) -> Summary:
        shape = self._shape(x, y)
        if y.constant:
            return self.make(shape, x.degree, x.terms, x.den_terms, x.exp_free, x.den, x.constant)
        self.divisions.append(Division(math.prod(y.shape), y.degree, y.terms, y.exp_free))
        ids: np.ndarray | None = self._fresh_ids(y.shape)
        if y.den is not None:
            ids = self._combine(ids, y.den, y.shape)
        return self.make(shape, x.degree + y.degree, x.terms * y.den_terms, x.den_terms * y.terms,
                         x.exp_free and y.exp_free, self._combine(x.den, ids, shape))

    def exp(self, x: Summary) -> Summary:
        if not x.exp_free:
            raise ExpNestingError("a second exp on an input→output path (outside the LAX fragment)")
        return self.make(x.shape, x.degree, 1, 1, False, None, x.constant)

    def _fresh(self, name: str, x: Summary, keeps_q_part: bool) -> Summary:
        """A fresh variable; without a q-part when its argument lost its own (sqrt after exp)."""
        if x.constant:
            return self.make(x.shape, 0, 1, 1, True, None, constant=True)
        self.applications.append(Application(name, math.prod(x.shape), x.degree,
                                             max(x.terms, x.den_terms), x.exp_free))
        return self.make(x.shape, 1, 1, 1, keeps_q_part or x.exp_free, None)

    def sqrt(self, x: Summary) -> Summary:
        return self._fresh("sqrt", x, keeps_q_part=False)

    def opaque(self, name: str, x: Summary, reference: Callable) -> Summary:
        return self._fresh(name, x, keeps_q_part=True)  # the hash defines both parts

    def sum(self, x: Summary, axis: int, keepdims: bool = True) -> Summary:
        n = x.shape[axis]
        if _constant_along(x.den, x.shape, axis):
            den = None if x.den is None else np.take(np.broadcast_to(x.den, x.shape), [0], axis=axis)
            degree, terms, den_terms = x.degree, n * x.terms, x.den_terms
        else:  # different denominators: bring all n to a common one
            reduced = list(x.shape)
            reduced[axis] = 1
            den = self._fresh_ids(tuple(reduced))
            degree, den_terms = n * x.degree, x.den_terms ** min(n, 64)
            terms = n * x.terms * x.den_terms ** min(n - 1, 64)
        shape = list(x.shape)
        if keepdims:
            shape[axis] = 1
        else:
            del shape[axis]
            den = None if den is None else np.squeeze(den, axis=axis)
        return self.make(shape, degree, terms, den_terms, x.exp_free, den, x.constant)

    def matmul(self, x: Summary, y: Summary) -> Summary:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], y.shape[:-2]))
        k = x.shape[-1]
        out_shape = (*batch, x.shape[-2], y.shape[-1])
        degree, terms = x.degree + y.degree, x.terms * y.terms
        den_terms, exp_free = x.den_terms * y.den_terms, x.exp_free and y.exp_free
        if _constant_along(x.den, x.shape, -1) and _constant_along(y.den, y.shape, -2):
            # every product x[i, l]·y[l, j] of one output element has one denominator: add numerators
            left = None if x.den is None else np.broadcast_to(x.den, x.shape)[..., :1]
            right = None if y.den is None else np.broadcast_to(y.den, y.shape)[..., :1, :]
            return self.make(out_shape, degree, k * terms, den_terms, exp_free,
                             self._combine(left, right, out_shape))
        return self.make(out_shape, k * degree, k * terms * den_terms ** min(k - 1, 64),
                         den_terms ** min(k, 64), exp_free, self._fresh_ids(out_shape))

    # order-based helpers
    def max(self, x, axis: int, keepdims: bool = True):
        raise OrderedOpError("max has no finite-field meaning (it needs an order)")

    def maximum(self, x, y):
        raise OrderedOpError("maximum has no finite-field meaning (it needs an order)")

    def neg_inf(self, shape):
        raise OrderedOpError("-inf has no finite-field meaning (it needs an order)")

    # shape-only work
    def structural(self, fn: Callable[..., np.ndarray], *xs: Summary) -> Summary:
        dummies = [np.broadcast_to(np.zeros((), np.int8), x.shape) for x in xs]
        shape = np.shape(fn(*dummies))
        if all(x.den is None for x in xs):
            den = None
        else:
            ids = [np.broadcast_to(x.den if x.den is not None else np.zeros((), np.int64), x.shape)
                   for x in xs]
            den = np.asarray(fn(*ids))
        return self.make(shape, max(x.degree for x in xs), max(x.terms for x in xs),
                         max(x.den_terms for x in xs), all(x.exp_free for x in xs), den,
                         all(x.constant for x in xs))

    def shape(self, x: Summary) -> tuple[int, ...]:
        return x.shape


def _constant_along(den: np.ndarray | None, shape: tuple[int, ...], axis: int) -> bool:
    """Whether the denominator ids do not change along ``axis`` (always true without ids)."""
    if den is None:
        return True
    full = np.broadcast_to(den, shape)
    first = np.take(full, [0], axis=axis)
    return bool(np.array_equal(np.broadcast_to(first, full.shape), full))


# ---- the bound -----------------------------------------------------------------------------------


def theorem_bound(degree: int, terms: int, q: int) -> float:
    """Theorem 2: 8·d·k⁴/q + q^(-1/k²), capped at 1."""
    if terms >= 10**6 or degree >= HUGE:
        return 1.0
    value = 8.0 * degree * float(terms) ** 4 / q + q ** (-1.0 / terms**2)
    return min(1.0, value)


def zero_probability(degree: int, terms: int, exp_free: bool, fields: FieldPair) -> tuple[float, float]:
    """Bounds on Pr[a non-zero value is 0] in the p-part and in the q-part (1.0 where undefined)."""
    if exp_free:
        return min(1.0, degree / fields.p), min(1.0, degree / fields.q)
    return theorem_bound(degree, terms, fields.q), 1.0


@dataclass(frozen=True)
class TestBound:
    """The probability that one random test passes a graph pair that is not equivalent."""

    epsilon: float
    degree: int  # d of the difference N1·D2 - N2·D1
    terms: int  # k of the difference
    exp_free: bool
    zero_divisor: float  # the part of epsilon that comes from divisors vanishing
    collision: float  # the part that comes from uninterpreted arguments colliding


def per_test_bound(outputs: list[tuple[Summary, Summary]], applications: list[Application],
                   divisions: list[Division], fields: FieldPair) -> TestBound:
    """ε for one test: max over output pairs of Pr[P = 0], plus divisor zeros and argument collisions."""
    zero_p = zero_q = 0.0
    for d in divisions:
        zp, zq = zero_probability(d.degree, d.terms, d.exp_free, fields)
        zero_p, zero_q = zero_p + d.count * zp, zero_q + d.count * zq
    count = sum(a.count for a in applications)
    pairs = count * (count - 1) / 2
    collision = 0.0
    if pairs:
        worst = max(applications, key=lambda a: (not a.exp_free, a.degree, a.terms))
        zp, zq = zero_probability(2 * worst.degree, 2 * worst.terms, worst.exp_free, fields)
        collision = min(1.0, pairs * zp * zq)
    worst_epsilon, worst_shape = 0.0, (0, 0, True)
    for first, second in outputs:
        same = SummaryAlgebra._same_den(first, second)
        degree = max(first.degree, second.degree) if same else first.degree + second.degree
        terms = (first.terms + second.terms if same else
                 first.terms * second.den_terms + second.terms * first.den_terms)
        exp_free = first.exp_free and second.exp_free
        if exp_free:
            epsilon = min(1.0, degree / fields.p + zero_p) * min(1.0, degree / fields.q + zero_q)
        else:
            epsilon = theorem_bound(degree, _cap(terms), fields.q) + zero_p
        if epsilon >= worst_epsilon:
            worst_epsilon, worst_shape = epsilon, (degree, _cap(terms), exp_free)
    epsilon = min(1.0, worst_epsilon + collision)
    degree, terms, exp_free = worst_shape
    return TestBound(epsilon, degree, terms, exp_free, min(1.0, zero_p), collision)


def tests_needed(epsilon: float, delta: float, matchings: int = 1) -> int | None:
    """The fewest t with matchings·ε^t ≤ δ (None when ε ≥ 1: no number of tests suffices)."""
    if epsilon <= 0.0:
        return 1
    if epsilon >= 1.0:
        return None
    return max(1, math.ceil(math.log(delta / matchings) / math.log(epsilon)))
