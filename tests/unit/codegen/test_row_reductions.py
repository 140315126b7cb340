"""Row-local bodies that reduce along their rows (``OptimizerOptions.row_reductions``): which kernels
qualify, what the memory plan keeps, and what the generated code and its SASS do."""

from __future__ import annotations

import dataclasses
import re

import pytest
from codegen_helpers import needs_nvcc, sass_by_function

import mirage as mi
from benchmarks.mugraphs import ntrans
from mirage.codegen.compile import CompileOptions, Stage, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions, prepare
from tests.unit.optimizer.optimizer_graphs import column_softmax, gated_rms, rms_of_slices, row_softmax

OFF = dataclasses.replace(OptimizerOptions(), row_reductions=False)


def _kernel(graph, options=None):
    (kernel,) = prepare(graph, options=options or OptimizerOptions()).kernels
    return kernel


@pytest.mark.parametrize("threads", [128, 512, 1024])
def test_ntrans_runs_in_registers_from_inputs_to_output(threads):
    kernel = _kernel(ntrans.fused(8, threads=threads))
    plan = kernel.row_loop
    assert plan is not None and (plan.rows, plan.width, plan.row_threads) == (1, 4096, threads)
    assert set(plan.direct) == set(kernel.block_graph.input_nodes)  # H, X and A read once, directly
    assert len(plan.reductions) == 2  # the two rms_norms
    ((state, saver),) = plan.outputs
    assert kernel.block_graph.nodes[saver].inputs[0].node == state
    assert kernel.memory.buffers == ()  # no tile in shared memory at all
    assert plan.scratch_floats == 2 * threads // 32
    assert _kernel(ntrans.fused(8, threads=threads), OFF).row_loop is None


def test_reductions_over_rows_of_few_threads_may_loop():
    plan = _kernel(rms_of_slices()).row_loop
    assert plan is not None and plan.row_threads == 8 and plan.scratch_floats == 0
    assert plan.untiled == plan.states and len(plan.outputs) == 1  # saved from registers after the loop
    # rows spanning warps need a barrier each iteration: not row-local in a loop
    assert _kernel(rms_of_slices(rows=1, cols=8192, iters=2, threads=128)).row_loop is None


def test_rows_must_fill_the_block_when_they_reduce():
    # 2 rows of 64 columns: 16 threads of 256 would hold them, the rest idle at the shuffles
    assert _kernel(gated_rms(rows=2, cols=64, threads=256)).row_loop is None
    assert _kernel(gated_rms(rows=4, cols=2048, threads=512)).row_loop is not None


def test_softmax_rows_reduce_max_and_sum():
    kernel = _kernel(row_softmax())
    plan = kernel.row_loop
    ops = sorted(kernel.block_graph.nodes[i].op.value for i in plan.reductions)
    assert ops == ["reduction", "reduction_max"]  # its exp reads x − max(x): the rewrite adds no second max
    assert plan.row_threads == 32 and plan.scratch_floats == 0  # a warp a row: shuffles only


def test_generated_ntrans_has_no_shared_tiles_and_one_barrier_per_rms():
    code = generate_cuda_program(ntrans.fused(8, threads=512)).code
    body = code.split('extern "C"')[1]
    assert "SharedTile" not in body and "Pipeline" not in body
    assert body.count("row_combine<512, mirage::dev::SumReduce>") == 2
    assert "__syncthreads" not in body  # the combines' own barriers are the only ones
    assert "sink.chunk(row_loop_row * 4096 + row_loop_col, s" in body
    op_by_op = generate_cuda_program(ntrans.fused(8, threads=512), options=OFF).code
    assert "rms_norm_apply" in op_by_op and "row_combine" not in op_by_op


