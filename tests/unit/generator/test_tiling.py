"""Dim classes of a reference, which block headers fit them, and the visiting order that puts those first."""

from __future__ import annotations

import doctest
import time
from collections import Counter

import numpy as np
import pytest

import mirage as mi
from benchmarks.mugraphs import CASES
from mirage.generator import Budget, StopReason, search
from mirage.generator import tiling as tiling_module
from mirage.generator.checks import make_rules
from mirage.generator.cost import is_fused
from mirage.generator.explore import Explorer, SearchContext, root_state
from mirage.generator.expressions import output_terms
from mirage.generator.space import SearchSpace
from mirage.generator.tiling import DimClasses
from mirage.generator.units import split
from mirage.generator.verification import make_checker
from mirage.mugraph.ops import Op

QUIET = {"progress": False, "cache": False, "checkpoint": False}
NO_LOOP = (-1, -1, -1)


def residual_rms(b: int = 4, d: int = 256):
    """rms(x + r) * g with a gain row: one block per row computes it in one iteration."""
    g = mi.new_kernel_graph("residual_rms")
    x = g.new_input(dims=(b, d), dtype=mi.float16)
    r = g.new_input(dims=(b, d), dtype=mi.float16)
    gain = g.new_input(dims=(1, d), dtype=mi.float16)
    g.mark_output(g.mul(g.rms_norm(g.add(x, r), eps=1e-6), gain))
    return g.freeze()


def rms_matmul():
    g = mi.new_kernel_graph("rms_matmul")
    x = g.new_input(dims=(8, 1024), dtype=mi.float16)
    w = g.new_input(dims=(1024, 512), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(x, eps=1e-6), w))
    return g.freeze()


def softmax():
    g = mi.new_kernel_graph("softmax")
    x = g.new_input(dims=(8, 1024), dtype=mi.float16)
    e = g.exp(x)
    g.mark_output(g.div(e, g.reduction(e, 1)))
    return g.freeze()


def _context(reference, **overrides):
    space = SearchSpace.named("mlp", **overrides).resolve(reference)
    rules = make_rules(output_terms(reference), space)
    return SearchContext(reference, space, rules, make_checker(reference), time.time())


def _header_key(header):
    return (header.inputs, header.grid_dim, header.input_maps, header.forloop_dims, header.forloop_range)


def test_docstring_examples():
    assert doctest.testmod(tiling_module).failed == 0


def test_classes_of_a_row_norm_and_of_a_product():
    norm = DimClasses.of(residual_rms())
    rows, columns = norm.class_of(0, 0), norm.class_of(0, 1)
    assert rows in norm.parallel and columns in norm.output and columns not in norm.parallel
    assert norm.class_of(1, 0) == rows and norm.class_of(2, 1) == columns  # r's rows, the gain's columns
    assert norm.class_of(2, 0) is None  # a broadcast dim of size 1 is in no class

    product = DimClasses.of(rms_matmul())
    inner = product.class_of(0, 1)  # x's columns: the norm's rows, then the product's inner dim
    assert product.class_of(1, 0) == inner and inner not in product.output
    assert product.class_of(1, 1) in product.parallel and product.class_of(0, 0) in product.parallel


@pytest.mark.parametrize(
    "grid, maps, loop, iterations, misfits",
    [
        ((128, 1, 1), ((-1, -1, -1), (1, -1, -1)), (1, 0), 16, 0),  # columns split, the inner dim iterated
        ((8, 1, 1), ((0, -1, -1), (-1, -1, -1)), (-1, -1), 1, 0),  # one block per row
        ((16, 1, 1), ((1, -1, -1), (0, -1, -1)), (-1, -1), 1, 1),  # the inner dim split (partial sums)
        ((8, 1, 1), ((0, -1, -1), (-1, -1, -1)), (-1, 1), 4, 1),  # loops over the output's columns
        ((128, 1, 1), ((-1, -1, -1), (1, -1, -1)), (1, -1), 4, 1),  # W keeps the whole inner dim
    ],
)
def test_misfits_of_product_headers(grid, maps, loop, iterations, misfits):
    classes = DimClasses.of(rms_matmul())
    assert classes.misfits((0, 1), maps, loop, grid, iterations) == misfits


def test_row_reductions_are_neither_split_nor_iterated():
    classes = DimClasses.of(softmax())
    assert classes.misfits((0,), ((0, -1, -1),), (-1,), (8, 1, 1), 1) == 0
    assert classes.misfits((0,), ((1, -1, -1),), (-1,), (64, 1, 1), 1) == 1
    assert classes.misfits((0,), ((0, -1, -1),), (1,), (8, 1, 1), 4) == 1
    assert classes.misfits((None,), ((1, -1, -1),), (1,), (64, 1, 1), 4) == 0  # unknown: no verdict


