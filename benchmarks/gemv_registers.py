"""A GEMV that streams its weight straight into registers, no shared-memory stage: a probe of how fast
rmsnorm's and gatedmlp's weight stream can go when every warp keeps its own loads in flight.

Each block owns ``COLS`` columns of W (K, N), each warp a slice of K. A thread loads, per 16 rows of
its slice, 16 or 8 bytes of four rows (``4t .. 4t + 3`` of the 16, t = lane % 4) at columns
``COLS / 8 · g`` on (g = lane / 4), and pairs the rows' halves with byte permutes into the B fragments
of ``COLS / 8`` tensor-core products (m16n8k16): column ``j`` of its load is column ``g`` of product
``j``. X's rows come from global memory as the A fragments, in the same order of K (rows 4t .. 4t + 3
as the fragment's k pairs ``2t, 2t + 1`` and ``2t + 8, 2t + 9``: a permutation of K that the sum does
not see). After the slice, the warps' partial products meet in shared memory. With ``RMS`` the kernel
is rmsnorm's whole function: A scaled by the gain in its fragments, the rows' sums of squares taken
from the same fragments, the output divided by the rms.

Compares, in one run: this kernel over its parameters, cuBLAS (``torch.mm``), and the generated
fused kernel of the suite's rmsnorm members.  Writes gemv_registers_<date>.json into ``--out``."""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import torch

import mirage as mi
from benchmarks.mugraphs import mlp
from benchmarks.stream_floor import cuda_kernel, launch, write_record
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

