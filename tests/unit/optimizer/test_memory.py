"""Shared-memory planning: valid placements, lifetimes, stages, the best of several fits."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from optimizer_graphs import matmul_chain

from benchmarks.mugraphs import CASES
from mirage.errors import SharedMemoryError
from mirage.mugraph.ops import Op
from mirage.mugraph.target import DEFAULT_TARGET
from mirage.optimizer.fusion import fuse_thread_graphs
from mirage.optimizer.graphs import customized_nodes
from mirage.optimizer.layout import select_layouts
from mirage.optimizer.memory import (
    ALIGNMENT,
    FITS,
    ORDERS,
    Buffer,
    BufferKind,
    best_fit,
    first_fit,
    place,
    plan_memory,
    worst_fit,
)
from mirage.optimizer.registers import RegisterOptions, plan_registers
from mirage.optimizer.schedule import Phase, build_schedule
from mirage.optimizer.softmax import online_softmax


@functools.cache
def _analysed(name: str):
    graph, _ = online_softmax(CASES[name].fused())
    graph, _ = fuse_thread_graphs(graph)
    _, layouts = select_layouts(graph)
    out = []
    for k in customized_nodes(graph):
        block = graph.nodes[k].attrs
        registers = plan_registers(block)
        out.append((block, build_schedule(block, registers), registers, layouts.of_kernel(k)))
    return out


def _kernels(name: str):
    return iter(_analysed(name))


def _assert_valid(plan):
    for b in plan.buffers:
        assert b.offset % ALIGNMENT == 0 and b.slot_bytes % ALIGNMENT == 0
        assert b.offset + b.size <= plan.total
    for i, a in enumerate(plan.buffers):
        for b in plan.buffers[i + 1:]:
            if a.overlaps_in_time(b):
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (a, b)
    assert plan.total == max((b.offset + b.size for b in plan.buffers), default=0)
    assert plan.total >= plan.live_bytes()


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_benchmark_plans_are_valid_and_tight(name, stages):
    for block, schedule, registers, layouts in _kernels(name):
        plan = plan_memory(block, schedule, registers, layouts, stages=stages)
        _assert_valid(plan)
        assert plan.total == plan.live_bytes()  # these lifetimes leave no fragmentation
        assert plan.total <= DEFAULT_TARGET.smem_per_block
        assert {name for name, _ in plan.candidates} == {f"{f}/{o}" for f in FITS for o in ORDERS}
        assert plan.total == min(peak for _, peak in plan.candidates)
        for b in plan.buffers:
            if b.kind is BufferKind.INPUT_STAGES:
                assert b.slots == stages and block.forloop_range > 1
            assert b.node not in registers.register_only


def test_stages_multiply_pipelined_inputs_only():
    block, schedule, registers, layouts = next(_kernels("gqa_b1"))
    plans = {s: plan_memory(block, schedule, registers, layouts, stages=s) for s in (1, 2, 3)}
    q = plans[2].buffer_of(0)
    assert q.kind is BufferKind.TILE and q.slots == 1  # Q has no for-loop dim: loaded once
    k_tile = plans[1].buffer_of(1)
    assert [plans[s].buffer_of(1).size for s in (1, 2, 3)] == [k_tile.size * s for s in (1, 2, 3)]
    assert plans[1].total < plans[2].total < plans[3].total


def test_loop_state_lives_through_the_loop_and_register_accumulators_only_after():
    block, schedule, registers, layouts = next(_kernels("gqa_b1"))
    plan = plan_memory(block, schedule, registers, layouts)
    loop_levels = len(schedule.levels(Phase.LOOP))
    (register_acc,) = registers.accumulators
    write_back = plan.buffer_of(register_acc)
    running = next(b for b in plan.buffers if b.kind is BufferKind.RUNNING_MAX)
    assert running.slots == 2 and running.end - running.start + 1 >= loop_levels
    assert write_back.start > running.end  # only after the loop
    for b in plan.buffers:
        if b.kind is BufferKind.ACCUMULATOR and b.node != register_acc:
            assert b.start <= running.start and b.end >= running.end
    # accumulators are fp32: the [1, 16, 64] numerator takes 4 KiB
    assert write_back.slot_bytes == 16 * 64 * 4


def test_register_accumulators_save_shared_memory():
    (block,) = fuse_thread_graphs(matmul_chain())[0].block_graphs()
    with_registers = plan_registers(block)
    without = plan_registers(block, RegisterOptions(epilogues=False))
    a = plan_memory(block, build_schedule(block, with_registers), with_registers)
    b = plan_memory(block, build_schedule(block, without), without)
    assert {x.node for x in a.buffers} < {x.node for x in b.buffers}
    assert a.total < b.total


def test_a_plan_over_the_target_raises():
    block, schedule, registers, layouts = next(_kernels("gqa_b1"))
    tiny = dataclasses.replace(DEFAULT_TARGET, smem_per_block=16 * 1024)
    with pytest.raises(SharedMemoryError, match="fewer pipeline stages"):
        plan_memory(block, schedule, registers, layouts, tiny)


GAPS = [(0, 256), (512, 1024), (2048, 384), (4096, -1)]


@pytest.mark.parametrize(("fit", "size", "offset"), [
    (first_fit, 256, 0), (first_fit, 300, 512), (first_fit, 2000, 4096),
    (best_fit, 300, 2048), (best_fit, 1000, 512), (best_fit, 2000, 4096),
    (worst_fit, 128, 512), (worst_fit, 2000, 4096),
])
def test_fits_choose_their_gap(fit, size, offset):
    assert fit(GAPS, size) == offset


def test_fits_differ_and_best_fit_fills_the_right_hole():
    # at level 2 two holes are free, 512 B at 0 and 384 B at 896, split by a live buffer; a 256 B
    # buffer comes, then a 512 B one: only best-fit leaves the 512 B hole for the second
    tile = BufferKind.TILE
    buffers = [Buffer(0, tile, 1, 512, 0, 1), Buffer(1, tile, 1, 384, 0, 3), Buffer(2, tile, 1, 384, 0, 1),
               Buffer(3, tile, 1, 128, 0, 3), Buffer(4, tile, 1, 256, 2, 3), Buffer(5, tile, 1, 512, 3, 3)]
    peaks = {}
    for name, fit in FITS.items():
        placed = place(buffers, fit, ORDERS["by_start"])
        peaks[name] = max(b.offset + b.size for b in placed)
        for i, a in enumerate(placed):
            for b in placed[i + 1:]:
                disjoint = a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
                assert not a.overlaps_in_time(b) or disjoint
    assert peaks == {"first_fit": 1920, "best_fit": 1408, "worst_fit": 1920}


def test_every_graph_defined_op_gets_a_plan_and_outputs_take_no_memory():
    for block, schedule, registers, layouts in _kernels("rmsnorm_b1"):
        plan = plan_memory(block, schedule, registers, layouts)
        nodes = {b.node for b in plan.buffers}
        assert not nodes & set(block.output_nodes)
        assert all(block.nodes[n].op is not Op.OUTPUT for n in nodes)
