// Reductions of shared-memory tiles along one dim (sum, max), and reduction_to_dimx.
//
// reduce: the output has the input's shape with dim `Dim` set to 1. A group of G lanes
// (G a power of two <= 32, chosen at compile time from the number of outputs and threads)
// reduces one output element: each lane strides over the reduced dim, then the group combines
// with warp shuffles. A prologue is applied to each input element before the reduction
// (e.g. Square for a sum of squares) and an epilogue to each result (e.g. a Chain).
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

}  // namespace detail

// Calls store(output_index, value) once for each element of the reduced tile (row-major index
// in Resized<InLayout, Dim, 1>), from one thread.
template <int NumThreads, int Dim, class Reduce, class In, class InLayout, class Prologue, class Store>
MIRAGE_DEVICE void reduce_apply(SharedTile<In, InLayout> in, Prologue prologue, Store store) {
  static_assert(Dim >= 0 && Dim < 4, "reduction dim out of range");
  using OutLayout = Resized<InLayout, Dim, 1>;
  constexpr int kOutputs = OutLayout::size;
  constexpr int kExtent = InLayout::dim(Dim);
  constexpr int kGroup = detail::reduction_group(kOutputs, kExtent, NumThreads);
  static_assert(kGroup == 1 || NumThreads % kWarpSize == 0, "shuffle reductions need whole warps");
  const Reduce reduce{};
  for (int base = 0; base < kOutputs * kGroup; base += NumThreads) {
    const int slot = base + thread_index();
    const int output = slot / kGroup;
    const int lane = slot % kGroup;
    float value = Reduce::identity();
    if (output < kOutputs) {
      int index[4];
      OutLayout::coordinates(output, index);
      for (int element = lane; element < kExtent; element += kGroup) {
        index[Dim] = element;
        value = reduce(value, prologue(to_float(in.data[InLayout::offset(index[0], index[1], index[2], index[3])])));
      }
    }
#pragma unroll
    for (int width = kGroup / 2; width > 0; width /= 2) value = reduce(value, __shfl_xor_sync(0xffffffffu, value, width));
    if (output < kOutputs && lane == 0) store(output, value);
  }
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
