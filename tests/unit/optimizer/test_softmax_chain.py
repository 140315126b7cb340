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
        (48, 64, 128, 1),  # 3 row tiles over 4 warps: 4 run (padded_rows), one a warp
        (24, 64, 128, 2),  # rows not whole 16-row tiles: 32 run (padded_rows), 2 groups of 32 keys
        (15, 197, 128, 4),  # 15 rows (100 tokens in 7 blocks): 16 run, 4 groups of 64 keys
        (16, 197, 128, 4),  # ViT's keys: 4 groups of 64 (256 keys run, padded_keys)
        (64, 77, 128, 1),  # CLIP's: 80 keys run
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


# ---- per-key factors: QKNorm's scores divided by their key's rms ------------------------------------


def _thread(ops):
    """A thread graph over inputs x0 (the product) and x1 from ``ops``: (op, operand indices, value)."""
    from mirage.mugraph.dtypes import DType
    from mirage.mugraph.graph import Node, Ref, Scalar, TensorType, ThreadGraph, ThreadInput

    t = TensorType((1,), DType.FLOAT32)
    nodes = [Node(Op.INPUT, (), ThreadInput(0), (t,)), Node(Op.INPUT, (), ThreadInput(1), (t,))]
    for op, operands, value in ops:
        attrs = Scalar(value) if value is not None else None
        nodes.append(Node(op, tuple(Ref(k) for k in operands), attrs, (t,)))
    return ThreadGraph(tuple(nodes), (Ref(len(nodes) - 1),))


@pytest.mark.parametrize(("ops", "linear"), [
    ([(Op.DIV, (0, 1), None), (Op.MUL_SCALAR, (2,), 0.125)], True),  # x0 / x1 · 0.125
    ([(Op.SQRT, (1,), None), (Op.MUL, (2, 0), None)], True),  # sqrt(x1) · x0
    ([(Op.DIV, (1, 0), None)], False),  # x1 / x0
    ([(Op.ADD, (0, 1), None)], False),  # x0 + x1: affine, not linear
    ([(Op.MUL, (0, 0), None)], False),  # x0²
    ([(Op.EXP, (0,), None), (Op.MUL, (2, 1), None)], False),
    ([(Op.SQRT, (1,), None)], False),  # no x0 at all
])
def test_linear_in_the_product(ops, linear):
    from mirage.optimizer.softmax_chain import linear_in

    assert linear_in(_thread(ops), 0) is linear


def _key_scale_graph(**splits):
    return attention_fused(1, True, row_sums=True, combine_rows=16, key_scales=True, **(splits or SPLITS))


STEPPED_FACTORS = {"chain_key_norms": False}  # the per-key values computed by a step of their own
KEY_NORMS = {"chain_key_norms": True}  # ...or by the chain, from its K fragments


def test_key_scales_run_the_chain_with_a_per_key_operand():
    first, _ = _kernels(_key_scale_graph())
    chain = first.softmax_chain
    assert chain is not None and chain.column is not None
    nodes = first.block_graph.nodes
    assert nodes[chain.column].op is Op.REDUCTION and nodes[chain.column].outputs[0].shape == (1, 1, 128)
    assert nodes[chain.score].inputs[chain.qk_argument].node == chain.qk
    assert chain.anchor == chain.score  # after the per-key values are computed
    assert chain.column in {b.node for b in first.memory.buffers}  # the factors' tile


def test_key_scales_lowering_stores_factors_then_steps_the_chain():
    options = dataclasses.replace(OptimizerOptions(), **STEPPED_FACTORS)
    code = generate_cuda_program(_key_scale_graph(), options=options).code
    first = code.split("extern \"C\"")[1]
    loop = first.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    assert loop.count("::step(") == 1 and "ColumnScore" in first
    factor = loop.index("mirage::gen::ColumnFactor<")
    barrier = loop.index("__syncthreads()", factor)
    assert factor < barrier < loop.index("::step(")  # stored, synchronized, then read by the chain
    step_line = next(line for line in loop.splitlines() if "::step(" in line)
    assert step_line.count(",") == 4  # state, Q, K, V and the factors


