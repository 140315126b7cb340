"""Attention over heads whose dim is no multiple of 16, at Stable Diffusion 1.5's first level (64 × 64
latents: 4,096 tokens, 2 images × 8 heads of 40), in the one-kernel forms the search offers and in
blocks of 128 query rows (two 16-row tiles a warp, which share every K and V fragment a warp loads):
timed beside SDPA by ``python -m benchmarks.narrow_heads``. K is read in place, as models pass it."""

from __future__ import annotations

from benchmarks.mugraphs.attention import one_kernel
from benchmarks.mugraphs.uneven import keys_in_place

HEADS, TOKENS, PROMPT = 16, 4096, 77


def self_attention(dim: int, rows: int, key_tile: int, threads: int = 128):
    return lambda: keys_in_place(one_kernel(HEADS, TOKENS, TOKENS, dim, rows=rows, key_tile=key_tile,
                                            threads=threads))


def cross_attention(dim: int, rows: int, threads: int = 128):
    return lambda: keys_in_place(one_kernel(HEADS, TOKENS, PROMPT, dim, rows=rows, key_tile=PROMPT,
                                            threads=threads))


GRAPHS = {
    # the self-attention: rows a block, keys a step, threads a block
    "self_40_r64_k64_attention": self_attention(40, 64, 64),
    "self_40_r64_k128_attention": self_attention(40, 64, 128),  # the search's pick (2026-11-30)
    "self_40_r128_k64_attention": self_attention(40, 128, 64),
    "self_40_r128_k128_attention": self_attention(40, 128, 128),
    "self_40_r128_k64_t256_attention": self_attention(40, 128, 64, threads=256),
    "self_40_r128_k128_t256_attention": self_attention(40, 128, 128, threads=256),
    # the same tokens at 64 dims, for the cost of the dim (the warpgroup form where it qualifies)
    "self_64_r64_k128_attention": self_attention(64, 64, 128),
    "self_64_r128_k128_attention": self_attention(64, 128, 128),
    # the cross-attention over the prompt's 77 tokens (80 run)
    "cross_40_r64_attention": cross_attention(40, 64),
    "cross_40_r128_attention": cross_attention(40, 128),
}
