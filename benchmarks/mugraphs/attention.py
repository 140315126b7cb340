"""GQA and QKNorm: ``softmax(Q @ K / 8) @ V`` with K stored transposed, optionally QK-normalized.

Shapes (BENCHMARKS.md): Q (2b, 256, 64), K (2b, 64, 4096), V (2b, 4096, 64), fp16.  The search works
on the LAX form ``exp(S) / Σ exp(S)``; the codegen's online-softmax rewrite makes kernels stable.
"""

from __future__ import annotations

import mirage as mi

SCALE = 1.0 / 8.0
EPS = 1e-6


def shapes(b: int) -> list[tuple[int, ...]]:
    return [(2 * b, 256, 64), (2 * b, 64, 4096), (2 * b, 4096, 64)]


def key_rms(g, k):
    """rms of each 64-vector of K (2b, 64, n) over dim 1: sqrt(mean(k², dim 1) + eps), (2b, 1, n)."""
    mean = g.mul_scalar(g.reduction(g.square(k), 1), 1.0 / k.dims[1])
    return g.sqrt(g.add_scalar(mean, EPS))


def _rms_k(g, k):
    """Normalize each 64-vector of K (2b, 64, n) over dim 1: k / sqrt(mean(k², dim 1) + eps)."""
    return g.div(k, key_rms(g, k))


def reference(b: int, qknorm: bool = False) -> mi.KernelGraph:
    g = mi.new_kernel_graph("qknorm" if qknorm else "gqa")
    q, k, v = (g.new_input(dims=s, dtype=mi.float16, name=n) for s, n in zip(shapes(b), "QKV", strict=True))
    if qknorm:
        q = g.rms_norm(q, eps=EPS)
        k = _rms_k(g, k)
    e = g.exp(g.mul_scalar(g.matmul(q, k), SCALE))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
    return g.freeze()


def fused(b: int, qknorm: bool = False, kv_splits: int = 8, q_splits: int = 16,
          iters: int = 4, threads: int = 128) -> mi.KernelGraph:
    """Two graph-defined kernels, as Mirage's FlashDecoding-like µGraph (mirage-notes §1.7): the keys
    are split ``kv_splits`` ways across blocks and ``iters`` ways across the for-loop, the queries
    ``q_splits`` ways across blocks; ``threads`` per block in the first kernel."""
    heads = 2 * b
    g = mi.new_kernel_graph("qknorm" if qknorm else "gqa")
    q, k, v = (g.new_input(dims=s, dtype=mi.float16, name=n) for s, n in zip(shapes(b), "QKV", strict=True))
    tb = mi.new_threadblock_graph(grid_dim=(heads, kv_splits, q_splits), block_dim=(threads, 1, 1),
                                  forloop_range=iters, reduction_dimx=64)
    bq = tb.new_input(q, input_map=(0, -1, 1), forloop_dim=-1)  # [1, 16, 64]
    bk = tb.new_input(k, input_map=(0, 2, -1), forloop_dim=2)  # [1, 64, 128]
    bv = tb.new_input(v, input_map=(0, 1, -1), forloop_dim=1)  # [1, 128, 64]
    if qknorm:
        bq = tb.rms_norm(bq, eps=EPS)
        bk = _rms_k(tb, bk)
    e = tb.exp(tb.mul_scalar(tb.matmul(bq, bk), SCALE))
    sums = tb.forloop_accum(e)  # [1, 16, 128]
    numerators = tb.forloop_accum(tb.matmul(e, bv))  # [1, 16, 64]
    tb.new_output(sums, output_map=(0, 2, 1))  # [2b, 256, 1024]
    tb.new_output(numerators, output_map=(0, 2, 1))  # [2b, 256, 512]
    g.mark_output(combine(g, g.customized([q, k, v], tb), heads, q_splits))
    return g.freeze()


