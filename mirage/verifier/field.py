"""Finite-field fingerprints: the field pair (p, q) and the algebra that evaluates µGraphs in it.

A value is a pair of residue arrays ``(x mod p, x mod q)`` (mirage-notes §3).  Field operations act
on both parts; ``exp`` maps the q-part into the p-part through a root of unity ω of order q
(``exp(x) = ω^(x mod q) mod p``), after which the q-part is undefined.  Every op's meaning comes
from its registry formula, evaluated over :class:`FieldAlgebra` by the generic interpreter.

The default pair is p = 2097143 = 2q + 1, q = 1048571, both primes ≡ 3 (mod 4).  Residues are kept
in [0, m) as int64; matrix products run through float64 BLAS, exact while every dot product stays
below 2⁵³: on the residues as they are for k ≤ 2048 here, on residues centred in (-m/2, m/2] for
k ≤ 8192 (``k · ((p - 1)/2)² < 2⁵³``); longer products are chunked.  ``docs/verifier.md`` gives the
measurements behind this choice.

>>> import numpy as np
>>> A = FieldAlgebra(DEFAULT_FIELDS)
>>> x = FieldArray(np.array([3]), np.array([3]))
>>> A.mul(A.div(x, A.const(4, None)), A.const(4, None)).p.tolist()
[3]
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from mirage.mugraph.algebra import Scalar
from mirage.verifier.errors import ExpNestingError, FieldConstantError, OrderedOpError

FLOAT64_EXACT = 2**53


@dataclass(frozen=True)
class FieldPair:
    """Primes p, q with q | p - 1 and p ≡ q ≡ 3 (mod 4), with a generator of each unit group.

    ``construct_fields`` finds pairs with ``galois``; :data:`DEFAULT_FIELDS` is one it found (the
    unit tests re-derive it).
    """

    p: int
    q: int
    generator_p: int
    generator_q: int

    def __post_init__(self) -> None:
        if self.p >= 2**31:
            raise ValueError(f"p = {self.p} must be < 2^31 so that residue products fit in int64")
        for name, m in (("p", self.p), ("q", self.q)):
            if m % 4 != 3:
                raise ValueError(f"{name} = {m} must be ≡ 3 (mod 4) so that x^((m+1)/4) is a square root")
        if (self.p - 1) % self.q:
            raise ValueError(f"q = {self.q} must divide p - 1 = {self.p - 1} (roots of unity of order q)")

    @property
    def max_matmul_depth(self) -> int:
        """The longest inner dimension whose float64 product of centred residues is exact."""
        half = (self.p - 1) // 2
        return (FLOAT64_EXACT - 1) // (half * half)

    @property
    def omega_step(self) -> int:
        """(p - 1) / q: ω = g^(step · t) has order q for every t in [1, q)."""
        return (self.p - 1) // self.q

    def tables(self) -> FieldTables:
        return _tables(self)

    def element(self, value: Scalar) -> tuple[int, int]:
        """The residues (mod p, mod q) of an int, a Fraction, or a float (see :func:`as_fraction`)."""
        fraction = as_fraction(value)
        out = []
        for m in (self.p, self.q):
            denominator = fraction.denominator % m
            if denominator == 0:
                raise FieldConstantError(f"the constant {value!r} has a denominator divisible by {m}; "
                                         "it has no image in the field (choose another field pair)")
            out.append(fraction.numerator * pow(denominator, -1, m) % m)
        return out[0], out[1]

    def random(self, shape: tuple[int, ...], rng: np.random.Generator) -> FieldArray:
        """Uniform residues in Z_p × Z_q (with their centred float64 copies, for matrix products)."""
        p = rng.integers(0, self.p, shape, dtype=np.int64)
        q = rng.integers(0, self.q, shape, dtype=np.int64)
        return FieldArray(p, q, centred(p, self.p), centred(q, self.q))


def as_fraction(value: Scalar) -> Fraction:
    """The exact rational a constant stands for.

    A float maps to the simplest fraction (denominator ≤ 10⁹) that rounds to exactly the same
    float, so ``1/3``, ``Fraction(1, 3)`` and ``0.1`` ↦ ``1/10`` give one field element whichever
    way a graph wrote them; distinct floats still map to distinct fractions.
    """
    if isinstance(value, Fraction):
        return value
    if isinstance(value, (int, np.integer)):
        return Fraction(int(value))
    exact = Fraction(float(value))
    simple = exact.limit_denominator(10**9)
    return simple if float(simple) == float(value) else exact


DEFAULT_FIELDS = FieldPair(p=2097143, q=1048571, generator_p=5, generator_q=2)


def construct_fields(q_bits: int) -> FieldPair:
    """The largest safe-prime pair p = 2q + 1 with q < 2^q_bits and p ≡ q ≡ 3 (mod 4) (uses galois)."""
    import galois

    q = (1 << q_bits) - 1
    while q > 3:
        if q % 4 == 3 and galois.is_prime(q) and galois.is_prime(2 * q + 1):
            p = 2 * q + 1
            # "jit-calculate": fields below 2^20 would otherwise build lookup tables (tens of seconds)
            fields = [galois.GF(m, compile="jit-calculate") for m in (p, q)]
            return FieldPair(p, q, int(fields[0].primitive_element), int(fields[1].primitive_element))
        q -= 2
    raise ValueError(f"no field pair below 2^{q_bits}")


@dataclass(frozen=True, eq=False)
class FieldTables:
    """Lookup tables for one field pair (built once per process, in numpy, from the generators).

    ``power_p[j] = g^j mod p`` for j in [0, p - 1); ``inverse_m[x] = x^-1`` with ``inverse_m[0] = 0``;
    ``sqrt_m[x] = x^((m+1)/4) mod m`` (a square root of x when x is a square, of -x otherwise).
    """

    power_p: np.ndarray
    inverse_p: np.ndarray
    inverse_q: np.ndarray
    sqrt_p: np.ndarray
    sqrt_q: np.ndarray


def _powers(generator: int, m: int) -> np.ndarray:
    """[g^0, g^1, ..., g^(m-2)] mod m, by doubling (log2(m) vectorized steps)."""
    powers = np.ones(1, dtype=np.int64)
    while len(powers) < m - 1:
        step = pow(generator, len(powers), m)
        powers = np.concatenate([powers, powers * step % m])
    return powers[: m - 1]


def _inverse_and_sqrt(generator: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    powers = _powers(generator, m)
    seen = np.zeros(m, dtype=bool)
    seen[powers] = True
    if not seen[1:].all():
        raise ValueError(f"{generator} does not generate the units mod {m}")
    exponents = np.arange(m - 1, dtype=np.int64)
    inverse = np.zeros(m, dtype=np.int64)
    inverse[powers] = powers[(-exponents) % (m - 1)]
    root = np.zeros(m, dtype=np.int64)
    root[powers] = powers[exponents * ((m + 1) // 4) % (m - 1)]
    return powers, inverse, root


@functools.cache
def _tables(fields: FieldPair) -> FieldTables:
    power_p, inverse_p, sqrt_p = _inverse_and_sqrt(fields.generator_p, fields.p)
    _, inverse_q, sqrt_q = _inverse_and_sqrt(fields.generator_q, fields.q)
    return FieldTables(power_p, inverse_p, inverse_q, sqrt_p, sqrt_q)


@dataclass(frozen=True, eq=False)
class FieldArray:
    """A tensor of fingerprints: ``p`` (residues mod p) and ``q`` (mod q, or None once undefined)."""

    p: np.ndarray
    q: np.ndarray | None
    # the same residues centred in (-m/2, m/2] as float64, kept along structural ops when known
    p_centred: np.ndarray | None = None
    q_centred: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.p))

    def equals(self, other: FieldArray) -> bool:
        """Element-wise equality of both parts (of the p-parts alone where a q-part is undefined)."""
        if self.shape != other.shape or not np.array_equal(self.p, other.p):
            return False
        if self.q is None or other.q is None:
            return True
        return bool(np.array_equal(self.q, other.q))


# ---- the keyed hash of uninterpreted functions -------------------------------------------------

_MASK = (1 << 64) - 1


def _mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer: a bijection of 64-bit words with full avalanche."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def name_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def keyed_hash(fields: FieldPair, key: int, name: str, x: FieldArray) -> FieldArray:
    """A random-looking function of (name, x_p, x_q), fixed by ``key``: the uninterpreted ``name``.

    ``(x_p, x_q)`` are packed injectively into one word (an undefined q-part packs as q, a value
    no residue takes), XORed with a key derived from ``key`` and ``name``, and mixed twice.
    """
    q_part = np.full(x.shape, fields.q, dtype=np.int64) if x.q is None else x.q
    shift = np.uint64(fields.q.bit_length())
    packed = (x.p.astype(np.uint64) << shift) | q_part.astype(np.uint64)
    first = np.uint64((key ^ name_key(name)) & _MASK)
    second = np.uint64(((key * 0x9E3779B97F4A7C15) ^ name_key(name[::-1])) & _MASK)
    h = _mix(_mix(packed ^ first) + second)
    return FieldArray((h % np.uint64(fields.p)).astype(np.int64),
                      ((h >> np.uint64(32)) % np.uint64(fields.q)).astype(np.int64))


# ---- exact modular matrix products through float64 BLAS ----------------------------------------


def centred(x: np.ndarray, m: int) -> np.ndarray:
    """Residues in [0, m) as float64 values in (-m/2, m/2]."""
    out = x.astype(np.float64)
    np.subtract(out, m, out=out, where=x > m // 2)  # a masked store: a third of boolean indexing's time
    return out


def matmul_mod(a: np.ndarray, b: np.ndarray, m: int, a_centred: np.ndarray | None = None,
               b_centred: np.ndarray | None = None) -> np.ndarray:
    """(a @ b) mod m for residue arrays, exactly, via float64 products: of the residues as they are
    while every dot product stays below 2^53 (k (m-1)^2, an inner dim up to 2,048 for the default
    fields), else of residues centred in (-m/2, m/2] (a quarter of the magnitude; the centred
    copies are used wherever they are at hand), in slices of the inner dim as long as that allows."""
    half = (m - 1) // 2
    k = a.shape[-1]
    fa, bound_a = (a_centred, half) if a_centred is not None else (None, m - 1)
    fb, bound_b = (b_centred, half) if b_centred is not None else (None, m - 1)
    if k * bound_a * bound_b >= FLOAT64_EXACT:  # centring is 4x the exact depth, and costs a pass
        if fa is None:
            fa, bound_a = centred(a, m), half
        if fb is None:
            fb, bound_b = centred(b, m), half
    fa = a.astype(np.float64) if fa is None else fa
    fb = b.astype(np.float64) if fb is None else fb
    depth = max(1, (FLOAT64_EXACT - 1) // (bound_a * bound_b))
    if k <= depth:
        return np.matmul(fa, fb).astype(np.int64) % m
    total = None
    for start in range(0, k, depth):
        part = np.matmul(fa[..., start:start + depth], fb[..., start:start + depth, :]).astype(np.int64) % m
        total = part if total is None else (total + part) % m
    assert total is not None
    return total


@functools.lru_cache(maxsize=8)
def omega_powers(fields: FieldPair, omega_exponent: int) -> np.ndarray:
    """[ω^0, ..., ω^(q-1)] mod p for ω = g^(step · omega_exponent): exp is one table lookup."""
    exponents = np.arange(fields.q, dtype=np.int64) * (fields.omega_step * omega_exponent) % (fields.p - 1)
    return fields.tables().power_p[exponents]


# ---- the algebra ---------------------------------------------------------------------------------


def _both(x: FieldArray, y: FieldArray, on_p, on_q) -> FieldArray:
    q = None if x.q is None or y.q is None else on_q(x.q, y.q)
    return FieldArray(on_p(x.p, y.p), q)


class FieldAlgebra:
    """The Algebra protocol over Z_p × Z_q, for one random test (ω and the hash key fixed).

    ``omega_exponent`` t in [1, q) picks ω = g_p^((p-1)/q · t), a root of unity of order q;
    ``hash_key`` picks the uninterpreted functions.  Division uses the meadow convention
    x / 0 = 0 (inverse(0) = 0), so (x/y)/z = x/(y·z) and x/y·y/x agree even at zeros.
    """

    concrete = True  # values, not terms: the interpreter checks what two blocks compute twice

    def __init__(self, fields: FieldPair = DEFAULT_FIELDS, omega_exponent: int = 1,
                 hash_key: int = 0) -> None:
        if not 1 <= omega_exponent < fields.q:
            raise ValueError(f"omega_exponent must lie in [1, q) = [1, {fields.q}), got {omega_exponent}")
        self.fields = fields
        self.tables = fields.tables()
        self.omega_exponent = omega_exponent
        self.hash_key = hash_key & _MASK

    @classmethod
    def random(cls, fields: FieldPair, rng: np.random.Generator) -> FieldAlgebra:
        """Fresh ω (uniform among the roots of unity of order q) and a fresh hash key."""
        return cls(fields, int(rng.integers(1, fields.q)), int(rng.integers(0, 2**63)))

    @property
    def omega(self) -> int:
        return int(self.tables.power_p[self.fields.omega_step * self.omega_exponent])

    # constants and creation
    def const(self, value: Scalar, like: Any) -> FieldArray:
        p, q = self.fields.element(value)
        return FieldArray(np.asarray(p, dtype=np.int64), np.asarray(q, dtype=np.int64))

    def zeros(self, shape: tuple[int, ...]) -> FieldArray:
        return FieldArray(np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64))

    # field operations
    def add(self, x: FieldArray, y: FieldArray) -> FieldArray:
        p, q = self.fields.p, self.fields.q
        return _both(x, y, lambda a, b: (a + b) % p, lambda a, b: (a + b) % q)

    def sub(self, x: FieldArray, y: FieldArray) -> FieldArray:
        p, q = self.fields.p, self.fields.q
        return _both(x, y, lambda a, b: (a - b) % p, lambda a, b: (a - b) % q)

    def mul(self, x: FieldArray, y: FieldArray) -> FieldArray:
        p, q = self.fields.p, self.fields.q
        return _both(x, y, lambda a, b: a * b % p, lambda a, b: a * b % q)

    def div(self, x: FieldArray, y: FieldArray) -> FieldArray:
        p, q, t = self.fields.p, self.fields.q, self.tables
        return _both(x, y, lambda a, b: a * t.inverse_p[b] % p, lambda a, b: a * t.inverse_q[b] % q)

    def exp(self, x: FieldArray) -> FieldArray:
        if x.q is None:
            raise ExpNestingError("exp applied to a value that already went through exp: the LAX "
                                  "fragment allows one exp on each input→output path; compare such "
                                  "graphs with float_check")
        # ω^x = g^(step·(t·x mod q)), looked up for the elements of x only: a table of all q powers
        # per ω (omega_powers) took 40 ms to build, and every test of a verification draws a new ω
        fields = self.fields
        exponents = x.q * self.omega_exponent % fields.q * fields.omega_step
        return FieldArray(self.tables.power_p[exponents], None)

    def sqrt(self, x: FieldArray) -> FieldArray:
        t = self.tables
        return FieldArray(t.sqrt_p[x.p], None if x.q is None else t.sqrt_q[x.q])

    def matmul(self, x: FieldArray, y: FieldArray) -> FieldArray:
        p, q = self.fields.p, self.fields.q
        out_p = matmul_mod(x.p, y.p, p, x.p_centred, y.p_centred)
        if x.q is None or y.q is None:
            return FieldArray(out_p, None)
        return FieldArray(out_p, matmul_mod(x.q, y.q, q, x.q_centred, y.q_centred))

    def sum(self, x: FieldArray, axis: int, keepdims: bool = True) -> FieldArray:
        p, q = self.fields.p, self.fields.q
        sp = np.sum(x.p, axis=axis, keepdims=keepdims) % p
        return FieldArray(sp, None if x.q is None else np.sum(x.q, axis=axis, keepdims=keepdims) % q)

    # ops outside the fragment: uninterpreted functions
    def opaque(self, name: str, x: FieldArray, reference: Callable[[np.ndarray], np.ndarray]) -> FieldArray:
        return keyed_hash(self.fields, self.hash_key, name, x)

    # order-based helpers have no meaning in a field
    def max(self, x: FieldArray, axis: int, keepdims: bool = True) -> FieldArray:
        raise OrderedOpError("max needs an order, which a finite field lacks; write the graph in the "
                             "LAX form (exp(S) / sum(exp(S))) or compare it with float_check")

    def maximum(self, x: FieldArray, y: FieldArray) -> FieldArray:
        raise OrderedOpError("maximum needs an order, which a finite field lacks; compare such graphs "
                             "with float_check")

    def neg_inf(self, shape: tuple[int, ...]) -> FieldArray:
        raise OrderedOpError("-inf needs an order, which a finite field lacks; compare such graphs "
                             "with float_check")

    # shape-only work
    def structural(self, fn: Callable[..., np.ndarray], *xs: FieldArray) -> FieldArray:
        p = fn(*(x.p for x in xs))
        p_centred = fn(*(x.p_centred for x in xs)) if all(x.p_centred is not None for x in xs) else None
        if any(x.q is None for x in xs):
            return FieldArray(p, None, p_centred)
        q = fn(*(x.q for x in xs))
        q_centred = fn(*(x.q_centred for x in xs)) if all(x.q_centred is not None for x in xs) else None
        return FieldArray(p, q, p_centred, q_centred)

    def shape(self, x: FieldArray) -> tuple[int, ...]:
        return x.shape
