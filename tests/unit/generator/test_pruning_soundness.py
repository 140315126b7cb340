"""Theorem 1 as a test: no prefix of a µGraph equivalent to the reference is pruned.

For every hand-built benchmark µGraph, the verifier's equivalent variants, and a few restructured
kernel-level variants, every tensor at every level (the abstract expression of every prefix in the
graph's node order) must pass the subexpression check against the reference's target.
"""

from __future__ import annotations

import pytest

import mirage as mi
from benchmarks.mugraphs import CASES, attention, mlp
from mirage.generator.egraph_subexpression import Backend, SubexpressionCheck, SubexpressionConfig
from mirage.generator.pruning import prefix_terms, target_terms
from mirage.generator.pruning.rules import identity_reductions
from mirage.generator.scalars import chained_scalars, scalar_chains
from mirage.mugraph.ops import Op
from tests.unit.verifier.verifier_graphs import small_attention, tiled_matmul


def _rmsnorm_kernel_level(b: int) -> mi.KernelGraph:
    """RMSNorm + linear with the gain applied first and the normalization after the matmul."""
    g = mi.new_kernel_graph("rmsnorm")
    x, gain, w = (g.new_input(dims=s, dtype=mi.float16) for s in mlp.rmsnorm_shapes(b))
    mean = g.mul_scalar(g.reduction(g.square(x), 1), 1.0 / 4096)
    rms = g.sqrt(g.add_scalar(mean, mlp.EPS))
    g.mark_output(g.div(g.matmul(g.mul(x, gain), w), rms))
    return g.freeze()


def _attention_kernel_level(b: int) -> mi.KernelGraph:
    """Attention with the softmax division after the second matmul."""
    g = mi.new_kernel_graph("gqa")
    q, k, v = (g.new_input(dims=s, dtype=mi.float16) for s in attention.shapes(b))
    e = g.exp(g.matmul(g.mul_scalar(q, attention.SCALE), k))
    g.mark_output(g.div(g.matmul(e, v), g.reduction(e, 2)))
    return g.freeze()


def _tiled_matmul_reference(epilogue: str) -> mi.KernelGraph:
    g = mi.new_kernel_graph("tiled")
    x = g.new_input(dims=(4, 8), dtype=mi.float16)
    w = g.new_input(dims=(8, 6), dtype=mi.float16)
    match epilogue:
        case "rms":
            y = g.matmul(g.rms_norm(x, eps=1e-6), w)
        case "silu":
            y = g.silu(g.matmul(x, w))
        case _:
            y = g.matmul(x, w)
    g.mark_output(y)
    return g.freeze()


# (name, reference, equivalent µGraph)
EQUIVALENT = [(name, case.reference, case.fused) for name, case in CASES.items()]
EQUIVALENT += [
    ("rmsnorm_b1_grid32_iters16", lambda: mlp.rmsnorm_reference(1), lambda: mlp.rmsnorm_fused(1, 32, 16)),
    ("rmsnorm_b8_grid128_iters4", lambda: mlp.rmsnorm_reference(8), lambda: mlp.rmsnorm_fused(8, 128, 4)),
    ("gatedmlp_m8_grid64_iters16", lambda: mlp.gatedmlp_reference(8), lambda: mlp.gatedmlp_fused(8, 64, 16)),
    ("lora_m16_concat", lambda: mlp.lora_reference(16), lambda: mlp.lora_fused(16, concat=True)),
    ("rmsnorm_b1_kernel_level", lambda: mlp.rmsnorm_reference(1), lambda: _rmsnorm_kernel_level(1)),
    ("gqa_b1_kernel_level", lambda: attention.reference(1), lambda: _attention_kernel_level(1)),
    ("small_attention", lambda: small_attention(fused=False), lambda: small_attention(fused=True)),
    (
        "small_attention_4_splits",
        lambda: small_attention(keys=16, fused=False),
        lambda: small_attention(keys=16, fused=True, kv_splits=4, iters=2),
    ),
]
for grid, iters in [(1, 1), (2, 2), (3, 4), (6, 8)]:
    for epilogue in ("none", "rms", "silu"):
        EQUIVALENT.append(
            (
                f"tiled_matmul_grid{grid}_iters{iters}_{epilogue}",
                lambda epilogue=epilogue: _tiled_matmul_reference(epilogue),
                lambda grid=grid, iters=iters, epilogue=epilogue: tiled_matmul(grid, iters, None, epilogue),
            )
        )

