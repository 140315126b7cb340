"""The LAX classifier on a table of graphs."""

from __future__ import annotations

import pytest
from verifier_graphs import small_attention, tiled_matmul

import mirage as mi
from mirage.mugraph.ops import Op
from mirage.verifier import Guarantee, classify


def kernel(build, shapes=((4, 6), (6, 4))):
    g = mi.new_kernel_graph()
    xs = [g.new_input(dims=s, dtype=mi.float16) for s in shapes]
    g.mark_output(build(g, *xs))
    return g.freeze()


def exp_after_block() -> mi.KernelGraph:
    """An exp inside a block graph, then another on its output at the kernel level: 2 on one path."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=1)
    bx = tb.new_input(x, input_map=(0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.exp(bx)), output_map=(0, -1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(g.exp(y))
    return g.freeze()


def block_with(acc: str) -> mi.KernelGraph:
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=2)
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    out = tb.forloop_accum_max(bx) if acc == "max" else tb.forloop_accum(bx, acc=acc)
    tb.new_output(out, output_map=(0, -1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(y)
    return g.freeze()


# (name, graph, in fragment, exps per path, guarantee, has sqrt)
CASES = [
    ("matmul", kernel(lambda g, x, w: g.matmul(x, w)), True, 0, Guarantee.THEOREM, False),
    ("exp", kernel(lambda g, x, w: g.exp(g.matmul(x, w))), True, 1, Guarantee.THEOREM, False),
    ("two exps side by side", kernel(lambda g, x, w: g.add(g.exp(x), g.exp(x)), ((4, 6),) * 2), True, 1,
     Guarantee.THEOREM, False),
    ("nested exps", kernel(lambda g, x, w: g.exp(g.exp(x))), False, 2, Guarantee.NONE, False),
    ("exp in a block then at kernel level", exp_after_block(), False, 2, Guarantee.NONE, False),
    ("rms_norm", kernel(lambda g, x, w: g.rms_norm(x)), True, 0, Guarantee.UNINTERPRETED, True),
    ("rms accumulator", block_with("rms"), True, 0, Guarantee.UNINTERPRETED, True),
    ("max accumulator", block_with("max"), False, 0, Guarantee.NONE, False),
    ("silu", kernel(lambda g, x, w: g.silu(g.matmul(x, w))), False, 0, Guarantee.UNINTERPRETED, False),
    ("relu", kernel(lambda g, x, w: g.relu(x)), False, 0, Guarantee.UNINTERPRETED, False),
    ("reduction_max", kernel(lambda g, x, w: g.reduction_max(x, 1)), False, 0, Guarantee.NONE, False),
    ("attention", small_attention(), True, 1, Guarantee.THEOREM, False),
    ("tiled matmul with silu", tiled_matmul(epilogue="silu"), False, 0, Guarantee.UNINTERPRETED, False),
]


@pytest.mark.parametrize("name, graph, in_fragment, exps, guarantee, has_sqrt", CASES,
                         ids=[row[0] for row in CASES])
def test_classification(name, graph, in_fragment, exps, guarantee, has_sqrt):
    info = classify(graph)
    assert (info.in_fragment, info.max_exps_per_path, info.guarantee, info.has_sqrt) == (
        in_fragment, exps, guarantee, has_sqrt)
    assert info.fingerprintable == (guarantee is not Guarantee.NONE)
    assert bool(info.reason) == (not in_fragment)


def test_reasons_name_the_offending_ops():
    info = classify(kernel(lambda g, x, w: g.silu(g.reduction_max(g.exp(g.exp(x)), 1))))
    assert "2 exps" in info.reason and "reduction_max" in info.reason and "silu" in info.reason
    assert Op.SILU in info.uninterpreted_ops and Op.REDUCTION_MAX in info.order_based_ops
