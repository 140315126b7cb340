"""Small graphs for the verifier's tests: seeded random kernel graphs and block-graph templates."""

from __future__ import annotations

import random

import mirage as mi
from benchmarks.mugraphs.attention import combine

SCALARS = (0.125, 0.5, 1.0 / 3.0, 2.0, -1.5, 1e-6)


def random_kernel_graph(seed: int, num_ops: int = 8, allow_opaque: bool = True) -> mi.KernelGraph:
    """A random LAX-ish kernel graph on inputs (2, 4), (4, 3), (2, 3), with at most one exp per path."""
    chooser = random.Random(seed)
    g = mi.new_kernel_graph(f"random{seed}")
    tensors = [g.new_input(dims=s, dtype=mi.float32) for s in ((2, 4), (4, 3), (2, 3))]
    exps = {id(t): 0 for t in tensors}

    def pick(predicate=lambda t: True):
        options = [t for t in tensors if predicate(t)]
        return chooser.choice(options) if options else None

    def record(t, count):
        tensors.append(t)
        exps[id(t)] = count

    unary = ["square", "mul_scalar", "add_scalar", "sqrt", "exp", "reduction", "rms_norm"]
    if allow_opaque:
        unary += ["silu", "gelu", "sigmoid"]
    for _ in range(num_ops):
        kind = chooser.choice(["unary", "binary", "binary", "matmul"])
        if kind == "unary":
            name = chooser.choice(unary)
            x = pick(lambda t: exps[id(t)] == 0) if name == "exp" else pick()
            if x is None:
                continue
            match name:
                case "mul_scalar" | "add_scalar":
                    y = getattr(g, name)(x, chooser.choice(SCALARS))
                case "reduction":
                    y = g.reduction(x, chooser.randrange(x.num_dims))
                case _:
                    y = getattr(g, name)(x)
            record(y, exps[id(x)] + (name == "exp"))
        elif kind == "binary":
            x = pick()
            y = pick(lambda t, x=x: all(a == b or 1 in (a, b) for a, b in zip(t.dims, x.dims, strict=True)))
            z = getattr(g, chooser.choice(["add", "sub", "mul", "div"]))(x, y)
            record(z, max(exps[id(x)], exps[id(y)]))
        else:
            x = pick()
            y = pick(lambda t, x=x: t.dims[0] == x.dims[-1])
            if y is None:
                continue
            record(g.matmul(x, y), max(exps[id(x)], exps[id(y)]))
    outputs = tensors[3:] or tensors
    for t in outputs[-2:]:
        g.mark_output(t)
    return g.freeze()


def tiled_matmul(grid: int = 2, iters: int = 2, accum: str | None = None, epilogue: str = "none",
                 rows: int = 4, inner: int = 8, cols: int = 6) -> mi.KernelGraph:
    """X (rows, inner) @ W (inner, cols) split over a grid on W's columns and a loop over ``inner``."""
    g = mi.new_kernel_graph("tiled")
    x = g.new_input(dims=(rows, inner), dtype=mi.float16)
    w = g.new_input(dims=(inner, cols), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), forloop_range=iters)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    product = tb.matmul(bx, bw)
    if epilogue == "exp":
        product = tb.exp(product)
    acc = tb.forloop_accum(product, acc=accum)
    if epilogue == "rms":
        acc = tb.div(acc, tb.forloop_accum(bx, acc="rms", eps=1e-6))
    if epilogue == "silu":
        acc = tb.silu(acc)
    tb.new_output(acc, output_map=(1, -1, -1) if grid > 1 else (-1, -1, -1))
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g.freeze()


