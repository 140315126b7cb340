"""Scheduling by depth: every read after its write, barriers only between depths."""

from __future__ import annotations

import pytest
from optimizer_graphs import elementwise_tree, matmul_chain

from benchmarks.mugraphs import CASES
from mirage.mugraph.ops import Op
from mirage.optimizer.fusion import fuse_thread_graphs
from mirage.optimizer.registers import RegisterOptions, plan_registers
from mirage.optimizer.schedule import Action, Barrier, Phase, Step, build_schedule, naive_barriers, phases
from mirage.optimizer.softmax import online_softmax


def _blocks(name: str):
    graph, _ = online_softmax(CASES[name].fused())
    graph, _ = fuse_thread_graphs(graph)
    return graph.block_graphs()


ALL_BLOCKS = [(name, i) for name in CASES for i in range(len(_blocks(name)))]


def _positions(schedule):
    """Per node: (index in items, number of barriers before it) of its main step."""
    seen, barriers = {}, 0
    for k, item in enumerate(schedule.items):
        if isinstance(item, Barrier):
            barriers += 1
        elif item.action is not Action.FINALIZE:
            seen[item.node] = (k, barriers)
    return seen


@pytest.mark.parametrize(("name", "index"), ALL_BLOCKS)
def test_every_read_comes_after_a_barrier_following_its_write(name, index):
    block = _blocks(name)[index]
    registers = plan_registers(block)
    schedule = build_schedule(block, registers)
    epilogue_of = dict(registers.epilogues)
    prologue_of = dict(registers.prologues)
    at = _positions(schedule)
    assert sorted(at) == list(range(len(block.nodes)))  # each node exactly once
    finalized = {s.node: k for k, s in enumerate(schedule.items) if isinstance(s, Step) and
                 s.action is Action.FINALIZE}
    for i, node in enumerate(block.nodes):
        for r in node.inputs:
            (k_read, b_read), (k_write, b_write) = at[i], at[r.node]
            assert k_write < k_read, f"%{i} runs before its input %{r.node}"
            if epilogue_of.get(i) == r.node:
                assert b_read == b_write  # the epilogue runs on the producer's registers
            elif prologue_of.get(r.node) == i:
                assert b_read == b_write  # the prologue runs inside its reduction, on what it reads
            elif r.node in finalized:
                barriers_before = sum(isinstance(x, Barrier) for x in schedule.items[:finalized[r.node]])
                assert b_read > barriers_before  # read after the write-back, across a barrier
            else:
                assert b_read > b_write, f"%{i} reads %{r.node} without a barrier in between"


@pytest.mark.parametrize(("name", "index"), ALL_BLOCKS)
def test_barriers_only_between_depths(name, index):
    block = _blocks(name)[index]
    schedule = build_schedule(block, plan_registers(block))
    for phase in Phase:
        depths = [s.depth for s in schedule.phase_items(phase) if isinstance(s, Step)]
        assert depths == sorted(depths)
        inner = [b for b in schedule.phase_items(phase) if isinstance(b, Barrier) and "depth" in b.reason]
        assert len(inner) == max(len(set(depths)) - 1, 0)
    assert schedule.barriers_executed() < naive_barriers(block)


def test_gqa_phases_hoist_the_query_and_loop_over_keys():
    kernel1, _ = _blocks("qknorm_b1")
    phase = phases(kernel1)
    inputs = [i for i, n in enumerate(kernel1.nodes) if n.op is Op.INPUT]
    assert [phase[i] for i in inputs] == [Phase.PRE_LOOP, Phase.LOOP, Phase.LOOP]
    rms = next(i for i, n in enumerate(kernel1.nodes) if n.op is Op.RMS_NORM)
    assert phase[rms] is Phase.PRE_LOOP  # rms_norm(Q) does not depend on the loop
    assert all(phase[i] is Phase.POST_LOOP for i in kernel1.output_nodes)
    assert phases(kernel1, hoist_invariants=False)[rms] is Phase.LOOP


def test_levels_and_barrier_count_of_a_gemm():
    (block,) = fuse_thread_graphs(matmul_chain())[0].block_graphs()
    schedule = build_schedule(block, plan_registers(block))
    # loop: loads | matmul, its scaling epilogue, register accumulate | end of iteration
    assert schedule.levels(Phase.LOOP) == ((0, 1), (2, 3, 4))
    assert [s.action for s in schedule.phase_items(Phase.LOOP) if isinstance(s, Step)] == \
        [Action.LOAD, Action.LOAD, Action.COMPUTE, Action.COMPUTE, Action.ACCUMULATE]
    # after the loop: write the register accumulator back, then silu, then store
    assert schedule.levels(Phase.POST_LOOP) == ((4,), (5,), (6,))
    assert schedule.barriers_executed() == 4 * 2 + 2
    without = build_schedule(block, plan_registers(block, RegisterOptions(epilogues=False)))
    assert without.barriers_executed() == 4 * 4 + 1


def test_schedule_without_register_plan_syncs_between_all_dependent_ops():
    (block,) = fuse_thread_graphs(elementwise_tree())[0].block_graphs()
    schedule = build_schedule(block)
    assert all(s.epilogue_of is None for s in schedule.steps)
    assert schedule.depths and len(schedule.depths) == len(block.nodes)


def test_a_one_iteration_loop_hoists_nothing():
    """With forloop_range 1 the pre-loop phase only loads, so ops can chain as epilogues."""
    (block,) = _blocks("ntrans_b1")
    phase = phases(block)
    assert [phase[i] for i, n in enumerate(block.nodes) if n.op is Op.INPUT] == [Phase.PRE_LOOP] * 3
    computed = [i for i, n in enumerate(block.nodes) if n.op in (Op.RMS_NORM, Op.FUSED, Op.ACCUM)]
    assert computed and all(phase[i] is Phase.LOOP for i in computed)
    accum = next(i for i, n in enumerate(block.nodes) if n.op is Op.ACCUM)
    assert block.nodes[dict(plan_registers(block).epilogues)[accum]].op is Op.RMS_NORM