SOURCE = r"""
#include <cuda_fp16.h>

constexpr int V = COLS / 8;                 // halves of one load, products of one warp
constexpr int WARPS = THREADS / 32;
constexpr int SLICE = KDIM / WARPS;         // rows of K a warp reads
constexpr int STEPS = SLICE / 16;
static_assert(V == 8 || V == 4, "COLS is 64 or 32");
static_assert(SLICE % 16 == 0, "K splits into whole 16-row steps");
template <bool Wide> struct LoadOf { using type = uint4; };
template <> struct LoadOf<false> { using type = uint2; };
using Load = typename LoadOf<V == 8>::type;
constexpr int R = V / 2;                    // 32-bit registers of one load
constexpr int kUnroll = UNROLL;             // steps of the staged loop unrolled

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ unsigned word(const uint2& v, int i) { return i == 0 ? v.x : v.y; }

__device__ __forceinline__ void mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float squares(unsigned h2) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  return f.x * f.x + f.y * f.y;
}

__device__ __forceinline__ unsigned scale(unsigned h2, unsigned g2) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&h2), *reinterpret_cast<const __half2*>(&g2));
  return *reinterpret_cast<const unsigned*>(&r);
}

// A's fragments from X's raw words (rows g and g + 8, k 4t .. 4t + 3 of the step), the gain's
// (RMS), W's words of the step: the products of one 16-row step, and the rows' sums of squares.
__device__ __forceinline__ void step(float (&acc)[V][4], float& sq_lo, float& sq_hi,
                                     const unsigned (&wr)[4][R], uint2 xlo, uint2 xhi, uint2 g2) {
  unsigned a[4] = {xlo.x, xhi.x, xlo.y, xhi.y};
  if (RMS) {
    sq_lo += squares(a[0]) + squares(a[2]);
    sq_hi += squares(a[1]) + squares(a[3]);
    a[0] = scale(a[0], g2.x); a[1] = scale(a[1], g2.x);
    a[2] = scale(a[2], g2.y); a[3] = scale(a[3], g2.y);
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const unsigned select = (j & 1) ? 0x7632 : 0x5410;
    mma(acc[j], a, __byte_perm(wr[0][j / 2], wr[1][j / 2], select),
        __byte_perm(wr[2][j / 2], wr[3][j / 2], select));
  }
}

// The warps' partial products (and sums of squares) meet in shared memory; rows below m are stored.
__device__ __forceinline__ void finish(float* partial, const float (&acc)[V][4], float sq_lo, float sq_hi,
                                       __half* __restrict__ out, int m, int n) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  __syncthreads();  // the staged form reuses its ring
  // column 2t (+1) of product j is column (2t (+1)) * V + j of the block
  float* mine = partial + warp * 16 * COLS;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mine[g * COLS + 2 * t * V + j] = acc[j][0];
    mine[g * COLS + (2 * t + 1) * V + j] = acc[j][1];
    mine[(g + 8) * COLS + 2 * t * V + j] = acc[j][2];
    mine[(g + 8) * COLS + (2 * t + 1) * V + j] = acc[j][3];
  }
  float* sums = partial + WARPS * 16 * COLS;
  if (RMS) {
    sq_lo += __shfl_xor_sync(0xffffffff, sq_lo, 1); sq_lo += __shfl_xor_sync(0xffffffff, sq_lo, 2);
    sq_hi += __shfl_xor_sync(0xffffffff, sq_hi, 1); sq_hi += __shfl_xor_sync(0xffffffff, sq_hi, 2);
    if (t == 0) { sums[warp * 16 + g] = sq_lo; sums[warp * 16 + g + 8] = sq_hi; }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < 16 * COLS; e += THREADS) {
    const int row = e / COLS, col = e % COLS;
    if (row >= m) continue;
    float v = 0.0f, sq = 0.0f;
#pragma unroll
    for (int i = 0; i < WARPS; ++i) v += partial[i * 16 * COLS + e];
    if (RMS) {
#pragma unroll
      for (int i = 0; i < WARPS; ++i) sq += sums[i * 16 + row];
      v *= rsqrtf(sq / KDIM + 1e-6f);
    }
    out[(unsigned long long)row * n + blockIdx.x * COLS + col] = __float2half(v);
  }
}

// W, X and the gain loaded into registers, DEPTH steps ahead (where ptxas keeps them).
extern "C" __global__ void __launch_bounds__(THREADS) gemv_registers(
    const __half* __restrict__ x, const __half* __restrict__ gain, const __half* __restrict__ w,
    __half* __restrict__ out, int m, int n) {
  extern __shared__ float partial[];        // [WARPS][16][COLS], then [WARPS][16] sums of squares
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k0 = warp * SLICE + 4 * t;
  const __half* wp = w + (unsigned long long)k0 * n + blockIdx.x * COLS + g * V;
  const bool lo = g < m, hi = g + 8 < m;
  const __half* xlo = x + (unsigned long long)g * KDIM + k0;
  const __half* xhi = x + (unsigned long long)(g + 8) * KDIM + k0;
  Load ring[DEPTH][4];
  uint2 xa[DEPTH][2];
  uint2 ga[DEPTH];
  auto load = [&](int s, int slot) {
#pragma unroll
    for (int q = 0; q < 4; ++q)
      ring[slot][q] = __ldcs(reinterpret_cast<const Load*>(wp + (unsigned long long)(16 * s + q) * n));
    xa[slot][0] = lo ? __ldg(reinterpret_cast<const uint2*>(xlo + 16 * s)) : make_uint2(0, 0);
    xa[slot][1] = hi ? __ldg(reinterpret_cast<const uint2*>(xhi + 16 * s)) : make_uint2(0, 0);
    if (RMS) ga[slot] = __ldg(reinterpret_cast<const uint2*>(gain + k0 + 16 * s));
  };
  float acc[V][4] = {};
  float sq_lo = 0.0f, sq_hi = 0.0f;
#pragma unroll
  for (int s = 0; s < DEPTH && s < STEPS; ++s) load(s, s);
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    const int slot = s % DEPTH;
    unsigned wr[4][R];
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int i = 0; i < R; ++i) wr[q][i] = word(ring[slot][q], i);
    const uint2 x0 = xa[slot][0], x1 = xa[slot][1], g2 = ga[slot];
    if (s + DEPTH < STEPS) load(s + DEPTH, slot);
    step(acc, sq_lo, sq_hi, wr, x0, x1, g2);
  }
  finish(partial, acc, sq_lo, sq_hi, out, m, n);
}

// The same ring, the loop unrolled DEPTH steps at a time (not fully): a step's loads are issued one
// loop iteration before their use, across the back edge, where ptxas cannot sink them. Only where the
// steps come in whole rounds of DEPTH (the other kernels compile for any DEPTH).
#if (KDIM / (THREADS / 32) / 16) % DEPTH == 0
extern "C" __global__ void __launch_bounds__(THREADS) gemv_rolled(
    const __half* __restrict__ x, const __half* __restrict__ gain, const __half* __restrict__ w,
    __half* __restrict__ out, int m, int n) {
  extern __shared__ float partial[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k0 = warp * SLICE + 4 * t;
  const __half* wp = w + (unsigned long long)k0 * n + blockIdx.x * COLS + g * V;
  const bool lo = g < m, hi = g + 8 < m;
  const __half* xlo = x + (unsigned long long)(lo ? g : 0) * KDIM + k0;
  const __half* xhi = x + (unsigned long long)(hi ? g + 8 : 0) * KDIM + k0;
  Load ring[DEPTH][4];
  uint2 xa[DEPTH][2];
  uint2 ga[DEPTH];
  auto load = [&](int s, int slot) {
    const int c = s < STEPS ? s : STEPS - 1;  // the last round re-reads its own step (no branch)
#pragma unroll
    for (int q = 0; q < 4; ++q)
      ring[slot][q] = __ldcs(reinterpret_cast<const Load*>(wp + (unsigned long long)(16 * c + q) * n));
    xa[slot][0] = __ldg(reinterpret_cast<const uint2*>(xlo + 16 * c));
    xa[slot][1] = __ldg(reinterpret_cast<const uint2*>(xhi + 16 * c));
    if (!lo) xa[slot][0] = make_uint2(0, 0);
    if (!hi) xa[slot][1] = make_uint2(0, 0);
    if (RMS) ga[slot] = __ldg(reinterpret_cast<const uint2*>(gain + k0 + 16 * c));
  };
  float acc[V][4] = {};
  float sq_lo = 0.0f, sq_hi = 0.0f;
#pragma unroll
  for (int i = 0; i < DEPTH; ++i) load(i, i);
#pragma unroll 1
  for (int base = 0; base < STEPS; base += DEPTH) {
#pragma unroll
    for (int i = 0; i < DEPTH; ++i) {
      unsigned wr[4][R];
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int e = 0; e < R; ++e) wr[q][e] = word(ring[i][q], e);
      const uint2 x0 = xa[i][0], x1 = xa[i][1], g2 = ga[i];
      load(base + DEPTH + i, i);
      step(acc, sq_lo, sq_hi, wr, x0, x1, g2);
    }
  }
  finish(partial, acc, sq_lo, sq_hi, out, m, n);
}
#endif

template <int Bytes>
__device__ __forceinline__ void copy_async(void* shared, const void* global, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(global));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;"
                 :: "r"(dst), "l"(global), "n"(Bytes), "r"(valid ? Bytes : 0));
}

// W, X and the gain copied by each thread into its own slots of a shared ring, DEPTH - 1 steps in
// flight (cp.async groups), read back by the same thread: no barrier in the loop.
extern "C" __global__ void __launch_bounds__(THREADS) gemv_staged(
    const __half* __restrict__ x, const __half* __restrict__ gain, const __half* __restrict__ w,
    __half* __restrict__ out, int m, int n) {
  extern __shared__ float4 shared4[];
  Load* wring = reinterpret_cast<Load*>(shared4);                  // [DEPTH][4][THREADS]
  uint2* sring = reinterpret_cast<uint2*>(wring + DEPTH * 4 * THREADS);  // [DEPTH][3][THREADS]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int k0 = warp * SLICE + 4 * t;
  const __half* wp = w + (unsigned long long)k0 * n + blockIdx.x * COLS + g * V;
  const bool lo = g < m, hi = g + 8 < m;
  const __half* xlo = x + (unsigned long long)(lo ? g : 0) * KDIM + k0;
  const __half* xhi = x + (unsigned long long)(hi ? g + 8 : 0) * KDIM + k0;
  auto issue = [&](int s, int slot) {
    if (s < STEPS) {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        copy_async<sizeof(Load)>(&wring[(slot * 4 + q) * THREADS + tid],
                                 wp + (unsigned long long)(16 * s + q) * n, true);
      copy_async<8>(&sring[(slot * 3 + 0) * THREADS + tid], xlo + 16 * s, lo);
      copy_async<8>(&sring[(slot * 3 + 1) * THREADS + tid], xhi + 16 * s, hi);
      if (RMS) copy_async<8>(&sring[(slot * 3 + 2) * THREADS + tid], gain + k0 + 16 * s, true);
    }
    asm volatile("cp.async.commit_group;");
  };
  float acc[V][4] = {};
  float sq_lo = 0.0f, sq_hi = 0.0f;
#pragma unroll
  for (int s = 0; s < DEPTH - 1; ++s) issue(s, s);
#pragma unroll kUnroll
  for (int s = 0; s < STEPS; ++s) {
    asm volatile("cp.async.wait_group %0;" :: "n"(DEPTH - 2));
    issue(s + DEPTH - 1, (s + DEPTH - 1) % DEPTH);  // the slot step s - 1 read
    const int slot = s % DEPTH;
    unsigned wr[4][R];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const Load v = wring[(slot * 4 + q) * THREADS + tid];
#pragma unroll
      for (int i = 0; i < R; ++i) wr[q][i] = word(v, i);
    }
    const uint2 x0 = sring[(slot * 3 + 0) * THREADS + tid], x1 = sring[(slot * 3 + 1) * THREADS + tid];
    const uint2 g2 = RMS ? sring[(slot * 3 + 2) * THREADS + tid] : make_uint2(0, 0);
    step(acc, sq_lo, sq_hi, wr, x0, x1, g2);
  }
  asm volatile("cp.async.wait_group 0;");
  finish(reinterpret_cast<float*>(shared4), acc, sq_lo, sq_hi, out, m, n);
}
"""


