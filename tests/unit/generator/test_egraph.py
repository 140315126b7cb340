"""The two e-graph back ends: congruence, the axiom table, saturation limits and stop reasons."""

from __future__ import annotations

import doctest

import pytest

from mirage.generator import abstract_expr as ae
from mirage.generator import egraph, egraph_egglog, egraph_rules
from mirage.generator.egraph import EGraph, SaturationLimits, StopReason
from mirage.generator.egraph_egglog import EgglogEGraph
from mirage.generator.egraph_rules import AXIOMS, P, Rewrite, factor_chain_rules, pattern_variables

BACKENDS = [EGraph, EgglogEGraph]
x, y, z = ae.variable(0), ae.variable(1), ae.variable(2)
c = ae.constant()

# (name, target, a term A_eq-equal to it that saturation must put in the target's e-class)
EQUALITIES = [
    ("comm-add", ae.add(x, y), ae.add(y, x)),
    ("assoc-mul", ae.mul(x, ae.mul(y, z)), ae.mul(ae.mul(x, y), z)),
    ("distribute", ae.mul(ae.add(x, y), z), ae.add(ae.mul(x, z), ae.mul(y, z))),
    ("div-add", ae.add(ae.div(x, z), ae.div(y, z)), ae.div(ae.add(x, y), z)),
    ("mul-div", ae.mul(x, ae.div(y, z)), ae.div(ae.mul(x, y), z)),
    ("div-div", ae.div(ae.div(x, y), z), ae.div(x, ae.mul(y, z))),
    ("sum-add", ae.sum_of(8, ae.add(x, y)), ae.add(ae.sum_of(8, x), ae.sum_of(8, y))),
    ("sum-mul", ae.sum_of(8, ae.mul(x, y)), ae.mul(ae.sum_of(8, x), y)),
    ("sum-div", ae.sum_of(8, ae.div(x, y)), ae.div(ae.sum_of(8, x), y)),
    ("exp-add", ae.mul(ae.exp(x), ae.exp(y)), ae.exp(ae.add(x, y))),
    ("sqrt-mul", ae.sqrt(ae.mul(x, y)), ae.mul(ae.sqrt(x), ae.sqrt(y))),
    ("reciprocal", ae.div(x, ae.sqrt(y)), ae.mul(x, ae.div(c, ae.sqrt(y)))),
    (
        "rmsnorm-matmul",
        ae.sum_of(64, ae.mul(ae.div(x, ae.rms(64, x)), y)),
        ae.div(ae.sum_of(64, ae.mul(y, x)), ae.sqrt(ae.sum_of(64, ae.mul(x, x)))),
    ),
]

# (name, target, a term that is NOT a subterm of any rewrite: no cancellation, no made-up sums)
NON_MEMBERS = [
    ("exp-is-not-linear", ae.exp(ae.add(x, y)), ae.add(ae.exp(x), ae.exp(y))),
    ("other-variable", ae.mul(x, y), ae.mul(x, z)),
    ("sum-sizes-differ", ae.sum_of(8, x), ae.sum_of(16, x)),
    ("opaque-is-opaque", ae.opaque("silu", ae.add(x, y)), ae.add(ae.opaque("silu", x), ae.opaque("silu", y))),
]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.backend)
@pytest.mark.parametrize(("name", "target", "equal"), EQUALITIES, ids=[e[0] for e in EQUALITIES])
def test_saturation_puts_equal_terms_in_the_target_class(backend, name, target, equal):
    graph = backend()
    root = graph.add_term(target)
    report = graph.saturate(AXIOMS, SaturationLimits(iterations=30))
    assert report.stop_reason is StopReason.SATURATED
    assert graph.lookup(equal) == graph.find(root)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.backend)
@pytest.mark.parametrize(("name", "target", "other"), NON_MEMBERS, ids=[e[0] for e in NON_MEMBERS])
def test_terms_outside_the_rewrites_are_not_represented(backend, name, target, other):
    graph = backend()
    graph.add_term(target)
    graph.saturate(AXIOMS, SaturationLimits(iterations=30))
    assert graph.lookup(other) is None


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.backend)
def test_there_is_no_cancellation_axiom(backend):
    graph = backend()
    root = graph.add_term(ae.div(ae.mul(x, y), y))
    graph.saturate(AXIOMS, SaturationLimits(iterations=30))
    assert graph.lookup(x) is not None and graph.lookup(x) != graph.find(root)


@pytest.mark.parametrize("iterations", [1, 2, 3, 5, 8, 20])
def test_both_back_ends_build_the_same_egraph_iteration_by_iteration(iterations):
    target = ae.sum_of(64, ae.mul(ae.mul(ae.div(x, ae.rms(64, x)), y), z))
    reports = []
    for backend in BACKENDS:
        graph = backend()
        graph.add_term(target)
        reports.append(graph.saturate(AXIOMS, SaturationLimits(iterations=iterations)))
    python, egglog = reports
    assert python.nodes == egglog.nodes
    assert python.stop_reason is egglog.stop_reason
    assert (python.stop_reason is StopReason.SATURATED) == (iterations == 20)


