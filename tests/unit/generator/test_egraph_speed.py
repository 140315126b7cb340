"""The built-in e-graph's fast saturation: rules compiled to Python functions and a semi-naive search
(each search after the first looks only for matches with a new e-node) build, iteration by
iteration, the e-graph that a full search with a recursive matcher builds."""

from __future__ import annotations

import pytest

from mirage.generator import abstract_expr as ae
from mirage.generator.egraph import EGraph, SaturationLimits, StopReason, _Rule
from mirage.generator.egraph_rules import AXIOMS, Pattern, PatternVariable, SizeVariable

CENTERED = "(+ v0 (sum 512 v0))"
LAYERNORM = ae.parse(f"(+ (* (/ {CENTERED} (sqrt (sum 512 (* {CENTERED} {CENTERED})))) v1) v2)")
RMSNORM = ae.parse("(sum 4096 (* (* (/ v0 (sqrt (sum 4096 (* v0 v0)))) v1) v2))")
NTRANS_PART = ae.parse("(* (+ v1 (* v2 v0)) (+ v1 (* v2 v0)))")
DIRECTIONS = [direction for rule in AXIOMS for direction in rule.directions()]
#: A match limit no rule reaches: every search is a full one (the ban counts every match).
FULL_SEARCH = 1 << 40


def canonical_form(graph: EGraph) -> set[str]:
    """The e-nodes, each e-class named by its least term: equal for e-graphs equal up to the
    numbering of e-classes."""
    graph._compact()
    nodes = [(node, graph.find(eclass)) for node, eclass in graph._hashcons.items()]
    least: dict[int, tuple] = {}
    changed = True
    while changed:  # a least fixed point: a term only grows with its children
        changed = False
        for node, eclass in nodes:
            if all(child in least for child in node[2:]):
                term = (1 + sum(least[c][0] for c in node[2:]), node[0].value, repr(node[1]))
                term += tuple(least[c] for c in node[2:])
                if eclass not in least or term < least[eclass]:
                    least[eclass], changed = term, True
    assert len(least) == graph.class_count, "every e-class represents a term"
    name = {eclass: repr(term) for eclass, term in least.items()}
    assert len(set(name.values())) == len(name)
    return {repr((node[0].value, node[1], [name[c] for c in node[2:]], name[e])) for node, e in nodes}


def saturated(target: ae.Term, limits: SaturationLimits) -> tuple[EGraph, tuple]:
    graph = EGraph()
    graph.add_term(target)
    report = graph.saturate(AXIOMS, limits)
    return graph, (report.stop_reason, report.iterations, report.nodes, report.classes)


@pytest.mark.parametrize(
    ("target", "iterations"),
    [(LAYERNORM, n) for n in (6, 7, 9, 13)] + [(RMSNORM, n) for n in (5, 8, 10)] + [(NTRANS_PART, 6)],
)
def test_semi_naive_search_builds_the_same_egraph_as_a_full_search(target, iterations):
    fast, fast_report = saturated(target, SaturationLimits(iterations=iterations))
    full, full_report = saturated(target, SaturationLimits(iterations=iterations, match_limit=FULL_SEARCH))
    assert fast_report == full_report
    assert canonical_form(fast) == canonical_form(full)


def test_layernorm_saturates_to_the_recorded_size():
    _, report = saturated(LAYERNORM, SaturationLimits(time_s=60.0))
    assert report == (StopReason.SATURATED, 13, 7236, 294)


def recursive_matches(index, pattern: Pattern, eclass: int, subst: dict):
    """egg's recursive matcher (the compiled searches replace it), over the same index."""
    if isinstance(pattern, PatternVariable):
        bound = subst.get(pattern)
        if bound is None:
            yield {**subst, pattern: eclass}
        elif bound == eclass:
            yield subst
        return
    for node, _ in index[pattern.op].get(eclass, ((), ()))[0]:
        current = subst
        if isinstance(pattern.parameter, SizeVariable):
            bound = current.get(pattern.parameter)
            if bound is None:
                current = {**current, pattern.parameter: node[1]}
            elif bound != node[1]:
                continue
        elif pattern.parameter != node[1]:
            continue
        yield from matches_of_children(index, pattern.args, node, 0, current)


def matches_of_children(index, args: tuple[Pattern, ...], node: tuple, position: int, subst: dict):
    if position == len(args):
        yield subst
        return
    for extended in recursive_matches(index, args[position], node[2 + position], subst):
        yield from matches_of_children(index, args, node, position + 1, extended)


def test_compiled_searches_find_the_matches_of_the_recursive_matcher_in_its_order():
    graph, _ = saturated(RMSNORM, SaturationLimits(iterations=6))
    index = graph._index(None)
    for name, lhs, rhs in DIRECTIONS:
        rule = _Rule.compile(name, lhs, rhs)
        expected = [
            (eclass, tuple(subst.values()))
            for eclass in index[lhs.op]
            for subst in recursive_matches(index, lhs, eclass, {})
        ]
        assert rule.search(index, None, [], 1 << 62, float("inf")) == expected, name


@pytest.mark.parametrize("done", [0, 2, 4, 6])
def test_a_semi_naive_search_finds_every_match_that_is_new(done):
    """After an iteration, a match (e-class and values) that was not one before has a new e-node,
    so the semi-naive search finds it; and it finds only matches, in the order of a full search."""
    graph = EGraph()
    graph.add_term(LAYERNORM)
    graph.saturate(AXIOMS, SaturationLimits(iterations=done))
    before = graph._index(None)
    previous = dict(graph._hashcons)
    graph.saturate(AXIOMS, SaturationLimits(iterations=1))
    after, everything = graph._index(previous), graph._index(None)
    fresh = graph._fresh(after, 2)
    for name, lhs, rhs in DIRECTIONS:
        rule = _Rule.compile(name, lhs, rhs)
        old = set(rule.search(before, None, [], 1 << 62, float("inf")))
        every = rule.search(everything, None, [], 1 << 62, float("inf"))
        new = rule.search(after, fresh, [], 1 << 62, float("inf"))
        assert {match for match in every if match not in old} <= set(new), name
        assert [match for match in every if match in set(new)] == new, name
