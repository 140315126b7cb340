// Test kernels for matmul.cuh, and an attention kernel that composes the whole library
// (built by test_device_lib.py).
#include <mirage/mirage.cuh>
#include <type_traits>

using namespace mirage::dev;

// C[M gy, N gx] = A[M gy, K R] · B[K R, N gx]: block (bx, by) computes C tile (by, bx), the
// forloop walks K, and the accumulator stays in registers across the forloop. With BStored, B is
// given transposed (Bᵀ [N gx, K R] row-major, i.e. B column-major, as nn.Linear's weight): its tiles
// are copied as they lie, BStored [N, K], and read as Transposed<BStored> [K, N]. APitch and BPitch:
// the pitches of A's and (not transposed) B's tiles.
template <class T, class Out, int M, int N, int K, int NumThreads, int Stages, template <class, class, class, int> class Mm,
          class BStored = void, int APitch = padded_pitch<T>(K), int BPitch = padded_pitch<T>(N)>
__device__ void matmul_forloop(Out* c, const T* a, const T* b, int forloop_range) {
  extern __shared__ __align__(128) char shared[];
  constexpr bool kTransposed = !std::is_same_v<BStored, void>;
  using ALayout = WithPitch<RowMajor<M, K>, APitch>;
  using BCopied = std::conditional_t<kTransposed, BStored, WithPitch<RowMajor<K, N>, BPitch>>;
  using BLayout = std::conditional_t<kTransposed, Transposed<BCopied>, BCopied>;
  using CLayout = RowMajor<M, N>;
  using Matmul = Mm<T, ALayout, BLayout, NumThreads>;
  using AIterator = InputIterator<T, ALayout, Stages, NumThreads>;
  using BIterator = InputIterator<T, BCopied, Stages, NumThreads>;
  const int64_t rows = int64_t(M) * gridDim.y, cols = int64_t(N) * gridDim.x, depth = int64_t(K) * forloop_range;
  const Strides a_strides = row_major_strides(1, 1, rows, depth);
  const Strides b_strides = kTransposed ? row_major_strides(1, 1, cols, depth) : row_major_strides(1, 1, depth, cols);
  const Strides c_strides = row_major_strides(1, 1, rows, cols);
  // Four-dim numbering: rows are dim 2, columns dim 3.
  const AIterator in_a(a, a_strides, locate_input_tile<ALayout>(a_strides, DimMap{-1, 2, -1}, 3, forloop_range, blockIdx),
                       forloop_range, shared_at<T>(shared, 0));
  const BIterator in_b(b, b_strides,
                       locate_input_tile<BCopied>(b_strides, DimMap{kTransposed ? 2 : 3, -1, -1}, kTransposed ? 3 : 2,
                                                  forloop_range, blockIdx),
                       forloop_range, shared_at<T>(shared, AIterator::kSharedBytes));
  const auto c_tile = make_shared_tile<CLayout>(shared_at<Out>(shared, AIterator::kSharedBytes + BIterator::kSharedBytes));
  typename Matmul::Accumulator accumulator;
  accumulator.clear();
  pipelined_forloop<Stages>(
      forloop_range,
      [&](int r) { Matmul::run(accumulator, in_a.stage(r), SharedTile<T, BLayout>{in_b.stage(r).data}); }, in_a, in_b);
  Matmul::write_back(accumulator, c_tile);
  __syncthreads();
  OutputSaver<Out, CLayout, NumThreads>::save(c, c_strides, locate_output_tile<CLayout>(c_strides, DimMap{3, 2, -1}, blockIdx),
                                              c_tile);
}

#define MATMUL(NAME, T, OUT, M, N, K, THREADS, STAGES, MM)                                                    \
  extern "C" __global__ void __launch_bounds__(THREADS) NAME(OUT* c, const T* a, const T* b, int forloop_range) { \
    matmul_forloop<T, OUT, M, N, K, THREADS, STAGES, MM>(c, a, b, forloop_range);                               \
  }

