"""The split-K GEMV of the weight-streaming probe (``benchmarks.stream_floor.split_k_gemv``) is the
product it times: kernel 1's partial products per K split, added by kernel 2."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.stream_floor import split_k_gemv
from mirage.mugraph.interpret import interpret


@pytest.mark.parametrize("b, n_blocks, k_splits, iters", [(1, 32, 4, 4), (8, 16, 16, 2)])
def test_split_k_gemv_is_x_times_w(b, n_blocks, k_splits, iters):
    graph = split_k_gemv(b, n_blocks, k_splits, iters, 256)
    assert [k.grid_dim for k in graph.block_graphs()] == [(n_blocks, k_splits, 1), (n_blocks, 1, 1)]
    rng = np.random.default_rng(b)
    x = rng.standard_normal((1, 2 * b, 4096)).astype(np.float16)
    w = rng.standard_normal((1, 4096, 6144)).astype(np.float16)
    (out,) = interpret(graph, [x, w], dtype=np.float64)
    want = x[0].astype(np.float64) @ w[0].astype(np.float64)
    assert np.asarray(out).shape == (1, 2 * b, 6144)
    assert np.abs(np.asarray(out)[0] - want).max() <= 1e-9 * np.abs(want).max()


class _Program:
    """Stands for a build: ``launch`` returns what ``compute`` makes of the inputs."""

    def __init__(self, compute):
        self.compute = compute

    def launch(self, inputs):
        return [self.compute(*inputs)]


def test_relative_error_tells_the_product_from_something_else():
    """The probes' check (``rms_forms.relative_error``): small for the function, large for another."""
    torch = pytest.importorskip("torch")
    from benchmarks.rms_forms import relative_error

    gen = torch.Generator().manual_seed(0)
    x, g, w = (torch.randn(s, generator=gen).half() for s in ((2, 64), (64,), (64, 96)))
    product = _Program(lambda x, g, w: (x.float() @ w.float()).half())
    assert relative_error(product, [x, g, w]) < 1e-3
    assert relative_error(product, [x, g, w], norm=True) > 0.1  # not rmsnorm's function
    rmsnorm = _Program(lambda x, g, w: ((x.float() / (x.float().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
                                         * g.float()) @ w.float()).half())
    assert relative_error(rmsnorm, [x, g, w], norm=True) < 1e-3
    columns = _Program(lambda x, g, w: (x.float() @ w.float()).sum(-1, keepdim=True).half())  # the old bug
    assert relative_error(columns, [x, g, w]) == float("inf")  # a (2, 1) output: another function
