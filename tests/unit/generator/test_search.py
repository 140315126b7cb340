"""The search: what it finds, that it finds each µGraph once, and that budgets cut deterministically."""

from __future__ import annotations

import doctest
import time

import numpy as np
import pytest

import mirage as mi
from mirage.errors import GraphError
from mirage.generator import Budget, SearchSpaceError, StopReason, search
from mirage.generator.candidates import first_order, input_tuples, order_key
from mirage.generator.checks import make_rules
from mirage.generator.cost import is_fused, structure
from mirage.generator.explore import Explorer, SearchContext, root_state
from mirage.generator.expressions import op_term, output_terms
from mirage.generator.space import SearchSpace
from mirage.generator.units import split
from mirage.generator.verification import make_checker
from mirage.mugraph import TensorType, float16, tensor_cores
from mirage.mugraph.graph import AccumKind, Node, Ref
from mirage.mugraph.ops import REGISTRY, UNARY, Level, Op, ShapeContext
from mirage.mugraph.tensor_cores import simt_rounds


def tiny_reference():
    """exp(X @ W), small enough that its whole search space takes about two seconds."""
    g = mi.new_kernel_graph("tiny")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(x, w)))
    return g.freeze()


TINY = {
    "griddims": [(4, 1, 1)],
    "franges": [4],
    "kernel_ops": ["matmul", "exp"],
    "block_ops": ["matmul", "exp", "accum", "accum_sum"],
    "max_block_ops": 5,
    "max_kernel_ops": 4,
}
QUIET = {"progress": False, "cache": False, "checkpoint": False}
FUSED = (("customized",), (("accum:none", "exp", "matmul"),))


@pytest.fixture(scope="module")
def complete():
    return search(tiny_reference(), workers=1, **TINY, **QUIET)


def test_the_whole_space_is_searched_and_the_fused_graph_found(complete):
    assert complete.stop_reason is StopReason.COMPLETE
    assert FUSED in {f.structure for f in complete.found}
    assert any(is_fused(g) for g in complete.graphs)
    assert (("matmul", "exp"), ()) in {f.structure for f in complete.found}  # the reference itself
    assert complete.stats.states_per_level["block"] > complete.stats.states_per_level["kernel"] > 0
    assert complete.stats.pruned["abstract_expression"] > 0 and complete.stats.pruned["shape"] > 0
    assert complete.best.content_hash() == complete.found[0].graph.content_hash()
    costs = [f.estimated_us for f in complete.found]
    assert costs == sorted(costs) and is_fused(complete.best)


def test_every_result_is_equivalent_to_the_reference(complete):
    reference = tiny_reference()
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(t.shape) * 0.3 for t in reference.input_types]
    (expected,) = mi.interpret(reference, inputs)
    for graph in complete.graphs:
        mi.check(graph)
        assert mi.verify(reference, graph).equivalent
        (got,) = mi.interpret(graph, inputs)
        np.testing.assert_allclose(got, expected, rtol=1e-9)


def test_each_graph_is_generated_once(complete):
    assert len(complete.hashes) == len(complete.found)
    assert len({f.graph.content_hash() for f in complete.found}) == complete.stats.verified


