"""A hand-written GEMV probe: does weight streaming reach the read floor once its block barriers go?

``Y[16, N] = X[16, K] @ W[K, N]`` (fp16, fp32 sums) with the weight copied by the warps that use it:
each block owns 48 columns, its warps take turns over K in slices of 16 rows, and each warp copies
its own slices (``cp.async``) into a pipeline of its own, waits for them with ``cp.async.wait_group``
and ``__syncwarp`` only, and multiplies them on the tensor cores (``ldmatrix``, ``mma.sync``).  The
warps' partial sums meet once, after the loop, through shared memory.  No block barrier runs in the
loop; every warp keeps ``stages - 1`` slices in flight.

Compared, in one run, with ``torch.mm`` and with our generated GEMV (``benchmarks.stream_floor``).
Each probe result is checked against ``torch.mm`` before it is timed.  Prints one line per build and
writes gemv_warps_<date>.json into ``--out`` (default benchmarks/results)."""

from __future__ import annotations

import argparse
import itertools

import torch

from mirage.codegen.profile import device_facts, time_graph

SOURCE = r"""
#define WARPS %(warps)d
#define STAGES %(stages)d
#define KC %(rows)d
#define NC 48
#define PITCH_W 56
#define PITCH_X (KC + 8)

__device__ __forceinline__ void cp_async16(unsigned short* shared, const unsigned short* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%%0], [%%1], 16;" ::"r"(address), "l"(global));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const unsigned short* shared, bool trans) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  if (trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%%0, %%1, %%2, %%3}, [%%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%%0, %%1, %%2, %%3}, [%%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}

__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%%0, %%1, %%2, %%3}, "
               "{%%4, %%5, %%6, %%7}, {%%8, %%9}, {%%0, %%1, %%2, %%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) gemv_warps(
    const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
    unsigned short* __restrict__ y, int k, int n) {
  extern __shared__ __align__(128) unsigned short smem[];
  constexpr int kWStage = KC * PITCH_W, kStage = kWStage + 16 * PITCH_X;
  const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;
  const int n0 = blockIdx.x * NC;
  unsigned short* mine = smem + warp * STAGES * kStage;
  const int chunks = k / KC / WARPS;
  float acc[6][4] = {};
  auto issue = [&](int c) {
    if (c < chunks) {
      const int k0 = (c * WARPS + warp) * KC;
      unsigned short* ws = mine + (c %% STAGES) * kStage;
      unsigned short* xs = ws + kWStage;
      for (int v = lane; v < KC * 6; v += 32) {
        const int r = v / 6, q = v %% 6;
        cp_async16(ws + r * PITCH_W + q * 8, w + (long long)(k0 + r) * n + n0 + q * 8);
      }
      for (int v = lane; v < 16 * KC / 8; v += 32) {
        const int row = v / (KC / 8), q = v %% (KC / 8);
        cp_async16(xs + row * PITCH_X + q * 8, x + (long long)row * k + k0 + q * 8);
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  for (int c = 0; c < chunks; ++c) {
    issue(c + STAGES - 1);
    asm volatile("cp.async.wait_group %%0;" ::"n"(STAGES - 1));
    __syncwarp();
    const unsigned short* ws = mine + (c %% STAGES) * kStage;
    const unsigned short* xs = ws + kWStage;
#pragma unroll
    for (int s = 0; s < KC / 16; ++s) {
      unsigned a[4];
      ldmatrix_x4(a, xs + (lane %% 16) * PITCH_X + s * 16 + (lane / 16) * 8, false);
#pragma unroll
      for (int t = 0; t < 3; ++t) {
        unsigned b[4];
        ldmatrix_x4(b, ws + (s * 16 + lane %% 16) * PITCH_W + (2 * t + lane / 16) * 8, true);
        mma(acc[2 * t], a, b[0], b[1]);
        mma(acc[2 * t + 1], a, b[2], b[3]);
      }
    }
    __syncwarp();
  }
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  float* partial = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int t = 0; t < 6; ++t) {
    const int row = lane / 4, col = t * 8 + (lane %% 4) * 2;
    float* p = partial + (warp * 16 + row) * NC + col;
    p[0] = acc[t][0]; p[1] = acc[t][1]; p[8 * NC] = acc[t][2]; p[8 * NC + 1] = acc[t][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * NC; i += blockDim.x) {
    float sum = 0.0f;
    for (int v = 0; v < WARPS; ++v) sum += partial[v * 16 * NC + i];
    unsigned short h;
    asm("cvt.rn.f16.f32 %%0, %%1;" : "=h"(h) : "f"(sum));
    y[(long long)(i / NC) * n + n0 + i %% NC] = h;
  }
}
"""


