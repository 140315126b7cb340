"""Mutation operators: every kind yields valid wrong mutants that verify rejects; equivalent edits
are accepted; a small fuzzing sample of the benchmark graphs (the full run is ``mirage.verifier.fuzz``)."""

from __future__ import annotations

import dataclasses

import pytest
from verifier_graphs import tiled_matmul

import mirage as mi
from mirage.verifier import NotVerifiableError, float_check, verify
from mirage.verifier.fuzz import fuzz_case
from mirage.verifier.mutate import MutationKind, rebuild, valid_mutants


def kernel(build, shapes=((4, 4), (4, 4))):
    g = mi.new_kernel_graph()
    xs = [g.new_input(dims=s, dtype=mi.float32) for s in shapes]
    g.mark_output(build(g, *xs))
    return g.freeze()


def blocks_2d() -> mi.KernelGraph:
    """X + Y on a 2×2 grid of square tiles, then a square matmul with W."""
    g = mi.new_kernel_graph()
    x, y, w = (g.new_input(dims=(4, 4), dtype=mi.float32) for _ in range(3))
    tb = mi.new_threadblock_graph(grid_dim=(2, 2, 1), forloop_range=1)
    bx = tb.new_input(x, input_map=(0, 1, -1))
    by = tb.new_input(y, input_map=(0, 1, -1))
    tb.new_output(tb.forloop_accum(tb.add(bx, by)), output_map=(0, 1, -1))
    (s,) = g.customized([x, y], tb)
    g.mark_output(g.matmul(s, w))
    return g.freeze()


def row_sums(replicated: bool, forloop_dim: int = -1, acc: str = "sum") -> mi.KernelGraph:
    """Each of 2 blocks sums its half (or, replicated, all) of every row of X (4, 8)."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=2)
    bx = tb.new_input(x, input_map=(-1 if replicated else 1, -1, -1), forloop_dim=forloop_dim)
    tb.new_output(tb.forloop_accum(tb.exp(bx), acc=acc), output_map=(1, -1, -1))
    (s,) = g.customized([x], tb)
    g.mark_output(s)
    return g.freeze()


softmax_like = kernel(lambda g, x, w: g.div(g.exp(x), g.reduction(g.exp(x), 1)))
chain = kernel(lambda g, x, w: g.mul_scalar(g.square(g.exp(g.matmul(x, w))), 0.5))

# (kind, a graph on which the kind has valid mutants)
KINDS = [
    (MutationKind.INPUT_MAP, blocks_2d()),
    (MutationKind.OUTPUT_MAP, blocks_2d()),
    (MutationKind.TRANSPOSED_INPUT, blocks_2d()),
    (MutationKind.REPLICATE, row_sums(replicated=False)),
    (MutationKind.PARTITION, row_sums(replicated=True)),
    (MutationKind.FORLOOP_DIM, row_sums(replicated=False, forloop_dim=1)),
    (MutationKind.SWAP_MATMUL, chain),
    (MutationKind.SWAP_OPERANDS, kernel(lambda g, x, w: g.div(g.matmul(x, w), w))),
    (MutationKind.ACCUM_KIND, tiled_matmul(grid=1, iters=2, cols=1)),
    (MutationKind.DROP_OP, chain),
    (MutationKind.DUPLICATE_OP, chain),
    (MutationKind.UNARY_OP, chain),
    (MutationKind.BINARY_OP, kernel(lambda g, x, w: g.add(g.matmul(x, w), x))),
    (MutationKind.REDUCTION_DIM, softmax_like),
    (MutationKind.SCALAR, chain),
    (MutationKind.WRONG_INPUT, kernel(lambda g, x, w: g.sub(g.matmul(x, w), x))),
]


@pytest.mark.parametrize("kind, graph", KINDS, ids=[row[0].value for row in KINDS])
def test_each_kind_yields_valid_mutants_that_verify_rejects(kind, graph):
    mutants = [(m, g) for m, g in valid_mutants(graph) if m.kind is kind]
    assert mutants, f"no valid {kind.value} mutant"
    confirmed = 0
    for mutation, mutant in mutants:
        assert mutant != graph
        assert [t.shape for t in mutant.output_types] == [t.shape for t in graph.output_types]
        if float_check(graph, mutant, seed=0).equivalent:
            continue
        try:
            result = verify(graph, mutant, seed=0)
        except NotVerifiableError:  # e.g. a duplicated exp: outside the fragment
            continue
        confirmed += 1
        assert not result.equivalent, f"{mutation} accepted"
    assert confirmed >= 1


def test_at_least_ten_kinds_of_wrong_change():
    kinds = {kind for kind in MutationKind if kind not in (MutationKind.COMMUTE, MutationKind.SPLIT)}
    assert len(kinds) >= 10 and kinds == {row[0] for row in KINDS}


def test_equivalent_edits_are_accepted():
    graph = tiled_matmul(grid=2, iters=2, cols=8)  # a linear loop body: every split is equivalent
    variants = valid_mutants(graph, equivalent=True)
    assert len(variants) >= 3
    assert {m.kind for m, _ in variants} == {MutationKind.SPLIT}
    for mutation, variant in variants:
        assert float_check(graph, variant, seed=1).equivalent, mutation
        assert verify(graph, variant, seed=1).equivalent, mutation
    commuted = [g for m, g in valid_mutants(softmax_like, equivalent=True) if m.kind is MutationKind.COMMUTE]
    assert not commuted  # softmax_like has no add or mul
    added = kernel(lambda g, x, w: g.add(g.mul(x, w), x))
    commuted = [g for m, g in valid_mutants(added, equivalent=True) if m.kind is MutationKind.COMMUTE]
    assert len(commuted) == 2 and all(verify(added, g, seed=2).equivalent for g in commuted)


def test_rebuild_keeps_valid_graphs_and_refuses_broken_ones():
    graph = blocks_2d()
    assert rebuild(graph) == graph
    matmul = next(i for i, n in enumerate(graph.nodes) if n.inputs and n.op.value == "matmul")
    broken = dataclasses.replace(graph, nodes=graph.nodes[:matmul] + (
        dataclasses.replace(graph.nodes[matmul], inputs=(graph.nodes[matmul].inputs[0],) * 3),))
    with pytest.raises(mi.MirageError):
        rebuild(broken)


@pytest.mark.parametrize("case, mutants", [("ntrans_b1", 60), ("lora_m16", 20)])
def test_fuzzing_sample_of_benchmark_graphs(case, mutants):
    report = fuzz_case(case, mutants=mutants, equivalents=4, seed=3, time_limit=60)
    assert report.mutants_confirmed == mutants
    assert report.mutants_accepted == [] and report.mutants_rejected == mutants
    assert report.equivalents_checked >= 2
    assert report.equivalents_accepted == report.equivalents_checked