MATMUL(mm_tc_f16_64x64x32, __half, __half, 64, 64, 32, 128, 3, TensorCoreMatmul)
MATMUL(mm_tc_bf16_32x64x16, __nv_bfloat16, float, 32, 64, 16, 128, 2, TensorCoreMatmul)
MATMUL(mm_tc_f32_32x32x16, float, float, 32, 32, 16, 128, 2, TensorCoreMatmul)
// One warp of four works; a single n8 tile per warp (ldmatrix .x2.trans).
MATMUL(mm_tc_f16_16x8x16, __half, float, 16, 8, 16, 128, 2, TensorCoreMatmul)
// A 3 x 1 warp grid with three n8 tiles per warp (.x4 then .x2).
MATMUL(mm_tc_f16_48x24x32, __half, __half, 48, 24, 32, 128, 2, TensorCoreMatmul)
// M not a multiple of 16: padded to whole atoms (GEMV-like tiles on tensor cores).
MATMUL(mm_tc_f16_8x64x32, __half, float, 8, 64, 32, 128, 2, TensorCoreMatmul)
MATMUL(mm_tc_f32_4x32x16, float, float, 4, 32, 16, 128, 2, TensorCoreMatmul)
MATMUL(mm_tc_bf16_20x16x16, __nv_bfloat16, __nv_bfloat16, 20, 16, 16, 128, 2, TensorCoreMatmul)
MATMUL(mm_simt_f16_10x12x6, __half, float, 10, 12, 6, 64, 2, SimtMatmul)
MATMUL(mm_simt_bf16_32x32x32, __nv_bfloat16, __nv_bfloat16, 32, 32, 32, 128, 2, SimtMatmul)

// B given transposed (see matmul_forloop): stored as STORED [N, K]
#define MATMUL_BT(NAME, T, OUT, M, N, K, THREADS, STORED, MM)                                                    \
  extern "C" __global__ void __launch_bounds__(THREADS) NAME(OUT* c, const T* a, const T* bt, int forloop_range) { \
    matmul_forloop<T, OUT, M, N, K, THREADS, 2, MM, STORED>(c, a, bt, forloop_range);                             \
  }

// Stored rows padded by 16 bytes (ldmatrix free of bank conflicts), .x4 then .x2 (three n8 tiles)
using StoredPadded64 = WithPitch<RowMajor<64, 32>, 40>;
using StoredPadded24 = WithPitch<RowMajor<24, 32>, 40>;
MATMUL_BT(mmt_tc_f16_64x64x32, __half, __half, 64, 64, 32, 128, StoredPadded64, TensorCoreMatmul)
MATMUL_BT(mmt_tc_f16_48x24x32, __half, float, 48, 24, 32, 128, StoredPadded24, TensorCoreMatmul)
// 128-byte swizzled, and dense (correct, with bank conflicts)
using StoredSwizzled = Swizzled128Layout<1, 1, 128, 64>;
using StoredDense = RowMajor<32, 32>;
MATMUL_BT(mmt_tc_bf16_8x128x64, __nv_bfloat16, float, 8, 128, 64, 128, StoredSwizzled, TensorCoreMatmul)
MATMUL_BT(mmt_tc_f16_16x32x32, __half, float, 16, 32, 32, 128, StoredDense, TensorCoreMatmul)
// SIMT cores read it through the layout's offsets
using StoredSimt = RowMajor<12, 8>;
MATMUL_BT(mmt_simt_f16_10x12x8, __half, float, 10, 12, 8, 64, StoredSimt, SimtMatmul)

// Padded products (K or N no whole atom, too large for the CUDA cores): rows rounded up to whole
// 16-byte vectors, as the generated tiles' are.
template <class T>
constexpr int vector_pitch(int cols) {
  return round_up(cols, kVectorElements<T>);
}
#define MATMUL_PADDED(NAME, T, OUT, M, N, K, THREADS)                                                           \
  extern "C" __global__ void __launch_bounds__(THREADS) NAME(OUT* c, const T* a, const T* b, int forloop_range) { \
    matmul_forloop<T, OUT, M, N, K, THREADS, 2, TensorCoreMatmul, void, vector_pitch<T>(K), vector_pitch<T>(N)>(    \
        c, a, b, forloop_range);                                                                                 \
  }
// N of 197: 25 n8 atoms would keep three of the four warps (over three row tiles) busy; 224 keeps four
MATMUL_PADDED(mm_pad_f16_48x197x24, __half, __half, 48, 197, 24, 128)
// K of 37: the last step keeps one element of a pair, and its second chunk lies past the row
MATMUL_PADDED(mm_pad_f16_64x72x37, __half, __half, 64, 72, 37, 64)
MATMUL_PADDED(mm_pad_bf16_32x150x26, __nv_bfloat16, float, 32, 150, 26, 64)
MATMUL_PADDED(mm_pad_f32_80x110x5, float, float, 80, 110, 5, 128)  // TF32: K of 5, one step of 8
using StoredOddK = WithPitch<RowMajor<197, 21>, 24>;
using StoredOddN = WithPitch<RowMajor<100, 32>, 40>;
#define MATMUL_BT_PADDED(NAME, T, OUT, M, N, K, THREADS, STORED)                                                \
  extern "C" __global__ void __launch_bounds__(THREADS) NAME(OUT* c, const T* a, const T* bt, int forloop_range) { \
    matmul_forloop<T, OUT, M, N, K, THREADS, 2, TensorCoreMatmul, STORED, vector_pitch<T>(K)>(c, a, bt, forloop_range); \
  }