def test_state_budget_cuts_at_the_same_place_for_any_number_of_workers(complete):
    budget = Budget(states=complete.stats.states // 2)
    serial = search(tiny_reference(), budget=budget, workers=1, **TINY, **QUIET)
    parallel = search(tiny_reference(), budget=budget, workers=2, **TINY, **QUIET)
    assert serial.stop_reason is parallel.stop_reason is StopReason.STATES
    assert serial.hashes == parallel.hashes and 0 < len(serial) < len(complete)
    assert serial.hashes < complete.hashes


def test_results_budget_keeps_the_first_in_search_order(complete):
    first = search(tiny_reference(), budget=Budget(results=3), workers=2, **TINY, **QUIET)
    again = search(tiny_reference(), budget=Budget(results=3), workers=1, **TINY, **QUIET)
    assert first.stop_reason is StopReason.RESULTS and len(first) == 3
    assert first.hashes == again.hashes <= complete.hashes


def test_time_budget():
    start = time.perf_counter()
    result = search(tiny_reference(), time_limit_s=0.5, workers=1, griddims=[(4, 1, 1)], **QUIET)
    assert result.stop_reason is StopReason.TIME
    assert time.perf_counter() - start < 20


def test_switching_off_abstract_expression_pruning_finds_more_in_more_states():
    small = {**TINY, "max_block_ops": 4}
    pruned = search(tiny_reference(), workers=1, **small, **QUIET)
    unpruned = search(tiny_reference(), workers=1, disabled_rules=["abstract_expression"], **small, **QUIET)
    assert unpruned.stats.states > 2 * pruned.stats.states
    assert "abstract_expression" not in unpruned.stats.pruned
    assert pruned.hashes <= unpruned.hashes


@pytest.mark.parametrize(
    "rule, message",
    [
        ("no_such_rule", "unknown pruning rule"),
        ("shape", "cannot be switched off"),
    ],
)
def test_rules_that_cannot_be_switched_off(rule, message):
    with pytest.raises(SearchSpaceError, match=message):
        search(tiny_reference(), disabled_rules=[rule], **TINY, **QUIET)


# ---- the incremental block search against a naive one -------------------------------------------


def _context(reference, space, disabled=()):
    space = space.resolve(reference)
    rules = make_rules(output_terms(reference), space, disabled)
    return SearchContext(reference, space, rules, make_checker(reference), time.time())


def _naive_states(context, tiles, forloop_range, terms):
    """Every block state and closable body, by trying every op on every operand tuple at every state."""
    space, rules = context.space, context.rules
    complete = space.order == "complete"
    shape_context = ShapeContext(Level.BLOCK, forloop_range, space.reduction_dimx)
    states, bodies = set(), set()

    def visit(nodes, types, state_terms, uses, last, memory):
        states.add(nodes)
        sinks = [i for i, n in enumerate(uses) if n == 0]
        if (
            sinks
            and len(sinks) <= space.max_block_outputs
            and all(i >= len(tiles) and types[i].after_accum for i in sinks)
        ):
            bodies.add(nodes)
        if len(types) >= space.max_block_ops:
            return
        for rank, choice in enumerate(space.block_ops):
            for inputs in input_tuples(len(types), REGISTRY[choice.op].arity):
                if order_key(complete, inputs, rank) <= last:
                    continue
                if complete and choice.op in (Op.ADD, Op.MUL) and inputs[0] > inputs[1]:
                    continue
                in_types = tuple(types[i] for i in inputs)
                try:
                    (out,) = REGISTRY[choice.op].shape(shape_context, in_types, choice.attrs)
                except GraphError:
                    continue
                if choice.op is Op.MATMUL and any(d != 1 for t in in_types for d in t.shape[:-2]):
                    continue
                term = op_term(
                    choice.op,
                    choice.attrs,
                    in_types,
                    [state_terms[i] for i in inputs],
                    forloop_range,
                    space.reduction_dimx,
                )
                if term.exp_depth > 1 or not rules.context.oracle.contains(term):
                    continue
                in_place = choice.op in UNARY or (
                    choice.op is Op.ACCUM and choice.attrs.kind is AccumKind.NONE
                )
                grown = memory + (0 if in_place else out.nbytes)
                if grown > space.shared_memory_bytes:
                    continue
                new_uses = list(uses)
                for i in inputs:
                    new_uses[i] += 1
                node = Node(choice.op, tuple(Ref(i, 0) for i in inputs), choice.attrs, (out,))
                visit(
                    nodes + (node,),
                    types + (out,),
                    state_terms + (term,),
                    tuple(new_uses) + (0,),
                    order_key(complete, inputs, rank),
                    grown,
                )

    visit((), tiles, terms, (0,) * len(tiles), first_order(complete), sum(t.nbytes for t in tiles))
    return states, bodies


@pytest.mark.parametrize(
    "max_block_ops, block_ops, order",
    [
        (6, ["matmul", "exp", "accum", "accum_sum"], "complete"),
        (5, ["matmul", "exp", "add", "mul", "div", "accum", "accum_sum", "accum_rms"], "complete"),
        (6, ["matmul", "exp", "accum", "accum_sum"], "mirage"),
        (5, ["matmul", "exp", "add", "mul", "div", "accum", "accum_sum", "accum_rms"], "mirage"),
    ],
)
@pytest.mark.parametrize("guided", [False, True])
def test_incremental_block_search_visits_what_a_naive_one_visits(max_block_ops, block_ops, order, guided):
    """Also with the guided order (the inputs recompute the reference's X and W): the same states."""
    from mirage.generator import abstract_expr as ae
    from mirage.generator.blocks import search_bodies

    space = SearchSpace(block_ops=block_ops, max_block_ops=max_block_ops, order=order, guided_order=guided)
    context = _context(tiny_reference(), space, disabled=("block_lookahead",))
    tiles = (TensorType((8, 16), float16), TensorType((16, 8), float16))
    terms = (ae.variable(0), ae.variable(1))
    values = (0, 1) if guided else None
    bodies, count, truncated = search_bodies(Explorer(context), tiles, 4, terms, None, values=values)
    naive_states, naive_bodies = _naive_states(context, tiles, 4, terms)
    assert not truncated
    assert count == len(naive_states) > 50
    assert {b.nodes for b in bodies} == naive_bodies
    assert len(bodies) == len({b.nodes for b in bodies})


@pytest.mark.parametrize("order", ["mirage", "complete"])
def test_guided_order_visits_reference_ops_first(order):
    """Tiles that hold whole rows of X and columns of W (no for-loop): matmul then exp recompute the
    reference, so the first body found starts with them; the canonical order finds others first."""
    from mirage.generator import abstract_expr as ae
    from mirage.generator.blocks import search_bodies

    found = {}
    for guided in (False, True):
        space = SearchSpace(
            block_ops=["matmul", "exp", "accum", "accum_sum"],
            max_block_ops=6,
            order=order,
            guided_order=guided,
        )
        context = _context(tiny_reference(), space)
        tiles = (TensorType((2, 64), float16), TensorType((64, 8), float16))
        terms = (ae.variable(0), ae.variable(1))
        bodies, _, _ = search_bodies(Explorer(context), tiles, 1, terms, None, values=(0, 1))
        found[guided] = [[n.op.value for n in b.nodes] for b in bodies]
    assert sorted(map(str, found[True])) == sorted(map(str, found[False]))
    assert found[True][0][:2] == ["matmul", "exp"] != found[False][0][:2]


def test_unguided_block_search_reports_shallowest_bodies_first():
    """Inputs that recompute nothing of the reference: iterative deepening; each body reported once."""
    from mirage.generator import abstract_expr as ae
    from mirage.generator.blocks import search_bodies

    space = SearchSpace(block_ops=["matmul", "exp", "add", "mul", "accum", "accum_sum"], max_block_ops=6)
    context = _context(tiny_reference(), space, disabled=("block_lookahead",))
    tiles = (TensorType((8, 16), float16), TensorType((16, 8), float16))
    terms = (ae.variable(0), ae.variable(1))
    bodies, count, truncated = search_bodies(Explorer(context), tiles, 4, terms, None, values=(None, None))
    naive_states, naive_bodies = _naive_states(context, tiles, 4, terms)
    sizes = [len(b.nodes) for b in bodies]
    assert not truncated and sizes == sorted(sizes) and sizes[0] < sizes[-1]
    assert {b.nodes for b in bodies} == naive_bodies and len(bodies) == len(naive_bodies)
    assert len(naive_states) < count < 2 * len(naive_states)  # the shallower passes are repeated


def test_memoized_block_search_counts_states_as_if_repeated():
    reference = tiny_reference()
    context = _context(reference, SearchSpace.named("mlp", **TINY))
    root = root_state(reference)
    explorer = Explorer(context)
    headers = [u for u in split(explorer, root) if u.kind == "header"]
    cold = Explorer(context)
    context.memo.clear()
    cold.run_header(headers[0].state, headers[0].header, 1)
    warm = Explorer(context)
    warm.run_header(headers[0].state, headers[0].header, 1)
    assert warm.position == cold.position > 1
    assert [f.position for f in warm.found] == [f.position for f in cold.found]
    assert warm.stats.block_states == cold.stats.block_states and warm.stats.block_states_searched == 0
    assert structure(reference) == (("matmul", "exp"), ())


@pytest.mark.parametrize("order", ["mirage", "complete"])
def test_canonical_order_reaches_a_chain_whose_commutative_op_takes_a_later_operand_first(order):
    """x + a * (exp(h) - x): in Mirage's order the mul must read (sub, a), not (a, sub), so the
    search must try both operand orders of a commutative op; the complete order needs only one."""
    g = mi.new_kernel_graph("chain")
    h, x, a = (g.new_input(dims=(1, 64), dtype=mi.float16) for _ in range(3))
    g.mark_output(g.add(x, g.mul(a, g.sub(g.exp(h), x))))
    result = search(
        g.freeze(),
        griddims=[(1, 1, 1)],
        fmaps=[-1],
        max_kernel_ops=4,
        max_block_ops=8,
        block_ops=["exp", "sub", "mul", "add", "accum"],
        order=order,
        workers=1,
        **QUIET,
    )
    assert result.stop_reason is StopReason.COMPLETE
    assert (("customized",), (("accum:none", "add", "exp", "mul", "sub"),)) in {
        f.structure for f in result.found
    }


def test_concat_matmul_operands_are_exactly_the_permutations_that_fit():
    from mirage.generator.blocks import _concat_matmul_tuples

    context = ShapeContext(Level.BLOCK, 1, 64)
    shapes = [(16, 64), (64, 8), (16, 32), (32, 8), (64, 64), (16, 64), (8, 16)]
    types = tuple(TensorType(s, float16) for s in shapes)
    fitting = []
    for inputs in input_tuples(len(types), 4):
        try:
            REGISTRY[Op.CONCAT_MATMUL].shape(context, tuple(types[i] for i in inputs), None)
        except GraphError:
            continue
        fitting.append(inputs)
    listed = _concat_matmul_tuples(types, newest_only=False)
    assert set(fitting) <= set(listed) and len(fitting) >= 4
    newest = _concat_matmul_tuples(types, newest_only=True)
    assert all(len(types) - 1 in t for t in newest) and set(newest) <= set(listed)


def test_block_lookahead_cuts_states_but_no_closable_body():
    from mirage.generator import abstract_expr as ae
    from mirage.generator.blocks import search_bodies

    space = SearchSpace(block_ops=["matmul", "exp", "add", "mul", "accum", "accum_sum"], max_block_ops=6)
    tiles = (TensorType((8, 16), float16), TensorType((16, 8), float16))
    terms = (ae.variable(0), ae.variable(1))
    results = {}
    for disabled in [(), ("block_lookahead",)]:
        context = _context(tiny_reference(), space, disabled=disabled)
        bodies, count, _ = search_bodies(Explorer(context), tiles, 4, terms, None)
        results[disabled] = ({b.nodes for b in bodies}, count)
    (with_bodies, with_count), (without_bodies, without_count) = results.values()
    assert with_bodies == without_bodies and len(with_bodies) > 3
    assert with_count < without_count


@pytest.mark.parametrize(
    "op",
    [
        Op.ADD,
        Op.SUB,
        Op.MUL,
        Op.DIV,
        Op.EXP,
        Op.SQRT,
        Op.SQUARE,
        Op.SILU,
        Op.GELU,
        Op.GELU_ERF,
        Op.RELU,
        Op.SIGMOID,
        Op.TANH,
        Op.MUL_SCALAR,
        Op.ADD_SCALAR,
        Op.MATMUL,
    ],
)
def test_direct_terms_equal_the_registry_formulas(op):
    from mirage.generator import abstract_expr as ae
    from mirage.generator.expressions import ALGEBRA, ShapedTerm
    from mirage.mugraph.graph import Scalar

    arity = REGISTRY[op].arity
    second = (16, 16) if op is Op.MATMUL else (1, 16)
    types = (TensorType((8, 16), float16), TensorType(second, float16))[:arity]
    terms = (ae.sum_of(4, ae.variable(0)), ae.exp(ae.variable(1)))[:arity]
    attrs = Scalar(0.5) if op in (Op.MUL_SCALAR, Op.ADD_SCALAR) else None
    values = [ShapedTerm(t.shape, term) for t, term in zip(types, terms, strict=True)]
    expected = REGISTRY[op].formula(ALGEBRA, attrs, types, *values).term
    assert op_term(op, attrs, types, terms) is expected


def test_only_the_complete_order_fuses_a_division_by_a_later_tensor():
    """div(x, exp(y)) with x before y: Mirage's order cannot put the exp before the division in one
    block graph ((0, 2) sorts before (1,)); the complete order can."""
    g = mi.new_kernel_graph("late_divisor")
    x, y = (g.new_input(dims=(8, 64), dtype=mi.float16) for _ in range(2))
    g.mark_output(g.div(x, g.exp(y)))
    fused = (("customized",), (("accum:none", "div", "exp"),))
    found = {}
    for order in ("mirage", "complete"):
        result = search(g.freeze(), griddims=[(8, 1, 1)], fmaps=[-1], order=order, workers=1, **QUIET)
        found[order] = {f.structure for f in result.found}
        assert result.stop_reason is StopReason.COMPLETE and found[order]
    assert fused not in found["mirage"] and fused in found["complete"]


class _IsFused:
    """A picklable stop condition (worker processes receive it with the search context)."""

    def __call__(self, graph) -> bool:
        return is_fused(graph)


@pytest.mark.parametrize("workers", [1, 2])
def test_stop_when_a_wanted_graph_is_found(workers):
    result = search(tiny_reference(), workers=workers, stop_when=_IsFused(), **TINY, **QUIET)
    assert result.stop_reason is StopReason.TARGET
    assert any(is_fused(g) for g in result.graphs)


class _NotFused:
    """A picklable filter of complete candidates: only the unfused ones are verified."""

    def __call__(self, graph) -> bool:
        return not is_fused(graph)


@pytest.mark.parametrize("workers", [1, 2])
def test_keep_when_filters_candidates_before_verification(workers):
    every = search(tiny_reference(), workers=1, **TINY, **QUIET)
    kept = search(tiny_reference(), workers=workers, keep_when=_NotFused(), **TINY, **QUIET)
    assert any(is_fused(g) for g in every.graphs) and kept.graphs
    assert not any(is_fused(g) for g in kept.graphs)
    assert kept.stats.pruned["keep_when"] > 0 and kept.stats.verify_calls < every.stats.verify_calls


def _most_simt_rounds(graph, threads=128):
    """The most outputs a thread of any block-level product of ``graph`` on the CUDA cores."""
    return max((simt_rounds(*a.shape[-2:], b.shape[-1], threads)
                for n in graph.nodes if n.op is Op.CUSTOMIZED for m in n.attrs.nodes if m.op is Op.MATMUL
                for a, b in [n.attrs.operand_types(m)]), default=0)


def _odd_k_reference():
    g = mi.new_kernel_graph("odd_k")
    x = g.new_input(dims=(256, 12), dtype=mi.float16)
    w = g.new_input(dims=(12, 64), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(x, w)))
    return g.freeze()


def test_products_of_odd_k_too_large_for_the_cuda_cores_run_padded_on_tensor_cores():
    """K of 12 is no whole tensor-core step; at 128 threads the one-block product (128 outputs a
    thread on the CUDA cores, more than the lowering allows there) runs on tensor cores with K padded,
    so the search keeps and verifies it (it cut such products before padding)."""
    space = {**TINY, "griddims": [(1, 1, 1), (8, 1, 1)], "franges": [1]}
    found = search(_odd_k_reference(), workers=1, **space, **QUIET)
    assert "simt_size" not in found.stats.pruned
    one_block = [g for g in found.graphs if any(n.op is Op.CUSTOMIZED and n.attrs.grid_dim == (1, 1, 1)
                                               for n in g.nodes)]
    assert one_block and all(_most_simt_rounds(g) == 0 for g in one_block)


def test_the_tensor_core_rule_examples():
    result = doctest.testmod(tensor_cores)
    assert result.attempted > 0 and result.failed == 0
