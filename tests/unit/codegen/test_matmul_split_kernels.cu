// Test kernels for the K split of TensorCoreMatmul (matmul.cuh), built by test_matmul_split.py and
// run by tests/gpu/test_matmul_split_gpu.py.
#include <mirage/mirage.cuh>

using namespace mirage::dev;

// C[M gy, N gx] = Σ_r decay^(R−1−r) · A_r · B_r: block (bx, by) computes C tile (by, bx), the forloop
// walks K with the accumulator in registers, scaled by `decay` before each product (every partial
// sum of a split takes the factor). decay = 1 is the plain product.
template <class T, class Out, int M, int N, int K, int NumThreads, class Grid>
__device__ void split_matmul(Out* c, const T* a, const T* b, int forloop_range, float decay) {
  extern __shared__ __align__(128) char shared[];
  using ALayout = WithPitch<RowMajor<M, K>, padded_pitch<T>(K)>;
  using BLayout = WithPitch<RowMajor<K, N>, padded_pitch<T>(N)>;
  using CLayout = RowMajor<M, N>;
  using Mm = TensorCoreMatmul<T, ALayout, BLayout, NumThreads, Grid>;
  static_assert(Mm::kSupported, "the test shapes run on tensor cores");
  constexpr int kStages = 2;
  using AIterator = InputIterator<T, ALayout, kStages, NumThreads>;
  using BIterator = InputIterator<T, BLayout, kStages, NumThreads>;
  const int64_t rows = int64_t(M) * gridDim.y, cols = int64_t(N) * gridDim.x, depth = int64_t(K) * forloop_range;
  const Strides a_strides = row_major_strides(1, 1, rows, depth);
  const Strides b_strides = row_major_strides(1, 1, depth, cols);
  const Strides c_strides = row_major_strides(1, 1, rows, cols);
  const AIterator in_a(a, a_strides, locate_input_tile<ALayout>(a_strides, DimMap{-1, 2, -1}, 3, forloop_range, blockIdx),
                       forloop_range, shared_at<T>(shared, 0));
  const BIterator in_b(b, b_strides, locate_input_tile<BLayout>(b_strides, DimMap{3, -1, -1}, 2, forloop_range, blockIdx),
                       forloop_range, shared_at<T>(shared, AIterator::kSharedBytes));
  const auto c_tile = make_shared_tile<CLayout>(shared_at<Out>(shared, AIterator::kSharedBytes + BIterator::kSharedBytes));
  typename Mm::Accumulator accumulator;
  accumulator.clear();
  pipelined_forloop<kStages>(
      forloop_range,
      [&](int r) {
        if (decay != 1.0f) Mm::scale_rows(accumulator, [&](int) { return decay; });
        Mm::run(accumulator, in_a.stage(r), in_b.stage(r));
      },
      in_a, in_b);
  Mm::write_back(accumulator, c_tile);
  __syncthreads();
  OutputSaver<Out, CLayout, NumThreads>::save(c, c_strides, locate_output_tile<CLayout>(c_strides, DimMap{3, 2, -1}, blockIdx),
                                              c_tile);
}

#define SPLIT_MATMUL(NAME, T, OUT, M, N, K, THREADS, GRID)                                                         \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                          \
      NAME(OUT* c, const T* a, const T* b, int forloop_range, float decay) {                                      \
    split_matmul<T, OUT, M, N, K, THREADS, GRID>(c, a, b, forloop_range, decay);                                  \
  }

// The rmsnorm_b1 tile (2 rows padded to 16, 48 columns, K = 512): the model's split, fp32 output
// (summed in place in the output tile).
SPLIT_MATMUL(split_f16_2x48x512_auto, __half, float, 2, 48, 512, 256, SplitKWarpGrid)
// fp16 output: the partial sums go through the 16-bit tile in two rounds.
SPLIT_MATMUL(split_f16_16x48x256_auto_f16out, __half, __half, 16, 48, 256, 256, SplitKWarpGrid)
// bf16, 16 warps (16 accumulator values at most per thread).
SPLIT_MATMUL(split_bf16_8x48x128_auto, __nv_bfloat16, float, 8, 48, 128, 512, SplitKWarpGrid)
// TF32 (fp32 inputs), two row tiles, an uneven split: 3 groups over 8 k-steps (2 + 3 + 3).
using TwoByOneByThree = FixedWarpGrid<2, 1, 3>;
SPLIT_MATMUL(split_f32_32x16x64_3groups, float, float, 32, 16, 64, 256, TwoByOneByThree)
// bf16 in and out (two rounds through the 16-bit tile), 4 groups over 6 k-steps (1 + 2 + 1 + 2).
using OneByOneByFour = FixedWarpGrid<1, 1, 4>;
SPLIT_MATMUL(split_bf16_4x32x96_4groups, __nv_bfloat16, __nv_bfloat16, 4, 32, 96, 128, OneByOneByFour)
// No split: the default grid through the same kernel (the reference layout).
SPLIT_MATMUL(split_f16_2x48x512_default, __half, float, 2, 48, 512, 256, DefaultWarpGrid)

// The grids the model picks for the shapes above (and the rmsnorm/gatedmlp tiles).
static_assert(TensorCoreMatmul<__half, WithPitch<RowMajor<2, 512>, 520>, WithPitch<RowMajor<512, 48>, 56>, 256,
                               SplitKWarpGrid>::kWarpsK == 4);
static_assert(TensorCoreMatmul<__half, WithPitch<RowMajor<2, 512>, 520>, WithPitch<RowMajor<512, 48>, 56>, 256,
                               SplitKWarpGrid>::kWarpsN == 1);
static_assert(TensorCoreMatmul<__half, WithPitch<RowMajor<2, 512>, 520>, WithPitch<RowMajor<512, 48>, 56>, 256>::kWarpsK == 1);
static_assert(TensorCoreMatmul<__half, WithPitch<RowMajor<2, 512>, 520>, WithPitch<RowMajor<512, 48>, 56>, 256>::kWarpsN == 6);
// A fixed grid must fit the block and the tile; it may have more groups than k-steps (idle groups).
static_assert(!TensorCoreMatmul<__half, RowMajor<16, 64>, WithPitch<RowMajor<64, 32>, 40>, 128, FixedWarpGrid<1, 2, 4>>::kSupported,
              "more warps than the block has");
static_assert(!TensorCoreMatmul<__half, RowMajor<16, 64>, WithPitch<RowMajor<64, 32>, 40>, 128, FixedWarpGrid<2, 1, 1>>::kSupported,
              "two row tiles of 16 rows");
static_assert(TensorCoreMatmul<__half, RowMajor<16, 16>, WithPitch<RowMajor<16, 32>, 40>, 128, FixedWarpGrid<1, 2, 2>>::kSupported,
              "one k-step, two groups");
