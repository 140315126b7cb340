// Forloop accumulators (Mirage's TB_FORLOOP_ACCUM_*), kept in fp32 shared memory.
//
//   kind (Mirage)               type here                      update per iteration r
//   NO_RED            (None)    SumAccumulator<L>              acc += x
//   RED_LD_SUM        "sum"     LastDimAccumulator<kSum>       acc[..., 0] += Σ_j x[..., j]
//   RED_LD_MEAN       "mean"    LastDimAccumulator<kMean>      same; finalize divides by R·d
//   RED_LD_RMS        "rms"     LastDimAccumulator<kRms>       acc += Σ_j x²; finalize sqrt(acc / (R·d))
//   REDTOX_LD_SUM     sum_todimx SumToDimxAccumulator<L, X>    acc[..., j] += Σ_k x[..., j + X k]
//   MAX                         MaxAccumulator<L>              previous = acc; acc = max(acc, x)
//   NO_RED_RESCALE              RescaleAccumulator<L>          acc = acc · exp(m_prev − m_new) + x
//   RED_LD_SUM_RESCALE          RescaleSumLastDimAccumulator   acc = acc · exp(m_prev − m_new) + Σ_j x
//
// Every accumulator owns a float tile in shared memory (kSharedBytes per stored tile) and its
// methods are collective block ops: the template separates them from other block ops that
// touch the same tiles with __syncthreads(), as between any two dependent block ops.
// An optional functor (a fused Chain) is applied to each input element before accumulating.
// For the matmul accumulator kept in registers, see Matmul::Accumulator.
#pragma once

#include "reduction.cuh"

namespace mirage::dev {

// exp(previous − current), defined as 1 when both are equal (including both −inf).
MIRAGE_DEVICE float rescale_factor(float previous_max, float current_max) {
  return previous_max == current_max ? 1.0f : expf(previous_max - current_max);
}

template <class L, int NumThreads>
struct SumAccumulator {
  using TileLayout = L;
  static constexpr int kSharedBytes = L::storage * static_cast<int>(sizeof(float));
  SharedTile<float, L> acc;

  MIRAGE_DEVICE SharedTile<float, L> tile() const { return acc; }

  MIRAGE_DEVICE void clear() const {
    for (int i = thread_index(); i < L::size; i += NumThreads) acc.at_linear(i) = 0.0f;
  }

  template <class In, class InLayout, class Op = Identity>
  MIRAGE_DEVICE void accumulate(SharedTile<In, InLayout> x, Op op = {}) const {
    static_assert(kSameShape<InLayout, L>, "the accumulated tile must have the accumulator's shape");
    for (int i = thread_index(); i < L::size; i += NumThreads) acc.at_linear(i) += op(x.load(i));
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  MIRAGE_DEVICE void finalize(SharedTile<Out, OutLayout> out, Epilogue epilogue = {}) const {
    elementwise_unary<NumThreads>(out, acc, epilogue);
  }
};

enum class LastDimMode { kSum, kMean, kRms };

// Reduces the last dim of each input tile (layout InLayout); the result has last dim 1.
template <LastDimMode Mode, class InLayout, int NumThreads>
struct LastDimAccumulator {
  using TileLayout = Resized<InLayout, 3, 1>;
  static constexpr int kSharedBytes = TileLayout::storage * static_cast<int>(sizeof(float));
  SharedTile<float, TileLayout> acc;

  MIRAGE_DEVICE SharedTile<float, TileLayout> tile() const { return acc; }

  MIRAGE_DEVICE void clear() const {
    for (int i = thread_index(); i < TileLayout::size; i += NumThreads) acc.at_linear(i) = 0.0f;
  }

  template <class In, class XLayout, class Op = Identity>
  MIRAGE_DEVICE void accumulate(SharedTile<In, XLayout> x, Op op = {}) const {
    static_assert(kSameShape<XLayout, InLayout>, "the accumulated tile must have the declared input shape");
    const auto prologue = [&](float value) {
      const float y = op(value);
      return Mode == LastDimMode::kRms ? y * y : y;
    };
    reduce_apply<NumThreads, 3, SumReduce>(x, prologue, [&](int output, float value) { acc.at_linear(output) += value; });
  }

  // Writes sum, mean (sum / (R·d)) or rms (sqrt(sum of squares / (R·d))) for forloop range R.
  template <class Out, class OutLayout, class Epilogue = Identity>
  MIRAGE_DEVICE void finalize(SharedTile<Out, OutLayout> out, int forloop_range, Epilogue epilogue = {}) const {
    static_assert(kSameShape<OutLayout, TileLayout>, "the output must have the accumulator's shape");
    const float count = static_cast<float>(forloop_range) * static_cast<float>(InLayout::dim3);
    for (int i = thread_index(); i < TileLayout::size; i += NumThreads) {
      float value = acc.at_linear(i);
      if constexpr (Mode == LastDimMode::kMean) value = value / count;
      if constexpr (Mode == LastDimMode::kRms) value = sqrtf(value / count);
      out.store(i, epilogue(value));
    }
  }
};

template <class InLayout, int Dimx, int NumThreads>
struct SumToDimxAccumulator {
  using TileLayout = Resized<InLayout, 3, Dimx>;
  static constexpr int kSharedBytes = TileLayout::storage * static_cast<int>(sizeof(float));
  SharedTile<float, TileLayout> acc;

  MIRAGE_DEVICE SharedTile<float, TileLayout> tile() const { return acc; }

  MIRAGE_DEVICE void clear() const {
    for (int i = thread_index(); i < TileLayout::size; i += NumThreads) acc.at_linear(i) = 0.0f;
  }