def _attention_scored_by(scores):
    """Split-KV attention at gqa_b1's shapes whose scores are ``scores(tb, q_tile, k_tile)``."""
    from benchmarks.mugraphs import attention

    return attention.rows_fused(2, 256, 64, 4096, kv_splits=8, q_splits=4, iters=4, threads=128,
                                combine_splits=16, scores=scores)


def test_key_norms_are_computed_by_the_chain():
    """QKNorm's rms(k) is g(Σ_d K[d, n]²) of the chain's own K: the chain computes it from its K
    fragments, so the square, the sum and their tiles go, and the chain runs at Q·K's place."""
    first, _ = _kernels(_key_scale_graph(), **KEY_NORMS)
    chain = first.softmax_chain
    assert chain is not None and chain.key_norm is not None
    total, square = chain.key_norm
    nodes = first.block_graph.nodes
    assert nodes[total].op is Op.REDUCTION and nodes[total].inputs[0].node == square
    assert nodes[square].inputs == nodes[chain.qk].inputs[1:]  # the square of the chain's K
    assert {chain.column, total, square} <= chain.computed and {total, square} <= chain.register_only
    assert chain.anchor == chain.qk
    buffers = {b.node for b in first.memory.buffers}
    assert not {chain.column, total, square} & buffers  # no tile for the factors or the squares


def test_key_norms_lowering_has_no_barrier_before_the_chain():
    options = dataclasses.replace(OptimizerOptions(), **KEY_NORMS)
    code = generate_cuda_program(_key_scale_graph(), options=options).code
    first = code.split("extern \"C\"")[1]
    assert "mirage::gen::KeyNorms<mirage::gen::Compose<" in first and "ColumnFactor<" in first
    loop = first.split("// ---- the for-loop")[1].split("// ---- after the for-loop")[0]
    body = loop.split("stage(iteration);")[-1]
    assert body.count("::step(") == 1 and body.index("::step(") < body.index("__syncthreads()")
    step_line = next(line for line in loop.splitlines() if "::step(" in line)
    assert step_line.count(",") == 3  # state, Q, K and V: no factor tile


@pytest.mark.parametrize("change", ["cube", "scaled square"])
def test_other_per_key_values_keep_their_step(change):
    """Only Σ_d K[d, n]² of the chain's K is computed from the fragments: Σ K³ or Σ (2K)² are not."""
    def scores(tb, bq, bk):
        if change == "cube":
            values = tb.reduction(tb.mul(tb.square(bk), bk), 1)
        else:
            values = tb.reduction(tb.square(tb.mul_scalar(bk, 2.0)), 1)
        return tb.mul_scalar(tb.div(tb.matmul(bq, bk), tb.sqrt(tb.add_scalar(values, 1.0))), 0.125)

    first, _ = _kernels(_attention_scored_by(scores), **KEY_NORMS)
    chain = first.softmax_chain
    assert chain is not None and chain.column is not None and chain.key_norm is None


def test_a_score_not_linear_in_the_product_is_lowered_op_by_op():
    from benchmarks.mugraphs import attention

    def scores(tb, bq, bk):  # S + rms(k): affine in S
        return tb.add(tb.matmul(bq, bk), attention.key_rms(tb, bk))

    first, _ = _kernels(_attention_scored_by(scores))
    assert any(n.op is Op.RUNNING_MAX for n in first.block_graph.nodes)  # the rewrite ran
    assert first.softmax_chain is None