@dataclasses.dataclass(frozen=True)
class Form:
    kind: str  # "registers", "rolled" or "staged"
    cols: int
    threads: int
    depth: int
    rms: bool
    unroll: int = 2

    def kernel(self, k: int):
        options = (f"-DCOLS={self.cols}", f"-DTHREADS={self.threads}", f"-DDEPTH={self.depth}",
                   f"-DRMS={int(self.rms)}", f"-DKDIM={k}", f"-DUNROLL={self.unroll}")
        return cuda_kernel(SOURCE, f"gemv_{self.kind}", self.shared_bytes, extra_options=options)

    @property
    def shared_bytes(self) -> int:
        partial = (self.threads // 32) * 16 * (self.cols + 1) * 4
        ring = self.depth * self.threads * (4 * self.cols // 4 + 24) if self.kind == "staged" else 0
        return max(partial, ring)


def run_form(form: Form, x: torch.Tensor, g: torch.Tensor, w: torch.Tensor):
    """A function that computes (rms(x) · g) @ w (or x @ w) into a new tensor with ``form``."""
    import cupy

    kernel = form.kernel(w.shape[0])
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    arguments = (x.data_ptr(), g.data_ptr(), w.data_ptr(), out.data_ptr(), cupy.int32(x.shape[0]),
                 cupy.int32(w.shape[1]))

    def call():
        launch(kernel, (w.shape[1] // form.cols,), (form.threads,), arguments, form.shared_bytes)
        return out
    return call


def reference(x, g, w, rms: bool) -> torch.Tensor:
    x, g, w = x.double(), g.double(), w.double()
    if rms:
        x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g
    return x @ w


SHARED_LIMIT = 227 * 1024
FORMS = [Form("registers", c, t, d, r) for (c, t, d), r in itertools.product(
    ((64, 256, 6), (32, 256, 4), (32, 256, 6), (64, 512, 2)), (False, True))]
FORMS += [Form("rolled", c, t, d, r) for (c, t, d), r in itertools.product(
    ((64, 256, 2), (64, 256, 4), (64, 256, 8), (64, 512, 2), (32, 256, 2), (32, 256, 4), (32, 256, 8),
     (32, 512, 2), (32, 512, 4)), (False, True))]  # the others spill
FORMS += [Form("staged", 64, 256, d, r) for d, r in itertools.product((6, 10), (False, True))]


def measure(b: int) -> list[dict]:
    """Rows for activations of ``2 b`` rows: cuBLAS, every form, the generated fused kernels."""
    rows = []
    x, g, w = (torch.randn(s, device="cuda").half() for s in mlp.rmsnorm_shapes(b))
    rows.append({"b": b, "what": "torch.mm", "us": time_graph(lambda: torch.mm(x, w), replays=100).median_us})
    print(rows[-1], flush=True)
    for form in FORMS:
        row = {"b": b, "what": "registers", **dataclasses.asdict(form)}
        try:
            call = run_form(form, x, g, w)
            out = call()
            torch.cuda.synchronize()
        except Exception as error:  # a form that does not compile or launch: recorded, not fatal
            row["failure"] = str(error).splitlines()[0]
        else:
            want = reference(x, g, w, form.rms)
            row["relative_error"] = float((out.double() - want).norm() / want.norm())
            row["us"] = time_graph(call, replays=100).median_us
        rows.append(row)
        print(row, flush=True)
    programs, labels = [], []
    for iters, threads in ((16, 256), (8, 256), (16, 512)):
        for multicast in (0, 2):
            graph = mlp.rmsnorm_fused(b, grid=128, iters=iters, threads=threads)
            programs.append(generate_cuda_program(graph, None, options=dataclasses.replace(
                OptimizerOptions(), stages=2, multicast_cluster=multicast)))
            labels.append({"iters": iters, "threads": threads, "multicast": multicast})
    for label, program in zip(labels, build_many(programs), strict=True):
        program.load()
        us = time_graph(lambda p=program: p.launch([x, g, w]), replays=100).median_us
        rows.append({"b": b, "what": "generated rmsnorm", **label, "us": us})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    args = parser.parse_args(argv)
    facts = device_facts()
    write_record(args.out, "gemv_registers", facts, measure(1) + measure(8))


if __name__ == "__main__":
    try:
        main()
    except mi.MirageError as error:
        raise SystemExit(str(error)) from error
