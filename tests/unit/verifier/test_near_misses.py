"""Pairs that are close but not equivalent: a constant factor, swapped operands, a reduction over the
neighbouring dim, and graphs that agree on most inputs (a max and its ReLU, a clamp's bound)."""

from __future__ import annotations

import numpy as np
import pytest

import mirage as mi
from mirage.generator.verification import make_checker
from mirage.verifier import field as field_module
from mirage.verifier import float_check, verify
from mirage.verifier.field import DEFAULT_FIELDS, FieldAlgebra, FieldArray


def _pair(build, shapes, dtype=mi.float32):
    graphs = []
    for variant in (False, True):
        g = mi.new_kernel_graph()
        inputs = [g.new_input(dims=s, dtype=dtype) for s in shapes]
        g.mark_output(build(g, variant, *inputs))
        graphs.append(g.freeze())
    return graphs


def _softmax(g, x, dim):
    e = g.exp(x)
    return g.div(e, g.reduction(e, dim))


NEAR_MISSES = {
    "constant_factor": (lambda g, v, x: g.mul_scalar(g.exp(x), 1.0 + 1e-6 if v else 1.0), [(4, 8)]),
    "epsilon": (lambda g, v, x: g.rms_norm(x, eps=1e-6 if v else 0.0), [(4, 8)]),
    "swapped_div": (lambda g, v, x, y: g.div(y, x) if v else g.div(x, y), [(4, 8), (4, 8)]),
    "swapped_sub": (lambda g, v, x, y: g.sub(y, x) if v else g.sub(x, y), [(4, 8), (4, 8)]),
    "swapped_matmul": (lambda g, v, x, y: g.matmul(y, x) if v else g.matmul(x, y), [(8, 8), (8, 8)]),
    "softmax_over_the_other_dim": (lambda g, v, x: _softmax(g, x, 0 if v else 1), [(8, 8)]),
    "reduction_over_the_next_dim": (lambda g, v, x: g.mul(x, g.reduction(x, 2 if v else 1)), [(2, 4, 4)]),
    "reduction_over_the_batch_dim": (lambda g, v, x: g.mul(x, g.reduction(x, 1 if v else 0)), [(4, 4, 4)]),
    "clamp_bound": (lambda g, v, x: g.clamp(x, -3.0, 3.5 if v else 3.0), [(4, 8)]),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_the_field_verifier_tells_near_misses_apart(name):
    build, shapes = NEAR_MISSES[name]
    reference, candidate = _pair(build, shapes)
    assert verify(reference, reference).equivalent
    assert not verify(reference, candidate).equivalent


def _max_or_its_relu(g, relu, x):
    m = g.reduction_max(x, 1)
    return g.relu(m) if relu else m


# differ only where a whole row is negative (max) or beyond a bound the standard normal rarely
# reaches (clamp): both float checks took them for equal, with the max and its ReLU at error 0
AGREE_ON_MOST_INPUTS = {
    "max_or_its_relu": (_max_or_its_relu, [(4, 64)]),
    "clamp_bound": NEAR_MISSES["clamp_bound"],
}


@pytest.mark.parametrize("name", sorted(AGREE_ON_MOST_INPUTS))
def test_the_float_check_tells_apart_graphs_that_agree_on_most_inputs(name):
    build, shapes = AGREE_ON_MOST_INPUTS[name]
    reference, candidate = _pair(build, shapes)
    for a, b in ((reference, candidate), (candidate, reference)):
        assert float_check(a, a, seed=0).equivalent
        result = float_check(a, b, seed=0)
        assert not result.equivalent and result.max_error > 1.0


@pytest.mark.parametrize("name", sorted(AGREE_ON_MOST_INPUTS))
def test_the_searchs_float_checker_tells_apart_graphs_that_agree_on_most_inputs(name):
    build, shapes = AGREE_ON_MOST_INPUTS[name]
    reference, candidate = _pair(build, shapes)
    checker = make_checker(reference, prefer="float")
    assert checker.match(reference, list(reference.outputs)) == reference.outputs
    assert checker.match(candidate, list(candidate.outputs)) is None


def test_the_float_check_still_takes_the_max_shifted_softmax_for_the_softmax():
    def build(g, stable, x):
        shifted = g.sub(x, g.reduction_max(x, 1)) if stable else x
        return _softmax(g, shifted, 1)

    lax, stable = _pair(build, [(4, 64)])
    result = float_check(lax, stable, seed=0)
    assert result.equivalent and result.tests_run == 4  # two standard-normal trials, two edge trials
    assert make_checker(lax, prefer="float").match(stable, list(stable.outputs)) == stable.outputs


def test_exp_is_omega_to_the_power_of_the_q_residue_without_a_table_of_all_powers(monkeypatch):
    """Each test of a verification draws a new ω, and exp built all q powers of it (40 ms, a cache of
    8): a verification of 56 tests of a (2, 3, 77) exp took 3 s and ran its search past its budget."""
    p, q = DEFAULT_FIELDS.p, DEFAULT_FIELDS.q
    rng = np.random.default_rng(0)
    x = rng.integers(0, q, size=(3, 50))
    x[0, :2] = (0, q - 1)
    tables = {t: field_module.omega_powers(DEFAULT_FIELDS, t) for t in (1, 7, q - 1)}
    monkeypatch.setattr(field_module, "omega_powers", None)  # exp must not build the table
    for t, powers in tables.items():
        algebra = FieldAlgebra(DEFAULT_FIELDS, t)
        got = algebra.exp(FieldArray(x % p, x))
        assert got.q is None and np.array_equal(got.p, powers[x])
        assert int(got.p[0, 1]) == pow(algebra.omega, q - 1, p)
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(2, 3, 77), dtype=mi.float16)
    g.mark_output(g.reduction(g.exp(x), 1))
    assert verify(g.freeze(), g.freeze()).equivalent
