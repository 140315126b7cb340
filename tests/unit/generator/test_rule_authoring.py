"""Writing a pruning rule as docs/pruning.md says, and measuring it in whole searches: what the search
reports for rules that cut nothing, everything, raise, name one level, or cannot reach the workers."""

from __future__ import annotations

import pickle
import signal

import pytest

import mirage as mi
from mirage.generator import SearchSpaceError, StopReason, search
from mirage.generator.checks import make_rules
from mirage.generator.expressions import output_terms
from mirage.generator.pruning import (
    RULES,
    Candidate,
    PruningContext,
    PruningRuleError,
    PruningTable,
    pruning_rule,
)
from mirage.generator.space import SearchSpace
from mirage.mugraph.graph import Level, Ref
from mirage.mugraph.ops import Op
from tests.unit.generator.test_driver import isolated_cache  # noqa: F401 - a fixture
from tests.unit.generator.test_search import QUIET, TINY, tiny_reference


@pytest.fixture
def registry():
    """Rules registered by a test are gone after it."""
    before = dict(RULES)
    yield RULES
    RULES.clear()
    RULES.update(before)


@pytest.fixture(scope="module")
def without_rules():
    return search(tiny_reference(), workers=1, **TINY, **QUIET)


def test_a_rule_that_keeps_everything_cuts_nothing_and_changes_nothing(registry, without_rules):
    @pruning_rule("keeps_all", "keeps every candidate")
    def keeps_all(candidate, context):
        return True

    result = search(tiny_reference(), workers=1, **TINY, **QUIET)
    assert result.stats.pruned.get("keeps_all", 0) == 0
    assert result.hashes == without_rules.hashes and len(result) > 0
    assert result.stats.states == without_rules.stats.states
    assert result.stats.pruned == without_rules.stats.pruned


def test_a_rule_that_cuts_everything_finds_nothing_and_counts_its_cuts(registry, without_rules):
    @pruning_rule("cuts_all", "cuts every candidate")
    def cuts_all(candidate, context):
        return False

    result = search(tiny_reference(), workers=1, **TINY, **QUIET)
    assert len(result) == 0 and result.stop_reason is StopReason.COMPLETE
    assert result.stats.pruned["cuts_all"] > 0 and result.stats.verified == 0
    assert result.stats.states < without_rules.stats.states
    off = search(tiny_reference(), workers=1, disabled_rules="cuts_all", **TINY, **QUIET)
    assert off.hashes == without_rules.hashes and "cuts_all" not in off.stats.pruned


def test_a_rule_registered_after_a_search_was_cached_is_not_answered_from_the_cache(
        registry, isolated_cache):  # noqa: F811
    """The cache key held the switched-off rules but not the registered ones: once a search was
    cached, a new rule took no part in the same search (0 cuts, the old µGraphs)."""
    first = search(tiny_reference(), workers=1, progress=False, **TINY)
    assert len(first) > 0

    @pruning_rule("cuts_all_late", "cuts every candidate")
    def cuts_all_late(candidate, context):
        return False

    second = search(tiny_reference(), workers=1, progress=False, **TINY)
    assert second.key != first.key
    assert len(second) == 0 and second.stats.pruned["cuts_all_late"] > 0


def test_a_rule_that_raises_is_reported_by_name(registry):
    @pruning_rule("broken_rule", "raises on every candidate")
    def broken_rule(candidate, context):
        raise RuntimeError("no such field")

    with pytest.raises(PruningRuleError, match="rule 'broken_rule' raised RuntimeError: no such field"):
        search(tiny_reference(), workers=1, **TINY, **QUIET)
    g = mi.new_kernel_graph()
    g.new_input(dims=(8, 64), dtype=mi.float16)
    with pytest.raises(PruningRuleError, match="'broken_rule'") as raised:
        PruningTable(PruningContext()).check(Candidate.extend(g.graph, Op.EXP, (Ref(0),)))
    assert raised.value.rule == "broken_rule" and isinstance(raised.value.__cause__, RuntimeError)


@pytest.mark.parametrize("level", [Level.KERNEL, Level.BLOCK])
def test_a_rule_judges_only_the_candidates_of_the_levels_it_names(registry, level):
    """The search ran every registered rule at both levels, whatever its ``levels``."""
    seen = set()

    @pruning_rule("one_level", "cuts every candidate of one level", levels=[level])
    def one_level(candidate, context):
        seen.add(candidate.level)
        return False

    result = search(tiny_reference(), workers=1, **TINY, **QUIET)
    assert seen == {level} and result.stats.pruned["one_level"] > 0


def test_workers_that_lack_a_rule_refuse_the_search_when_they_start(registry):
    """A rule defined under ``if __name__ == "__main__":`` is not registered in worker processes:
    unpickling the search's rules raised there, the worker hung, and the search with it."""

    @pruning_rule("main_only", "cuts every candidate")
    def main_only(candidate, context):
        return False

    main_only.__module__ = "__main__"  # as if defined under the main guard of the program
    rules = make_rules(output_terms(tiny_reference()), SearchSpace.named("mlp", **TINY))
    RULES.pop("main_only")
    received = pickle.loads(pickle.dumps(rules))  # what a worker process receives
    with pytest.raises(SearchSpaceError, match=r"\['main_only'\] are not registered in the search's worker"):
        received.require_registered()
    RULES["main_only"] = rules.table.rules["main_only"]

    def hung(signum, frame):
        raise TimeoutError("the search hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        with pytest.raises(SearchSpaceError, match="define rules at the top level of an importable module"):
            search(tiny_reference(), workers=2, **TINY, **QUIET)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_reference_with_a_max_is_searched_without_the_abstract_expression_rule():
    """A max has no abstract expression: the search raised NotInterpretable before it began."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 64), dtype=mi.float16)
    g.mark_output(g.relu(g.reduction_max(x, 1)))
    result = search(g, workers=1, time_limit_s=1, **QUIET)
    assert result.stop_reason in (StopReason.TIME, StopReason.COMPLETE)
    assert result.stats.oracle == "abstract-expression pruning off"
    assert result.checker == "float64 interpreter" and result.stats.states > 0
