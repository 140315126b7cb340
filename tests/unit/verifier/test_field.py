"""The field pair, the fast numpy algebra, and its agreement with the galois oracle.

``hypothesis`` is not installed in this environment, so the property tests draw from seeded
random tables: every case is reproducible from its seed.
"""

from __future__ import annotations

from fractions import Fraction

import galois
import numpy as np
import pytest
from verifier_graphs import random_kernel_graph, small_attention, tiled_matmul

from mirage.mugraph.algebra import NotInterpretable
from mirage.mugraph.interpret import Interpreter
from mirage.verifier.errors import ExpNestingError, FieldConstantError, OrderedOpError
from mirage.verifier.field import (
    DEFAULT_FIELDS,
    FieldAlgebra,
    FieldArray,
    FieldPair,
    as_fraction,
    centred,
    construct_fields,
    matmul_mod,
)
from mirage.verifier.oracle import GaloisAlgebra

F = DEFAULT_FIELDS
P, Q = F.p, F.q


def random_value(rng, shape, zeros: float = 0.0) -> FieldArray:
    x = F.random(shape, rng)
    if zeros:
        mask = rng.random(shape) < zeros
        x.p[mask] = 0
        x.q[mask] = 0
    return x


# ---- the field pair ------------------------------------------------------------------------------


def test_default_pair_is_what_galois_constructs():
    assert construct_fields(20) == F
    assert galois.is_prime(P) and galois.is_prime(Q)
    assert P % 4 == 3 and Q % 4 == 3 and (P - 1) % Q == 0
    assert galois.GF(P, compile="jit-calculate").primitive_element == F.generator_p
    assert galois.GF(Q, compile="jit-calculate").primitive_element == F.generator_q


def test_matmul_depth_is_exact_in_float64():
    half = (P - 1) // 2
    depth = F.max_matmul_depth
    assert depth >= 8192
    assert depth * half * half < 2**53 <= (depth + 1) * half * half


@pytest.mark.parametrize("p, q, message", [
    (2097143, 1048573, r"3 \(mod 4\)"),  # q ≡ 1 (mod 4)
    (2097143, 1048583, "divide"),
    (4294967291, 3, r"2\^31"),
])
def test_bad_pairs_are_refused(p, q, message):
    with pytest.raises(ValueError, match=message):
        FieldPair(p, q, 5, 2)


