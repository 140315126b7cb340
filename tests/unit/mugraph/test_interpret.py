"""The block interpreter against a literal, loop-by-loop reading of the tiling formula."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mirage as mi


def literal_tile(source, input_map, forloop_dim, grid, forloop_range, block, r):
    """mirage-notes §1.3, line by line: off[d] = b_a; off[f] = off[f]·R + r; off[d] *= T[d]."""
    shape = list(source.shape)
    tile = list(shape)
    for a, d in enumerate(input_map):
        if d >= 0 and grid[a] > 1:
            tile[d] //= grid[a]
    if forloop_dim >= 0:
        tile[forloop_dim] //= forloop_range
    off = [0] * len(shape)
    for a, d in enumerate(input_map):
        if d >= 0 and grid[a] > 1:
            off[d] = block[a]
    if forloop_dim >= 0:
        off[forloop_dim] = off[forloop_dim] * forloop_range + r
    off = [o * t for o, t in zip(off, tile, strict=True)]
    return source[tuple(slice(o, o + t) for o, t in zip(off, tile, strict=True))]


def literal_run(source_a, source_b, maps, grid, forloop_range, output_map):
    """out = Σ_r (A_r @ B_r) per block, saved with output_map — by explicit loops."""
    (ma, fa), (mb, fb) = maps
    out_tiles = {}
    for block in itertools.product(*(range(g) for g in grid)):
        acc = 0
        for r in range(forloop_range):
            a = literal_tile(source_a, ma, fa, grid, forloop_range, block, r)
            b = literal_tile(source_b, mb, fb, grid, forloop_range, block, r)
            acc = acc + a @ b
        out_tiles[block] = acc
    tile = next(iter(out_tiles.values()))
    shape = list(tile.shape)
    for a, d in enumerate(output_map):
        if d >= 0:
            shape[d] *= grid[a]
    out = np.full(shape, np.nan)
    for block, t in out_tiles.items():
        off = [0] * len(shape)
        for a, d in enumerate(output_map):
            if d >= 0:
                off[d] = block[a] * t.shape[d]
        out[tuple(slice(o, o + s) for o, s in zip(off, t.shape, strict=True))] = t
    return out


CASES = [
    # (A shape, B shape, A map, B map, grid, R, output map)
    ((8, 64), (64, 48), ((-1, -1, -1), 1), ((1, -1, -1), 0), (4, 1, 1), 4, (1, -1, -1)),
    ((8, 64), (64, 48), ((0, -1, -1), 1), ((-1, 1, -1), 0), (2, 3, 1), 2, (0, 1, -1)),
    ((4, 8, 32), (4, 32, 16), ((0, 1, -1), 2), ((0, -1, -1), 1), (2, 4, 1), 8, (0, 1, -1)),
    ((4, 8, 32), (4, 32, 16), ((0, -1, 1), -1), ((0, 2, -1), -1), (4, 2, 2), 1, (0, 2, 1)),
    ((6, 16), (16, 10), ((-1, 0, -1), 1), ((-1, -1, -1), 0), (1, 3, 1), 8, (-1, 0, -1)),
]


@pytest.mark.parametrize("a_shape,b_shape,a_map,b_map,grid,R,omap", CASES)
def test_interpreter_matches_literal_loops(a_shape, b_shape, a_map, b_map, grid, R, omap):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    g = mi.new_kernel_graph()
    A = g.new_input(dims=a_shape, dtype=mi.float32)
    B = g.new_input(dims=b_shape, dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid_dim=grid, forloop_range=R)
    ta = tb.new_input(A, input_map=a_map[0], forloop_dim=a_map[1])
    tb_ = tb.new_input(B, input_map=b_map[0], forloop_dim=b_map[1])
    tb.new_output(tb.forloop_accum(tb.matmul(ta, tb_)), output_map=omap)
    (result,) = g.customized([A, B], tb)
    g.mark_output(result)
    (got,) = mi.interpret(g, [a, b])
    expected = literal_run(a, b, (a_map, b_map), grid, R, omap)
    assert not np.isnan(expected).any()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("acc,expected", [
    (None, lambda x: x.reshape(2, 4, 8).sum(1)),
    ("sum", lambda x: x.sum(1, keepdims=True)),
    ("mean", lambda x: x.mean(1, keepdims=True)),
    ("rms", lambda x: np.sqrt((x * x).mean(1, keepdims=True) + 0.5)),
    ("sum_todimx", lambda x: x.reshape(2, 32 // 4, 4).sum(1)),
    ("max", lambda x: x.reshape(2, 4, 8).max(1)),
])
def test_accumulators(acc, expected):
    x = np.random.default_rng(2).standard_normal((2, 32))
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(2, 32), dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=4, reduction_dimx=4)
    t = tb.new_input(X, forloop_dim=1)
    tb.new_output(tb.forloop_accum_max(t) if acc == "max" else
                  tb.forloop_accum(t, acc=acc, eps=0.5 if acc == "rms" else 0.0))
    (result,) = g.customized([X], tb)
    g.mark_output(result)
    (got,) = mi.interpret(g, [x])
    np.testing.assert_allclose(got, expected(x), rtol=1e-12)


def test_online_softmax_helpers_give_a_stable_softmax():
    """running_max + accum_rescale compute softmax(S) @ V exactly, even where exp(S) overflows."""
    rng = np.random.default_rng(3)
    s, v = 900 * rng.standard_normal((4, 64)), rng.standard_normal((64, 8))
    g = mi.new_kernel_graph()
    S = g.new_input(dims=(4, 64), dtype=mi.float32)
    V = g.new_input(dims=(64, 8), dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=8)
    ts, tv = tb.new_input(S, forloop_dim=1), tb.new_input(V, forloop_dim=0)
    m = tb.running_max(tb.reduction_max(ts, 1))
    p = tb.exp(tb.sub(ts, m))
    total = tb.forloop_accum_rescale(p, m, acc="sum")
    numerator = tb.forloop_accum_rescale(tb.matmul(p, tv), m)
    tb.new_output(tb.div(numerator, total))
    (result,) = g.customized([S, V], tb)
    g.mark_output(result)
    (got,) = mi.interpret(g, [s, v], dtype=np.float32)
    e = np.exp(s - s.max(1, keepdims=True))
    expected = (e / e.sum(1, keepdims=True)) @ v
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_kernel_level_ops_match_numpy():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((3, 5)), rng.standard_normal((1, 5))
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(3, 5), dtype=mi.float32)
    Y = g.new_input(dims=(1, 5), dtype=mi.float32)
    g.mark_output(g.reduction(g.silu(g.sub(X, Y)), 1))
    g.mark_output(g.rms_norm(g.add_scalar(g.mul_scalar(X, 2.0), 1.0), eps=1e-6))
    a, b = mi.interpret(g, [x, y])
    d = x - y
    np.testing.assert_allclose(a, (d / (1 + np.exp(-d))).sum(1, keepdims=True), rtol=1e-12)
    z = 2 * x + 1
    np.testing.assert_allclose(b, z / np.sqrt((z * z).mean(1, keepdims=True) + 1e-6), rtol=1e-12)


def test_interpret_rejects_wrong_inputs():
    g = mi.new_kernel_graph()
    X = g.new_input(dims=(3, 5), dtype=mi.float32)
    g.mark_output(g.exp(X))
    with pytest.raises(mi.MirageError, match="shape"):
        mi.interpret(g, [np.zeros((5, 3))])
    with pytest.raises(mi.MirageError, match="1 inputs"):
        mi.interpret(g, [np.zeros((3, 5))] * 2)
