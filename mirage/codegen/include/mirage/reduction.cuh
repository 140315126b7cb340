// Reductions of shared-memory tiles along one dim (sum, max), and reduction_to_dimx.
//
// reduce: the output has the input's shape with dim `Dim` set to 1. A group of G lanes
// (G a power of two <= 32, chosen at compile time from the number of outputs and threads)
// reduces one output element: each lane strides over the reduced dim, then the group combines
// with warp shuffles. Given a ReductionScratch (kScratchFloats<NumThreads> floats of shared memory
// that nothing else uses during the call), few outputs of a long reduced dim (at least
// kBlockReductionMinExtent elements) are reduced by several warps each: W warps per output each
// reduce a slice, then combine through the scratch (two barriers inside the call, so every thread
// of the block must call it, as with every collective op). Rows along the last dim
// are read as 16-byte vectors (LDS.128) when each lane gets at least one whole vector. A prologue
// is applied to each input element before the reduction (e.g. Square for a sum of squares) and an
// epilogue to each result (e.g. a Chain).
//
// reduce_to_dimx: out[..., j, ...] = Σ_k in[..., j + X k, ...] along `Dim`, X = the output's
// extent in that dim (Mirage's reduction_dimx, strided, i.e. reshape(N / X, X).sum(0)).
#pragma once

#include "elementwise.cuh"

