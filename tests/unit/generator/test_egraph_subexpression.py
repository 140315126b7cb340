"""The subexpression check: partial reductions, caching, pickling, and agreement of the back ends."""

from __future__ import annotations

import doctest
import pickle

import pytest

from mirage.generator import abstract_expr as ae
from mirage.generator import egraph_subexpression
from mirage.generator.egraph import SaturationLimits, StopReason
from mirage.generator.egraph_subexpression import Backend, SubexpressionCheck, SubexpressionConfig

q, k, v = ae.variable(0), ae.variable(1), ae.variable(2)
S = "(exp (sum 64 (* v0 v1)))"  # attention scores
SCORES = ae.parse(S)
ATTENTION = ae.parse(f"(sum 4096 (* (/ {S} (sum 4096 {S})) v2))")
RMS = "(sqrt (sum 4096 (* v0 v0)))"
RMSNORM = ae.parse(f"(sum 4096 (* (* (/ v0 {RMS}) v1) v2))")
LORA = ae.parse("(+ (sum 256 (* v0 v1)) (sum 16 (* (sum 256 (* v0 v2)) v3)))")

# (name, target, query, expected answer)
QUERIES = [
    ("whole target", ATTENTION, str(ATTENTION), True),
    ("inputs", ATTENTION, "v2", True),
    ("one block's partial numerator", ATTENTION, f"(sum 512 (* {S} v2))", True),
    ("partial sum of exps", ATTENTION, f"(sum 4 {S})", True),
    ("flash-decoding combine", ATTENTION, f"(/ (sum 4096 (* v2 {S})) (sum 4096 {S}))", True),
    ("exp of a partial dot product", ATTENTION, "(exp (sum 32 (* v0 v1)))", False),
    ("division of partial sums", ATTENTION, f"(/ (sum 512 (* {S} v2)) (sum 512 {S}))", False),
    ("a size that divides nothing", ATTENTION, f"(sum 3 (* {S} v2))", False),
    ("two exps", ATTENTION, f"(exp {S})", False),
    ("a foreign operation", ATTENTION, "(sqrt v2)", False),
    ("matmul tile over the gain", RMSNORM, "(sum 64 (* (* v0 v1) v2))", True),
    ("rms accumulated over tiles", RMSNORM, RMS, True),
    ("partial rms", RMSNORM, "(sqrt (sum 64 (* v0 v0)))", False),
    ("normalize after the matmul", RMSNORM, f"(/ (sum 4096 (* (* v0 v1) v2)) {RMS})", True),
    ("reciprocal of the rms", RMSNORM, f"(* (sum 4096 (* (* v0 v1) v2)) (/ c {RMS}))", True),
    ("the sum inside the rms", RMSNORM, "(sum 4096 (* v0 v0))", True),
    ("gain times weights", RMSNORM, "(* v1 v2)", True),
    ("input times input times weights", RMSNORM, "(* (* v0 v0) v2)", False),
    (
        "partial products added in a loop",
        LORA,
        "(+ (sum 64 (* v0 v1)) (sum 16 (* (sum 64 (* v0 v2)) v3)))",
        True,
    ),
    ("adapter chain", LORA, "(sum 16 (* (sum 256 (* v0 v2)) v3))", True),
    ("adapter without the weights", LORA, "(+ (sum 256 (* v0 v1)) v3)", False),
]


@pytest.fixture(scope="module", params=list(Backend), ids=lambda b: b.value)
def checks(request):
    config = SubexpressionConfig(backend=request.param)
    return {target: SubexpressionCheck([target], config) for target in {ATTENTION, RMSNORM, LORA}}


@pytest.mark.parametrize(("name", "target", "query", "expected"), QUERIES, ids=[row[0] for row in QUERIES])
def test_query_answers(checks, name, target, query, expected):
    check = checks[target]
    assert check.saturation.stop_reason is StopReason.SATURATED
    assert check(ae.parse(query)) is expected


