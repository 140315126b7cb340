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