  template <class In, class XLayout, class Op = Identity>
  MIRAGE_DEVICE void accumulate(SharedTile<In, XLayout> x, Op op = {}) const {
    static_assert(kSameShape<XLayout, InLayout>, "the accumulated tile must have the declared input shape");
    reduce_to_dimx_apply<NumThreads, 3, Dimx>(x, op, [&](int output, float value) { acc.at_linear(output) += value; });
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  MIRAGE_DEVICE void finalize(SharedTile<Out, OutLayout> out, Epilogue epilogue = {}) const {
    elementwise_unary<NumThreads>(out, acc, epilogue);
  }
};

// Element-wise running maximum; keeps the previous value for online-softmax rescaling.
template <class L, int NumThreads>
struct MaxAccumulator {
  using TileLayout = L;
  // Two tiles: the running maximum and its value before the last update.
  static constexpr int kSharedBytes = 2 * L::storage * static_cast<int>(sizeof(float));
  SharedTile<float, L> current;
  SharedTile<float, L> previous;

  MIRAGE_DEVICE SharedTile<float, L> tile() const { return current; }

  MIRAGE_DEVICE void clear() const {
    for (int i = thread_index(); i < L::size; i += NumThreads) {
      current.at_linear(i) = MaxReduce::identity();
      previous.at_linear(i) = MaxReduce::identity();
    }
  }

  template <class In, class InLayout, class Op = Identity>
  MIRAGE_DEVICE void accumulate(SharedTile<In, InLayout> x, Op op = {}) const {
    static_assert(kSameShape<InLayout, L>, "the accumulated tile must have the accumulator's shape");
    for (int i = thread_index(); i < L::size; i += NumThreads) {
      const float old = current.at_linear(i);
      previous.at_linear(i) = old;
      current.at_linear(i) = fmaxf(old, op(x.load(i)));
    }
  }

  // factors[i] = exp(previous[i] − current[i]): the rescale of the last update.
  template <class Out, class OutLayout>
  MIRAGE_DEVICE void rescale_factors(SharedTile<Out, OutLayout> factors) const {
    static_assert(kSameShape<OutLayout, L>, "the factors tile must have the accumulator's shape");
    for (int i = thread_index(); i < L::size; i += NumThreads)
      factors.store(i, rescale_factor(previous.at_linear(i), current.at_linear(i)));
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  MIRAGE_DEVICE void finalize(SharedTile<Out, OutLayout> out, Epilogue epilogue = {}) const {
    elementwise_unary<NumThreads>(out, current, epilogue);
  }
};

// acc = acc · exp(m_prev − m_new) + op(x); the maxima broadcast to L (usually last dim 1).
template <class L, int NumThreads>
struct RescaleAccumulator {
  using TileLayout = L;
  static constexpr int kSharedBytes = L::storage * static_cast<int>(sizeof(float));
  SharedTile<float, L> acc;

  MIRAGE_DEVICE SharedTile<float, L> tile() const { return acc; }

  MIRAGE_DEVICE void clear() const {
    for (int i = thread_index(); i < L::size; i += NumThreads) acc.at_linear(i) = 0.0f;
  }

  template <class In, class InLayout, class MaxLayout, class Op = Identity>
  MIRAGE_DEVICE void accumulate(SharedTile<In, InLayout> x, SharedTile<float, MaxLayout> previous_max,
                                SharedTile<float, MaxLayout> current_max, Op op = {}) const {
    static_assert(kSameShape<InLayout, L>, "the accumulated tile must have the accumulator's shape");
    static_assert(kBroadcastsTo<MaxLayout, L>, "the maxima must broadcast to the accumulator");
    for (int i = thread_index(); i < L::size; i += NumThreads) {
      int index[4];
      L::coordinates(i, index);
      const int m = broadcast_offset<MaxLayout>(index);
      float& value = acc.at_linear(i);
      value = value * rescale_factor(previous_max.data[m], current_max.data[m]) + op(x.load(i));
    }
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  MIRAGE_DEVICE void finalize(SharedTile<Out, OutLayout> out, Epilogue epilogue = {}) const {
    elementwise_unary<NumThreads>(out, acc, epilogue);
  }
};

// acc[..., 0] = acc · exp(m_prev − m_new) + Σ_j op(x[..., j]); maxima have the accumulator's shape.
template <class InLayout, int NumThreads>
struct RescaleSumLastDimAccumulator {
  using TileLayout = Resized<InLayout, 3, 1>;
  static constexpr int kSharedBytes = TileLayout::storage * static_cast<int>(sizeof(float));
  SharedTile<float, TileLayout> acc;

  MIRAGE_DEVICE SharedTile<float, TileLayout> tile() const { return acc; }

  MIRAGE_DEVICE void clear() const {
    for (int i = thread_index(); i < TileLayout::size; i += NumThreads) acc.at_linear(i) = 0.0f;
  }

  template <class In, class XLayout, class MaxLayout, class Op = Identity>
  MIRAGE_DEVICE void accumulate(SharedTile<In, XLayout> x, SharedTile<float, MaxLayout> previous_max,
                                SharedTile<float, MaxLayout> current_max, Op op = {}) const {
    static_assert(kSameShape<XLayout, InLayout>, "the accumulated tile must have the declared input shape");
    static_assert(kSameShape<MaxLayout, TileLayout>, "the maxima must have the accumulator's shape");
    reduce_apply<NumThreads, 3, SumReduce>(x, op, [&](int output, float value) {
      float& target = acc.at_linear(output);
      target = target * rescale_factor(previous_max.at_linear(output), current_max.at_linear(output)) + value;
    });
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  MIRAGE_DEVICE void finalize(SharedTile<Out, OutLayout> out, Epilogue epilogue = {}) const {
    elementwise_unary<NumThreads>(out, acc, epilogue);
  }
};

}  // namespace mirage::dev