def test_dims_read_by_an_op_not_followed_never_misfit():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 256), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(8, 1, 1), forloop_range=1)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.exp(bx)), output_map=(0, -1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(g.exp(y))
    classes = DimClasses.of(g.freeze())
    assert classes.misfits((0,), ((1, -1, -1),), (-1,), (64, 1, 1), 1) == 0


def test_bad_input_is_reported():
    with pytest.raises(TypeError, match="kernel graph"):
        DimClasses.of("rms(x)")
    classes = DimClasses.of(softmax())
    with pytest.raises(ValueError, match="one input map and one for-loop dim per input"):
        classes.misfits((0,), ((0, -1, -1), NO_LOOP), (-1,), (8, 1, 1), 1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_built_kernels_fit_unless_they_split_a_reduction(name):
    """The one-kernel benchmark µGraphs fit; FlashDecoding's first kernel splits the KV reduction."""
    case = CASES[name]
    reference, fused = case.reference(), case.fused()
    classes = DimClasses.of(reference)
    position = {node: k for k, node in enumerate(fused.input_nodes)}
    verdicts = []
    for node in fused.nodes:
        if node.op is not Op.CUSTOMIZED:
            continue
        block = node.attrs
        iterators = [n.attrs for n in block.nodes if n.op is Op.INPUT]
        values = [
            reference.input_nodes[position[r.node]] if r.node in position else None for r in node.inputs
        ]
        verdicts.append(
            classes.misfits(
                values,
                [i.input_map for i in iterators],
                [i.forloop_dim for i in iterators],
                block.grid_dim,
                block.forloop_range,
            )
        )
    assert verdicts == ([1, 0] if case.program in ("gqa", "qknorm") else [0])


def test_headers_that_fit_come_first_and_none_is_lost():
    reference = residual_rms(8, 2048)
    guided = split(Explorer(_context(reference)), root_state(reference))
    canonical = split(Explorer(_context(reference, guided_order=False)), root_state(reference))
    assert Counter(_header_key(u.header) for u in guided if u.header) == Counter(
        _header_key(u.header) for u in canonical if u.header
    )
    assert [u.kind for u in guided] == [u.kind for u in canonical]  # the pre-defined ops stay last
    first = guided[0].header
    assert first.grid_dim == (8, 1, 1) and first.forloop_range == 1
    assert first.input_maps == ((0, -1, -1), (0, -1, -1), NO_LOOP)
    # today's canonical order reaches that header after more than a thousand others
    position = [_header_key(u.header) for u in canonical if u.header].index(_header_key(first))
    assert position > 1000


def test_the_residual_norm_kernel_is_found_within_a_small_state_budget():
    """Canonical order spends these 20,000 states in the first two of 926 work units."""
    reference = residual_rms()
    result = search(reference, budget=Budget(states=20_000), workers=1, stop_when=is_fused, **QUIET)
    assert result.stop_reason is StopReason.TARGET
    (graph,) = [g for g in result.graphs if is_fused(g)]
    (kernel,) = [n for n in graph.nodes if n.op is Op.CUSTOMIZED]
    assert kernel.attrs.grid_dim == (4, 1, 1) and kernel.attrs.forloop_range == 1
    assert mi.verify(reference, graph).equivalent
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(t.shape) for t in reference.input_types]
    np.testing.assert_allclose(mi.interpret(graph, inputs)[0], mi.interpret(reference, inputs)[0], rtol=1e-9)


def test_the_order_changes_what_comes_first_not_what_is_found():
    """A whole space with headers that fit and headers that do not: the same µGraphs either way."""
    space = {
        "griddims": [(4, 1, 1), (8, 1, 1)],
        "franges": [4],
        "block_ops": ["add", "mul", "rms_norm=1e-6", "accum"],
        "kernel_ops": ["mul"],
        "max_block_ops": 6,
        "imaps": [(0, -1, -1), (1, -1, -1), NO_LOOP],
        "fmaps": [-1, 1],
    }
    guided = search(residual_rms(4, 64), workers=1, **space, **QUIET)
    canonical = search(residual_rms(4, 64), workers=1, guided_order=False, **space, **QUIET)
    in_turn = search(residual_rms(4, 64), workers=1, complete_first=False, **space, **QUIET)
    assert guided.stop_reason is canonical.stop_reason is in_turn.stop_reason is StopReason.COMPLETE
    assert set(guided.hashes) == set(canonical.hashes) == set(in_turn.hashes) and len(guided.hashes) > 1
    assert guided.stats.states == canonical.stats.states == in_turn.stats.states