namespace mirage::dev {

struct SumReduce {
  static MIRAGE_DEVICE float identity() { return 0.0f; }
  MIRAGE_DEVICE float operator()(float a, float b) const { return a + b; }
};

struct MaxReduce {
  static MIRAGE_DEVICE float identity() { return __int_as_float(0xff800000); }  // -inf
  MIRAGE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};

namespace detail {

// Lanes per output element: as many as keep all threads busy, at most a warp and at most the
// reduced extent.
constexpr int reduction_group(int outputs, int extent, int threads) {
  int group = 1;
  while (group * 2 <= kWarpSize && group * 2 <= extent && outputs * group * 2 <= threads) group *= 2;
  return group;
}

// Below this extent a warp per output is fast enough (32 elements per lane or fewer), and the two
// barriers of a cross-warp combine would cost more than they save.
constexpr int kBlockReductionMinExtent = 1024;

// Warps per output element: 1, or (for few outputs of a long extent) a power of two such that all
// outputs' warps fit in the block and each lane has at least one element.
constexpr int reduction_warps(int outputs, int extent, int threads) {
  if (extent < kBlockReductionMinExtent) return 1;
  int warps = 1;
  while (outputs * warps * 2 * kWarpSize <= threads && warps * 2 * kWarpSize <= extent) warps *= 2;
  return warps;
}

// reduce(prologue(x)) over the contiguous row `row` of `Extent` elements, for lane `lane` of `Lanes`
// lanes (the lanes' partial results still have to be combined). 16-byte vector reads when every lane
// gets at least one vector and rows start 16-byte aligned (the pitch is a whole number of vectors).
template <int Extent, int Lanes, int Pitch, class Reduce, class T, class Prologue>
MIRAGE_DEVICE float reduce_row_slice(const T* row, int lane, Prologue prologue) {
  constexpr int kVector = kVectorElements<T>;
  const Reduce reduce{};
  float value = Reduce::identity();
  if constexpr (Extent % kVector == 0 && Pitch % kVector == 0 && Extent / kVector >= Lanes) {
    constexpr int kChunks = Extent / kVector;
#pragma unroll 4
    for (int chunk = lane; chunk < kChunks; chunk += Lanes) {
      const uint4 bits = reinterpret_cast<const uint4*>(row)[chunk];
      const T* elements = reinterpret_cast<const T*>(&bits);
#pragma unroll
      for (int e = 0; e < kVector; ++e) value = reduce(value, prologue(to_float(elements[e])));
    }
  } else {
    for (int element = lane; element < Extent; element += Lanes) value = reduce(value, prologue(to_float(row[element])));
  }
  return value;
}

// Combines the values of the `Lanes` consecutive threads reducing one output (Lanes <= 32: warp
// shuffles only).
template <int Lanes, class Reduce>
MIRAGE_DEVICE float combine_lanes(float value) {
  const Reduce reduce{};
#pragma unroll
  for (int width = Lanes / 2; width > 0; width /= 2) value = reduce(value, __shfl_xor_sync(0xffffffffu, value, width));
  return value;
}

// The result for `output` when `Warps` warps reduce each of `Outputs` outputs: every thread of the
// block calls it; each warp's lane 0 publishes its warp's value, and every thread gets the total
// of its output's warps (threads beyond the outputs get the identity). Two barriers.
template <int Outputs, int Warps, class Reduce>
MIRAGE_DEVICE float combine_warps(float value, int output, float* partial) {
  const int warp = thread_index() / kWarpSize;
  if (output < Outputs && thread_index() % kWarpSize == 0) partial[warp] = value;
  __syncthreads();
  const Reduce reduce{};
  float total = Reduce::identity();
  if (output < Outputs) {
#pragma unroll
    for (int w = 0; w < Warps; ++w) total = reduce(total, partial[output * Warps + w]);
  }
  __syncthreads();  // the partials may be overwritten by the next call
  return total;
}

}  // namespace detail

// Floats of shared scratch a block-wide reduction of NumThreads threads may use (one per warp).
template <int NumThreads>
constexpr int kScratchFloats = NumThreads / kWarpSize > 0 ? NumThreads / kWarpSize : 1;

// Shared memory for the cross-warp combine of block-wide reductions (kScratchFloats floats,
// 4-byte aligned), handed to reduce_apply and gen::rms_norm_apply by the caller.
struct ReductionScratch {
  float* data;
};

namespace detail {

// Warps per output for a reduction that may (BlockWide) or may not use a scratch.
template <bool BlockWide>
constexpr int warps_per_output(int group, int outputs, int extent, int threads) {
  return BlockWide && group == kWarpSize ? reduction_warps(outputs, extent, threads) : 1;
}

template <int NumThreads, int Dim, class Reduce, bool BlockWide, class In, class InLayout, class Prologue,
          class Store>
MIRAGE_DEVICE void reduce_apply(SharedTile<In, InLayout> in, Prologue prologue, Store store, float* scratch) {
  static_assert(Dim >= 0 && Dim < 4, "reduction dim out of range");
  using OutLayout = Resized<InLayout, Dim, 1>;
  constexpr int kOutputs = OutLayout::size;
  constexpr int kExtent = InLayout::dim(Dim);
  constexpr int kGroup = reduction_group(kOutputs, kExtent, NumThreads);
  constexpr int kWarps = warps_per_output<BlockWide>(kGroup, kOutputs, kExtent, NumThreads);
  constexpr int kLanes = kGroup * kWarps;  // threads per output
  static_assert(kGroup == 1 || NumThreads % kWarpSize == 0, "shuffle reductions need whole warps");
  const Reduce reduce{};
  for (int base = 0; base < kOutputs * kLanes; base += NumThreads) {
    const int slot = base + thread_index();
    const int output = slot / kLanes;
    const int lane = slot % kLanes;
    float value = Reduce::identity();
    if (output < kOutputs) {
      int index[4];
      OutLayout::coordinates(output, index);
      if constexpr (Dim == 3) {
        static_assert(read_by_pitch<InLayout>());
        const In* row = in.data + InLayout::offset(index[0], index[1], index[2], 0);
        value = reduce_row_slice<kExtent, kLanes, InLayout::pitch, Reduce>(row, lane, prologue);
      } else {
        // four independent partials: a column of 64 is four chains of 16, not one of 64
        const auto at = [&](int element) {
          index[Dim] = element;
          return prologue(to_float(in.data[InLayout::offset(index[0], index[1], index[2], index[3])]));
        };
        float p0 = Reduce::identity(), p1 = Reduce::identity(), p2 = Reduce::identity(), p3 = Reduce::identity();
        int element = lane;
        for (; element + 3 * kLanes < kExtent; element += 4 * kLanes) {
          p0 = reduce(p0, at(element));
          p1 = reduce(p1, at(element + kLanes));
          p2 = reduce(p2, at(element + 2 * kLanes));
          p3 = reduce(p3, at(element + 3 * kLanes));
        }
        for (; element < kExtent; element += kLanes) p0 = reduce(p0, at(element));
        value = reduce(reduce(p0, p1), reduce(p2, p3));
      }
    }
    value = combine_lanes<kGroup, Reduce>(value);
    if constexpr (kWarps > 1) {
      static_assert(kOutputs * kLanes <= NumThreads, "a block-wide reduction runs in one round");
      static_assert(kOutputs * kWarps <= kScratchFloats<NumThreads>, "the scratch holds one float per warp");
      value = combine_warps<kOutputs, kWarps, Reduce>(value, output, scratch);
    }
    if (output < kOutputs && lane == 0) store(output, value);
  }
}

}  // namespace detail

// The reduction of `value` over the RowThreads consecutive threads of one row of a row-local loop
// body (RowThreads a power of two; every thread of the row calls it): warp shuffles, and where a row
// spans warps, one float per warp in `scratch` (this call's own: nothing else writes it, and it is
// not reused, so one barrier suffices, which every thread of the block must reach) read back by
// every lane. Every thread of the row gets the total.
template <int RowThreads, class Reduce>
MIRAGE_DEVICE float row_combine(float value, float* scratch) {
  static_assert(RowThreads > 0 && (RowThreads & (RowThreads - 1)) == 0, "a power of two of threads per row");
  value = detail::combine_lanes<(RowThreads < kWarpSize ? RowThreads : kWarpSize), Reduce>(value);
  if constexpr (RowThreads > kWarpSize) {
    constexpr int kWarps = RowThreads / kWarpSize;
    const int warp = thread_index() / kWarpSize;
    const int lane = thread_index() % kWarpSize;
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = scratch[warp / kWarps * kWarps + lane % kWarps];
    value = detail::combine_lanes<kWarps, Reduce>(value);
  }
  return value;
}

// Calls store(output_index, value) once for each element of the reduced tile (row-major index
// in Resized<InLayout, Dim, 1>), from one thread. Each output is reduced by at most one warp.
template <int NumThreads, int Dim, class Reduce, class In, class InLayout, class Prologue, class Store>
MIRAGE_DEVICE void reduce_apply(SharedTile<In, InLayout> in, Prologue prologue, Store store) {
  detail::reduce_apply<NumThreads, Dim, Reduce, false>(in, prologue, store, nullptr);
}

// The same, with several warps per output where the outputs are few and long (see the top).
template <int NumThreads, int Dim, class Reduce, class In, class InLayout, class Prologue, class Store>
MIRAGE_DEVICE void reduce_apply(SharedTile<In, InLayout> in, Prologue prologue, Store store, ReductionScratch scratch) {
  detail::reduce_apply<NumThreads, Dim, Reduce, true>(in, prologue, store, scratch.data);
}

template <int NumThreads, int Dim, class Reduce, class Out, class OutLayout, class In, class InLayout,
          class Prologue = Identity, class Epilogue = Identity>
MIRAGE_DEVICE void reduce(SharedTile<Out, OutLayout> out, SharedTile<In, InLayout> in, Prologue prologue = {},
                          Epilogue epilogue = {}) {
  static_assert(kSameShape<OutLayout, Resized<InLayout, Dim, 1>>, "the output must be the input with dim Dim of size 1");
  reduce_apply<NumThreads, Dim, Reduce>(in, prologue,
                                        [&](int output, float value) { out.store(output, epilogue(value)); });
}

template <int NumThreads, int Dim, class Out, class OutLayout, class In, class InLayout, class Prologue = Identity,
          class Epilogue = Identity>
MIRAGE_DEVICE void reduce_sum(SharedTile<Out, OutLayout> out, SharedTile<In, InLayout> in, Prologue prologue = {},
                              Epilogue epilogue = {}) {
  reduce<NumThreads, Dim, SumReduce>(out, in, prologue, epilogue);
}

template <int NumThreads, int Dim, class Out, class OutLayout, class In, class InLayout, class Prologue = Identity,
          class Epilogue = Identity>
MIRAGE_DEVICE void reduce_max(SharedTile<Out, OutLayout> out, SharedTile<In, InLayout> in, Prologue prologue = {},
                              Epilogue epilogue = {}) {
  reduce<NumThreads, Dim, MaxReduce>(out, in, prologue, epilogue);
}

// Calls store(output_index, value) for each element of Resized<InLayout, Dim, Dimx>.
template <int NumThreads, int Dim, int Dimx, class In, class InLayout, class Prologue, class Store>
MIRAGE_DEVICE void reduce_to_dimx_apply(SharedTile<In, InLayout> in, Prologue prologue, Store store) {
  static_assert(InLayout::dim(Dim) % Dimx == 0, "reduction_to_dimx needs the extent to be a multiple of dimx");
  using OutLayout = Resized<InLayout, Dim, Dimx>;
  constexpr int kTerms = InLayout::dim(Dim) / Dimx;
  for (int output = thread_index(); output < OutLayout::size; output += NumThreads) {
    int index[4];
    OutLayout::coordinates(output, index);
    const int first = index[Dim];
    float value = 0.0f;
#pragma unroll 4
    for (int term = 0; term < kTerms; ++term) {
      index[Dim] = first + Dimx * term;
      value += prologue(to_float(in.data[InLayout::offset(index[0], index[1], index[2], index[3])]));
    }
    store(output, value);
  }
}

template <int NumThreads, int Dim, class Out, class OutLayout, class In, class InLayout, class Prologue = Identity,
          class Epilogue = Identity>
MIRAGE_DEVICE void reduce_to_dimx(SharedTile<Out, OutLayout> out, SharedTile<In, InLayout> in, Prologue prologue = {},
                                  Epilogue epilogue = {}) {
  constexpr int kDimx = OutLayout::dim(Dim);
  static_assert(kSameShape<OutLayout, Resized<InLayout, Dim, kDimx>>, "the output must be the input with dim Dim resized");
  reduce_to_dimx_apply<NumThreads, Dim, kDimx>(in, prologue,
                                                [&](int output, float value) { out.store(output, epilogue(value)); });
}

}  // namespace mirage::dev