def test_the_backoff_scheduler_delays_busy_rules_but_reaches_the_same_saturation():
    target = ae.sum_of(64, ae.mul(ae.div(x, ae.rms(64, x)), y))
    plain, backoff = EGraph(), EGraph()
    plain.add_term(target)
    backoff.add_term(target)
    free = plain.saturate(AXIOMS)
    banned = backoff.saturate(AXIOMS, SaturationLimits(match_limit=200, ban_length=1))
    assert free.stop_reason is banned.stop_reason is StopReason.SATURATED
    assert banned.iterations > free.iterations
    assert banned.nodes == free.nodes


def test_union_restores_congruence_on_rebuild():
    graph = EGraph()
    fx = graph.add_term(ae.exp(ae.add(x, y)))
    fz = graph.add_term(ae.exp(z))
    assert graph.find(fx) != graph.find(fz)
    graph.union(graph.add_term(ae.add(x, y)), graph.add_term(z))
    graph.rebuild()
    assert graph.find(fx) == graph.find(fz)


def test_rebuild_propagates_merges_upwards_through_several_levels():
    graph = EGraph()
    deep_x = graph.add_term(ae.sqrt(ae.exp(ae.mul(x, y))))
    deep_z = graph.add_term(ae.sqrt(ae.exp(ae.mul(z, y))))
    graph.union(graph.add_term(x), graph.add_term(z))
    graph.rebuild()
    assert graph.find(deep_x) == graph.find(deep_z)
    assert graph.lookup(ae.exp(ae.mul(z, y))) == graph.lookup(ae.exp(ae.mul(x, y)))


BLOWUP = ae.div(
    ae.add(y, ae.mul(z, ae.add(ae.div(x, ae.rms(4096, x)), y))),
    ae.rms(4096, ae.add(y, ae.mul(z, ae.add(ae.div(x, ae.rms(4096, x)), y)))),
)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.backend)
@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        (SaturationLimits(iterations=2), StopReason.ITERATION_LIMIT),
        (SaturationLimits(iterations=100, nodes=2_000), StopReason.NODE_LIMIT),
        (SaturationLimits(iterations=100, time_s=0.0), StopReason.TIME_LIMIT),
    ],
    ids=["iterations", "nodes", "time"],
)
def test_limits_stop_saturation_with_a_typed_reason(backend, limits, reason):
    graph = backend()
    root = graph.add_term(BLOWUP)
    report = graph.saturate(AXIOMS, limits)
    assert report.stop_reason is reason
    assert report.iterations <= limits.iterations
    if reason is StopReason.NODE_LIMIT:
        assert report.nodes <= 10 * limits.nodes  # stopped near the limit, not far past it
    assert graph.lookup(BLOWUP) == graph.find(root)  # the target itself is always represented


def test_rule_table_rows_are_named_once_and_print_as_rewrites():
    names = [rule.name for rule in AXIOMS]
    assert len(names) == len(set(names))
    text = {rule.name: str(rule) for rule in AXIOMS}
    assert text["sum-div"] == "sum-div: (sum ?i (/ ?x ?y)) <=> (/ (sum ?i ?x) ?y)"
    assert egraph_egglog.rule_text(AXIOMS[0]) == "(rewrite (Add x y) (Add y x))"


def test_bidirectional_rows_expand_to_two_directions():
    a, b = pattern_variables("a b")
    row = Rewrite("demo", P.add(a, b), P.mul(a, b), bidirectional=True)
    assert [name for name, _, _ in row.directions()] == ["demo", "demo-rev"]


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([4096], [f"factor-{2**k}" for k in range(12, 1, -1)]),
        ([12], ["factor-12", "factor-6", "factor-4"]),
        ([7], []),
        ([64, 4096], [f"factor-{2**k}" for k in range(12, 1, -1)]),
    ],
)
def test_factor_chains_cover_every_composite_divisor(sizes, expected):
    assert [rule.name for rule in factor_chain_rules(sizes)] == expected


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.backend)
def test_factor_chains_relate_splits_of_a_reduction(backend):
    graph = backend()
    root = graph.add_term(ae.sum_of(64, x))
    graph.saturate(list(AXIOMS) + factor_chain_rules([64]), SaturationLimits(iterations=30))
    # terms merge nested sums, so look the nested e-nodes up one by one: sum(4, sum(16, x))
    inner = graph.lookup_node((ae.TermOp.SUM, 16, graph.lookup(x)))
    assert inner is not None
    assert graph.lookup_node((ae.TermOp.SUM, 4, inner)) == graph.find(root)


@pytest.mark.parametrize("module", [egraph, egraph_egglog, egraph_rules])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
