"""Selection builds the search's µGraphs of few blocks with more threads a block too
(:func:`mirage.codegen.select.widened`): the same function, only the block dims change, and only in
kernels that leave SMs idle and carry no attention chain."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.variants import variants
from mirage.codegen import select
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.select import WIDE_THREADS, block_dims, widened, with_block_dims
from tests.unit.optimizer.optimizer_graphs import assert_same_function, logsumexp_block, matmul_epilogue


def test_a_kernel_of_few_blocks_gets_one_copy_per_thread_count_computing_the_same():
    graph = logsumexp_block(1, True, rows=32, cols=1024)  # 8 blocks
    copies = widened(graph, sms=132)
    assert [block_dims(c) for c in copies] == [((t, 1, 1),) for t in WIDE_THREADS]
    for copy in copies:
        assert_same_function(graph, copy)
        code = generate_cuda_program(copy, 90).code
        assert f"__launch_bounds__({copy.block_graphs()[0].block_dim[0]})" in code


def test_grids_that_fill_the_sms_and_attention_chains_keep_their_threads():
    assert widened(logsumexp_block(1, True, rows=4 * 132, cols=256), sms=132) == []
    assert len(widened(logsumexp_block(1, True, rows=4 * 132, cols=256), sms=200)) == len(WIDE_THREADS)
    for graph in variants("gqa_b1")[:3]:
        attention = [k for k, b in enumerate(graph.block_graphs())
                     if {"EXP", "MATMUL"} <= {n.op.name for n in b.nodes}]
        assert attention
        for copy in widened(graph, sms=132):
            assert all(block_dims(copy)[k] == block_dims(graph)[k] for k in attention)


def test_a_product_with_its_epilogue_is_widened_and_unchanged():
    graph = matmul_epilogue("relu", m=16, k=256, n=512)  # 8 blocks of 64 columns
    copy = widened(graph, sms=132, threads=(512,))[0]
    assert block_dims(copy) == ((512, 1, 1),)
    assert_same_function(graph, copy, rtol=1e-9)
    assert with_block_dims(copy, block_dims(graph)) == graph


def test_the_frontend_keeps_the_widened_build_of_the_candidate_it_came_from(monkeypatch):
    """A widened winner maps back to the searched candidate, with the winner's block dims; the note
    names its threads and the fastest build at the search's own threads."""
    pytest.importorskip("torch")
    from mirage.frontend import optimize

    graph = logsumexp_block(1, True, rows=32, cols=1024)

    def fake_select(reference, candidates, stages, wide_threads=()):
        assert wide_threads == WIDE_THREADS
        wide = widened(candidates[0], 132, wide_threads)[-1]
        trials = [select.Trial(select.Variant(candidates[0]), median_us=9.0),
                  select.Trial(select.Variant(wide), median_us=3.0)]
        return select.Selection(trials[1], trials, SimpleNamespace(cuda=None))

    monkeypatch.setattr(select, "select_fastest", fake_select)
    picked, note, _, us, _ = optimize.profile_choice(graph, [graph])
    assert block_dims(picked) == ((1024, 1, 1),) and with_block_dims(picked, ((128, 1, 1),)) == graph
    assert us == 3.0 and "threads 1024" in note and "search's threads: 9.00 µs" in note
