"""The search's µGraphs are timed on the GPU in the cost model's order, the first 16 only, and without
a GPU the first is kept; the cost model prices a one-step loop body the same whether the division
comes inside the loop (a form the online-softmax chain does not match: op by op, several times slower)
or after it. ``fused_first`` ranks µGraphs with attention kernels off the chain after the others."""

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel
from mirage.frontend.optimize import fused_first, op_by_op_attention

HEADS, TOKENS, DIM = 4, 64, 64


def _division_inside_the_loop() -> mi.KernelGraph:
    g = mi.new_kernel_graph("attention")
    q = g.new_input(dims=(HEADS, TOKENS, DIM), dtype=mi.float16, name="Q")
    k = g.new_input(dims=(HEADS, DIM, TOKENS), dtype=mi.float16, name="K")
    v = g.new_input(dims=(HEADS, TOKENS, DIM), dtype=mi.float16, name="V")
    tb = mi.new_threadblock_graph(grid_dim=(HEADS, 1, TOKENS // 16), forloop_range=1, reduction_dimx=DIM)
    bq = tb.new_input(q, input_map=(0, -1, 1), forloop_dim=-1)
    bk = tb.new_input(k, input_map=(0, -1, -1), forloop_dim=2)
    bv = tb.new_input(v, input_map=(0, -1, -1), forloop_dim=1)
    e = tb.exp(tb.mul_scalar(tb.matmul(bq, bk), 0.125))
    tb.new_output(tb.forloop_accum(tb.div(tb.matmul(e, bv), tb.reduction(e, 2))), output_map=(0, -1, 1))
    (out,) = g.customized([q, k, v], tb)
    g.mark_output(out)
    return g.freeze()


def _reference() -> mi.KernelGraph:
    g = mi.new_kernel_graph("attention")
    q = g.new_input(dims=(HEADS, TOKENS, DIM), dtype=mi.float16, name="Q")
    k = g.new_input(dims=(HEADS, DIM, TOKENS), dtype=mi.float16, name="K")
    v = g.new_input(dims=(HEADS, TOKENS, DIM), dtype=mi.float16, name="V")
    e = g.exp(g.mul_scalar(g.matmul(q, k), 0.125))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
    return g.freeze()


def test_attention_kernels_off_the_chain_are_counted():
    chain = one_kernel(HEADS, TOKENS, TOKENS, DIM, rows=16, key_tile=TOKENS)
    assert op_by_op_attention(chain) == 0
    assert op_by_op_attention(_division_inside_the_loop()) == 1
    assert op_by_op_attention(_reference()) == 0  # kernel-level ops only: nothing graph-defined


def test_fused_forms_come_first_and_the_rest_keep_their_order():
    inside, other = _division_inside_the_loop(), _division_inside_the_loop()
    chain = one_kernel(HEADS, TOKENS, TOKENS, DIM, rows=16, key_tile=TOKENS)
    found, note, graphs = fused_first(_reference(), inside, "searched", [inside, other, chain])
    assert found is chain and graphs == [inside, other]
    assert note == "searched; 2 with attention kernels off the online-softmax chain ranked after the others"
    # already in order, or nothing to check: unchanged
    assert fused_first(_reference(), chain, "n", [chain, inside]) == (chain, "n", [chain, inside])
    product = mi.new_kernel_graph()
    x = product.new_input(dims=(16, 16), dtype=mi.float16)
    product.mark_output(product.matmul(x, x))
    plain = product.freeze()
    assert fused_first(plain, plain, "n", [plain]) == (plain, "n", [plain])


def test_an_exp_beside_a_product_is_no_attention():
    """softmax(X) · W in one kernel (the exp feeds the product but comes from no product) is lowered op
    by op as it should be: it does not count, so such one-kernel forms keep their rank."""
    g = mi.new_kernel_graph("softmax_projection")
    x = g.new_input(dims=(16, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 64), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=1, reduction_dimx=64)
    bx, bw = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=-1), tb.new_input(w, (-1, -1, -1), 0)
    e = tb.exp(bx)
    tb.new_output(tb.forloop_accum(tb.div(tb.matmul(e, bw), tb.reduction(e, 1))), output_map=(-1, -1, -1))
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    assert op_by_op_attention(g.freeze()) == 0
