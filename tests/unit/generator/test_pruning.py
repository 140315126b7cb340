"""The pruning rule table: each built-in rule, switching rules, registering rules, counters."""

from __future__ import annotations

import dataclasses
import doctest
import pickle

import pytest

import mirage as mi
from mirage.errors import MirageError
from mirage.generator import abstract_expr as ae
from mirage.generator.pruning import (
    RULES,
    Candidate,
    PruningContext,
    PruningStats,
    PruningTable,
    RuleStats,
    SubexpressionCheck,
    UnknownRuleError,
    pruning_rule,
    rules,
    target_terms,
)
from mirage.generator.pruning import candidate as candidate_module
from mirage.mugraph import build
from mirage.mugraph.graph import Accum, AccumKind, Level, Reduce, Ref
from mirage.mugraph.ops import Op


def _kernel_prefix():
    """X (8, 64), W (64, 32), then X @ W (node 2) and exp of it (node 3): the reference's ops."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.exp(g.matmul(x, w))
    return g.graph


def _reference():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    e = g.exp(g.matmul(x, w))
    g.mark_output(g.div(e, g.reduction(e, 1)))
    return g.freeze()


def _block_prefix(rows: int = 8):
    """A block graph with a (rows, 16) tile of X and a (16, 32) tile of W per iteration."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(rows, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=4)
    tb.new_input(x, forloop_dim=1)
    tb.new_input(w, forloop_dim=0)
    return tb.graph


@pytest.fixture(scope="module")
def context():
    return PruningContext(oracle=SubexpressionCheck(target_terms(_reference())))


def test_the_default_table_runs_the_built_in_rules_in_order():
    table = PruningTable()
    assert table.enabled == ["canonical_order", "shape", "single_exp", "identity_reduction", "memory",
                             "abstract_expression"]
    assert "abstract_expression" in table.describe() and "[on ]" in table.describe()


# (name, how to build the candidate from the kernel prefix, the rule expected to cut it or None)
KERNEL_CASES = [
    ("a new op after the last one", lambda p: Candidate.extend(p, Op.DIV, (Ref(3), Ref(3))), None),
    ("an op before the last one", lambda p: Candidate.extend(p, Op.EXP, (Ref(0),)), "canonical_order"),
    ("mismatched matmul", lambda p: Candidate.extend(p, Op.MATMUL, (Ref(3), Ref(3))), "shape"),
    ("exp of an exp", lambda p: Candidate.extend(p, Op.EXP, (Ref(3),)), "single_exp"),
    ("not a subexpression", lambda p: Candidate.extend(p, Op.SQRT, (Ref(3),)), "abstract_expression"),
    ("the softmax denominator", lambda p: Candidate.extend(p, Op.REDUCTION, (Ref(3),), Reduce(1)), None),
]


