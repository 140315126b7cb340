"""nTrans with the whole row in registers: a probe of what the generated kernel's shared-memory round
trips cost at the launch floor.

The generated kernel (one block per row) copies H, X and A into shared memory, reads H back for its
sum of squares and again for the update, stores the update into shared memory, then reads it twice
for the second rms. The probe's kernel, of the same name and signature and launched by the same
runtime (so with the same dependent launch), loads each thread's elements of the three rows straight
into registers with 16-byte loads, sums squares with warp shuffles and one exchange through shared
memory per rms, and writes the output from registers. Its update is rounded to 16 bits before the
second rms, as the generated kernel's is.

Compares, in one run, at b = 1 and 8, at 256, 512 and 1024 threads: the generated kernel op by op
(``generated``, ``row_reductions=False``), this hand-written one (``registers``), and the generator's
row-local form of the same idea (``row_local``, the default since); and torch.compile.
Writes ntrans_registers_<date>.json into ``--out``."""

from __future__ import annotations

import argparse
import dataclasses

import torch

import mirage as mi
from benchmarks.mugraphs import ntrans
from benchmarks.stream_floor import write_record
from benchmarks.suite import ntrans as ntrans_torch
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

OFF = dataclasses.replace(OptimizerOptions(), row_reductions=False)  # the op-by-op kernel

SOURCE = r"""
#include <cuda_fp16.h>
#include <cstdint>

constexpr int kN = 4096;
constexpr int kE = kN / THREADS;            // elements a thread holds of each row
constexpr int kV = kE < 8 ? kE : 8;         // elements of one load
constexpr int kL = kE / kV;                 // loads a thread makes of each row
constexpr int kWarps = THREADS / 32;
template <int V> struct VecOf { using type = uint4; };
template <> struct VecOf<4> { using type = uint2; };
using Vec = typename VecOf<kV>::type;

__device__ __forceinline__ void load_row(const __half* row, float* out) {
#pragma unroll
  for (int j = 0; j < kL; ++j) {
    Vec v = *reinterpret_cast<const Vec*>(row + (j * THREADS + threadIdx.x) * kV);
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int e = 0; e < kV / 2; ++e) {
      const float2 f = __half22float2(h[e]);
      out[j * kV + 2 * e] = f.x;
      out[j * kV + 2 * e + 1] = f.y;
    }
  }
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31;
  if (lane == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < kWarps ? scratch[lane] : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void __launch_bounds__(THREADS) ntrans_k3(
    __half* __restrict__ output0, const __half* __restrict__ input0, const __half* __restrict__ input1,
    const __half* __restrict__ input2) {
  __shared__ float scratch[2][32];
  asm volatile("griddepcontrol.launch_dependents;");
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kN;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float h[kE], x[kE], a[kE];
  load_row(input0 + base, h);
  load_row(input1 + base, x);
  load_row(input2 + base, a);
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < kE; ++e) sum += h[e] * h[e];
  const float scale = rsqrtf(block_sum(sum, scratch[0]) / kN + 1e-6f);
  float y[kE];
  sum = 0.0f;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    y[e] = __half2float(__float2half(x[e] + a[e] * (h[e] * scale - x[e])));
    sum += y[e] * y[e];
  }
  const float scale2 = rsqrtf(block_sum(sum, scratch[1]) / kN + 1e-6f);
#pragma unroll
  for (int j = 0; j < kL; ++j) {
    Vec v;
    __half2* o = reinterpret_cast<__half2*>(&v);
#pragma unroll
    for (int e = 0; e < kV / 2; ++e)
      o[e] = __floats2half2_rn(y[j * kV + 2 * e] * scale2, y[j * kV + 2 * e + 1] * scale2);
    *reinterpret_cast<Vec*>(output0 + base + (j * THREADS + threadIdx.x) * kV) = v;
  }
}
"""


def registers_program(program, threads: int):
    """``program`` (a generated nTrans build) with its kernel replaced by the register form."""
    (kernel,) = program.kernels
    code = f"#define THREADS {threads}\n" + SOURCE
    return dataclasses.replace(program, code=code, kernels=(dataclasses.replace(kernel, smem_bytes=0),))


def measure(b: int) -> list[dict]:
    rows = []
    inputs = [torch.randn(s, device="cuda").half() for s in ntrans.shapes(b)]
    want = ntrans_torch(*(x.double() for x in inputs))
    compiled = torch.compile(ntrans_torch, mode="max-autotune-no-cudagraphs")
    compiled(*inputs)
    rows.append({"b": b, "what": "torch.compile", "us": time_graph(lambda: compiled(*inputs)).median_us})
    print(rows[-1], flush=True)
    programs, labels = [], []
    for threads in (256, 512, 1024):
        graph = ntrans.fused(b, threads=threads)
        op_by_op = generate_cuda_program(graph, options=OFF)
        programs += [op_by_op, registers_program(op_by_op, threads), generate_cuda_program(graph)]
        labels += [("generated", threads), ("registers", threads), ("row_local", threads)]
    outputs = {}
    for (what, threads), program in zip(labels, build_many(programs), strict=True):
        program.load()
        (out,) = program.launch(inputs)
        outputs[what, threads] = out
        row = {"b": b, "what": what, "threads": threads,
               "relative_error": float((out.double() - want).norm() / want.norm()),
               "us": time_graph(lambda p=program: p.launch(inputs)).median_us}
        if what != "generated":
            difference = out.float() - outputs["generated", threads].float()
            row["max_abs_vs_generated"] = float(difference.abs().max())
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    args = parser.parse_args(argv)
    write_record(args.out, "ntrans_registers", device_facts(), measure(1) + measure(8))


if __name__ == "__main__":
    try:
        main()
    except mi.MirageError as error:
        raise SystemExit(str(error)) from error