def test_tables_agree_with_galois():
    tables = F.tables()
    rng = np.random.default_rng(0)
    for m, inverse, root in ((P, tables.inverse_p, tables.sqrt_p), (Q, tables.inverse_q, tables.sqrt_q)):
        GF = galois.GF(m, compile="jit-calculate")
        x = np.concatenate([[1, 2, m - 1], rng.integers(1, m, 2000)])
        assert np.array_equal(inverse[x], np.asarray(GF(x) ** -1))
        assert np.array_equal(root[x], np.asarray(GF(x) ** ((m + 1) // 4)))
        assert inverse[0] == 0 and root[0] == 0
    j = rng.integers(0, P - 1, 2000)
    generator = galois.GF(P, compile="jit-calculate")(F.generator_p)
    assert np.array_equal(tables.power_p[j], np.asarray(generator**j))


# ---- constants -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value, fraction", [
    (3, Fraction(3)),
    (Fraction(1, 8), Fraction(1, 8)),
    (0.125, Fraction(1, 8)),
    (1.0 / 3.0, Fraction(1, 3)),
    (1e-6, Fraction(1, 10**6)),
    (-1.5, Fraction(-3, 2)),
    (1.0 / 4096, Fraction(1, 4096)),
])
def test_constants_map_to_exact_fractions(value, fraction):
    assert as_fraction(value) == fraction
    p, q = F.element(value)
    assert p * fraction.denominator % P == fraction.numerator % P
    assert q * fraction.denominator % Q == fraction.numerator % Q


def test_distinct_floats_stay_distinct():
    a, b = 0.1, np.nextafter(0.1, 1.0)
    assert as_fraction(a) != as_fraction(b)
    assert F.element(a) != F.element(b)


def test_constant_without_an_image_is_refused():
    with pytest.raises(FieldConstantError, match="denominator divisible by"):
        F.element(Fraction(1, P))


# ---- single operations against the oracle --------------------------------------------------------

SHAPES = [((3, 4), (3, 4)), ((3, 4), (1, 4)), ((2, 1, 5), (2, 3, 5))]
BINARY = ["add", "sub", "mul", "div"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_agree_with_oracle(op, seed):
    rng = np.random.default_rng(seed)
    shape_x, shape_y = SHAPES[seed % len(SHAPES)]
    x, y = random_value(rng, shape_x, 0.2), random_value(rng, shape_y, 0.2)
    fast, slow = FieldAlgebra(F), GaloisAlgebra(F)
    got = getattr(fast, op)(x, y)
    want = slow.lower(getattr(slow, op)(slow.lift(x), slow.lift(y)))
    assert got.equals(want) and want.equals(got)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("op", ["exp", "sqrt", "silu", "sum0", "sum1", "sum_flat"])
def test_unary_ops_agree_with_oracle(op, seed):
    rng = np.random.default_rng(100 + seed)
    x = random_value(rng, (3, 5), 0.1)
    omega_exponent, key = int(rng.integers(1, Q)), int(rng.integers(0, 2**63))
    fast, slow = FieldAlgebra(F, omega_exponent, key), GaloisAlgebra(F, omega_exponent, key)
    calls = {
        "exp": lambda A, v: A.exp(v),
        "sqrt": lambda A, v: A.sqrt(v),
        "silu": lambda A, v: A.opaque("silu", v, None),
        "sum0": lambda A, v: A.sum(v, axis=0),
        "sum1": lambda A, v: A.sum(v, axis=-1, keepdims=False),
        "sum_flat": lambda A, v: A.sum(A.structural(lambda a: a.reshape(15, 1), v), axis=0),
    }
    got = calls[op](fast, x)
    want = slow.lower(calls[op](slow, slow.lift(x)))
    assert got.shape == want.shape
    assert np.array_equal(got.p, want.p)
    assert (got.q is None) == (want.q is None)
    if got.q is not None:
        assert np.array_equal(got.q, want.q)


@pytest.mark.parametrize("shapes", [((4, 7), (7, 3)), ((2, 3, 6), (2, 6, 5)), ((1, 3, 6), (4, 6, 2))])
def test_matmul_agrees_with_oracle(shapes):
    rng = np.random.default_rng(len(shapes[0]))
    x, y = random_value(rng, shapes[0]), random_value(rng, shapes[1])
    slow = GaloisAlgebra(F)
    want = slow.lower(slow.matmul(slow.lift(x), slow.lift(y)))
    assert FieldAlgebra(F).matmul(x, y).equals(want)


@pytest.mark.parametrize("inner", [1, 2048, 2049, 8192, 8193, 20000])
def test_matmul_is_exact_at_and_past_the_float64_depth(inner):
    """Worst-case residues for the products of residues as they are (all p - 1, up to k = 2048) and
    of centred ones (all (p-1)/2 + 1, centred to -(p-1)/2, beyond), and random ones, against Python
    ints; also with a centred copy of one operand at hand (a mixed product)."""
    rng = np.random.default_rng(inner)
    worst = [np.full((2, inner), value, dtype=np.int64) for value in (P - 1, (P + 1) // 2)]
    for a in (*worst, rng.integers(0, P, (2, inner))):
        for b in (np.full((inner, 3), P - 1, dtype=np.int64), rng.integers(0, P, (inner, 3))):
            exact = ((a.astype(object) @ b.astype(object)) % P).astype(np.int64)
            assert np.array_equal(matmul_mod(a, b, P), exact)
            assert np.array_equal(matmul_mod(a, b, P, a_centred=centred(a, P)), exact)


# ---- semantics of exp, div, sqrt, opaque ----------------------------------------------------------


def test_exp_is_a_homomorphism_into_roots_of_unity():
    rng = np.random.default_rng(7)
    A = FieldAlgebra.random(F, rng)
    assert A.omega != 1 and pow(A.omega, Q, P) == 1
    x, y = random_value(rng, (50,)), random_value(rng, (50,))
    assert A.exp(A.add(x, y)).p.tolist() == A.mul(A.exp(x), A.exp(y)).p.tolist()
    assert A.exp(A.zeros((3,))).p.tolist() == [1, 1, 1]
    assert A.exp(x).q is None


def test_second_exp_on_a_path_raises():
    A = FieldAlgebra(F, 3)
    once = A.add(A.exp(random_value(np.random.default_rng(1), (4,))), A.const(1, None))
    with pytest.raises(ExpNestingError, match="one exp on each input→output path"):
        A.exp(once)
    assert issubclass(ExpNestingError, NotInterpretable)


def test_division_by_zero_is_zero_in_both_parts():
    A = FieldAlgebra(F)
    x = FieldArray(np.array([5, 0, 7]), np.array([5, 0, 7]))
    zero = A.zeros((3,))
    out = A.div(x, zero)
    assert out.p.tolist() == [0, 0, 0] and out.q.tolist() == [0, 0, 0]


def test_meadow_identities_hold_at_zeros():
    rng = np.random.default_rng(3)
    A = FieldAlgebra(F)
    x, y, z = (random_value(rng, (400,), 0.3) for _ in range(3))
    assert A.div(A.div(x, y), z).equals(A.div(x, A.mul(y, z)))
    assert A.div(A.div(x, y), z).equals(A.div(A.div(x, z), y))
    one = A.const(1, None)
    assert A.div(one, A.div(one, y)).equals(y)


def test_sqrt_squares_back_up_to_sign():
    rng = np.random.default_rng(4)
    A = FieldAlgebra(F)
    x = random_value(rng, (1000,))
    squared = A.mul(A.sqrt(x), A.sqrt(x))
    legendre = np.asarray(galois.GF(P, compile="jit-calculate")(x.p) ** ((P - 1) // 2))
    expected = np.where(legendre == 1, x.p, (-x.p) % P)
    assert np.array_equal(squared.p, expected)
    assert np.array_equal(A.sqrt(A.mul(x, x)).p ** 2 % P, x.p**2 % P)


def test_uninterpreted_functions_are_functions_of_name_and_argument():
    rng = np.random.default_rng(5)
    x = random_value(rng, (200,))
    A, B = FieldAlgebra(F, 1, 11), FieldAlgebra(F, 1, 12)
    silu = A.opaque("silu", x, None)
    assert silu.equals(A.opaque("silu", FieldArray(x.p.copy(), x.q.copy()), None))
    assert np.mean(silu.p == A.opaque("gelu", x, None).p) < 0.01
    assert np.mean(silu.p == B.opaque("silu", x, None).p) < 0.01
    assert len(set(silu.p.tolist())) > 190
    undefined = A.opaque("silu", FieldArray(x.p, None), None)
    assert np.mean(undefined.p == silu.p) < 0.01 and undefined.q is not None


@pytest.mark.parametrize("call", [
    lambda A, x: A.max(x, axis=0),
    lambda A, x: A.maximum(x, x),
    lambda A, x: A.neg_inf((2,)),
])
def test_ordered_ops_are_not_interpretable(call):
    A = FieldAlgebra(F)
    with pytest.raises(OrderedOpError, match="order"):
        call(A, A.zeros((2,)))


# ---- whole graphs against the oracle -------------------------------------------------------------


def run_both(graph, seed: int):
    rng = np.random.default_rng(seed)
    inputs = [F.random(t.shape, rng) for t in graph.input_types]
    omega_exponent, key = int(rng.integers(1, Q)), int(rng.integers(0, 2**63))
    fast = Interpreter(FieldAlgebra(F, omega_exponent, key)).run(graph, inputs)
    oracle = GaloisAlgebra(F, omega_exponent, key)
    slow = Interpreter(oracle).run(graph, [oracle.lift(x) for x in inputs])
    return fast, [oracle.lower(v) for v in slow]


@pytest.mark.parametrize("seed", range(40))
def test_random_kernel_graphs_agree_with_oracle(seed):
    fast, slow = run_both(random_kernel_graph(seed), seed)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):
        assert a.shape == b.shape and np.array_equal(a.p, b.p)
        assert (a.q is None) == (b.q is None)
        assert a.q is None or np.array_equal(a.q, b.q)


BLOCK_GRAPHS = [
    ("matmul grid 2 loop 2", lambda: tiled_matmul()),
    ("matmul sum accumulator", lambda: tiled_matmul(accum="sum")),
    ("matmul mean accumulator", lambda: tiled_matmul(accum="mean", grid=3, iters=4)),
    ("matmul rms accumulator", lambda: tiled_matmul(accum="rms")),
    ("exp epilogue", lambda: tiled_matmul(epilogue="exp", iters=4)),
    ("rms-normalized matmul", lambda: tiled_matmul(epilogue="rms", grid=1)),
    ("silu epilogue", lambda: tiled_matmul(epilogue="silu", grid=6, iters=1)),
    ("attention", lambda: small_attention()),
    ("attention reference", lambda: small_attention(fused=False)),
]


@pytest.mark.parametrize("name, build", BLOCK_GRAPHS, ids=[row[0] for row in BLOCK_GRAPHS])
def test_block_graphs_agree_with_oracle(name, build):
    fast, slow = run_both(build(), 17)
    for a, b in zip(fast, slow, strict=True):
        assert a.equals(b) and b.equals(a)


def test_fused_attention_fingerprint_equals_reference():
    rng = np.random.default_rng(9)
    reference, fused = small_attention(fused=False), small_attention()
    inputs = [F.random(t.shape, rng) for t in reference.input_types]
    A = FieldAlgebra.random(F, rng)
    (a,), (b,) = Interpreter(A).run(reference, inputs), Interpreter(A).run(fused, inputs)
    assert a.equals(b)