@pytest.mark.parametrize(("name", "build", "cut_by"), KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_each_rule_cuts_what_it_states(context, name, build, cut_by):
    table = PruningTable(context)
    assert table.check(build(_kernel_prefix())) == cut_by
    stats = table.stats
    assert stats.candidates == 1 and stats.kept == (cut_by is None)
    if cut_by is not None:
        assert stats.rules[cut_by].cut == 1
        judged = [n for n, s in stats.rules.items() if s.checked]
        assert judged == table.enabled[: table.enabled.index(cut_by) + 1]


def test_a_disabled_rule_neither_cuts_nor_counts(context):
    table = PruningTable(context, disabled=["single_exp", "abstract_expression"])
    assert table.check(Candidate.extend(_kernel_prefix(), Op.EXP, (Ref(3),))) is None
    assert table.stats.rules["single_exp"].checked == 0
    table.enable("single_exp")
    assert table.check(Candidate.extend(_kernel_prefix(), Op.EXP, (Ref(3),))) == "single_exp"
    table.disable("single_exp")
    assert not table.is_enabled("single_exp")


def test_unknown_rule_names_are_a_mirage_error():
    with pytest.raises(UnknownRuleError, match="no_such_rule") as info:
        PruningTable(disabled=["no_such_rule"])
    assert isinstance(info.value, MirageError)
    with pytest.raises(UnknownRuleError):
        PruningTable().enable("no_such_rule")


@pytest.mark.parametrize(
    ("rows", "budget", "cut_by"),
    [(8, 96 * 1024, None), (2048, 96 * 1024, "memory"), (2048, 1 << 20, None)],
)
def test_shared_memory_budget(rows, budget, cut_by):
    prefix = _block_prefix(rows)
    candidate = Candidate.extend(prefix, Op.MATMUL, (Ref(0), Ref(1)))
    # tiles (rows, 16) and (16, 32) plus the (rows, 32) product, fp16
    assert candidate.memory_bytes == 2 * (rows * 16 + 16 * 32 + rows * 32)
    table = PruningTable(PruningContext(shared_memory_bytes=budget))
    assert table.check(candidate) == cut_by


def test_in_place_block_ops_use_no_new_shared_memory():
    prefix = _block_prefix()
    product = Candidate.extend(prefix, Op.MATMUL, (Ref(0), Ref(1)))
    exp = Candidate.extend(prefix, Op.EXP, (Ref(0),))
    accum = Candidate.extend(prefix, Op.ACCUM, (Ref(0),), Accum(AccumKind.NONE))
    assert exp.memory_bytes == accum.memory_bytes == product.prefix_memory_bytes
    assert product.memory_bytes > product.prefix_memory_bytes
    assert accum.term is ae.sum_of(4, ae.variable(0))
    assert product.level is Level.BLOCK and product.forloop_range == 4


def test_device_memory_budget_applies_at_kernel_level():
    candidate = Candidate.extend(_kernel_prefix(), Op.DIV, (Ref(3), Ref(3)))
    assert candidate.memory_bytes == 2 * (8 * 64 + 64 * 32 + 8 * 32 + 8 * 32 + 8 * 32)
    assert PruningTable(PruningContext(device_memory_bytes=1000)).check(candidate) == "memory"


def test_registering_a_rule_takes_a_few_lines_and_its_counters_show():
    registry = dict(RULES)

    @pruning_rule("square_not_self_mul", "x * x is built as square(x)", registry=registry)
    def square_not_self_mul(candidate, context):
        return not (candidate.op is Op.MUL and candidate.inputs[0] == candidate.inputs[1])

    @pruning_rule("off_by_default", "cuts everything", registry=registry, enabled=False)
    def cut_everything(candidate, context):
        return False

    table = PruningTable(rules=registry)
    assert table.enabled[-1] == "square_not_self_mul" and "off_by_default" not in table.enabled
    prefix = _kernel_prefix()
    square = Candidate.extend(prefix, Op.SQUARE, (Ref(3),))
    assert table.check(square) is None
    assert table.check(Candidate.extend(prefix, Op.MUL, (Ref(3), Ref(3)))) == "square_not_self_mul"
    counters = table.stats.rules["square_not_self_mul"]
    assert (counters.checked, counters.cut) == (2, 1) and counters.seconds > 0
    assert "square_not_self_mul" in str(table.stats)
    assert PruningTable(rules=registry, enabled=["off_by_default"]).check(square) == "off_by_default"
    with pytest.raises(ValueError, match="already registered"):
        pruning_rule("square_not_self_mul", "again", registry=registry)(square_not_self_mul)
    assert "square_not_self_mul" not in RULES


def test_a_reduction_that_would_return_its_operand_is_cut():
    table = PruningTable()
    prefix = _kernel_prefix()
    sums = Candidate.extend(prefix, Op.REDUCTION, (Ref(3),), Reduce(1))
    assert table.check(sums) is None
    summed, _ = build.append(prefix, Op.REDUCTION, (Ref(3),), Reduce(1))
    again = Candidate.extend(summed, Op.REDUCTION, (Ref(4),), Reduce(1))  # one element a row: an identity
    assert table.check(again) == "identity_reduction"
    maximum = Candidate.extend(summed, Op.REDUCTION_MAX, (Ref(4),), Reduce(1))
    assert table.check(maximum) == "identity_reduction"
    assert table.check(Candidate.extend(summed, Op.REDUCTION, (Ref(4),), Reduce(0))) is None  # 8 rows
    assert PruningTable(disabled=["identity_reduction"]).check(again) is None


def test_stats_merge_across_workers_and_serialize():
    a = PruningStats({"shape": RuleStats(10, 2, 0.5)}, candidates=10, kept=8)
    b = PruningStats({"shape": RuleStats(5, 1, 0.25), "memory": RuleStats(4, 4, 0.1)}, candidates=5, kept=0)
    merged = a + b
    assert merged.rules["shape"] == RuleStats(15, 3, 0.75)
    assert merged.cut == {"shape": 3, "memory": 4}
    assert merged.to_dict()["rules"]["memory"] == {"checked": 4, "cut": 4, "seconds": 0.1}
    assert (merged.candidates, merged.kept) == (15, 8)


def test_rule_time_is_measured(context):
    table = PruningTable(context)
    prefix = _kernel_prefix()
    for _ in range(20):
        table.check(Candidate.extend(prefix, Op.SQRT, (Ref(3),)))
    assert table.stats.rules["abstract_expression"].cut == 20
    assert table.stats.rules["abstract_expression"].seconds > 0


def test_the_default_table_pickles():
    table = PruningTable(PruningContext())
    clone = pickle.loads(pickle.dumps(table))
    assert clone.enabled == table.enabled
    assert clone.rules["shape"].predicate is rules.shape


def test_candidates_are_values():
    prefix = _kernel_prefix()
    first = Candidate.extend(prefix, Op.DIV, (Ref(3), Ref(3)))
    assert first == Candidate.extend(prefix, Op.DIV, (Ref(3), Ref(3)))
    assert dataclasses.replace(first, rank=0).order == ((3, 3), 0)
    assert first.last_order == ((2,), candidate_module.op_rank(Op.EXP))


@pytest.mark.parametrize("module", [rules, candidate_module])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
