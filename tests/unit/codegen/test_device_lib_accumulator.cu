// Test kernels for accumulator.cuh (built by test_device_lib.py).
// One block; x is [16, 64 R] and the forloop walks its last dim (fmap = 3) in 2 stages.
#include <mirage/mirage.cuh>

using namespace mirage::dev;

constexpr int kThreads = 128;
constexpr int kStages = 2;
using XLayout = WithPitch<RowMajor<16, 64>, 72>;
using RowLayout = RowMajor<16, 1>;

template <class T>
struct Forloop {
  InputIterator<T, XLayout, kStages, kThreads> input;
  int range;

  template <class Body>
  __device__ void run(Body body) const {
    pipelined_forloop<kStages>(range, [&](int r) { body(input.stage(r)); }, input);
  }
};

template <class L, class Source>
__device__ void save_result(float* out, SharedTile<Source, L> tile) {
  __syncthreads();
  OutputSaver<float, L, kThreads>::save(out, row_major_strides(L::dim0, L::dim1, L::dim2, L::dim3), 0, tile);
}

// `kind` numbers the rows of ACCUMULATORS in test_device_lib.py.
template <class T>
__device__ void accumulators(float* out, const T* x, int forloop_range, int kind) {
  extern __shared__ __align__(128) char shared[];
  using Iterator = InputIterator<T, XLayout, kStages, kThreads>;
  const Strides strides = row_major_strides(1, 1, 16, 64 * forloop_range);
  const Forloop<T> loop{Iterator(x, strides, locate_input_tile<XLayout>(strides, DimMap{-1, -1, -1}, 3, forloop_range, blockIdx),
                                 forloop_range, shared_at<T>(shared, 0)),
                        forloop_range};
  char* state = shared + Iterator::kSharedBytes;
  // Scratch tiles for the online-softmax cases.
  const auto row_max = make_shared_tile<RowLayout>(shared_at<float>(state, 0));
  const auto result_rows = make_shared_tile<RowLayout>(shared_at<float>(state, 64));
  const auto probabilities = make_shared_tile<XLayout>(shared_at<float>(state, 128));
  state += 128 + XLayout::storage * 4;
  const MaxAccumulator<RowLayout, kThreads> maximum{make_shared_tile<RowLayout>(shared_at<float>(state, 0)),
                                                    make_shared_tile<RowLayout>(shared_at<float>(state, 64))};
  state += 128;
  switch (kind) {
    case 0:
    case 1: {  // sum (1: of silu(x))
      const SumAccumulator<XLayout, kThreads> acc{make_shared_tile<XLayout>(shared_at<float>(state, 0))};
      acc.clear();
      __syncthreads();
      if (kind == 0) loop.run([&](auto tile) { acc.accumulate(tile); });
      if (kind == 1) loop.run([&](auto tile) { acc.accumulate(tile, Silu{}); });
      save_result(out, acc.tile());
      break;
    }
    case 2:
    case 3:
    case 4: {
      const auto result = make_shared_tile<RowLayout>(shared_at<float>(state, 0));
      const auto run = [&](auto acc) {
        acc.clear();
        __syncthreads();
        loop.run([&](auto tile) { acc.accumulate(tile); });
        acc.finalize(result, forloop_range);
        save_result(out, result);
      };
      state += 64;
      if (kind == 2) run(LastDimAccumulator<LastDimMode::kSum, XLayout, kThreads>{make_shared_tile<RowLayout>(shared_at<float>(state, 0))});
      if (kind == 3) run(LastDimAccumulator<LastDimMode::kMean, XLayout, kThreads>{make_shared_tile<RowLayout>(shared_at<float>(state, 0))});
      if (kind == 4) run(LastDimAccumulator<LastDimMode::kRms, XLayout, kThreads>{make_shared_tile<RowLayout>(shared_at<float>(state, 0))});
      break;
    }
    case 5: {  // sum to dimx = 16
      const SumToDimxAccumulator<XLayout, 16, kThreads> acc{make_shared_tile<RowMajor<16, 16>>(shared_at<float>(state, 0))};
      acc.clear();
      __syncthreads();
      loop.run([&](auto tile) { acc.accumulate(tile); });
      save_result(out, acc.tile());
      break;
    }
    case 6: {  // element-wise max
      const MaxAccumulator<XLayout, kThreads> acc{make_shared_tile<XLayout>(shared_at<float>(state, 0)),
                                                  make_shared_tile<XLayout>(shared_at<float>(state, XLayout::storage * 4))};
      acc.clear();
      __syncthreads();
      loop.run([&](auto tile) { acc.accumulate(tile); });
      save_result(out, acc.tile());
      break;
    }
    case 7: {  // online softmax denominator: Σ_r Σ_j exp(x − running max), rescaled
      const RescaleSumLastDimAccumulator<XLayout, kThreads> acc{make_shared_tile<RowLayout>(shared_at<float>(state, 0))};
      acc.clear();
      maximum.clear();
      __syncthreads();
      loop.run([&](auto tile) {
        reduce_max<kThreads, 3>(row_max, tile);
        __syncthreads();
        maximum.accumulate(row_max);
        __syncthreads();
        elementwise_binary<kThreads>(probabilities, tile, maximum.tile(), Sub{}, Exp{});
        __syncthreads();
        acc.accumulate(probabilities, maximum.previous, maximum.current);
      });
      acc.finalize(result_rows);
      save_result(out, result_rows);
      break;
    }
    case 8: {  // element-wise rescale: Σ_r exp(x_r − running max) per position
      const RescaleAccumulator<XLayout, kThreads> acc{make_shared_tile<XLayout>(shared_at<float>(state, 0))};
      acc.clear();
      maximum.clear();
      __syncthreads();
      loop.run([&](auto tile) {
        reduce_max<kThreads, 3>(row_max, tile);
        __syncthreads();
        maximum.accumulate(row_max);
        __syncthreads();
        elementwise_binary<kThreads>(probabilities, tile, maximum.tile(), Sub{}, Exp{});
        __syncthreads();
        acc.accumulate(probabilities, maximum.previous, maximum.current);
      });
      save_result(out, acc.tile());
      break;
    }
  }
}

extern "C" __global__ void __launch_bounds__(kThreads) accumulators_f16(float* out, const __half* x, int forloop_range, int kind) {
  accumulators<__half>(out, x, forloop_range, kind);
}
extern "C" __global__ void __launch_bounds__(kThreads) accumulators_f32(float* out, const float* x, int forloop_range, int kind) {
  accumulators<float>(out, x, forloop_range, kind);
}