def test_the_chain_keeps_its_operands_alive_until_its_anchor():
    """In a one-iteration loop K is no pipelined stage: its tile must outlive the per-key factors'
    step, since the chain reads K where it runs (after the factors), not at Q·K's place."""
    first, _ = _kernels(_key_scale_graph(kv_splits=32, q_splits=4, iters=1, threads=128), **STEPPED_FACTORS)
    chain = first.softmax_chain
    assert chain is not None and chain.column is not None
    memory = first.memory
    k_tile = memory.buffer_of(first.block_graph.nodes[chain.qk].inputs[1].node)
    factors = memory.buffer_of(chain.column)
    assert k_tile.overlaps_in_time(factors)
    assert k_tile.offset + k_tile.size <= factors.offset or factors.offset + factors.size <= k_tile.offset


# ---- the warpgroup form (sm_90a) -------------------------------------------------------------------

WARPGROUP = {"warpgroup_softmax": True}


def _gqa(**splits):
    return attention_fused(8, False, row_sums=True, combine_rows=8, **splits)


@pytest.mark.parametrize(
    ("splits", "warpgroup"),
    [
        (dict(kv_splits=8, q_splits=2, iters=8, threads=128), True),  # 128 rows: 2 tiles of 64 a warpgroup
        (dict(kv_splits=8, q_splits=2, iters=8, threads=256), True),  # 2 warpgroups of one tile each
        (dict(kv_splits=8, q_splits=2, iters=8, threads=512), False),  # 16 warps, 8 row tiles: key groups
        (dict(kv_splits=8, q_splits=8, iters=4, threads=64), False),  # 2 warps: not a warpgroup
        (dict(kv_splits=8, q_splits=8, iters=16, threads=128), False),  # 32 keys an iteration
    ],
)
def test_warpgroup_form_needs_whole_warpgroups_and_key_blocks(splits, warpgroup):
    first, _ = _kernels(_gqa(**splits), **WARPGROUP)
    chain = first.softmax_chain
    assert chain is not None and chain.warpgroup is warpgroup
    nodes = first.block_graph.nodes
    (q, k), v = (r.node for r in nodes[chain.qk].inputs), nodes[chain.pv].inputs[1].node
    assert chain.swizzled == (frozenset({q, k, v}) if warpgroup else frozenset())


def test_warpgroup_tiles_are_unpadded_and_1024_byte_aligned():
    """Q's tile (128 x 64) and K and V's stages (64 x 64 each) hold unpadded fp16 rows from 1024-byte
    boundaries."""
    graph = _gqa(**SPLITS | dict(q_splits=2, iters=8))
    (plain, _), (first, _) = (_kernels(graph, **o) for o in ({}, WARPGROUP))
    assert len(first.softmax_chain.swizzled) == 3
    for node in first.softmax_chain.swizzled:
        buffer = first.memory.buffer_of(node)
        rows = first.block_graph.nodes[node].outputs[0].shape[-2]
        assert buffer.offset % 1024 == 0 and buffer.slot_bytes == rows * 64 * 2 and buffer.align == 1024
        assert plain.memory.buffer_of(node).slot_bytes == rows * 72 * 2


def test_deferred_values_give_v_one_ring_slot_more():
    graph = _gqa(**SPLITS | dict(q_splits=2, iters=8))
    (step, _), (deferred, _) = (_kernels(graph, **WARPGROUP, defer_values=d) for d in (False, True))
    v = deferred.block_graph.nodes[deferred.softmax_chain.pv].inputs[1].node
    k = deferred.block_graph.nodes[deferred.softmax_chain.qk].inputs[1].node
    assert not step.softmax_chain.late and deferred.softmax_chain.late == {v}
    assert (step.memory.buffer_of(v).slots, deferred.memory.buffer_of(v).slots) == (2, 3)
    assert deferred.memory.buffer_of(k).slots == 2


