"""Row-local loop bodies (``mirage.optimizer.row_loop``): which loops run per thread in registers,
and what that changes in the memory plan and the generated code."""

from __future__ import annotations

import dataclasses

import pytest
from optimizer_graphs import matmul_chain, split_kv

import mirage as mi
from benchmarks.variants import attention_fused
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.ops import Op
from mirage.optimizer import OptimizerOptions, prepare

SPLITS = dict(kv_splits=8, q_splits=8, iters=4, threads=128)


def _kernels(graph, **options):
    return prepare(graph, options=dataclasses.replace(OptimizerOptions(), **options)).kernels


def test_split_kv_combine_runs_row_local():
    graph = attention_fused(1, False, row_sums=True, combine_rows=16, **SPLITS)
    first, combine = _kernels(graph)
    assert first.row_loop is None  # the attention kernel runs the softmax chain instead
    plan = combine.row_loop
    assert plan is not None
    assert (plan.rows, plan.width, plan.chunk, plan.row_threads) == (16, 64, 8, 8)
    ops = {combine.block_graph.nodes[i].op for i in plan.states}
    assert ops == {Op.RUNNING_MAX, Op.ACCUM_RESCALE}
    buffered = {b.node for b in combine.memory.buffers}
    assert not plan.register_only & buffered and not buffered  # O / l after the loop in registers too
    assert len(plan.post) == 1 and set(plan.untiled) == set(plan.states)
    (saver,) = combine.block_graph.output_nodes
    assert plan.outputs == ((plan.post[0], saver),)
    (_, tiled) = _kernels(graph, row_epilogues=False)
    buffered = {b.node for b in tiled.memory.buffers}
    assert tiled.row_loop.post == () and set(tiled.row_loop.states) <= buffered
    assert set(plan.direct) == set(combine.block_graph.input_nodes)  # all three read per split
    (_, staged) = _kernels(graph, direct_row_loads=False)
    assert staged.row_loop.direct == () and set(staged.block_graph.input_nodes) <= {
        b.node for b in staged.memory.buffers}
    (_, op_by_op) = _kernels(graph, row_loops=False)
    assert op_by_op.row_loop is None and staged.smem_bytes < op_by_op.smem_bytes
    assert combine.smem_bytes < staged.smem_bytes


def test_loops_with_matmuls_or_real_reductions_stay_op_by_op():
    (kernel,) = _kernels(matmul_chain())
    assert kernel.row_loop is None
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(16, 256), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=4)
    tb.new_output(tb.forloop_accum(tb.exp(tb.new_input(x, forloop_dim=1)), acc="sum"))  # sums 64 columns
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    (kernel,) = _kernels(g.freeze())
    assert kernel.row_loop is None


def test_elementwise_accumulation_runs_row_local():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(32, 256), dtype=mi.float16)
    y = g.new_input(dims=(32, 1), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)  # [16, 64]
    by = tb.new_input(y, input_map=(0, -1, -1))  # [16, 1], before the loop
    tb.new_output(tb.forloop_accum(tb.mul(tb.exp(bx), by)), output_map=(0, -1, -1))
    (o,) = g.customized([x, y], tb)
    g.mark_output(o)
    (kernel,) = _kernels(g.freeze())
    assert kernel.row_loop is not None and kernel.row_loop.width == 64
    assert kernel.row_loop.direct == (0,)  # x changes every iteration; y is read once, staged


@pytest.mark.parametrize("qknorm", [False, True])
def test_generated_combine_loop_reads_directly_without_barriers(qknorm):
    graph = attention_fused(1, qknorm, row_sums=True, combine_rows=16, **SPLITS)
    code = generate_cuda_program(graph).code
    combine = code.split('extern "C"')[-1]
    loop = combine.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    assert loop.count("row-local loop body") == 1 and "__syncthreads()" not in loop
    assert "Pipeline" not in combine and ".read<kVectors>(" in loop
    staged = generate_cuda_program(
        graph, options=dataclasses.replace(OptimizerOptions(), direct_row_loads=False)).code
    combine = staged.split('extern "C"')[-1]
    loop = combine.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    assert loop.count("row-local loop body") == 1 and loop.count("__syncthreads()") == 1


def test_combine_of_per_key_sums_stays_op_by_op():
    """Mirage's form of split-KV saves exp(S) per key: its combine sums 64 keys per row and split,
    a reduction across threads, so it is not row-local."""
    (_, combine) = _kernels(split_kv("sum", combine_range=4))
    assert combine.row_loop is None
