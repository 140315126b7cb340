"""Epilogues and register-resident accumulators."""

from __future__ import annotations

import pytest
from optimizer_graphs import matmul_chain

from benchmarks.mugraphs import CASES
from mirage.mugraph.graph import AccumKind, Ref
from mirage.mugraph.ops import Op
from mirage.optimizer.fusion import fuse_thread_graphs
from mirage.optimizer.registers import EPILOGUE_PRODUCERS, RegisterOptions, plan_registers
from mirage.optimizer.softmax import online_softmax


def _block(graph, index: int = 0):
    graph, _ = online_softmax(graph)
    return fuse_thread_graphs(graph)[0].block_graphs()[index]


@pytest.mark.parametrize("name", list(CASES))
def test_epilogues_obey_mirages_rules(name):
    graph, _ = online_softmax(CASES[name].fused())
    for block in fuse_thread_graphs(graph)[0].block_graphs():
        plan = plan_registers(block)
        uses = block.consumers()
        for consumer, producer in plan.epilogues:
            c, p = block.nodes[consumer], block.nodes[producer]
            assert p.op in EPILOGUE_PRODUCERS  # never an input, an accumulator or a max
            assert set(uses[Ref(producer, 0)]) == {consumer}  # nobody else needs it in shared memory
            assert c.outputs[0].shape == p.outputs[0].shape  # read element for element
            if c.op is not Op.FUSED:
                assert c.op in (Op.ACCUM, Op.ACCUM_RESCALE)
                assert c.attrs.kind in (AccumKind.NONE, AccumKind.MAX)
        assert plan.registers_per_thread <= plan.budget
        for a in plan.accumulators:
            assert a in dict(plan.epilogues)


def test_gated_mlp_keeps_both_accumulators_in_registers():
    block = _block(CASES["gatedmlp_m8"].fused())
    plan = plan_registers(block)
    matmuls = [i for i, n in enumerate(block.nodes) if n.op is Op.MATMUL]
    accumulators = [i for i, n in enumerate(block.nodes) if n.op is Op.ACCUM]
    assert plan.accumulators == tuple(accumulators)
    assert set(plan.register_only) == set(matmuls)
    # [8, 32] fp32 over 128 threads: 2 registers each, on top of the base estimate
    assert plan.registers_per_thread == RegisterOptions().base_registers + 2 * 2


def test_the_register_budget_is_honoured():
    block = _block(CASES["gatedmlp_m8"].fused())
    base = RegisterOptions().base_registers
    assert len(plan_registers(block, RegisterOptions(register_budget=base + 2)).accumulators) == 1
    assert plan_registers(block, RegisterOptions(register_budget=base + 1)).accumulators == ()
    assert plan_registers(block, RegisterOptions(register_accumulators=False)).accumulators == ()


def test_attention_numerator_is_a_register_accumulator_but_the_sum_is_not():
    block = _block(CASES["gqa_b1"].fused())
    plan = plan_registers(block)
    (acc,) = plan.accumulators
    node = block.nodes[acc]
    assert node.op is Op.ACCUM_RESCALE and node.outputs[0].shape == (1, 16, 64)
    producer = block.nodes[dict(plan.epilogues)[acc]]
    assert producer.op is Op.MATMUL


def test_a_chain_matmul_scale_accumulate_stays_in_registers():
    (block,) = fuse_thread_graphs(matmul_chain())[0].block_graphs()
    plan = plan_registers(block)
    ops = {i: n.op for i, n in enumerate(block.nodes)}
    (acc,) = plan.accumulators
    scale = dict(plan.epilogues)[acc]
    assert ops[scale] is Op.FUSED and ops[dict(plan.epilogues)[scale]] is Op.MATMUL


def _two_products(second_is_product: bool):
    import mirage as mi

    g = mi.new_kernel_graph()
    a, b, c = (g.new_input(dims=s, dtype=mi.float16) for s in [(16, 32), (32, 16), (16, 16)])
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=1)
    ta, tb_, tc = tb.new_input(a), tb.new_input(b), tb.new_input(c)
    first = tb.matmul(ta, tb_)
    other = tb.matmul(tc, tc) if second_is_product else tc
    tb.new_output(tb.forloop_accum(tb.add(first, other)))
    (o,) = g.customized([a, b, c], tb)
    g.mark_output(o)
    return fuse_thread_graphs(g.freeze())[0].block_graphs()[0]


def test_binary_consumer_is_an_epilogue_only_when_its_other_operand_is_ready():
    ready = _two_products(second_is_product=False)  # matmul + an input tile: the input is loaded before
    plan = plan_registers(ready)
    fused = next(i for i, n in enumerate(ready.nodes) if n.op is Op.FUSED)
    assert ready.nodes[dict(plan.epilogues)[fused]].op is Op.MATMUL
    same_depth = _two_products(second_is_product=True)  # matmul + matmul: both at depth 1
    plan = plan_registers(same_depth)
    fused = next(i for i, n in enumerate(same_depth.nodes) if n.op is Op.FUSED)
    assert fused not in dict(plan.epilogues)


def test_epilogues_can_be_switched_off():
    block = _block(CASES["gatedmlp_m8"].fused())
    plan = plan_registers(block, RegisterOptions(epilogues=False))
    assert plan.epilogues == () and plan.accumulators == () and plan.register_only == frozenset()


# ---- prologues: an element-wise producer run inside the reduction that reads it ---------------------


def _key_norm_block():
    import mirage as mi
    from benchmarks.variants import _normalized_keys

    g = mi.new_kernel_graph()
    k = g.new_input(dims=(2, 64, 4096), dtype=mi.float16)
    g.mark_output(_normalized_keys(g, k, 2, 64))  # k / sqrt(mean(square(k), dim 1) + eps)
    return _block(g.freeze())


def test_square_runs_inside_the_reduction_of_its_squares():
    block = _key_norm_block()
    plan = plan_registers(block)
    ((producer, reduction),) = plan.prologues
    assert block.nodes[producer].op is Op.FUSED and block.nodes[reduction].op is Op.REDUCTION
    assert block.nodes[reduction].inputs[0].node == producer
    assert producer in plan.register_only  # never stored
    from mirage.optimizer.schedule import build_schedule

    schedule = build_schedule(block, plan)
    (step,) = [s for s in schedule.items if getattr(s, "node", None) == producer]
    assert step.prologue_of == reduction
    off = plan_registers(block, RegisterOptions(prologues=False))
    assert off.prologues == () and producer not in off.register_only
    # the reduction runs a level earlier: no step of squares and no barrier after it
    depth_on = {node: d for node, _, d in schedule.depths}
    depth_off = {node: d for node, _, d in build_schedule(block, off).depths}
    assert depth_on[reduction] == depth_off[reduction] - 1


def test_prologue_lowering_reads_the_operand_through_the_function():
    import mirage as mi
    from benchmarks.variants import _normalized_keys
    from mirage.codegen.lower_program import generate_cuda_program

    g = mi.new_kernel_graph()
    k = g.new_input(dims=(2, 64, 4096), dtype=mi.float16)
    g.mark_output(_normalized_keys(g, k, 2, 64))
    code = generate_cuda_program(g.freeze()).code
    reduce_line = next(line for line in code.splitlines() if "reduce_apply<" in line)
    assert "mirage::dev::Identity" not in reduce_line and "_f" in reduce_line  # the square's functor
    assert code.count("map_apply<") == 1  # only the division; no pass of squares
