// Test kernels for block-wide reductions (reduction.cuh, gen::rms_norm_apply): few long rows, so
// that several warps reduce each row and combine through a scratch in dynamic shared memory (after
// the tile). Built by test_device_lib.py (SASS) and run by test_reduction_gpu.py.
#include <mirage/mirage.cuh>
#include <mirage/gen/kernel.cuh>

using namespace mirage::dev;

// The scratch of a block-wide reduction, after a tile of layout L.
template <class T, class L>
__device__ ReductionScratch scratch_after(char* shared) {
  return ReductionScratch{shared_at<float>(shared, round_up(L::storage * sizeof(T), 16))};
}

template <class T, class L, int NumThreads>
__device__ SharedTile<T, L> load_rows(const T* in, char* shared) {
  const InputIterator<T, L, 1, NumThreads> input(in, row_major_strides(L::dim0, L::dim1, L::dim2, L::dim3),
                                                 TileCoordinate{0, 0}, 1, shared_at<T>(shared, 0));
  input.load(0);
  Pipeline<1>::commit();
  Pipeline<1>::wait_all();
  return input.stage(0);
}

// out[r] = Σ x[r, :]² (which 0) or max x[r, :] (which 1), R rows of C, N threads.
template <int R, int C, int N>
__device__ void reduce_rows(float* out, const __half* in, int which) {
  using L = WithPitch<RowMajor<R, C>, C + 8>;
  extern __shared__ __align__(128) char shared[];
  const auto x = load_rows<__half, L, N>(in, shared);
  const auto emit = [&](int row, float value) { out[row] = value; };
  if (which == 0) {
    reduce_apply<N, 3, SumReduce>(x, Square{}, emit, scratch_after<__half, L>(shared));
  } else {
    reduce_apply<N, 3, MaxReduce>(x, Identity{}, emit, scratch_after<__half, L>(shared));
  }
}

// out = x / sqrt(mean(x², last dim) + eps), called twice on the same tile (the partials of the
// first call must not leak into the second).
template <int R, int C, int N>
__device__ void rms_norm_rows(float* out, const __half* in, float eps) {
  using L = RowMajor<R, C>;
  extern __shared__ __align__(128) char shared[];
  const auto x = load_rows<__half, L, N>(in, shared);
  const auto scratch = scratch_after<__half, L>(shared);
  // emit functions take chunks of consecutive elements (gen/chunk.cuh)
  const auto first = [&](int linear, auto& values) {
    for (int e = 0; e < mirage::gen::chunk_of<decltype(values)>; ++e) out[linear + e] = values[e];
  };
  const auto second = [&](int linear, auto& values) {
    for (int e = 0; e < mirage::gen::chunk_of<decltype(values)>; ++e) out[R * C + linear + e] = 2.0f * values[e];
  };
  mirage::gen::rms_norm_apply<N>(x, eps, first, scratch);
  mirage::gen::rms_norm_apply<N>(x, eps, second, scratch);
}

extern "C" __global__ void __launch_bounds__(512) reduce_2x4096_t512(float* out, const __half* in, int which) {
  reduce_rows<2, 4096, 512>(out, in, which);
}
extern "C" __global__ void __launch_bounds__(128) reduce_1x1024_t128(float* out, const __half* in, int which) {
  reduce_rows<1, 1024, 128>(out, in, which);
}
extern "C" __global__ void __launch_bounds__(256) reduce_3x2048_t256(float* out, const __half* in, int which) {
  reduce_rows<3, 2048, 256>(out, in, which);  // 3 rows × 2 warps; two warps idle
}
extern "C" __global__ void __launch_bounds__(1024) rms_norm_1x4096_t1024(float* out, const __half* in, float eps) {
  rms_norm_rows<1, 4096, 1024>(out, in, eps);
}
extern "C" __global__ void __launch_bounds__(256) rms_norm_2x4096_t256(float* out, const __half* in, float eps) {
  rms_norm_rows<2, 4096, 256>(out, in, eps);
}

// Without a scratch the same reduction uses one warp per row (no combine, one barrier: the load's).
extern "C" __global__ void __launch_bounds__(512) reduce_2x4096_t512_warps(float* out, const __half* in) {
  using L = WithPitch<RowMajor<2, 4096>, 4104>;
  extern __shared__ __align__(128) char shared[];
  const auto x = load_rows<__half, L, 512>(in, shared);
  reduce_apply<512, 3, SumReduce>(x, Square{}, [&](int row, float value) { out[row] = value; });
}
