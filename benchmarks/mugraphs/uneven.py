"""µGraphs whose grids split a dim that no block count divides (``BlockGraph.spans``: tiles of
ceil(span / blocks) entries, the last one overlapping the one before it), at the shapes that need them:
ViT's 197 tokens, CLIP's 77. Checked against float64 by tests/unit/mugraph/test_uneven_grids.py (the
interpreter), compiled by tests/unit/codegen/test_uneven_codegen.py, run on the GPU by
tests/gpu/test_padded_products_gpu.py and timed by ``python -m benchmarks.uneven_grids``."""

from __future__ import annotations

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel, with_input_strides


def keys_in_place(graph: mi.KernelGraph) -> mi.KernelGraph:
    """An attention µGraph (Q, K [heads, dim, tokens], V) with K declared as the transposed view of a
    [heads, tokens, dim] tensor, as a model passes it (``superoptimize`` reads it so, in place)."""
    heads, dim, tokens = graph.input_types[1].shape
    return with_input_strides(graph, {1: (tokens * dim, 1, dim)})


def self_attention(heads: int, tokens: int, rows: int, mask: str = "") -> mi.KernelGraph:
    """Self-attention of 64-dim heads over ``tokens`` (``one_kernel``: blocks of ``rows`` query rows, all
    the keys in one step, ``mask`` as there), K read in place."""
    return keys_in_place(one_kernel(heads, tokens, tokens, 64, rows=rows, key_tile=tokens, mask=mask))


def rows_product(m: int, k: int, n: int, row_blocks: int, col_blocks: int, iterations: int) -> mi.KernelGraph:
    """``X @ W`` ([m, k] · [k, n]) in ``row_blocks`` × ``col_blocks`` blocks, ``m`` split unevenly over
    the first, the loop walking K in ``iterations`` steps."""
    g = mi.new_kernel_graph(f"rows_product_{m}x{k}x{n}")
    x = g.new_input(dims=(m, k), dtype=mi.float16, name="X")
    w = g.new_input(dims=(k, n), dtype=mi.float16, name="W")
    tb = mi.new_threadblock_graph(grid_dim=(row_blocks, col_blocks, 1), forloop_range=iterations,
                                  reduction_dimx=k // iterations, spans=(m, 0, 0))
    bx = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(-1, 1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(bx, bw)), output_map=(0, 1, -1))
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g.freeze()


def rms_rows(m: int, n: int, blocks: int, threads: int = 128) -> mi.KernelGraph:
    """``rms_norm(X) · g`` over the rows of X [m, n] (a pre-norm over ViT's tokens), ``m`` split unevenly
    over ``blocks`` blocks that each hold whole rows."""
    g = mi.new_kernel_graph(f"rms_rows_{m}x{n}")
    x = g.new_input(dims=(m, n), dtype=mi.float16, name="X")
    gain = g.new_input(dims=(1, n), dtype=mi.float16, name="G")
    tb = mi.new_threadblock_graph(grid_dim=(blocks, 1, 1), block_dim=(threads, 1, 1), spans=(m, 0, 0))
    bx = tb.new_input(x, input_map=(0, -1, -1))
    bg = tb.new_input(gain)
    tb.new_output(tb.forloop_accum(tb.mul(tb.rms_norm(bx, eps=1e-6), bg)), output_map=(0, -1, -1))
    (out,) = g.customized([x, gain], tb)
    g.mark_output(out)
    return g.freeze()


GRAPHS = {
    # ViT-B's attention (12 heads, 197 tokens): 4 blocks a head of 50 query rows (the last starts at
    # 147; the chain runs 64, padded), all 197 keys in one step
    "vit_attention": lambda: one_kernel(12, 197, 197, 64, rows=64, key_tile=197),
    # the same in 13 blocks a head of 16 rows (the last starts at 181): 156 blocks, on the online-softmax
    # chain with 256 keys run for 197 (gen/softmax.cuh's padded keys); K read in place, as models pass it
    "vit_attention_16": lambda: self_attention(12, 197, rows=16),
    # with K stored [heads, dim, tokens]: its rows of 394 bytes are copied element by element
    "vit_attention_16_rows": lambda: one_kernel(12, 197, 197, 64, rows=16, key_tile=197),
    # CLIP's text tower (8 heads, 77 tokens): 5 blocks a head of 16 rows (the last starts at 61)
    "clip_attention": lambda: self_attention(8, 77, rows=16),
    # CLIP's text tower is causal: its 77 queries in 5 blocks of 16 rows, 80 keys run, the mask computed
    "clip_causal_attention": lambda: self_attention(8, 77, rows=16, mask="causal"),
    # a prompt of 100 tokens: 7 blocks a head of 15 rows (the last starts at 85), each run as one 16-row tile
    "tokens_100_attention": lambda: self_attention(8, 100, rows=16),
    # causal, in 2 blocks a head of 50 rows (64 run, one 16-row tile a warp), 112 keys run
    "causal_100_attention": lambda: self_attention(8, 100, rows=64, mask="causal"),
    # BEiT's attention: a relative-position bias of each head read beside the scores, 197 tokens in 13
    # blocks of 16 rows (256 keys run, the padded ones hidden) and in 4 of 50 (64 rows run)
    "biased_attention": lambda: self_attention(12, 197, rows=16, mask="bias"),
    "biased_attention_50": lambda: self_attention(12, 197, rows=64, mask="bias"),
    # a projection of ViT's tokens: 4 row blocks of 50 rows × 4 column blocks of 128, K in 4 steps
    "vit_projection": lambda: rows_product(197, 256, 512, row_blocks=4, col_blocks=4, iterations=4),
    # an RMS norm of its tokens: 25 blocks of 8 whole rows (the last starts at 189)
    "vit_rms_norm": lambda: rms_rows(197, 768, blocks=25),
}