def test_q_fragments_render_the_chain_with_register_operands():
    """``q_fragments``: the chain's type gets QFragments (after DeferValues), in step and deferred."""
    graph = _gqa(**SPLITS | dict(q_splits=2, iters=8))
    for defer in (False, True):
        (first, _) = _kernels(graph, **WARPGROUP, q_fragments=True, defer_values=defer)
        assert first.softmax_chain.q_fragments
        code = generate_cuda_program(graph, 90, options=dataclasses.replace(
            OptimizerOptions(), **WARPGROUP, q_fragments=True, defer_values=defer)).code
        assert f"mirage::gen::NoTile, {str(defer).lower()}, true>;" in code


@pytest.mark.parametrize(("threads", "asked", "kept"), [(256, 1, 1), (256, 2, 2), (128, 2, 0)])
def test_pingpong_turns_are_kept_only_for_two_warpgroups(threads, asked, kept):
    """``softmax_pingpong``: the chain's type gets PingPong (after QFragments) with two warpgroups; a
    block of one warpgroup has nobody to take turns with, and renders as without the option."""
    graph = _gqa(**SPLITS | dict(q_splits=2, iters=8, threads=threads))
    (first, _) = _kernels(graph, **WARPGROUP, q_fragments=True, softmax_pingpong=asked)
    assert first.softmax_chain.pingpong == kept
    code = generate_cuda_program(graph, 90, options=dataclasses.replace(
        OptimizerOptions(), **WARPGROUP, q_fragments=True, softmax_pingpong=asked)).code
    assert code.count("mirage::gen::NoTile, false, true" + (f", {kept}>;" if kept else ">;")) == 1


@pytest.mark.parametrize("turns", [3, -1, True])
def test_pingpong_modes_other_than_0_1_2_are_refused(turns):
    with pytest.raises(ValueError, match="softmax_pingpong"):
        OptimizerOptions(softmax_pingpong=turns)


def test_a_normalized_q_is_swizzled_its_input_is_not():
    """QKNorm's Q, normalized in the block before the chain reads it: the rms_norm's tile, which only
    the chain reads (its pass writes 8-element chunks through the layout), is swizzled with K and V;
    the raw Q, which the rms_norm reads by rows, is not."""
    graph = attention_fused(1, True, row_sums=True, combine_rows=16, normalize_k=True, norm_blocks=64,
                            kv_splits=16, q_splits=2, iters=4, threads=256)
    first = next(k for k in _kernels(graph, **WARPGROUP) if k.softmax_chain is not None)
    chain = first.softmax_chain
    nodes = first.block_graph.nodes
    q = nodes[chain.qk].inputs[0].node
    assert chain.warpgroup and len(chain.swizzled) == 3 and q in chain.swizzled
    assert nodes[q].op.value == "rms_norm" and nodes[q].inputs[0].node not in chain.swizzled


def test_qknorms_column_reduction_may_read_a_swizzled_k():
    """QKNorm's per-key factors come from a sum of squares of K over d (a reduction over a dim other
    than the last, which addresses the tile element by element): K and V are swizzled all the same,
    and so is Q, normalized by an rms_norm that only the chain reads."""
    first, _ = _kernels(_key_scale_graph(kv_splits=8, q_splits=2, iters=8, threads=128),
                        **WARPGROUP, **STEPPED_FACTORS, warpgroup_key_norms=False)
    chain = first.softmax_chain
    assert chain is not None and chain.warpgroup and chain.column is not None and chain.key_norm is None
    nodes = first.block_graph.nodes
    (q, k), v = (r.node for r in nodes[chain.qk].inputs), nodes[chain.pv].inputs[1].node
    assert chain.swizzled == {q, k, v} and nodes[q].op.value == "rms_norm"


