// Basic definitions shared by the mirage device library: element types, conversions, constants.
//
// Every value is computed in fp32 inside the library; tiles in memory hold fp16 (__half),
// bf16 (__nv_bfloat16) or fp32 (float). Conversions go through Numeric<T>.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define MIRAGE_DEVICE __device__ __forceinline__
#define MIRAGE_HOST_DEVICE __host__ __device__ __forceinline__

namespace mirage::dev {

constexpr int kWarpSize = 32;
// Bytes moved by one vectorized access (cp.async, LDG.128, STG.128, LDS.128).
constexpr int kVectorBytes = 16;

template <class T>
struct Numeric;

template <>
struct Numeric<float> {
  static MIRAGE_DEVICE float to_float(float value) { return value; }
  static MIRAGE_DEVICE float from_float(float value) { return value; }
  static MIRAGE_DEVICE uint32_t bits(float value) { return __float_as_uint(value); }
};

template <>
struct Numeric<__half> {
  static MIRAGE_DEVICE float to_float(__half value) { return __half2float(value); }
  static MIRAGE_DEVICE __half from_float(float value) { return __float2half_rn(value); }
  static MIRAGE_DEVICE uint32_t bits(__half value) { return __half_as_ushort(value); }
};

template <>
struct Numeric<__nv_bfloat16> {
  static MIRAGE_DEVICE float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
  static MIRAGE_DEVICE __nv_bfloat16 from_float(float value) { return __float2bfloat16_rn(value); }
  static MIRAGE_DEVICE uint32_t bits(__nv_bfloat16 value) { return __bfloat16_as_ushort(value); }
};

template <class T>
MIRAGE_DEVICE float to_float(T value) {
  return Numeric<T>::to_float(value);
}

template <class T>
MIRAGE_DEVICE T from_float(float value) {
  return Numeric<T>::from_float(value);
}

// Converts fp32 values to T and packs them into 32-bit words (two 16-bit elements per word).
template <class T, int N>
MIRAGE_DEVICE void pack_words(const float (&values)[N], uint32_t (&words)[N * sizeof(T) / 4]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < N; ++i) words[i] = Numeric<T>::bits(from_float<T>(values[i]));
  } else {
    static_assert(sizeof(T) == 2 && N % 2 == 0, "pack_words packs 32-bit words");
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      words[i] = Numeric<T>::bits(from_float<T>(values[2 * i])) | (Numeric<T>::bits(from_float<T>(values[2 * i + 1])) << 16);
  }
}

// One 16-byte global store (STG.128). Written in PTX because the compiler may split a plain
// uint4 store into 32-bit stores when it cannot prove the alignment that the caller checked.
MIRAGE_DEVICE void store_global_vector(void* address, uint4 value) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "r"(value.x), "r"(value.y), "r"(value.z),
               "r"(value.w)
               : "memory");
}

// One 8-byte global store (STG.64), in PTX for the same reason.
MIRAGE_DEVICE void store_global_vector(void* address, uint2 value) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(address), "r"(value.x), "r"(value.y) : "memory");
}

// Elements of T in one 16-byte vector.
template <class T>
constexpr int kVectorElements = kVectorBytes / static_cast<int>(sizeof(T));

// `values` converted to T and written with one 16- or 8-byte global store (`address` aligned to it).
template <class T, int N>
MIRAGE_DEVICE void store_global_values(void* address, const float (&values)[N]) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes == 16 || kBytes == 8, "one 16- or 8-byte store");
  uint32_t words[kBytes / 4];
  pack_words<T>(values, words);
  if constexpr (kBytes == 16) {
    store_global_vector(address, make_uint4(words[0], words[1], words[2], words[3]));
  } else {
    store_global_vector(address, make_uint2(words[0], words[1]));
  }
}

MIRAGE_HOST_DEVICE constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
MIRAGE_HOST_DEVICE constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }

// The calling thread's index in a one-dimensional thread block (the only block shape the
// library's collective functions assume).
// MIRAGE_ASSUME_THREAD_INDEX tells the compiler that the index lies in [0, 1024), so that index
// arithmetic divides and takes remainders by shifts and masks, without the fix-ups for negative
// operands. It cuts the suite's kernels by up to a third of their instructions. On the H100 it moved
// the cases between -0.4 and +0.4 µs and made a GEMV member of rmsnorm_b1 21.3 → 28.9 µs
// (benchmarks/results/define_ab_h100_2026-11-27_thread_index.json); on an H200 the suite's picks built
// with it gave the same bits and took gatedmlp_m1 22.41 → 19.61 µs, gatedmlp_m8 22.52 → 21.32, the
// rest within -0.3 / +0.13 µs (define_ab_h200_2026-11-28_thread_index.json). On by default. ptxas 13.0
// miscompiles some kernels under it (a cp.async copy the GPU stops at): the compiler checks every cubin
// and rebuilds such a kernel with the define at 0 (mirage/codegen/miscompile.py).
#ifndef MIRAGE_ASSUME_THREAD_INDEX
#define MIRAGE_ASSUME_THREAD_INDEX 1
#endif
MIRAGE_DEVICE int thread_index() {
  const int index = static_cast<int>(threadIdx.x);
#if MIRAGE_ASSUME_THREAD_INDEX
  __builtin_assume(index >= 0 && index < 1024);
#endif
  return index;
}

// Programmatic dependent launch (sm_90): a kernel launched with the programmatic stream
// serialization attribute may start while the kernel before it in the stream still runs.
// Every generated kernel lets the next one launch as soon as all its own blocks have started
// (the next kernel's blocks then take SM slots as they free up), and waits for the previous
// kernel to complete, with its writes visible, before it touches global memory. Without the
// attribute both are no-ops. (CUTLASS's grid_dependency_control.h has the same two
// instructions, behind headers that would triple the compile time of a generated kernel.)
MIRAGE_DEVICE void launch_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

MIRAGE_DEVICE void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A typed pointer into dynamic shared memory at a byte offset chosen by the memory planner.
template <class T>
MIRAGE_DEVICE T* shared_at(char* shared_base, int byte_offset) {
  return reinterpret_cast<T*>(shared_base + byte_offset);
}

}  // namespace mirage::dev
