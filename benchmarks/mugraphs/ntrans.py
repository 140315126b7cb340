"""nGPT's normalized update ``rms(X + A * (rms(H) - X))`` (BENCHMARKS.md), H, X, A of shape (b, 4096)."""

from __future__ import annotations

import mirage as mi

EPS = 1e-6


def shapes(b: int) -> list[tuple[int, ...]]:
    return [(b, 4096)] * 3


def _update(g, h, x, a):
    return g.rms_norm(g.add(x, g.mul(a, g.sub(g.rms_norm(h, eps=EPS), x))), eps=EPS)


def reference(b: int) -> mi.KernelGraph:
    g = mi.new_kernel_graph("ntrans")
    h, x, a = (g.new_input(dims=s, dtype=mi.float16, name=n) for s, n in zip(shapes(b), "HXA", strict=True))
    g.mark_output(_update(g, h, x, a))
    return g.freeze()


def fused(b: int, threads: int = 128) -> mi.KernelGraph:
    """One kernel, one block of ``threads`` threads per row: the whole update stays on chip."""
    g = mi.new_kernel_graph("ntrans")
    h, x, a = (g.new_input(dims=s, dtype=mi.float16, name=n) for s, n in zip(shapes(b), "HXA", strict=True))
    tb = mi.new_threadblock_graph(grid_dim=(b, 1, 1), block_dim=(threads, 1, 1), forloop_range=1)
    bh, bx, ba = (tb.new_input(t, input_map=(0, -1, -1) if b > 1 else (-1, -1, -1)) for t in (h, x, a))
    out = tb.forloop_accum(_update(tb, bh, bx, ba))
    tb.new_output(out, output_map=(0, -1, -1) if b > 1 else (-1, -1, -1))
    (o,) = g.customized([h, x, a], tb)
    g.mark_output(o)
    return g.freeze()