def combine(g, partials, heads: int, groups: int, dim: int = 64, threads: int = 128):
    """FlashDecoding's second kernel: (heads, groups) blocks sum the splits' partial row sums and
    numerators (``partials``, as the first kernel writes them) and divide; returns its output."""
    partial_sums, partial_numerators = partials
    tb = mi.new_threadblock_graph(grid_dim=(heads, groups, 1), block_dim=(threads, 1, 1), forloop_range=1,
                                  reduction_dimx=dim)
    total = tb.forloop_accum(tb.new_input(partial_sums, input_map=(0, 1, -1)), acc="sum")  # [1, rows, 1]
    n = tb.forloop_accum(tb.new_input(partial_numerators, input_map=(0, 1, -1)), acc="sum_todimx")
    tb.new_output(tb.div(n, total), output_map=(0, 1, -1))
    (out,) = g.customized([partial_sums, partial_numerators], tb)
    return out


def rows_fused(heads: int, queries: int, dim: int, keys: int, kv_splits: int, q_splits: int, iters: int,
               threads: int, combine_splits: int, scores=None) -> mi.KernelGraph:
    """``softmax(Q @ K / sqrt(dim)) @ V`` at any shape, Q (heads, queries, dim), K (heads, dim, keys), V
    (heads, keys, dim), as the suite's row-sum members split it (``variants.attention_fused``): a
    first kernel of (heads, kv_splits, q_splits) blocks, ``iters`` key tiles each, that writes per-row
    partial sums and numerators, and a combine of (heads, combine_splits) blocks. Shapes no case of
    the suite has (a head dim of 128) go through the same lowering. ``scores(tb, q_tile, k_tile)``, if
    given, replaces the scaled product as what the exponential takes."""
    g = mi.new_kernel_graph("attention")
    q, k, v = (g.new_input(dims=s, dtype=mi.float16, name=n) for s, n in
               zip(((heads, queries, dim), (heads, dim, keys), (heads, keys, dim)), "QKV", strict=True))
    tb = mi.new_threadblock_graph(grid_dim=(heads, kv_splits, q_splits), block_dim=(threads, 1, 1),
                                  forloop_range=iters, reduction_dimx=64)
    rows_axis = 1 if q_splits > 1 else -1
    bq = tb.new_input(q, input_map=(0, -1, rows_axis), forloop_dim=-1)
    bk = tb.new_input(k, input_map=(0, 2, -1), forloop_dim=2)
    bv = tb.new_input(v, input_map=(0, 1, -1), forloop_dim=1)
    e = tb.exp(tb.mul_scalar(tb.matmul(bq, bk), dim ** -0.5) if scores is None else scores(tb, bq, bk))
    sums = tb.forloop_accum(e, acc="sum")
    numerators = tb.forloop_accum(tb.matmul(e, bv))
    tb.new_output(sums, output_map=(0, 2, rows_axis))
    tb.new_output(numerators, output_map=(0, 2, rows_axis))
    g.mark_output(combine(g, g.customized([q, k, v], tb), heads, combine_splits, dim))
    return g.freeze()