def small_attention(heads: int = 2, queries: int = 4, keys: int = 8, dim: int = 4,
                    fused: bool = True, kv_splits: int = 2, iters: int = 2) -> mi.KernelGraph:
    """softmax(Q @ K / 2) @ V, as a reference graph or as the two-kernel FlashDecoding µGraph."""
    g = mi.new_kernel_graph("attention")
    q = g.new_input(dims=(heads, queries, dim), dtype=mi.float16)
    k = g.new_input(dims=(heads, dim, keys), dtype=mi.float16)
    v = g.new_input(dims=(heads, keys, dim), dtype=mi.float16)
    if not fused:
        e = g.exp(g.mul_scalar(g.matmul(q, k), 0.5))
        g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
        return g.freeze()
    tb = mi.new_threadblock_graph(grid_dim=(heads, kv_splits, 1), forloop_range=iters, reduction_dimx=dim)
    bq = tb.new_input(q, input_map=(0, -1, -1))
    bk = tb.new_input(k, input_map=(0, 2, -1), forloop_dim=2)
    bv = tb.new_input(v, input_map=(0, 1, -1), forloop_dim=1)
    e = tb.exp(tb.mul_scalar(tb.matmul(bq, bk), 0.5))
    tb.new_output(tb.forloop_accum(e), output_map=(0, 2, -1))
    tb.new_output(tb.forloop_accum(tb.matmul(e, bv)), output_map=(0, 2, -1))
    sums, numerators = g.customized([q, k, v], tb)
    tb2 = mi.new_threadblock_graph(grid_dim=(heads, 1, 1), forloop_range=1, reduction_dimx=dim)
    s = tb2.forloop_accum(tb2.new_input(sums, input_map=(0, -1, -1)), acc="sum")
    n = tb2.forloop_accum(tb2.new_input(numerators, input_map=(0, -1, -1)), acc="sum_todimx")
    tb2.new_output(tb2.div(n, s), output_map=(0, -1, -1))
    (out,) = g.customized([sums, numerators], tb2)
    g.mark_output(out)
    return g.freeze()


def masked_attention(heads: int = 4, queries: int = 64, keys: int = 64, dim: int = 32,
                     form: str = "reference", shared: bool = True, rows: int = 16, key_tile: int = 32,
                     kv_splits: int = 2, pattern: str = "", per_key: bool = False) -> mi.KernelGraph:
    """softmax(Q @ K / 8 + M) @ V with an additive mask M of ``(1 or heads, queries, keys)``, or of
    ``(1 or heads, 1, keys)`` with ``per_key`` (a key-padding mask, which every query adds): the
    reference graph (``form="reference"``), the one-kernel FlashAttention µGraph (``"whole"``: blocks of
    ``rows`` query rows loop over the keys ``key_tile`` at a time) or the two-kernel FlashDecoding one
    (``"split"``: ``kv_splits`` blocks a row group, one key tile a block). ``pattern``: the mask input's
    (mirage.mugraph.patterns; "causal:<queries>" promises causal attention's mask)."""
    g = mi.new_kernel_graph("masked_attention")
    q = g.new_input(dims=(heads, queries, dim), dtype=mi.float16)
    k = g.new_input(dims=(heads, dim, keys), dtype=mi.float16)
    v = g.new_input(dims=(heads, keys, dim), dtype=mi.float16)
    m = g.new_input(dims=(1 if shared else heads, 1 if per_key else queries, keys), dtype=mi.float16,
                    pattern=pattern)
    if form == "reference":
        e = g.exp(g.add(g.mul_scalar(g.matmul(q, k), 0.125), m))
        g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
        return g.freeze()
    head = -1 if shared else 0
    split = form == "split"
    groups = queries // rows
    tb = mi.new_threadblock_graph(grid_dim=(heads, kv_splits if split else 1, groups),
                                  forloop_range=1 if split else keys // key_tile, reduction_dimx=dim)
    bq = tb.new_input(q, input_map=(0, -1, 1), forloop_dim=-1)
    bk = tb.new_input(k, input_map=(0, 2 if split else -1, -1), forloop_dim=2)
    bv = tb.new_input(v, input_map=(0, 1 if split else -1, -1), forloop_dim=1)
    bm = tb.new_input(m, input_map=(head, 2 if split else -1, -1 if per_key else 1), forloop_dim=2)
    e = tb.exp(tb.add(tb.mul_scalar(tb.matmul(bq, bk), 0.125), bm))
    sums, numerators = tb.forloop_accum(e, acc="sum"), tb.forloop_accum(tb.matmul(e, bv))
    if not split:
        tb.new_output(tb.div(numerators, sums), output_map=(0, -1, 1))
        (out,) = g.customized([q, k, v, m], tb)
        g.mark_output(out)
        return g.freeze()
    tb.new_output(sums, output_map=(0, 2, 1))
    tb.new_output(numerators, output_map=(0, 2, 1))
    g.mark_output(combine(g, g.customized([q, k, v, m], tb), heads, groups, dim))
    return g.freeze()


def causal_mask(queries: int, keys: int):
    """The additive float32 mask of causal attention: 0 where query i sees key j (j ≤ i), else −inf."""
    import numpy as np

    return np.where(np.tril(np.ones((queries, keys), bool)), 0.0, -np.inf).astype(np.float32)[None]