MATMUL_BT_PADDED(mmt_pad_f16_48x197x21, __half, __half, 48, 197, 21, 128, StoredOddK)
MATMUL_BT_PADDED(mmt_pad_f16_48x100x32, __half, __half, 48, 100, 32, 64, StoredOddN)
static_assert(TensorCoreMatmul<__half, WithPitch<RowMajor<48, 24>, 24>, WithPitch<RowMajor<24, 197>, 200>, 128>::kCols == 224);
static_assert(TensorCoreMatmul<__half, WithPitch<RowMajor<48, 24>, 24>, WithPitch<RowMajor<24, 197>, 200>, 128>::kGrid.n == 4);

static_assert(Transposed<WithPitch<RowMajor<24, 32>, 40>>::offset(0, 0, 5, 7) == 7 * 40 + 5);
static_assert(!TensorCoreMatmul<float, RowMajor<16, 32>, Transposed<RowMajor<32, 32>>, 128>::kSupported,
              "TF32 fragments of a transposed B are not loaded by ldmatrix: SIMT");

// Matmul picks tensor cores exactly when the shape allows it.
static_assert(std::is_same_v<Matmul<__half, RowMajor<10, 6>, RowMajor<6, 12>, 64>,
                             SimtMatmul<__half, RowMajor<10, 6>, RowMajor<6, 12>, 64>>);
static_assert(std::is_same_v<Matmul<__half, WithPitch<RowMajor<64, 32>, 40>, WithPitch<RowMajor<32, 64>, 72>, 128>,
                             TensorCoreMatmul<__half, WithPitch<RowMajor<64, 32>, 40>, WithPitch<RowMajor<32, 64>, 72>, 128>>);
static_assert(std::is_same_v<Matmul<__half, RowMajor<1, 64>, WithPitch<RowMajor<64, 64>, 72>, 128>,
                             TensorCoreMatmul<__half, RowMajor<1, 64>, WithPitch<RowMajor<64, 64>, 72>, 128>>);
// Rows of 36 halves are not 16-byte aligned for ldmatrix.
static_assert(!TensorCoreMatmul<__half, RowMajor<16, 36>, RowMajor<36, 8>, 128>::kSupported);
// K of 12: small products stay on the CUDA cores (16 outputs a thread), large ones are padded (128).
static_assert(std::is_same_v<Matmul<__half, WithPitch<RowMajor<32, 12>, 16>, WithPitch<RowMajor<12, 64>, 72>, 128>,
                             SimtMatmul<__half, WithPitch<RowMajor<32, 12>, 16>, WithPitch<RowMajor<12, 64>, 72>, 128>>);
static_assert(std::is_same_v<Matmul<__half, WithPitch<RowMajor<256, 12>, 16>, WithPitch<RowMajor<12, 64>, 72>, 128>,
                             TensorCoreMatmul<__half, WithPitch<RowMajor<256, 12>, 16>, WithPitch<RowMajor<12, 64>, 72>, 128>>);

