"""The verifier's and the float check's arguments out of range are named errors (VerifierOptionError, a
VerifierError and a ValueError), never a numpy TypeError from inside, nor an answer without a test."""

from __future__ import annotations

import pytest

import mirage as mi
from mirage import errors
from mirage.verifier import VerifierError, classify, float_check, verify
from mirage.verifier.errors import VerifierOptionError


def graph(op: str = "exp"):
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    g.mark_output(getattr(g, op)(x))
    return g.freeze()


@pytest.mark.parametrize(("options", "words"), [
    ({"delta": 0}, ["delta must be a probability strictly between 0 and 1", "got 0"]),
    ({"delta": float("nan")}, ["delta must be a probability"]),
    ({"delta": "1e-9"}, ["delta must be a probability", "'1e-9'"]),
    ({"seed": "a"}, ["seed must be None", "'a'"]),
    ({"seed": -1}, ["seed must be None", "-1"]),
    ({"max_tests": 0}, ["max_tests must be an integer ≥ 1"]),
    ({"heuristic_tests": 2.5}, ["heuristic_tests must be an integer ≥ 1"]),
    ({"fields": (3, 5)}, ["fields must be a mirage.verifier.FieldPair"]),
], ids=["delta 0", "delta nan", "delta str", "seed str", "seed negative", "max_tests 0", "heuristic float",
        "fields tuple"])
def test_verify_arguments_out_of_range(options, words):
    with pytest.raises(VerifierOptionError) as info:
        verify(graph(), graph(), **options)
    assert isinstance(info.value, VerifierError) and isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)


def test_float_check_without_trials_is_refused_not_equivalent():
    """exp and sqrt differ; with no trial the check used to call them equivalent."""
    with pytest.raises(VerifierOptionError, match="trials must be an integer ≥ 1"):
        float_check(graph("exp"), graph("sqrt"), trials=0)
    assert not float_check(graph("exp"), graph("sqrt"), trials=1).equivalent


@pytest.mark.parametrize("options", [{"rtol": -1.0}, {"atol": float("nan")}, {"seed": 1.5}])
def test_float_check_tolerances_and_seed_out_of_range(options):
    with pytest.raises(VerifierOptionError):
        float_check(graph(), graph(), **options)


def test_classify_takes_graphs_only():
    with pytest.raises(errors.GraphError, match="expected a kernel graph or a builder, got str"):
        classify("graph")
    g = mi.new_kernel_graph()
    g.mark_output(g.exp(g.new_input(dims=(4, 8), dtype=mi.float32)))
    assert classify(g).fingerprintable  # a builder is frozen first
