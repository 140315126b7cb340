"""µGraphs whose block products have a K or an N that is no whole tensor-core atom and are too large
for the CUDA cores, so that they run padded (``dev::TensorCoreMatmul``, docs/codegen.md): compiled by
tests/unit/codegen/test_padded_products.py, run against float64 by tests/gpu/test_padded_products_gpu.py,
timed by ``python -m benchmarks.padded_products``."""

from __future__ import annotations

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel
from benchmarks.mugraphs.uneven import keys_in_place


def whole_attention(tokens: int, threads: int) -> mi.KernelGraph:
    """12 heads of 64 dims, a block per head holding all ``tokens`` queries and keys (ViT's 197: a prime,
    so no grid or loop divides it): Q·K is [197, 64] · [64, 197] (N padded), P·V [197, 197] · [197, 64]
    (K padded)."""
    return one_kernel(12, tokens, tokens, 64, rows=tokens, key_tile=tokens, threads=threads)



def product(m: int, k: int, n: int, grid: int, iterations: int, dtype=mi.float16,
            threads: int = 128) -> mi.KernelGraph:
    """``X @ W`` ([m, k] · [k, n]): ``grid`` blocks split N, the loop walks K in ``iterations`` steps,
    the sum kept in an accumulator."""
    g = mi.new_kernel_graph(f"product_{m}x{k}x{n}")
    x = g.new_input(dims=(m, k), dtype=dtype, name="X")
    w = g.new_input(dims=(k, n), dtype=dtype, name="W")
    tb = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), block_dim=(threads, 1, 1), forloop_range=iterations,
                                  reduction_dimx=k // iterations)
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w, input_map=(1, -1, -1) if grid > 1 else (-1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(bx, bw)), output_map=(1, -1, -1) if grid > 1 else (-1, -1, -1))
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g.freeze()


GRAPHS = {
    # ViT's 197 tokens, a block per head: the online-softmax chain runs 256 rows (4 row tiles a warp)
    # over 256 keys, both padded (op by op, each warp held 13 × 7 score tiles at once and spilled)
    "vit_attention": lambda: whole_attention(197, threads=128),
    # CLIP's 77 tokens at 64 threads: 96 rows run (3 row tiles a warp), 80 keys
    "clip_attention": lambda: whole_attention(77, threads=64),
    # 8 heads of 128 queries over 200 keys, 100 an iteration: the online-softmax chain runs 112 keys a
    # step, the 12 padded ones −∞ (gen/softmax.cuh)
    "keys_100_attention": lambda: one_kernel(8, 128, 200, 64, rows=64, key_tile=100),
    # 100 queries in 4 blocks of 25 rows: the chain runs 32 (two 16-row tiles, the second padded)
    "rows_25_attention": lambda: one_kernel(8, 100, 100, 64, rows=25, key_tile=100),
    # Stable Diffusion 1.5's heads of 40: the chain's Q·K runs a depth of 48 (the last k-step's upper half
    # zeroed), P·V its 5 column tiles of 8 (the last alone); K [heads, 40, keys] copied, 4 key steps
    "head_40_attention": lambda: one_kernel(8, 256, 256, 40, rows=64, key_tile=64),
    # its cross-attention over a prompt's 77 keys (80 run), K read in place ([77, 40] rows of 80 bytes)
    "head_40_cross_attention": lambda: keys_in_place(one_kernel(8, 256, 77, 40, rows=64, key_tile=77)),
    # heads of 72 (depth 80 run, 9 column tiles), causal, in blocks of 32 rows
    "head_72_causal_attention": lambda: keys_in_place(one_kernel(4, 128, 128, 72, rows=32, key_tile=64,
                                                                 mask="causal")),
    # N tile of 197 (M of 64: 99 outputs a thread), K in four steps of 128
    "odd_n": lambda: product(64, 512, 394, grid=2, iterations=4),
    # K of 111 in one step (odd: the last step keeps one element of a pair), N of 128
    "odd_k": lambda: product(128, 111, 128, grid=1, iterations=1),
    # both, in bf16: N tile of 100, K steps of 50
    "odd_both_bf16": lambda: product(96, 150, 200, grid=2, iterations=3, dtype=mi.bfloat16),
    # fp32 (TF32 atoms, K steps of 8): K of 100, N of 136
    "odd_k_fp32": lambda: product(64, 100, 136, grid=1, iterations=1, dtype=mi.float32),
}