@needs_nvcc
def test_ntrans_sass_loads_and_stores_16_bytes_without_shared_tiles():
    """The vector path reads H, X and A with one 16-byte load each per thread and stores with one;
    shared memory holds only the two combines' per-warp floats."""
    programs = [generate_cuda_program(ntrans.fused(8, threads=512), options=o).code for o in (None, OFF)]
    results = compile_sources(programs, CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    ours, op_by_op = (r.sass() for r in results)
    assert len(re.findall(r"\bLDG\.E\.128", ours)) >= 3 and re.search(r"\bSTG\.E\.128", ours)
    assert "LDGSTS" not in ours and "LDGSTS" in op_by_op
    # two barriers (one per rms) in each of the loop's two builds, with and without vector loads
    assert len(re.findall(r"\bBAR\.SYNC", ours)) == 2 * 2 < len(re.findall(r"\bBAR\.SYNC", op_by_op))
    assert "LDL" not in ours and "STL" not in ours


def test_combine_divides_after_the_loop_in_registers_and_writes_the_output():
    """A split-KV combine's O / l runs after the loop on the states' registers and goes straight to
    the output: no shared memory, no barrier, no saver pass; with row_epilogues=False the states go
    through their tiles and the division is a step of its own."""
    from benchmarks.variants import attention_fused

    graph = attention_fused(1, False, row_sums=True, combine_rows=16, kv_splits=8, q_splits=8, iters=4,
                            threads=128)
    ours, tiled = (generate_cuda_program(graph, options=o).code.split('extern "C"')[-1]
                   for o in (None, dataclasses.replace(OptimizerOptions(), row_epilogues=False)))
    after = ours.split("// ---- after the for-loop")[1]
    assert "store_global<" in after and "__syncthreads" not in ours and "SharedTile" not in ours
    assert "map_apply" in tiled and "__syncthreads" in tiled


@needs_nvcc
def test_combine_stores_its_chunks_whole():
    """A combine thread's 4 output halves leave in one 8-byte store, an nTrans thread's 8 in one
    16-byte store (assembled from 16-bit halves, the compiler would split them into 32-bit stores)."""
    from benchmarks.variants import attention_fused

    graph = attention_fused(1, False, row_sums=True, combine_rows=8, kv_splits=16, q_splits=4, iters=2,
                            threads=128)
    program = generate_cuda_program(graph)
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    functions = {f.split()[0]: f for f in result.sass().split("Function : ")[1:]}
    combine = functions[program.kernels[-1].name]
    assert re.search(r"\bSTG\.E\.64\b", combine) and not re.search(r"\bSTG\.E\s", combine)


def test_columns_beyond_a_vector_interleave_across_the_row():
    """At 256 threads an nTrans thread holds 16 columns: two groups of 8, 2048 columns apart, so that a
    warp's 16-byte loads cover contiguous bytes; at 512 threads one group of 8, as before."""
    wide = _kernel(ntrans.fused(8, threads=256)).row_loop
    assert (wide.chunk, wide.group, wide.row_threads) == (16, 8, 256)
    narrow = _kernel(ntrans.fused(8, threads=512)).row_loop
    assert narrow.group == narrow.chunk == 8
    off = dataclasses.replace(OptimizerOptions(), row_interleave=False)
    assert _kernel(ntrans.fused(8, threads=256), off).row_loop.group == 16
    code = generate_cuda_program(ntrans.fused(8, threads=256)).code
    assert code.count("row_loop_col + j * 2048") == 4  # three inputs and the output


@pytest.mark.parametrize(("iterations", "most", "batch"),
                         [(32, 26, 16), (16, 26, 16), (29, 26, 15), (32, 11, 11), (7, 1, 1), (5, 0, 1),
                          (3, 200, 3)])
def test_direct_loop_batches_are_as_even_as_the_range_allows(iterations, most, batch):
    from mirage.codegen.lower_rowloop import batch_size

    assert batch_size(iterations, most) == batch
    batches = -(-iterations // batch)
    assert batch <= max(most, 1) and batches == -(-iterations // max(1, min(most, iterations)))


COLUMNS = dataclasses.replace(OptimizerOptions(), column_loops=True)


def _key_norm_kernel(norm_blocks: int, options=None):
    """QKNorm's K-normalize kernel, K / rms over dim 1 of K (16, 64, 4096): tiles [64, 4096 / norm_blocks]."""
    from benchmarks.variants import attention_fused

    graph = attention_fused(8, True, row_sums=True, combine_rows=8, normalize_k=True, norm_blocks=norm_blocks,
                            kv_splits=4, q_splits=4, iters=8, threads=128)
    return prepare(graph, options=options or COLUMNS).kernels[0]


@pytest.mark.parametrize("norm_blocks", [32, 64])
def test_column_norm_runs_a_column_a_thread(norm_blocks):
    """The key norm reduces over the tiles' rows (dim -2): the loop of the transposed tiles, each
    thread a whole column of 64 in registers, read from global memory and written to the output."""
    kernel = _key_norm_kernel(norm_blocks)
    plan = kernel.row_loop
    assert plan is not None and plan.transposed
    assert (plan.rows, plan.width, plan.chunk, plan.row_threads) == (4096 // norm_blocks, 64, 64, 1)
    assert len(plan.reductions) == 1 and plan.scratch_floats == 0
    assert set(plan.direct) == set(kernel.block_graph.input_nodes) and len(plan.outputs) == 1
    assert kernel.memory.buffers == () and kernel.smem_bytes == 0
    assert _key_norm_kernel(norm_blocks, OptimizerOptions()).row_loop is None  # off by default
    no_reductions = dataclasses.replace(COLUMNS, row_reductions=False)  # column loops reduce: both needed
    assert _key_norm_kernel(norm_blocks, no_reductions).row_loop is None


def test_columns_that_leave_most_threads_idle_stay_op_by_op():
    assert _kernel(column_softmax(rows=64, cols=1024, blocks=8, threads=128), COLUMNS).row_loop.transposed
    # 32 columns a block of 128 threads: three warps of four would idle
    assert _kernel(column_softmax(rows=64, cols=256, blocks=8, threads=128), COLUMNS).row_loop is None
    # columns of 128 elements: more than a thread holds in registers
    assert _kernel(column_softmax(rows=128, cols=1024, blocks=8, threads=128), COLUMNS).row_loop is None
    # a row softmax is still the row-local loop, not the transposed one
    assert not _kernel(row_softmax(), COLUMNS).row_loop.transposed


@needs_nvcc
def test_column_norm_sass_reads_each_element_once_without_shared_memory():
    """Each thread of the column loop loads its 64 elements (2 bytes each, a warp's 32 threads 64
    neighbouring bytes of a row), takes one rsqrt, and stores 64 results; no shared memory, no
    barrier. Op by op the kernel stages the tile through shared memory with a barrier."""
    from benchmarks.variants import attention_fused

    graph = attention_fused(8, True, row_sums=True, combine_rows=8, normalize_k=True, norm_blocks=32,
                            kv_splits=4, q_splits=4, iters=8, threads=128)
    programs = [generate_cuda_program(graph, options=o) for o in (COLUMNS, None)]
    assert "read_column(" in programs[0].code and "sink.column(" in programs[0].code
    results = compile_sources([p.code for p in programs], CompileOptions(target=TARGETS["H100"]),
                              dumps={Stage.SASS})
    ours, op_by_op = (sass_by_function(r.sass())[f"{programs[0].kernels[0].name}"] for r in results)
    assert len(re.findall(r"\bLDG\.E\.U16", ours)) == 64 and len(re.findall(r"\bSTG\.E\.U16", ours)) == 64
    assert len(re.findall(r"\bMUFU\.RSQ", ours)) == 1
    assert not re.search(r"\b(LDS|STS|LDGSTS|BAR\.SYNC)", ours)
    assert "LDGSTS" in op_by_op and "BAR.SYNC" in op_by_op
    assert "LDL" not in ours and "STL" not in ours


RAGGED_OFF = dataclasses.replace(OptimizerOptions(), ragged_rows=False)


@pytest.mark.parametrize(("cols", "threads", "plan"), [
    (1733, 128, (14, 1792, "element")),  # GPT-2's slice: no chunk divides it
    (1733, 256, (7, 1792, "element")),
    (2000, 128, (16, 2048, "chunk")),  # 125 chunks of 16 would leave 3 of 128 threads without one
    (16032, 256, (64, 16384, "vector")),  # Llama 3's slice of 8: whole 16-byte groups, 63 → 64 a thread
])
def test_rows_no_chunk_fits_are_padded(cols, threads, plan):
    kernel = _kernel(row_softmax(rows=8, cols=cols, blocks=8, threads=threads))
    loop = kernel.row_loop
    assert (loop.chunk, loop.padded, loop.mask) == plan and loop.row_threads == threads
    assert kernel.memory.buffers == () and loop.direct  # read from global memory, nothing in shared tiles
    assert _kernel(row_softmax(rows=8, cols=cols, blocks=8, threads=threads), RAGGED_OFF).row_loop is None


def test_padding_of_more_than_an_eighth_of_the_row_stays_op_by_op():
    # 2 rows of 64 in a block of 256: each row's 128 threads would hold 64 columns of padding
    assert _kernel(gated_rms(rows=2, cols=64, threads=256)).row_loop is None
    assert _kernel(gated_rms(rows=2, cols=3000, threads=512)).row_loop.padded == 3072


def test_ragged_rows_mask_their_padding_in_reads_reductions_and_stores():
    element = generate_cuda_program(row_softmax(rows=8, cols=1733, blocks=8, threads=128)).code
    assert "constexpr int kRowWidth = 1733;" in element
    assert "read_masked(iteration, row_loop_row, row_loop_col, kRowWidth" in element
    assert element.count("if (row_loop_col + e < kRowWidth) partial =") == 2  # the max and the sum
    assert "if (row_loop_col + e < kRowWidth) sink(" in element
    assert ".direct_vectors()" not in element.split('extern "C"')[-1]  # no 16-byte path: chunks of 14
    chunk = generate_cuda_program(row_softmax(rows=8, cols=2000, blocks=8, threads=128)).code
    assert "if (row_loop_col < kRowWidth) {  // chunks past the row's width" in chunk
    assert "if (row_loop_col < kRowWidth) sink.chunk(" in chunk
    assert "in0.direct_vectors()" in chunk
    vector = generate_cuda_program(row_softmax(rows=8, cols=16032, blocks=8, threads=256)).code
    assert "groups of 8 past the row's width are padding" in vector and "in0.direct_vectors()" in vector
    assert "if (row_loop_col + j * 8 < kRowWidth)" in vector.split("groups of 8 past")[1]


@needs_nvcc
def test_padded_rows_of_whole_chunks_load_16_bytes_without_shared_tiles():
    programs = [generate_cuda_program(row_softmax(rows=8, cols=2000, blocks=8, threads=128), options=o).code
                for o in (None, RAGGED_OFF)]
    results = compile_sources(programs, CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    ours, op_by_op = (r.sass() for r in results)
    assert re.search(r"\bLDG\.E\.128", ours) and "LDGSTS" not in ours and "LDGSTS" in op_by_op
    assert "LDL" not in ours and "STL" not in ours


SHORT_OFF = dataclasses.replace(OptimizerOptions(), short_rows=False)


def _split_log_softmax(cols: int, splits: int, threads: int = 128, rows: int = 8):
    from mirage.generator import split_rows
    from tests.unit.generator.test_split_rows import lse_reference

    graph = lse_reference(rows, cols, True)
    return split_rows.split_graph(graph, split_rows.match(graph), splits, threads)


def test_a_split_combine_reduces_its_partials_across_a_warps_lanes():
    """The second kernel of a split log_softmax reduces a row's 29 partial maxima and sums to its
    logsumexp, then writes its slice of 1,733 columns: row-local, lane l of each warp holding partial
    l and the warp's shuffles reducing them (no barrier); with short_rows=False, op by op through
    shared memory.  Llama 3's 64 partials are two a lane."""
    graph = _split_log_softmax(50257, 29)
    first, second = prepare(graph).kernels
    assert first.row_loop.short == 0 and first.row_loop.padded == 1792
    loop = second.row_loop
    assert (loop.short, loop.short_lanes, loop.short_chunk) == (29, 32, 1)
    assert (loop.width, loop.chunk, loop.padded, loop.row_threads) == (1733, 14, 1792, 128)
    assert len(loop.short_reductions) == 2 and loop.reductions == () and second.memory.buffers == ()
    assert prepare(graph, options=SHORT_OFF).kernels[1].row_loop is None
    code = generate_cuda_program(graph).code.split('extern "C"')[-1]
    assert "constexpr int kShort = 29;" in code and "constexpr int kShortChunk = 1;" in code
    assert code.count("read_masked(iteration, row_loop_row, short_col, kShort,") == 2
    assert code.count("if (short_col + e < kShort) partial =") == 2
    assert "row_combine<32, mirage::dev::MaxReduce>(partial, nullptr)" in code and "__syncthreads" not in code
    llama3 = prepare(_split_log_softmax(128256, 64, threads=256)).kernels[1].row_loop
    assert (llama3.short, llama3.short_lanes, llama3.short_chunk) == (64, 32, 2)


def _short_state(kept: bool):
    g = mi.new_kernel_graph()
    x = g.new_input((8, 2048), mi.float16)
    p = g.new_input((8, 16), mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(8, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    bx, bp = tb.new_input(x, input_map=(0, -1, -1)), tb.new_input(p, input_map=(0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.mul(bx, tb.reduction(tb.exp(bp), 1))), output_map=(0, -1, -1))
    if kept:
        tb.new_output(tb.forloop_accum(tb.exp(bp)), output_map=(0, -1, -1))
    for out in g.customized([x, p], tb):
        g.mark_output(out)
    return g.freeze()


def test_short_values_are_reduced_within_the_iteration_not_kept():
    """A short value reduced to a narrow one within the iteration is row-local; one the body also
    accumulates (a state of [R, S]) is not: only wide and narrow values are states."""
    assert _kernel(_short_state(kept=False)).row_loop.short == 16
    assert _kernel(_short_state(kept=True)).row_loop is None
