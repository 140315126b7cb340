"""The online-softmax rewrite of a log of shifted exps (logsumexp, log_softmax): the log adds the row
maxima back, so the result is PyTorch's in float32 where the LAX form overflows to inf or underflows
to log 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from optimizer_graphs import assert_same_function, interpret, logsumexp_block

import mirage as mi
from mirage.mugraph.algebra import FloatAlgebra
from mirage.mugraph.ops import Op
from mirage.optimizer.softmax import online_softmax


def _kernel_form() -> mi.KernelGraph:
    g = mi.new_kernel_graph("log_softmax")
    x = g.new_input(dims=(16, 256), dtype=mi.float32)
    g.mark_output(g.sub(x, g.log(g.reduction(g.exp(x), 1))))
    return mi.as_graph(g)


def _logits() -> np.ndarray:
    """Rows far above exp's float32 range, far below it, all −inf, and one +inf-free row of −inf keys."""
    x = np.random.default_rng(0).standard_normal((16, 256)).astype(np.float32) * 30
    x[0] += 500
    x[1] -= 500
    x[2] = -np.inf
    x[3, ::2] = -np.inf
    return x


CASES = {
    "logsumexp, one step": (lambda: logsumexp_block(1, False), torch.logsumexp, True),
    "logsumexp, four steps (running max)": (lambda: logsumexp_block(4, False), torch.logsumexp, True),
    "log_softmax, one step": (lambda: logsumexp_block(1, True), torch.log_softmax, True),
    "log_softmax, kernel level": (_kernel_form, torch.log_softmax, False),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_log_of_shifted_exps_is_pytorchs_in_float32(case):
    build, fn, in_block = case
    graph = build()
    stable, result = online_softmax(graph)
    assert result.applied and not result.skipped
    assert (result.rewritten[0].kernel == -1) != in_block
    if in_block:
        mi.check(stable)
    assert_same_function(graph, stable)
    x = _logits()
    (got,) = interpret(stable, [x], FloatAlgebra(np.float32))
    want = fn(torch.from_numpy(x).double(), -1)
    want = want.unsqueeze(-1).numpy() if fn is torch.logsumexp else want.numpy()
    with np.errstate(all="ignore"):
        (lax,) = interpret(graph, [x], FloatAlgebra(np.float32))
    finite = np.isfinite(want)
    assert not np.array_equal(np.isfinite(lax), finite)  # the LAX form is off on the far rows
    # PyTorch: −inf for a row all −inf (logsumexp), NaN there (log_softmax): the same here
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-4)


def test_the_log_reads_the_maximum_of_its_place():
    """In the loop the running max; after it, the maximum over all steps (an accumulator of kind max)."""
    stable, _ = online_softmax(logsumexp_block(4, False))
    (block,) = stable.block_graphs()
    log = next(i for i, n in enumerate(block.nodes) if n.op is Op.LOG)
    (add,) = [n for n in block.nodes if n.op is Op.ADD and n.inputs[0].node == log]
    maximum = block.nodes[add.inputs[1].node]
    assert maximum.op is Op.ACCUM and maximum.attrs.kind.value == "max"


def test_a_log_of_a_squared_sum_adds_twice_the_maximum():
    """log((Σ exp x)²) = 2·logsumexp(x): the rewrite adds 2·m."""
    g = mi.new_kernel_graph("log_square")
    x = g.new_input(dims=(16, 256), dtype=mi.float32)
    s = g.reduction(g.exp(x), 1)
    g.mark_output(g.log(g.mul(s, s)))
    graph = mi.as_graph(g)
    stable, result = online_softmax(graph)
    assert result.applied
    assert Op.MUL_SCALAR in [n.op for n in stable.nodes]
    x = _logits()[:, :]
    x[2] = 0.0
    (got,) = interpret(stable, [x], FloatAlgebra(np.float32))
    want = 2 * torch.logsumexp(torch.from_numpy(x).double(), -1, keepdim=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_the_rewrite_of_a_logsumexp_is_idempotent():
    stable, _ = online_softmax(_kernel_form())
    again, second = online_softmax(stable)
    assert again == stable and not second.applied
