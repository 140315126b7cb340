// Test kernels for elementwise.cuh and reduction.cuh (built by test_device_lib.py).
// Every kernel runs one block over whole (dense) tensors: load, op, save.
#include <mirage/mirage.cuh>

using namespace mirage::dev;

template <class T, class L, int NumThreads>
__device__ SharedTile<T, L> load_dense(const T* in, char* shared) {
  const InputIterator<T, L, 1, NumThreads> input(in, row_major_strides(L::dim0, L::dim1, L::dim2, L::dim3),
                                                 TileCoordinate{0, 0}, 1, shared_at<T>(shared, 0));
  input.load(0);
  Pipeline<1>::commit();
  Pipeline<1>::wait_all();
  return input.stage(0);
}

template <class T, class L, int NumThreads, class Source>
__device__ void save_dense(T* out, SharedTile<Source, L> tile) {
  __syncthreads();
  OutputSaver<T, L, NumThreads>::save(out, row_major_strides(L::dim0, L::dim1, L::dim2, L::dim3), 0, tile);
}

// out = op(in); `op` numbers the rows of UNARY_OPS in test_device_lib.py.
template <class T, class L, int NumThreads>
__device__ void unary_ops(T* out, const T* in, int op, float scalar, float low, float high) {
  extern __shared__ __align__(128) char shared[];
  const auto x = load_dense<T, L, NumThreads>(in, shared);
  const auto y = make_shared_tile<L>(shared_at<T>(shared, round_up(L::storage * sizeof(T), 16)));
  switch (op) {
    case 0: elementwise_unary<NumThreads>(y, x, Exp{}); break;
    case 1: elementwise_unary<NumThreads>(y, x, Log{}); break;
    case 2: elementwise_unary<NumThreads>(y, x, Sqrt{}); break;
    case 3: elementwise_unary<NumThreads>(y, x, Square{}); break;
    case 4: elementwise_unary<NumThreads>(y, x, Sigmoid{}); break;
    case 5: elementwise_unary<NumThreads>(y, x, Silu{}); break;
    case 6: elementwise_unary<NumThreads>(y, x, Gelu{}); break;
    case 7: elementwise_unary<NumThreads>(y, x, Relu{}); break;
    case 8: elementwise_unary<NumThreads>(y, x, MulScalar{scalar}); break;
    case 9: elementwise_unary<NumThreads>(y, x, Clamp{low, high}); break;
    case 10: elementwise_unary<NumThreads>(y, x, make_chain(MulScalar{scalar}, Silu{}, Square{})); break;
    case 11: {  // the same chain through a register tile
      RegisterTile<L, NumThreads, 4> registers;
      registers.load(x);
      registers.apply(make_chain(MulScalar{scalar}, Silu{}, Square{}));
      registers.store(y);
      break;
    }
    case 12: elementwise_unary<NumThreads>(x, x, Exp{}); elementwise_unary<NumThreads>(y, x, Identity{}); break;  // in place
    case 13: elementwise_unary<NumThreads>(y, x, Tanh{}); break;
  }
  save_dense<T, L, NumThreads>(out, y);
}

// out = op(a, b) with broadcasting; `op` numbers the rows of BINARY_OPS in test_device_lib.py.
template <class T, class ALayout, class BLayout, class OutLayout, int NumThreads>
__device__ void binary_ops(T* out, const T* a, const T* b, int op, float scalar) {
  extern __shared__ __align__(128) char shared[];
  constexpr int kB = round_up(ALayout::storage * sizeof(T), 16);
  constexpr int kOut = kB + round_up(BLayout::storage * sizeof(T), 16);
  const auto x = load_dense<T, ALayout, NumThreads>(a, shared);
  const auto y = load_dense<T, BLayout, NumThreads>(b, shared + kB);
  const auto z = make_shared_tile<OutLayout>(shared_at<T>(shared, kOut));
  switch (op) {
    case 0: elementwise_binary<NumThreads>(z, x, y, Add{}); break;
    case 1: elementwise_binary<NumThreads>(z, x, y, Sub{}); break;
    case 2: elementwise_binary<NumThreads>(z, x, y, Mul{}); break;
    case 3: elementwise_binary<NumThreads>(z, x, y, Div{}); break;
    case 4: elementwise_binary<NumThreads>(z, x, y, Pow{}); break;
    case 5: elementwise_binary<NumThreads>(z, x, y, Maximum{}); break;
    case 6: elementwise_binary<NumThreads>(z, x, y, Add{}, make_chain(MulScalar{scalar}, Relu{})); break;
    case 7: {  // a register tile of the output's shape combined with both operands
      RegisterTile<OutLayout, NumThreads, 1> registers;
      registers.apply([](float) { return 0.0f; });
      registers.combine(x, Add{});
      registers.combine(y, Mul{});
      registers.store(z);
      break;
    }
  }
  save_dense<T, OutLayout, NumThreads>(out, z);
}

using UnaryTile = WithPitch<RowMajor<8, 64>, 72>;
using BroadcastA = RowMajor<2, 1, 4, 16>;
using BroadcastB = RowMajor<1, 3, 4, 1>;
using BroadcastOut = RowMajor<2, 3, 4, 16>;
using Square32 = RowMajor<4, 32>;

