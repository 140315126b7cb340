"""Which block-level products run on tensor cores, and how large a product on the CUDA cores may be.

One place for the rule that code generation applies (``dev::TensorCoreMatmul::kSupported``, and the
lowering's check of products left to the CUDA cores).

>>> takes_tensor_cores(m=64, k=64, n=48, threads=128)
True
>>> simt_rounds(m=16, k=12, n=72, threads=128)  # K of 12, 9 outputs a thread: the CUDA cores
9
>>> simt_rounds(m=197, k=64, n=197, threads=128)  # 304 a thread: tensor cores, N padded to 224
0
"""

from __future__ import annotations

import math

#: outputs a thread computes by the CUDA cores' product (``dev::SimtMatmul``) at most (the device
#: library's ``dev::kMaxSimtRounds``): each is an accumulator and an unrolled round of loads and FMAs;
#: at 72 rounds nvcc took 51 s for one small GEMM kernel, at 144 more than 100 s (K of 12, 128
#: threads), for a kernel no faster than tensor-core tiles. Larger products run on tensor cores,
#: padded where K or N is not a whole number of atoms.
MAX_SIMT_ROUNDS = 64


def exact_shape(k: int, n: int) -> bool:
    """Whether the 16-bit atoms (m16n8k16) take an ``[m, k] · [k, n]`` product without padding."""
    return k % 16 == 0 and n % 8 == 0


def takes_tensor_cores(m: int, k: int, n: int, threads: int) -> bool:
    """Whether an ``[m, k] · [k, n]`` product of one batch of one 16-bit type runs on tensor cores
    (``dev::TensorCoreMatmul::kSupported``; in shared memory, rows of whole 16-byte vectors, which
    the tiles' padding gives): whole warps, and a shape the atoms take exactly (K a multiple of 16,
    N of 8) or one too large for the CUDA cores, which then runs padded (N rounded up, the last
    k-step's elements past K zeroed). Blocks are whole warps, so every product of more than
    :data:`MAX_SIMT_ROUNDS` outputs a thread takes tensor cores."""
    return threads % 32 == 0 and (exact_shape(k, n) or math.ceil(m * n / threads) > MAX_SIMT_ROUNDS)


def simt_rounds(m: int, k: int, n: int, threads: int) -> int:
    """Outputs a thread computes when the product runs on the CUDA cores; 0 on tensor cores."""
    if takes_tensor_cores(m, k, n, threads):
        return 0
    return math.ceil(m * n / threads)
