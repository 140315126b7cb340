"""Which attention block graphs run the online-softmax chain in registers, and what that changes in
the memory plan and the generated code (``mirage.optimizer.softmax_chain``)."""

from __future__ import annotations

import dataclasses

import pytest
from optimizer_graphs import attention_one_kernel

from benchmarks.mugraphs import CASES
from benchmarks.variants import attention_fused
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.ops import Op
from mirage.optimizer import OptimizerOptions, prepare
from mirage.optimizer.softmax_chain import warp_split

SPLITS = dict(kv_splits=8, q_splits=8, iters=4, threads=128)


def _kernels(graph, **options):
    program = prepare(graph, options=dataclasses.replace(OptimizerOptions(), **options))
    return program.kernels


@pytest.mark.parametrize(
    ("rows", "keys", "threads", "groups"),
    [
        (32, 128, 128, 2),  # 2 row tiles, 4 warps: 2 key groups of 64 keys
        (64, 128, 256, 2),
        (64, 64, 128, 1),  # a warp per row tile
        (64, 64, 64, 1),  # 2 row tiles per warp
        (16, 128, 256, 8),  # 8 groups of 16 keys
        (16, 64, 256, None),  # 8 groups of 8 keys: below one k16 step of P·V
        (48, 64, 128, None),  # 3 row tiles over 4 warps
        (24, 64, 128, None),  # rows not whole 16-row tiles
    ],
)
def test_warp_split(rows, keys, threads, groups):
    assert warp_split(rows, keys, threads) == groups


@pytest.mark.parametrize("qknorm", [False, True])
def test_row_sum_attention_runs_the_chain_and_its_intermediates_get_no_buffer(qknorm):
    graph = attention_fused(1, qknorm, row_sums=True, combine_rows=16, **SPLITS)
    first, combine = _kernels(graph)
    chain = first.softmax_chain
    assert chain is not None and combine.softmax_chain is None
    nodes = first.block_graph.nodes
    assert nodes[chain.qk].op is Op.MATMUL and nodes[chain.pv].op is Op.MATMUL
    assert nodes[chain.row_max].op is Op.REDUCTION_MAX and nodes[chain.running].op is Op.RUNNING_MAX
    assert chain.sum is not None and chain.maximum is not None  # split-KV partials: l and M saved
    assert chain.groups == 2 and chain.scratch_bytes == 4 * 2 * 32 * (64 + 2)
    buffered = {b.node for b in first.memory.buffers}
    assert not chain.register_only & buffered
    assert set(chain.accumulators) <= buffered  # the write-back targets keep their tiles
    (op_by_op, _) = _kernels(graph, register_softmax=False)
    assert op_by_op.softmax_chain is None
    assert first.smem_bytes < op_by_op.smem_bytes


def test_mirage_form_with_per_key_sums_is_lowered_op_by_op():
    """Mirage's µGraph accumulates exp(S) per key ([rows, keys] state): not the chain's row sum."""
    first, _ = _kernels(CASES["gqa_b1"].fused())
    assert first.softmax_chain is None


@pytest.mark.parametrize(("forloop_range", "matched"), [(1, True), (4, False)])
def test_one_kernel_attention(forloop_range, matched):
    """The degree-0 form (O / l after the loop); with 4 iterations a tile has 16 keys, too few for
    the 4 key groups of 128 threads on one 16-row tile."""
    (kernel,) = _kernels(attention_one_kernel("sum", forloop_range))
    assert (kernel.softmax_chain is not None) is matched
    if matched:
        assert kernel.softmax_chain.sum is not None and kernel.softmax_chain.maximum is None


def test_generated_kernel_steps_the_chain_once_per_iteration():
    graph = attention_fused(1, False, row_sums=True, combine_rows=16, **SPLITS)
    code = generate_cuda_program(graph).code
    first = code.split("extern \"C\"")[1]
    loop = first.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    assert loop.count("::step(") == 1
    assert loop.count("__syncthreads()") == 1  # only the end of the iteration
    assert "mm3" not in first and "mm9" not in first  # no op-by-op matmuls left
    assert "::write_back(softmax3_state" in first