#define UNARY(NAME, T)                                                                                    \
  extern "C" __global__ void NAME(T* out, const T* in, int op, float scalar, float low, float high) {     \
    unary_ops<T, UnaryTile, 128>(out, in, op, scalar, low, high);                                         \
  }
#define BINARY(NAME, T, A, B, OUT)                                                                         \
  extern "C" __global__ void NAME(T* out, const T* a, const T* b, int op, float scalar) {                 \
    binary_ops<T, A, B, OUT, 128>(out, a, b, op, scalar);                                                  \
  }

UNARY(unary_f16, __half)
UNARY(unary_bf16, __nv_bfloat16)
UNARY(unary_f32, float)
BINARY(binary_broadcast_f16, __half, BroadcastA, BroadcastB, BroadcastOut)
BINARY(binary_broadcast_bf16, __nv_bfloat16, BroadcastA, BroadcastB, BroadcastOut)
BINARY(binary_broadcast_f32, float, BroadcastA, BroadcastB, BroadcastOut)
BINARY(binary_same_f32, float, Square32, Square32, Square32)

// ---- reductions --------------------------------------------------------------------------

// `which` numbers the rows of REDUCTIONS in test_device_lib.py; outputs are fp32, dense.
extern "C" __global__ void reduce_2x3x8x64(float* out, const __half* in, int which) {
  constexpr int N = 128;
  using L = WithPitch<RowMajor<2, 3, 8, 64>, 72>;
  extern __shared__ __align__(128) char shared[];
  const auto x = load_dense<__half, L, N>(in, shared);
  float* target = shared_at<float>(shared, L::storage * 2);
  switch (which) {
    case 0: { const auto y = make_shared_tile<Resized<L, 0, 1>>(target); reduce_sum<N, 0>(y, x); save_dense<float, Resized<L, 0, 1>, N>(out, y); break; }
    case 1: { const auto y = make_shared_tile<Resized<L, 1, 1>>(target); reduce_sum<N, 1>(y, x); save_dense<float, Resized<L, 1, 1>, N>(out, y); break; }
    case 2: { const auto y = make_shared_tile<Resized<L, 2, 1>>(target); reduce_sum<N, 2>(y, x); save_dense<float, Resized<L, 2, 1>, N>(out, y); break; }
    case 3: { const auto y = make_shared_tile<Resized<L, 3, 1>>(target); reduce_sum<N, 3>(y, x); save_dense<float, Resized<L, 3, 1>, N>(out, y); break; }
    case 4: { const auto y = make_shared_tile<Resized<L, 0, 1>>(target); reduce_max<N, 0>(y, x); save_dense<float, Resized<L, 0, 1>, N>(out, y); break; }
    case 5: { const auto y = make_shared_tile<Resized<L, 1, 1>>(target); reduce_max<N, 1>(y, x); save_dense<float, Resized<L, 1, 1>, N>(out, y); break; }
    case 6: { const auto y = make_shared_tile<Resized<L, 2, 1>>(target); reduce_max<N, 2>(y, x); save_dense<float, Resized<L, 2, 1>, N>(out, y); break; }
    case 7: { const auto y = make_shared_tile<Resized<L, 3, 1>>(target); reduce_max<N, 3>(y, x); save_dense<float, Resized<L, 3, 1>, N>(out, y); break; }
    case 8: { const auto y = make_shared_tile<Resized<L, 3, 16>>(target); reduce_to_dimx<N, 3>(y, x); save_dense<float, Resized<L, 3, 16>, N>(out, y); break; }
    case 9: { const auto y = make_shared_tile<Resized<L, 2, 4>>(target); reduce_to_dimx<N, 2>(y, x); save_dense<float, Resized<L, 2, 4>, N>(out, y); break; }
  }
}

// More outputs than threads (one thread per output) and few outputs (16 lanes per output).
extern "C" __global__ void reduce_256x8(float* out, const float* in, int which) {
  constexpr int N = 128;
  using L = RowMajor<256, 8>;
  extern __shared__ __align__(128) char shared[];
  const auto x = load_dense<float, L, N>(in, shared);
  float* target = shared_at<float>(shared, L::storage * 4);
  if (which == 0) {
    const auto y = make_shared_tile<Resized<L, 3, 1>>(target);
    reduce_sum<N, 3>(y, x);
    save_dense<float, Resized<L, 3, 1>, N>(out, y);
  } else {
    const auto y = make_shared_tile<Resized<L, 2, 1>>(target);
    reduce_sum<N, 2>(y, x);
    save_dense<float, Resized<L, 2, 1>, N>(out, y);
  }
}

// rms(x) = sqrt(mean(x²)) of one long row: a whole warp per output, prologue and epilogue.
extern "C" __global__ void rms_1x2048(float* out, const __nv_bfloat16* in) {
  constexpr int N = 128;
  using L = RowMajor<1, 2048>;
  extern __shared__ __align__(128) char shared[];
  const auto x = load_dense<__nv_bfloat16, L, N>(in, shared);
  const auto y = make_shared_tile<Resized<L, 3, 1>>(shared_at<float>(shared, L::storage * 2));
  reduce_sum<N, 3>(y, x, Square{}, make_chain(MulScalar{1.0f / 2048}, Sqrt{}));
  save_dense<float, Resized<L, 3, 1>, N>(out, y);
}