def one_kernel(heads: int, queries: int, keys: int, dim: int, rows: int, key_tile: int,
               threads: int = 128, cap: float | None = None, output_strides=None,
               mask: str = "") -> mi.KernelGraph:
    """``softmax(Q @ K / sqrt(dim)) @ V`` as one kernel, FlashAttention's form (the prefill µGraphs the
    search finds): (heads, 1, queries / rows) blocks of ``rows`` query rows loop over the keys
    ``key_tile`` at a time; Q (heads, queries, dim), K (heads, dim, keys), V (heads, keys, dim).
    With ``cap``, the scores are Gemma 2's soft-capped ``cap · tanh(S / (sqrt(dim) · cap))``; with
    ``output_strides``, the output is laid out so (``mark_output(strides=...)``, e.g. a head merge).
    Where ``rows`` does not divide ``queries`` (ViT's 197), ceil(queries / rows) blocks split them
    unevenly (``spans``: tiles of ceil(queries / blocks) rows, the last one overlapping). ``mask``:
    ``"causal"`` adds causal attention's mask M to the scaled scores, an input of (1, queries, keys)
    that names the causal pattern (the chain computes it); ``"bias"`` a bias of each head's scores
    (heads, queries, keys), read (BEiT's relative positions)."""
    g = mi.new_kernel_graph("attention")
    q, k, v = (g.new_input(dims=s, dtype=mi.float16, name=n) for s, n in
               zip(((heads, queries, dim), (heads, dim, keys), (heads, keys, dim)), "QKV", strict=True))
    if mask not in ("", "causal", "bias"):
        raise ValueError(f"mask {mask!r}: '', 'causal' or 'bias'")
    causal = mask == "causal"
    m = g.new_input(dims=(1 if causal else heads, queries, keys), dtype=mi.float16, name="M",
                    pattern=f"causal:{queries}" if causal else "") if mask else None
    groups = -(-queries // rows)
    tb = mi.new_threadblock_graph(grid_dim=(heads, 1, groups), block_dim=(threads, 1, 1),
                                  forloop_range=keys // key_tile, reduction_dimx=dim,
                                  spans=(0, 0, queries if queries % rows else 0))
    bq = tb.new_input(q, input_map=(0, -1, 1), forloop_dim=-1)
    bk = tb.new_input(k, input_map=(0, -1, -1), forloop_dim=2)
    bv = tb.new_input(v, input_map=(0, -1, -1), forloop_dim=1)
    # a mask is tiled as the scores are: heads on x (none for the shared causal mask), rows on z
    bm = tb.new_input(m, input_map=(-1 if causal else 0, -1, 1), forloop_dim=2) if mask else None
    if cap is None:
        scores = tb.mul_scalar(tb.matmul(bq, bk), dim ** -0.5)
    else:
        scores = tb.mul_scalar(tb.tanh(tb.mul_scalar(tb.matmul(bq, bk), dim ** -0.5 / cap)), cap)
    if bm is not None:
        scores = tb.add(scores, bm)
    e = tb.exp(scores)
    sums, numerators = tb.forloop_accum(e, acc="sum"), tb.forloop_accum(tb.matmul(e, bv))
    # one group of all the queries (a dim no smaller group divides, ViT's 197): z maps nothing
    tb.new_output(tb.div(numerators, sums), output_map=(0, -1, 1 if groups > 1 else -1))
    (out,) = g.customized([q, k, v] + ([m] if m is not None else []), tb)
    g.mark_output(out, strides=output_strides)
    return g.freeze()


def with_input_strides(graph: mi.KernelGraph, strides: dict[int, tuple]) -> mi.KernelGraph:
    """``graph`` with its inputs at the given positions declared with those strides, in
    ``new_input(strides=...)``'s form (a pair of (size, stride) pairs for a dim of two strides)."""
    import dataclasses

    from mirage.mugraph.builder import declared_strides

    nodes = list(graph.nodes)
    for p, given in strides.items():
        i = graph.input_nodes[p]
        layout, viewed, split = declared_strides(nodes[i].outputs[0].shape, given)
        nodes[i] = dataclasses.replace(nodes[i], attrs=dataclasses.replace(
            nodes[i].attrs, layout=layout, strides=viewed, split_strides=split))
    return dataclasses.replace(graph, nodes=tuple(nodes))


def with_head_splits(graph: mi.KernelGraph, batch: int, heads: int, tokens: int, dim: int) -> mi.KernelGraph:
    """``graph`` (Q, K, V inputs of (batch · heads) rows) with its inputs declared as Hugging Face's head
    splits of one [batch, tokens, 3 · heads · dim] product: Q and V [b·h, s, d], K [b·h, d, s] read in
    place, each row's heads ``dim`` apart and batch rows ``tokens · 3 · heads · dim`` apart (at batch > 1
    the dim takes two strides: ``KernelInput.split_strides``)."""
    pitch = 3 * heads * dim
    first = ((batch, tokens * pitch), (heads, dim)) if batch > 1 else dim
    return with_input_strides(graph, {0: (first, pitch, 1), 1: (first, 1, pitch), 2: (first, pitch, 1)})
