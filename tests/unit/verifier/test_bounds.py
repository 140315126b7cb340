"""The error bound: Theorem 2's formula, the number of tests, the summary analysis of d and k, and an
empirical check of the bound in tiny fields where failures are frequent enough to count."""

from __future__ import annotations

import math

import numpy as np
import pytest
from verifier_graphs import small_attention, tiled_matmul

import mirage as mi
from mirage.mugraph.interpret import Interpreter
from mirage.verifier import bounds
from mirage.verifier.bounds import SummaryAlgebra, per_test_bound, theorem_bound
from mirage.verifier.field import DEFAULT_FIELDS, FieldAlgebra, FieldPair

Q = DEFAULT_FIELDS.q
TINY = FieldPair(p=23, q=11, generator_p=5, generator_q=2)


@pytest.mark.parametrize("degree, terms, expected", [
    (1, 1, 8 / Q + 1 / Q),
    (4, 2, 8 * 4 * 16 / Q + Q ** -0.25),
    (10, 3, 8 * 10 * 81 / Q + Q ** (-1 / 9)),
    (10, 4096, 1.0),
])
def test_theorem_bound_formula(degree, terms, expected):
    assert theorem_bound(degree, terms, Q) == pytest.approx(expected)


@pytest.mark.parametrize("epsilon, delta, matchings, expected", [
    (0.5, 1e-9, 1, 30),
    (0.031, 1e-9, 1, 6),
    (1e-12, 1e-9, 1, 1),
    (0.5, 1e-9, 2, 31),
    (1.0, 1e-9, 1, None),
])
def test_tests_needed(epsilon, delta, matchings, expected):
    t = bounds.tests_needed(epsilon, delta, matchings)
    assert t == expected
    if t is not None:
        assert matchings * epsilon**t <= delta
        assert t == 1 or matchings * epsilon ** (t - 1) > delta


def summarize(graph):
    algebra = SummaryAlgebra()
    outputs = Interpreter(algebra).run(graph, [algebra.input(t.shape) for t in graph.input_types])
    return outputs, algebra


def kernel(build, shapes=((4, 6), (6, 5))):
    g = mi.new_kernel_graph()
    xs = [g.new_input(dims=s, dtype=mi.float32) for s in shapes]
    g.mark_output(build(g, *xs))
    return g.freeze()


# (name, graph, degree, exponential terms, exp-free, denominator ids present)
SUMMARIES = [
    ("matmul", kernel(lambda g, x, w: g.matmul(x, w)), 2, 1, True, False),
    ("exp of matmul", kernel(lambda g, x, w: g.exp(g.matmul(x, w))), 2, 1, False, False),
    ("sum of 5 exps", kernel(lambda g, x, w: g.reduction(g.exp(g.matmul(x, w)), 1)), 2, 5, False, False),
    ("exp times polynomial", kernel(lambda g, x, w: g.mul(g.exp(g.matmul(x, w)), g.matmul(x, w))), 4, 1,
     False, False),
    ("divide then sum along a shared denominator",
     kernel(lambda g, x, w: g.reduction(g.div(x, g.reduction(x, 1)), 1), ((4, 6), (1, 1))), 2, 1, True, True),
    ("divide then sum across denominators",
     kernel(lambda g, x, w: g.reduction(g.div(x, g.reduction(x, 0)), 1), ((4, 6), (1, 1))), 12, 1, True,
     True),
    ("tiled matmul", tiled_matmul(grid=2, iters=4), 2, 1, True, False),
    # products add degrees (exponents g1/h1 + g2/h2 may need h1·h2): a conservative d
    ("attention reference", small_attention(fused=False), 5, 8, False, True),
    ("attention fused", small_attention(), 5, 8, False, True),
]


@pytest.mark.parametrize("name, graph, degree, terms, exp_free, has_den", SUMMARIES,
                         ids=[row[0] for row in SUMMARIES])
def test_summary_rules(name, graph, degree, terms, exp_free, has_den):
    (out,), _ = summarize(graph)
    assert (out.degree, out.terms, out.exp_free, out.den is not None) == (degree, terms, exp_free, has_den)


def test_uninterpreted_applications_are_fresh_variables():
    graph = kernel(lambda g, x, w: g.mul(g.silu(g.matmul(x, w)), g.sqrt(g.matmul(x, w))))
    (out,), algebra = summarize(graph)
    assert out.degree == 2 and out.exp_free
    assert [(a.name, a.count, a.degree) for a in algebra.applications] == [("silu", 20, 2), ("sqrt", 20, 2)]


def test_sqrt_after_exp_has_no_q_part_and_no_product_bound():
    graph = kernel(lambda g, x, w: g.sqrt(g.exp(g.matmul(x, w))))
    (out,), _ = summarize(graph)
    assert not out.exp_free  # the field's sqrt of an exp has only a p-part
    silu = kernel(lambda g, x, w: g.silu(g.exp(g.matmul(x, w))))
    (out,), _ = summarize(silu)
    assert out.exp_free  # the hash defines both parts


def test_exp_free_bound_multiplies_both_residue_tests():
    graph = kernel(lambda g, x, w: g.matmul(x, w))
    (a,), algebra = summarize(graph)
    (b,), _ = summarize(graph)
    bound = per_test_bound([(a, b)], [], [], DEFAULT_FIELDS)
    p, q = DEFAULT_FIELDS.p, DEFAULT_FIELDS.q
    assert bound.exp_free and bound.degree == 2  # one denominator: P = N1 - N2
    assert bound.epsilon == pytest.approx((2 / p) * (2 / q))


def single_test_passes(reference, candidate, fields, trials: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    passes = 0
    for _ in range(trials):
        algebra = FieldAlgebra.random(fields, rng)
        inputs = [fields.random(t.shape, rng) for t in reference.input_types]
        (want,), (got,) = (Interpreter(algebra).run(g, inputs) for g in (reference, candidate))
        passes += want.equals(got)
    return passes


@pytest.mark.parametrize("name, reference, candidate", [
    ("x·x vs x·y", kernel(lambda g, x, y: g.mul(x, x), ((1, 1),) * 2),
     kernel(lambda g, x, y: g.mul(x, y), ((1, 1),) * 2)),
    ("x/y vs y/x", kernel(lambda g, x, y: g.div(x, y), ((1, 1),) * 2),
     kernel(lambda g, x, y: g.div(y, x), ((1, 1),) * 2)),
    ("silu(x) vs silu(y)", kernel(lambda g, x, y: g.silu(x), ((1, 1),) * 2),
     kernel(lambda g, x, y: g.silu(y), ((1, 1),) * 2)),
])
def test_bound_holds_empirically_in_tiny_fields(name, reference, candidate):
    """With p = 23, q = 11 wrong graphs pass one test often; the pass rate stays under the bound."""
    (a,), first = summarize(reference)
    algebra = SummaryAlgebra(counter=first.counter)
    (b,) = Interpreter(algebra).run(candidate, [algebra.input(t.shape) for t in candidate.input_types])
    bound = per_test_bound([(a, b)], first.applications + algebra.applications,
                           first.divisions + algebra.divisions, TINY)
    trials = 4000
    passes = single_test_passes(reference, candidate, TINY, trials, seed=len(name))
    rate = passes / trials
    assert 0 < rate  # the tiny field does let wrong graphs through sometimes: the test can fail
    assert rate <= bound.epsilon + 3 * math.sqrt(bound.epsilon / trials)