_CHECKS: dict[tuple, SubexpressionCheck] = {}


def _check(reference: mi.KernelGraph, backend: Backend) -> SubexpressionCheck:
    targets = tuple(target_terms(reference))
    key = (targets, backend)
    if key not in _CHECKS:
        _CHECKS[key] = SubexpressionCheck(targets, SubexpressionConfig(backend=backend))
    return _CHECKS[key]


@pytest.mark.parametrize(("name", "reference", "equivalent"), EQUIVALENT, ids=[row[0] for row in EQUIVALENT])
def test_no_prefix_of_an_equivalent_mugraph_is_pruned(name, reference, equivalent):
    check = _check(reference(), Backend.EGGLOG)
    prefixes = prefix_terms(equivalent())
    assert len(prefixes) >= 3
    pruned = [(where, str(term)) for where, term in prefixes if not check(term)]
    assert pruned == [], f"{name}: {len(pruned)} of {len(prefixes)} prefixes falsely pruned; {check.report}"


@pytest.mark.parametrize(("name", "reference", "equivalent"), EQUIVALENT, ids=[row[0] for row in EQUIVALENT])
def test_no_equivalent_mugraph_has_a_reduction_that_identity_reduction_cuts(name, reference, equivalent):
    assert identity_reductions(equivalent()) == []


@pytest.mark.parametrize(("name", "reference", "equivalent"), EQUIVALENT, ids=[row[0] for row in EQUIVALENT])
def test_no_equivalent_mugraph_has_a_scalar_chain_that_the_search_cuts(name, reference, equivalent):
    assert scalar_chains(equivalent(), chained_scalars(reference())) == []


def test_scalar_chains_are_found_at_both_levels_through_accumulators_and_savers():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float16)
    tb = mi.new_threadblock_graph((4, 1, 1), forloop_range=1)
    scaled = tb.mul_scalar(tb.new_input(x, (0, -1, -1)), 0.5)
    tb.new_output(tb.mul_scalar(tb.forloop_accum(scaled), 0.5), (0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.add_scalar(scaled, 1.0)), (0, -1, -1))
    twice, shifted = g.customized([x], tb)
    g.mark_output(g.mul_scalar(twice, 2.0))
    g.mark_output(g.add_scalar(shifted, 1.0))
    graph = g.freeze()
    assert scalar_chains(graph) == ["%1/%3", "%2", "%3"]  # not the block's add of a product
    assert scalar_chains(graph, frozenset({Op.MUL_SCALAR})) == ["%3"]


def test_identity_reductions_are_found_at_both_levels():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float16)
    tb = mi.new_threadblock_graph((4, 1, 1), forloop_range=1)
    rows = tb.reduction(tb.new_input(x, (0, -1, -1)), 1)  # [1, 1]
    tb.new_output(tb.forloop_accum(tb.reduction(rows, 0)), (0, -1, -1))
    (out,) = g.customized([x], tb)
    g.mark_output(g.reduction(out, 1))
    assert identity_reductions(g.freeze()) == ["%2", "%1/%2"]


SMALL = ["gqa_b1", "lora_m16", "gatedmlp_m1", "small_attention", "tiled_matmul_grid2_iters2_rms"]


@pytest.mark.parametrize(
    ("name", "reference", "equivalent"),
    [row for row in EQUIVALENT if row[0] in SMALL],
    ids=SMALL,
)
def test_the_python_back_end_is_sound_too(name, reference, equivalent):
    check = _check(reference(), Backend.PYTHON)
    assert all(check(term) for _, term in prefix_terms(equivalent()))


def test_the_check_does_prune_prefixes_of_a_different_program():
    check = _check(mlp.rmsnorm_reference(1), Backend.EGGLOG)
    other = prefix_terms(mlp.gatedmlp_fused(1))
    pruned = {str(term) for _, term in other if not check(term)}
    assert str(other[-1][1]) in pruned  # the gated MLP's output
    assert {str(term) for _, term in other if "silu" in str(term)} <= pruned
    assert len(pruned) == 2
