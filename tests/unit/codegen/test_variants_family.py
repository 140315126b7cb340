"""The benchmark families of profile-guided selection (benchmarks/variants.py): every member builds a
valid µGraph with the splits its row names, and the row-sum attention µGraph (a member that is not one
of the mugraphs builders) computes the reference function."""

from __future__ import annotations

import numpy as np
import pytest

import mirage as mi
from benchmarks.mugraphs import CASES, attention
from benchmarks.variants import FAMILIES, attention_fused, family, variants
from mirage.optimizer import prepare


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_has_a_family_of_valid_members(name):
    members = family(name)
    rows, _ = FAMILIES[CASES[name].program]
    assert members and len(members) == len(rows)
    assert variants(name) == [graph for _, graph in members]
    for row, graph in members:
        # some kernel has the row's block size and for-loop range (QKNorm's family normalizes K in a
        # smaller kernel first, rmsnorm's two-kernel members normalize X first)
        arguments = row.kwargs()
        assert any(block.block_dim[0] == arguments.get("threads", block.block_dim[0])
                   and block.forloop_range == arguments.get("iters", block.forloop_range)
                   for block in graph.block_graphs()), row.label


@pytest.mark.parametrize("qknorm", [False, True])
def test_row_sum_attention_matches_the_reference(qknorm):
    graph = attention_fused(1, qknorm, True, combine_rows=16, kv_splits=8, q_splits=4, iters=4, threads=256)
    prepared = prepare(graph)
    assert [k.grid_dim for k in prepared.kernels] == [(2, 8, 4), (2, 16, 1)]
    generator = np.random.default_rng(0)
    reference = attention.reference(1, qknorm)
    inputs = [generator.standard_normal(t.shape) * 3 for t in reference.input_types]
    expected = np.asarray(mi.interpret(reference, inputs)[0], dtype=np.float64)
    for candidate in (graph, prepared.graph):  # as built, and after the online-softmax rewrite
        got = np.asarray(mi.interpret(candidate, inputs)[0], dtype=np.float64)
        assert np.abs(got - expected).max() <= 1e-9 * np.abs(expected).max()


def test_lora_members_with_a_k_loop_are_proved_equivalent():
    """Iteration k adds X_k·W_k + (X_k·LA_k)·LB: equal to X·W + (X·LA)·LB (the product distributes over
    the K split), which the finite-field verifier proves; a loop whose low-rank term reads X_k squared is
    refuted."""
    from benchmarks.mugraphs import mlp

    reference = mlp.lora_reference(16)
    looped = [g for row, g in family("lora_m16") if "iters" in row.label]
    assert len(looped) == 8
    for graph in looped:
        assert mi.verify(reference, graph).equivalent
    g = mi.new_kernel_graph("lora")
    x, w, la, lb = (g.new_input(dims=s, dtype=mi.float16) for s in mlp.lora_shapes(16))
    tb = mi.new_threadblock_graph(grid_dim=(64, 1, 1), block_dim=(128, 1, 1), forloop_range=2)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    ba = tb.new_input(la, input_map=(-1, -1, -1), forloop_dim=0)
    bb = tb.new_input(lb, input_map=(1, -1, -1), forloop_dim=-1)
    wrong = tb.add(tb.matmul(bx, bw), tb.matmul(tb.matmul(tb.mul(bx, bx), ba), bb))
    tb.new_output(tb.forloop_accum(wrong), output_map=(1, -1, -1))
    (out,) = g.customized([x, w, la, lb], tb)
    g.mark_output(out)
    assert not mi.verify(reference, g.freeze()).equivalent
