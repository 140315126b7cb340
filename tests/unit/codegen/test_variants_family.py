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
