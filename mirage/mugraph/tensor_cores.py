"""Which block-level products run on tensor cores, and how large a product on the CUDA cores may be.

One place for the rule that code generation applies (``dev::TensorCoreMatmul::kSupported``) and that
the search applies ahead of it, so that it does not verify µGraphs the lowering would refuse.

>>> takes_tensor_cores(k=64, n=48, threads=128)
True
>>> simt_rounds(m=256, k=12, n=72, threads=128)  # K of 12: the CUDA cores, 144 a thread
144
"""

from __future__ import annotations

import math

#: outputs a thread computes by the CUDA cores' product (``dev::SimtMatmul``) at most: each is an
#: accumulator and an unrolled round of loads and FMAs; at 72 rounds nvcc took 51 s for one small GEMM
#: kernel, at 144 more than 100 s (K of 12, 128 threads), for a kernel no faster than tensor-core tiles
MAX_SIMT_ROUNDS = 64


def takes_tensor_cores(k: int, n: int, threads: int) -> bool:
    """Whether an ``[m, k] · [k, n]`` product of one batch of 16-bit values runs on tensor cores: K a
    multiple of 16, N of 8, whole warps (and, in shared memory, rows of whole 16-byte vectors, which
    the tiles' padding gives)."""
    return k % 16 == 0 and n % 8 == 0 and threads % 32 == 0


def simt_rounds(m: int, k: int, n: int, threads: int) -> int:
    """Outputs a thread computes when the product runs on the CUDA cores; 0 on tensor cores."""
    if takes_tensor_cores(k, n, threads):
        return 0
    return math.ceil(m * n / threads)