// O[16 gy, D] = softmax(scale · Q Kᵀ) V with Kᵀ given as [D, KB R] and V as [KB R, D]; the
// forloop walks the keys with the online-softmax accumulators; O stays in registers.
template <int D, int KB, int NumThreads, int Stages>
__device__ void attention(__half* o, const __half* q, const __half* kt, const __half* v, int forloop_range, float scale) {
  constexpr int BM = 16;
  extern __shared__ __align__(128) char shared[];
  using QLayout = WithPitch<RowMajor<BM, D>, padded_pitch<__half>(D)>;
  using KLayout = WithPitch<RowMajor<D, KB>, padded_pitch<__half>(KB)>;
  using VLayout = WithPitch<RowMajor<KB, D>, padded_pitch<__half>(D)>;
  using SLayout = RowMajor<BM, KB>;
  using PLayout = WithPitch<RowMajor<BM, KB>, padded_pitch<__half>(KB)>;
  using RowLayout = RowMajor<BM, 1>;
  using OLayout = RowMajor<BM, D>;
  using QK = TensorCoreMatmul<__half, QLayout, KLayout, NumThreads>;
  using PV = TensorCoreMatmul<__half, PLayout, VLayout, NumThreads>;
  using QIterator = InputIterator<__half, QLayout, 1, NumThreads>;
  using KIterator = InputIterator<__half, KLayout, Stages, NumThreads>;
  using VIterator = InputIterator<__half, VLayout, Stages, NumThreads>;
  constexpr int kQ = 0;
  constexpr int kK = kQ + QIterator::kSharedBytes;
  constexpr int kV = kK + KIterator::kSharedBytes;
  constexpr int kS = kV + VIterator::kSharedBytes;
  constexpr int kP = kS + SLayout::storage * 4;
  constexpr int kRowMax = kP + round_up(PLayout::storage * 2, 16);
  constexpr int kMax = kRowMax + RowLayout::storage * 4;
  constexpr int kFactors = kMax + MaxAccumulator<RowLayout, NumThreads>::kSharedBytes;
  constexpr int kSum = kFactors + RowLayout::storage * 4;
  constexpr int kO = kSum + RowLayout::storage * 4;
  constexpr int kOut = kO + OLayout::storage * 4;

  const int64_t keys = int64_t(KB) * forloop_range;
  const Strides q_strides = row_major_strides(1, 1, int64_t(BM) * gridDim.y, D);
  const Strides k_strides = row_major_strides(1, 1, D, keys);
  const Strides v_strides = row_major_strides(1, 1, keys, D);
  const QIterator in_q(q, q_strides, locate_input_tile<QLayout>(q_strides, DimMap{-1, 2, -1}, -1, 1, blockIdx), 1,
                       shared_at<__half>(shared, kQ));
  const KIterator in_k(kt, k_strides, locate_input_tile<KLayout>(k_strides, DimMap{-1, -1, -1}, 3, forloop_range, blockIdx),
                       forloop_range, shared_at<__half>(shared, kK));
  const VIterator in_v(v, v_strides, locate_input_tile<VLayout>(v_strides, DimMap{-1, -1, -1}, 2, forloop_range, blockIdx),
                       forloop_range, shared_at<__half>(shared, kV));
  const auto s_tile = make_shared_tile<SLayout>(shared_at<float>(shared, kS));
  const auto p_tile = make_shared_tile<PLayout>(shared_at<__half>(shared, kP));
  const auto row_max = make_shared_tile<RowLayout>(shared_at<float>(shared, kRowMax));
  const auto factors = make_shared_tile<RowLayout>(shared_at<float>(shared, kFactors));
  const auto o_tile = make_shared_tile<OLayout>(shared_at<float>(shared, kO));
  const auto out_tile = make_shared_tile<OLayout>(shared_at<__half>(shared, kOut));
  const MaxAccumulator<RowLayout, NumThreads> maximum{make_shared_tile<RowLayout>(shared_at<float>(shared, kMax)),
                                                      make_shared_tile<RowLayout>(shared_at<float>(shared, kMax + RowLayout::storage * 4))};
  const RescaleSumLastDimAccumulator<PLayout, NumThreads> sum{make_shared_tile<RowLayout>(shared_at<float>(shared, kSum))};

  in_q.load(0);
  Pipeline<1>::commit();
  maximum.clear();
  sum.clear();
  typename PV::Accumulator o_accumulator;
  o_accumulator.clear();
  pipelined_forloop<Stages>(
      forloop_range,
      [&](int r) {
        typename QK::Accumulator s_accumulator;
        s_accumulator.clear();
        QK::run(s_accumulator, in_q.stage(0), in_k.stage(r));
        QK::write_back(s_accumulator, s_tile, MulScalar{scale});
        __syncthreads();
        reduce_max<NumThreads, 3>(row_max, s_tile);
        __syncthreads();
        maximum.accumulate(row_max);
        __syncthreads();
        maximum.rescale_factors(factors);
        elementwise_binary<NumThreads>(p_tile, s_tile, maximum.tile(), Sub{}, Exp{});
        __syncthreads();
        sum.accumulate(p_tile, maximum.previous, maximum.current);
        PV::rescale_rows(o_accumulator, factors);
        PV::run(o_accumulator, p_tile, in_v.stage(r));
      },
      in_k, in_v);
  PV::write_back(o_accumulator, o_tile);
  __syncthreads();
  elementwise_binary<NumThreads>(out_tile, o_tile, sum.tile(), Div{});
  __syncthreads();
  const Strides o_strides = q_strides;
  OutputSaver<__half, OLayout, NumThreads>::save(o, o_strides, locate_output_tile<OLayout>(o_strides, DimMap{-1, 2, -1}, blockIdx),
                                                 out_tile);
}

extern "C" __global__ void __launch_bounds__(128)
    attention_f16_d64_kb32(__half* o, const __half* q, const __half* kt, const __half* v, int forloop_range, float scale) {
  attention<64, 32, 128, 2>(o, q, kt, v, forloop_range, scale);
}