# rmsnorm's weight read box by box (128 strips of 48 columns, as benchmarks.stream_floor's box read),
# each thread's UNROLL vectors a round copied by cp.async into a ring of STAGES rounds in shared
# memory, waited for with cp.async.wait_group and read back: the read through the copy path that
# the generated kernels use, against the same read into registers (stream_floor.read_boxes)
COPY_SOURCE = r"""
#define STAGES %(stages)d
#define UNROLL 4
extern "C" __global__ void read_copies(const int4* __restrict__ p, int row_vectors, int box_rows,
                                       int box_vectors, int* out) {
  extern __shared__ __align__(16) int4 ring[];
  const int total = box_rows * box_vectors;
  const int4* base = p + (long long)blockIdx.x * box_vectors;
  const int rounds = total / (UNROLL * blockDim.x);
  auto issue = [&](int round) {
    if (round < rounds) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int e = (round * UNROLL + u) * blockDim.x + threadIdx.x;
        const int4* source = base + (long long)(e / box_vectors) * row_vectors + e %% box_vectors;
        int4* target = ring + ((round %% STAGES) * UNROLL + u) * blockDim.x + threadIdx.x;
        const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(target));
        asm volatile("cp.async.cg.shared.global [%%0], [%%1], 16;" ::"r"(address), "l"(source));
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  int acc = 0;
  for (int r = 0; r < STAGES - 1; ++r) issue(r);
  for (int r = 0; r < rounds; ++r) {
    issue(r + STAGES - 1);
    asm volatile("cp.async.wait_group %%0;" ::"n"(STAGES - 1));
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int4 v = ring[((r %% STAGES) * UNROLL + u) * blockDim.x + threadIdx.x];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x5eed) out[0] = acc;
}
"""


def copy_probe(w: torch.Tensor, stages: int, threads: int) -> float:
    """µs to read ``w`` box by box through ``cp.async`` and a ring of ``stages`` rounds."""
    import cupy

    from benchmarks.stream_floor import cuda_kernel, launch

    smem = stages * 4 * threads * 16
    kernel = cuda_kernel(COPY_SOURCE % {"stages": stages}, "read_copies", smem)
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    rows, cols = w.shape
    arguments = (w.data_ptr(), cupy.int32(cols // 8), cupy.int32(rows), cupy.int32(6), sink.data_ptr())
    return time_graph(lambda: launch(kernel, (cols // 48,), (threads,), arguments, smem),
                      replays=100).median_us


def shared_bytes(warps: int, stages: int, rows: int) -> int:
    stage_bytes = (rows * 56 + 16 * (rows + 8)) * 2
    return max(warps * stages * stage_bytes, warps * 16 * 48 * 4)


def probe(warps: int, stages: int, rows: int):
    """The probe with ``warps`` warps, ``stages`` slices of ``rows`` weight rows each in flight."""
    from benchmarks.stream_floor import cuda_kernel

    return cuda_kernel(SOURCE % {"warps": warps, "stages": stages, "rows": rows}, "gemv_warps",
                       shared_bytes(warps, stages, rows))


def main(argv=None) -> None:
    import cupy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    args = parser.parse_args(argv)
    facts = device_facts()
    k, n = 4096, 6144
    x = torch.randn(16, k, device="cuda").half()
    w = torch.randn(k, n, device="cuda").half()
    expected = (x.float() @ w.float())
    rows = [{"what": "torch.mm", "us": time_graph(lambda: torch.mm(x, w), replays=100).median_us}]
    print(rows[-1], flush=True)
    from benchmarks.stream_floor import launch, read_boxes, write_record

    for threads in (256, 512):
        us = read_boxes(w, 128, 1, threads)
        rows.append({"what": "read boxes into registers", "threads": threads, "us": us})
        print(rows[-1], flush=True)
        for stages in (2, 3, 4):
            rows.append({"what": "read boxes through cp.async", "threads": threads, "stages": stages,
                         "us": copy_probe(w, stages, threads)})
            print(rows[-1], flush=True)
    for warps, stages, slice_rows in itertools.product((4, 8, 16), (2, 3, 4, 6), (16, 32, 64)):
        smem = shared_bytes(warps, stages, slice_rows)
        if smem > 227 * 1024:
            continue
        kernel = probe(warps, stages, slice_rows)
        y = torch.empty(16, n, device="cuda").half()

        def run(kernel=kernel, smem=smem, warps=warps, y=y):
            arguments = (x.data_ptr(), w.data_ptr(), y.data_ptr(), cupy.int32(k), cupy.int32(n))
            launch(kernel, (n // 48,), (warps * 32,), arguments, smem)
        run()
        torch.cuda.synchronize()
        error = ((y.float() - expected).abs().max() / expected.abs().max()).item()
        row = {"what": "warp-owned probe", "warps": warps, "stages": stages, "rows": slice_rows,
               "smem": smem,
               "relative_error": error}
        if error < 1e-2:
            row["us"] = time_graph(run, replays=100).median_us
        rows.append(row)
        print(row, flush=True)
    write_record(args.out, "gemv_warps", facts, rows)


if __name__ == "__main__":
    main()