@pytest.mark.parametrize("threads", [128, 256])
def test_warpgroup_chain_computes_the_key_norms_itself(threads):
    """With warpgroup_key_norms (the default) a warpgroup chain takes QKNorm's sum of squares of K as
    its own (``key_norm``: the square, the sum and the factor join what the chain computes, no step
    of theirs runs) and reserves two buffers of 128 floats a warpgroup for the factors' trade; the
    warp form keeps them in a step of their own (chain_key_norms off)."""
    graph = _key_scale_graph(kv_splits=8, q_splits=2, iters=8, threads=threads)
    first, _ = _kernels(graph, **WARPGROUP, **STEPPED_FACTORS)
    chain = first.softmax_chain
    assert chain.warpgroup and chain.key_norm is not None
    assert set(chain.key_norm) | {chain.column} <= chain.computed
    assert chain.scratch_bytes == 2 * (threads // 128) * 128 * 4
    warp, _ = _kernels(graph, **STEPPED_FACTORS)
    assert not warp.softmax_chain.warpgroup and warp.softmax_chain.key_norm is None


def _k_read_by(extra):
    """A block graph whose K tile [64, 128] is read by Q·K and by ``extra(tb, k)``: (graph, K, Q·K)."""
    import mirage as mi

    g = mi.new_kernel_graph("readers")
    q_in, k_in = g.new_input(dims=(64, 64), name="Q"), g.new_input(dims=(64, 128), name="K")
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    q, k = tb.new_input(q_in), tb.new_input(k_in)
    tb.new_output(tb.forloop_accum(tb.matmul(q, k)))
    tb.new_output(tb.forloop_accum(extra(tb, k)))
    for out in g.customized([q_in, k_in], tb):
        g.mark_output(out)
    block = next(n.attrs for n in g.freeze().nodes if n.op is Op.CUSTOMIZED)
    matmul = next(i for i, n in enumerate(block.nodes) if n.op is Op.MATMUL)
    return block, block.nodes[matmul].inputs[1].node, matmul


@pytest.mark.parametrize(("extra", "allowed"), [
    (lambda tb, k: tb.reduction(tb.square(k), 0), True),  # Σ_d K², QKNorm's keys (a prologue)
    (lambda tb, k: tb.reduction_max(k, 0), True),  # a column maximum
    (lambda tb, k: tb.reduction(k, 1), False),  # a row sum: reads rows by their pitch
    (lambda tb, k: tb.exp(k), False),  # an element-wise step that saves K's values
])
def test_only_offset_addressed_readers_leave_k_swizzlable(extra, allowed):
    from mirage.optimizer.softmax_chain import _offset_readers

    block, k, matmul = _k_read_by(extra)
    assert _offset_readers(block, block.consumers(), k, matmul) is allowed


def test_warpgroup_form_is_refused_where_the_target_has_no_wgmma():
    graph = _gqa(kv_splits=8, q_splits=2, iters=8, threads=128)
    from mirage.mugraph.target import TARGETS

    program = prepare(graph, TARGETS["A100"], dataclasses.replace(OptimizerOptions(), **WARPGROUP))
    assert not program.kernels[0].softmax_chain.warpgroup
    code = generate_cuda_program(graph, 80, options=dataclasses.replace(OptimizerOptions(), **WARPGROUP)).code
    assert "Swizzled128Layout" not in code and "__align__(128)" in code


@pytest.mark.parametrize(("dim", "warpgroup"), [(40, False), (72, False), (64, True), (128, True)])
def test_heads_of_no_whole_k_step_run_the_warp_form_of_the_chain(dim, warpgroup):
    """Head dims of whole 8-element chunks but no whole 16 (Stable Diffusion 1.5's 40) run the chain in
    its warp form, whose Q·K pads them to whole k-steps; the warpgroup form takes whole k-steps only."""
    from benchmarks.mugraphs.attention import one_kernel

    (kernel,) = _kernels(one_kernel(8, 256, 256, dim, rows=64, key_tile=64), **WARPGROUP)
    chain = kernel.softmax_chain
    assert chain is not None and chain.warpgroup is warpgroup
    q = kernel.block_graph.nodes[chain.qk].inputs[0]
    assert kernel.block_graph.type_of(q).shape[-1] == dim
