"""Layout selection: the z3 optimum is exact, honours the costs, and obeys every rule."""

from __future__ import annotations

import pytest
from optimizer_graphs import matmul_chain

import mirage as mi
from benchmarks.mugraphs import CASES
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import Ref, TensorType
from mirage.mugraph.ops import Op
from mirage.mugraph.target import Target
from mirage.optimizer.errors import LayoutError
from mirage.optimizer.fusion import fuse_thread_graphs
from mirage.optimizer.layout import LayoutCosts, layout_rules, select_layouts, strides
from mirage.optimizer.layout_model import Choice, Is, Rule, assignments, evaluate, solve


def _copy_kernel(shape=(16, 24), dtype=mi.float16):
    """One input tile, an element-wise accumulator and an output: small enough to brute-force."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=shape, dtype=dtype)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=1)
    tb.new_output(tb.forloop_accum(tb.new_input(x)))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g.freeze()


@pytest.mark.parametrize("shape", [(16, 24), (64, 3), (8, 1)])
@pytest.mark.parametrize("costs", [LayoutCosts(), LayoutCosts(padding_byte=100)],
                         ids=["default", "dear_padding"])
def test_z3_finds_the_brute_force_optimum(shape, costs):
    graph = _copy_kernel(shape)
    rules = layout_rules(graph, costs)
    feasible = [c for c in (evaluate(rules, a) for a in assignments(rules)) if c is not None]
    values, cost = solve(rules)
    assert evaluate(rules, values) == cost == min(feasible)


@pytest.mark.parametrize("name", ["gqa_b1", "rmsnorm_b1", "lora_m16", "gatedmlp_m1", "ntrans_b1"])
def test_benchmark_layouts_obey_every_rule(name):
    graph, _ = fuse_thread_graphs(CASES[name].fused())
    _, plan = select_layouts(graph)
    rules = layout_rules(graph)
    values = dict(plan.assignment)
    assert evaluate(rules, values) == plan.cost  # every hard constraint holds, the cost adds up
    assert sum(c for _, c in plan.breakdown) == plan.cost
    # the layouts are the assignment's
    for ref, layout in plan.device:
        assert values[f"inner_d{ref.node}_{ref.index}"] == layout.innermost_dim
    for (k, i), layout in plan.shared:
        assert values[f"inner_s{k}_{i}"] == layout.innermost_dim
        assert layout.swizzled_dims == tuple(d for d in range(len(layout.shape))
                                             if values.get(f"swizzle_s{k}_{i}_{d}"))
    # graph inputs and outputs are row-major; every tensor has a layout
    for k in graph.input_nodes:
        assert plan.of_device(Ref(k, 0)).innermost_dim == graph.nodes[k].outputs[0].rank - 1
    for r in graph.outputs:
        assert plan.of_device(r).strides[-1] == 1
    for k, node in enumerate(graph.nodes):
        if node.op is Op.CUSTOMIZED:
            tensors = {i for i, n in enumerate(node.attrs.nodes) if n.op is not Op.OUTPUT}
            assert set(plan.of_kernel(k)) == tensors


def test_matmul_operands_swizzle_the_dim_that_is_not_contiguous():
    graph, _ = fuse_thread_graphs(matmul_chain())
    _, plan = select_layouts(graph)
    block = graph.nodes[2].attrs
    matmul = next(i for i, n in enumerate(block.nodes) if n.op is Op.MATMUL)
    for r in (*block.nodes[matmul].inputs, Ref(matmul, 0)):
        layout = plan.of_shared(2, r.node)
        rank = len(layout.shape)
        assert layout.innermost_dim in (rank - 1, rank - 2)
        other = 2 * rank - 3 - layout.innermost_dim
        assert other in layout.swizzled_dims
        assert layout.innermost_dim not in layout.swizzled_dims


def test_costs_decide_between_padding_and_a_transposed_tile():
    graph = _copy_kernel((64, 3))  # rows of 3 halves pad to 8: 640 bytes of padding row-major
    _, cheap = select_layouts(graph)
    _, dear = select_layouts(graph, costs=LayoutCosts(padding_byte=100))
    assert cheap.of_shared(1, 0).innermost_dim == 1  # keeps cp.async (20000) over padding (640)
    assert dear.of_shared(1, 0).innermost_dim == 0  # 64000 of padding now outweighs it
    assert dict(dear.breakdown)["input_no_async_copy"] == LayoutCosts().input_no_async_copy
    assert dict(cheap.breakdown)["padding_byte"] == 2 * 640  # the input tile and the accumulator


def test_row_major_only_mode_fixes_every_tile():
    graph = _copy_kernel((64, 3))
    _, plan = select_layouts(graph, costs=LayoutCosts(padding_byte=100), free_innermost=False)
    assert all(t.innermost_dim == len(t.shape) - 1 for _, t in plan.shared)


def test_older_targets_pay_for_wide_copies_instead_of_cp_async():
    graph = _copy_kernel((64, 3))
    _, plan = select_layouts(graph, Target("V100", 70, 96 * 1024, 80), LayoutCosts(padding_byte=100))
    assert dict(plan.breakdown).get("input_no_wide_copy") == LayoutCosts().input_no_wide_copy
    assert "input_no_async_copy" not in dict(plan.breakdown)


STRIDES = [
    # shape, dtype, innermost, padded?, extra vector?, strides, elements spanned
    ((8, 3), DType.FLOAT16, 1, True, False, (8, 1), 64),
    ((8, 3), DType.FLOAT16, 0, True, False, (1, 8), 24),
    ((8, 3), DType.FLOAT16, 1, False, False, (3, 1), 24),
    ((2, 16, 1), DType.FLOAT16, 2, True, False, (16, 1, 1), 32),
    ((4, 6), DType.FLOAT32, 1, True, False, (8, 1), 32),
    ((1, 1), DType.FLOAT16, 1, True, False, (1, 1), 8),
    ((64, 32), DType.FLOAT16, 1, True, True, (40, 1), 2560),  # the device library's padded pitch
    ((1, 16, 64), DType.FLOAT16, 2, True, True, (1152, 72, 1), 1152),
]


@pytest.mark.parametrize(("shape", "dtype", "inner", "pad", "extra", "expected", "span"), STRIDES)
def test_strides_follow_the_innermost_first_order_with_16_byte_rows(shape, dtype, inner, pad, extra, expected,
                                                                    span):
    assert strides(TensorType(shape, dtype), inner, pad, extra) == (expected, span)


def test_swizzled_tiles_get_padded_rows_unless_switched_off():
    graph, _ = fuse_thread_graphs(matmul_chain())
    _, padded = select_layouts(graph)
    _, plain = select_layouts(graph, swizzle_by_padding=False)
    w_tile = padded.of_shared(2, 1)  # [64, 16] fp16, dim 0 swizzled
    assert w_tile.swizzled_dims == (0,) and w_tile.strides == (24, 1)
    assert plain.of_shared(2, 1).strides == (16, 1)


def test_contradictory_constraints_raise_a_layout_error():
    v = Choice("v", (0, 1))
    with pytest.raises(LayoutError, match="contradict"):
        solve([Rule("first", "t", Is(v, 0)), Rule("second", "t", Is(v, 1))])