def test_answers_are_cached_and_counted():
    check = SubexpressionCheck([ATTENTION])
    queries = [ae.sum_of(512, ae.mul(SCORES, v)), ae.exp(ae.sum_of(32, ae.mul(q, k)))]
    for _ in range(3):
        assert [check.contains(t) for t in queries] == [True, False]
    assert check.stats.queries == 6
    assert check.stats.cache_hits == 4
    assert check.stats.accepted == 1
    assert check.stats.seconds > 0


def test_a_check_pickles_and_answers_the_same_in_another_process():
    check = SubexpressionCheck([RMSNORM])
    clone = pickle.loads(pickle.dumps(check))
    assert clone.targets == check.targets
    assert clone.saturation.nodes == check.saturation.nodes
    for _, target, query, expected in QUERIES:
        if target is RMSNORM:
            assert clone(ae.parse(query)) is expected


def test_the_built_in_e_graph_travels_saturated(monkeypatch):
    """The built-in back end's check pickles with its e-graph: a worker process answers at once,
    without saturating again (the egglog handle cannot travel; that back end saturates again)."""
    check = SubexpressionCheck([RMSNORM], SubexpressionConfig(backend=Backend.PYTHON))
    check(ae.parse(RMS))  # a cached answer and statistics, which the clone starts without

    def saturate_again(*args, **kwargs):
        raise AssertionError("saturated again")

    monkeypatch.setattr(egraph_subexpression.EGraph, "saturate", saturate_again)
    clone = pickle.loads(pickle.dumps(check))
    assert clone.saturation == check.saturation and clone.stats.queries == 0
    for _, target, query, expected in QUERIES:
        if target is RMSNORM:
            assert clone(ae.parse(query)) is expected


def test_factor_chains_give_the_same_answers_on_small_sizes():
    target = ae.sum_of(64, ae.mul(ae.div(SCORES, ae.sum_of(16, SCORES)), v))
    plain = SubexpressionCheck([target])
    chains = SubexpressionCheck([target], SubexpressionConfig(factor_chains=True))
    assert chains.saturation.nodes > plain.saturation.nodes
    queries = [ae.sum_of(n, ae.mul(SCORES, v)) for n in (2, 4, 8, 16, 32, 64, 128, 3)]
    queries += [ae.sum_of(n, SCORES) for n in (2, 4, 8, 16, 32)]
    assert [plain(t) for t in queries] == [chains(t) for t in queries]
    assert [plain(t) for t in queries[:8]] == [True] * 6 + [False, False]


def test_the_report_says_why_saturation_stopped():
    check = SubexpressionCheck([RMSNORM], SubexpressionConfig(limits=SaturationLimits(iterations=2)))
    assert check.saturation.stop_reason is StopReason.ITERATION_LIMIT
    assert "iteration limit after 2 iterations" in check.report
    assert check(RMSNORM)  # the target is represented whatever the limits


def test_docstring_examples():
    result = doctest.testmod(egraph_subexpression)
    assert result.attempted > 0 and result.failed == 0


def test_without_egglog_the_check_runs_on_the_built_in_egraph(monkeypatch, caplog):
    """egglog missing from the environment: the default back end falls back, with a warning, to the
    built-in e-graph (test_egraph.py runs the same rules on both back ends)."""
    import builtins
    import logging

    from mirage.generator import egraph_subexpression as sub

    real_import = builtins.__import__

    def no_egglog(name, *args, **kwargs):
        if name == "egglog" or name.startswith("egglog."):
            raise ModuleNotFoundError("No module named 'egglog'", name="egglog")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_egglog)
    sub._warn_no_egglog.cache_clear()
    with caplog.at_level(logging.WARNING, logger="mirage.generator"):
        egraph = sub._make_egraph(sub.Backend.EGGLOG)
    assert isinstance(egraph, sub.EGraph)
    assert "egglog is not installed" in caplog.text
