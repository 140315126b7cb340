"""A slow, independent implementation of the fingerprint algebra on ``galois`` field arrays.

It shares nothing with :mod:`mirage.verifier.field` but the field pair, the choice of ω (as an
exponent of the generator) and the keyed hash of uninterpreted functions (which is a hash, not field
arithmetic).  Inverses, square roots, powers of ω, matrix products and sums all come from
``galois``; the tests check that the fast numpy path agrees with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mirage.mugraph.algebra import Scalar
from mirage.verifier.errors import ExpNestingError, OrderedOpError
from mirage.verifier.field import DEFAULT_FIELDS, FieldArray, FieldPair, as_fraction, keyed_hash


@dataclass(frozen=True, eq=False)
class OracleValue:
    p: Any  # a galois GF(p) array
    q: Any | None  # a GF(q) array, or None once undefined


class GaloisAlgebra:
    """The Algebra protocol over galois ``GF(p) × GF(q)`` arrays (test oracle)."""

    def __init__(self, fields: FieldPair = DEFAULT_FIELDS, omega_exponent: int = 1,
                 hash_key: int = 0) -> None:
        import galois

        self.fields = fields
        self.GFp = galois.GF(fields.p, compile="jit-calculate")
        self.GFq = galois.GF(fields.q, compile="jit-calculate")
        self.omega = self.GFp(fields.generator_p) ** (fields.omega_step * omega_exponent)
        self.hash_key = hash_key

    def lift(self, x: FieldArray) -> OracleValue:
        return OracleValue(self.GFp(np.asarray(x.p)), None if x.q is None else self.GFq(np.asarray(x.q)))

    @staticmethod
    def lower(x: OracleValue) -> FieldArray:
        return FieldArray(np.asarray(x.p, dtype=np.int64), None if x.q is None else np.asarray(x.q, np.int64))

    def _pair(self, x: OracleValue, y: OracleValue, fn) -> OracleValue:
        q = None if x.q is None or y.q is None else fn(x.q, y.q)
        return OracleValue(fn(x.p, y.p), q)

    @staticmethod
    def _element(GF, fraction) -> Any:
        return GF(fraction.numerator % GF.order) / GF(fraction.denominator % GF.order)

    def const(self, value: Scalar, like: Any) -> OracleValue:
        fraction = as_fraction(value)
        return OracleValue(self._element(self.GFp, fraction), self._element(self.GFq, fraction))

    def zeros(self, shape: tuple[int, ...]) -> OracleValue:
        return OracleValue(self.GFp.Zeros(shape), self.GFq.Zeros(shape))

    def add(self, x, y):
        return self._pair(x, y, lambda a, b: a + b)

    def sub(self, x, y):
        return self._pair(x, y, lambda a, b: a - b)

    def mul(self, x, y):
        return self._pair(x, y, lambda a, b: a * b)

    def div(self, x, y):
        def meadow(a, b):
            GF = type(a)
            a, b = (GF(np.array(v)) for v in np.broadcast_arrays(np.asarray(a), np.asarray(b)))
            zero = np.asarray(b) == 0
            safe = GF(np.where(zero, 1, np.asarray(b)))
            return GF(np.where(zero, 0, np.asarray(a / safe)))

        return self._pair(x, y, meadow)

    def exp(self, x):
        if x.q is None:
            raise ExpNestingError("second exp on a path")
        return OracleValue(self.omega ** np.asarray(x.q, dtype=np.int64), None)

    def sqrt(self, x):
        def root(a):
            return a ** ((type(a).order + 1) // 4)

        return OracleValue(root(x.p), None if x.q is None else root(x.q))

    def matmul(self, x, y):
        return self._pair(x, y, lambda a, b: np.matmul(*_broadcast_batch(a, b)))

    def sum(self, x, axis: int, keepdims: bool = True):
        q = None if x.q is None else np.sum(x.q, axis=axis, keepdims=keepdims)
        return OracleValue(np.sum(x.p, axis=axis, keepdims=keepdims), q)

    def opaque(self, name: str, x, reference: Callable[[np.ndarray], np.ndarray]):
        return self.lift(keyed_hash(self.fields, self.hash_key, name, self.lower(x)))

    def max(self, x, axis: int, keepdims: bool = True):
        raise OrderedOpError("max")

    def maximum(self, x, y):
        raise OrderedOpError("maximum")

    def neg_inf(self, shape):
        raise OrderedOpError("neg_inf")

    def structural(self, fn, *xs):
        p = fn(*(x.p for x in xs))
        q = None if any(x.q is None for x in xs) else fn(*(x.q for x in xs))
        return OracleValue(type(xs[0].p)(np.asarray(p)), None if q is None else type(xs[0].q)(np.asarray(q)))

    def shape(self, x) -> tuple[int, ...]:
        return tuple(np.shape(x.p))


def _broadcast_batch(a, b):
    """Broadcast the leading (batch) axes of two matmul operands, keeping the galois type."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    GF = type(a)
    return (GF(np.broadcast_to(np.asarray(a), batch + a.shape[-2:]).copy()),
            GF(np.broadcast_to(np.asarray(b), batch + b.shape[-2:]).copy()))
