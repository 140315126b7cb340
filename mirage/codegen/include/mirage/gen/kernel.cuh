// What generated kernels need beyond the device library (mirage/*.cuh), kept apart from it.
//
// A generated kernel computes every block op as a *producer* that hands each element of its
// result, once, to an *emit* function, in chunks (chunk.cuh): `emit(linear, values)` with
// `float (&values)[C]` the C consecutive elements of a row starting at row-major index `linear`
// of the result's logical shape. The emit function applies the op's epilogue chain (fused thread
// graphs that read the values in registers) and ends in a *sink*: a store into a shared tile, or
// an accumulator update (`sink.chunk(linear, values)`). Producers:
//
//   map_apply<NumThreads, OutLayout>(function, emit, tiles...)   n-ary element-wise (broadcasting)
//   dev::reduce_apply / dev::reduce_to_dimx_apply                 reductions (device library; their
//                                                                 per-element store is single(emit))
//   rms_norm_apply<NumThreads>(tile, eps, emit)                   x / sqrt(mean(x², last dim) + eps)
//   BlockMatmul<NumThreads, Product...>::apply(emit, a, b, ...)   Σ_i A_i · B_i, batched
//
// Sinks: StoreSink, AddSink, MaxSink, RunningMaxSink, RescaleSink. BlockMatmul::Registers keeps a
// matmul accumulator in registers across the forloop (for GEMV-like tiles split over K across warp
// groups; its write_back then adds the partial sums, with barriers). All functions below are
// collective (every thread of the block calls them) unless their comment says otherwise.
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>

#include "../mirage.cuh"
#include "chunk.cuh"

// Register accumulators of block matmuls split K across warp groups where the cost model expects a
// gain (BlockMatmul); build with -DMIRAGE_SPLIT_K=0 to keep every matmul on its unsplit warp grid
// (the layout before the split, for comparisons).
#ifndef MIRAGE_SPLIT_K
#define MIRAGE_SPLIT_K 1
#endif

// 1: an element-wise map whose threads each see the same columns in every chunk (NumThreads chunks
// span whole rows) reads its operands that depend on the column alone (a row vector or a scalar
// broadcast to the result) once, before its loop, so that what the function computes from them alone
// (a norm's rsqrt of a column sum) is computed once a thread, not once a row; the same values come out
// in the same order. 0: every operand read at every chunk (build with -DMIRAGE_MAP_FIXED_COLUMNS=0 to
// compare).
#ifndef MIRAGE_MAP_FIXED_COLUMNS
#define MIRAGE_MAP_FIXED_COLUMNS 1
#endif

namespace mirage::gen {

// ---- functors of IR ops that the device library does not define -------------------------------

struct AddScalar {
  float scalar;
  MIRAGE_DEVICE float operator()(float x) const { return x + scalar; }
};

// gelu with the tanh approximation, the IR's definition (torch's gelu(approximate="tanh")).
struct GeluTanh {
  MIRAGE_DEVICE float operator()(float x) const {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
};

// ---- loads ------------------------------------------------------------------------------------

// The element of `tile` at logical `index` of a (possibly larger) shape, broadcasting dims of size 1.
template <class T, class L>
MIRAGE_DEVICE float load_broadcast(dev::SharedTile<T, L> tile, const int (&index)[4]) {
  return dev::to_float(tile.data[dev::broadcast_offset<L>(index)]);
}

// ---- producers --------------------------------------------------------------------------------

namespace detail {

template <int C, class Function, class... Tiles, std::size_t... I>
MIRAGE_DEVICE void map_chunk(Function function, const int (&index)[4], float (&values)[C], std::index_sequence<I...>,
                             Tiles... tiles) {
  float operands[sizeof...(Tiles)][C];
  (load_chunk(tiles, index, operands[I]), ...);
#pragma unroll
  for (int e = 0; e < C; ++e) values[e] = function(operands[I][e]...);
}

// An operand that depends on the result's column alone: a row vector or a scalar (broadcast to it).
template <class Tile>
constexpr bool kColumnOnly = Tile::TileLayout::size == Tile::TileLayout::dim3;

// Whether map_apply's threads each see the same C columns in all their chunks (chunks t,
// t + NumThreads, ... of C elements: NumThreads · C is a whole number of rows) and take more than one
// chunk, and an operand depends on the column alone (MIRAGE_MAP_FIXED_COLUMNS).
template <int NumThreads, class OutLayout, int C, class... Tiles>
constexpr bool kFixedColumns = MIRAGE_MAP_FIXED_COLUMNS && (kColumnOnly<Tiles> || ...) &&
                               (NumThreads * C) % OutLayout::cols == 0 && OutLayout::size / C > NumThreads;

// map_apply's loop when kFixedColumns holds: the column-only operands' chunks are read once, from
// the thread's first chunk, and stay in registers; the others are read at every chunk.
template <int NumThreads, class OutLayout, int C, class Function, class Emit, class... Tiles, std::size_t... I>
MIRAGE_DEVICE void map_fixed_columns(Function function, Emit emit, std::index_sequence<I...>, Tiles... tiles) {
  float operands[sizeof...(Tiles)][C];
  const int first = dev::thread_index() * C;  // < OutLayout::size: every thread has a chunk
  {
    int index[4];
    OutLayout::coordinates(first, index);
    ((kColumnOnly<Tiles> ? load_chunk(tiles, index, operands[I]) : void()), ...);
  }
  for (int linear = first; linear < OutLayout::size; linear += NumThreads * C) {
    int index[4];
    OutLayout::coordinates(linear, index);
    ((kColumnOnly<Tiles> ? void() : load_chunk(tiles, index, operands[I])), ...);
    float values[C];
#pragma unroll
    for (int e = 0; e < C; ++e) values[e] = function(operands[I][e]...);
    emit(linear, values);
  }
}

}  // namespace detail

// emit(i, function(tiles[i]...)) for every element i of OutLayout, in chunks; each tile broadcasts
// to OutLayout.
template <int NumThreads, class OutLayout, class Function, class Emit, class... Tiles>
MIRAGE_DEVICE void map_apply(Function function, Emit emit, Tiles... tiles) {
  static_assert((dev::kBroadcastsTo<typename Tiles::TileLayout, OutLayout> && ...),
                "an operand does not broadcast to the result");
  constexpr int kChunk = chunk_elements(OutLayout::cols, OutLayout::size, NumThreads);
  if constexpr (detail::kFixedColumns<NumThreads, OutLayout, kChunk, Tiles...>) {
    detail::map_fixed_columns<NumThreads, OutLayout, kChunk>(function, emit, std::index_sequence_for<Tiles...>{},
                                                             tiles...);
  } else {
    for_each_chunk<NumThreads, OutLayout, kChunk>([&](int linear) {
      int index[4];
      OutLayout::coordinates(linear, index);
      float values[kChunk];
      detail::map_chunk(function, index, values, std::index_sequence_for<Tiles...>{}, tiles...);
      emit(linear, values);
    });
  }
}

namespace detail {

template <int NumThreads, bool BlockWide, class T, class L, class Emit>
MIRAGE_DEVICE void rms_norm_apply(dev::SharedTile<T, L> in, float eps, Emit emit, float* scratch) {
  static_assert(dev::read_by_pitch<L>());
  constexpr int kRows = L::rows;
  constexpr int kExtent = L::cols;
  constexpr int kGroup = dev::detail::reduction_group(kRows, kExtent, NumThreads);
  constexpr int kWarps = dev::detail::warps_per_output<BlockWide>(kGroup, kRows, kExtent, NumThreads);
  constexpr int kLanes = kGroup * kWarps;
  static_assert(kGroup == 1 || NumThreads % dev::kWarpSize == 0, "shuffle reductions need whole warps");
  for (int base = 0; base < kRows * kLanes; base += NumThreads) {
    const int slot = base + dev::thread_index();
    const int row = slot / kLanes;
    const int lane = slot % kLanes;
    float sum = 0.0f;
    if (row < kRows) {
      sum = dev::detail::reduce_row_slice<kExtent, kLanes, L::pitch, dev::SumReduce>(in.data + row * L::pitch, lane,
                                                                                    dev::Square{});
    }
    sum = dev::detail::combine_lanes<kGroup, dev::SumReduce>(sum);
    if constexpr (kWarps > 1) {
      static_assert(kRows * kLanes <= NumThreads, "a block-wide reduction runs in one round");
      sum = dev::detail::combine_warps<kRows, kWarps, dev::SumReduce>(sum, row, scratch);
    }
    const float scale = rsqrtf(sum / static_cast<float>(kExtent) + eps);
    if (row < kRows) {
      constexpr int kChunk = chunk_elements(kExtent, kExtent, kLanes);
#pragma unroll 2
      for (int chunk = lane; chunk < kExtent / kChunk; chunk += kLanes) {
        float values[kChunk];
        read_chunk<L::pitch>(in.data + row * L::pitch + chunk * kChunk, values);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) values[e] *= scale;
        emit(row * kExtent + chunk * kChunk, values);
      }
    }
  }
}

}  // namespace detail

// emit(i, x[i] / sqrt(mean of x² over the last dim + eps)): lanes per row as dev::reduce_apply
// chooses them (a group of a warp's lanes); no scratch memory.
template <int NumThreads, class T, class L, class Emit>
MIRAGE_DEVICE void rms_norm_apply(dev::SharedTile<T, L> in, float eps, Emit emit) {
  detail::rms_norm_apply<NumThreads, false>(in, eps, emit, nullptr);
}

// The same with a scratch: few long rows are reduced by several warps each (dev::reduce_apply).
template <int NumThreads, class T, class L, class Emit>
MIRAGE_DEVICE void rms_norm_apply(dev::SharedTile<T, L> in, float eps, Emit emit, dev::ReductionScratch scratch) {
  detail::rms_norm_apply<NumThreads, true>(in, eps, emit, scratch.data);
}

// ---- sinks (called by one thread per element or chunk) -------------------------------------------

// sink.chunk(linear, values) as one call per element, for sinks without a vector form.
template <class Sink>
struct ElementwiseChunks {
  template <int C>
  MIRAGE_DEVICE void chunk(int linear, const float (&values)[C]) const {
    const Sink& sink = static_cast<const Sink&>(*this);
#pragma unroll
    for (int e = 0; e < C; ++e) sink(linear + e, values[e]);
  }
};

template <class T, class L>
struct StoreSink {
  dev::SharedTile<T, L> tile;
  MIRAGE_DEVICE void operator()(int linear, float value) const { tile.store(linear, value); }
  template <int C>
  MIRAGE_DEVICE void chunk(int linear, const float (&values)[C]) const {
    write_chunk<L::pitch>(tile.data + L::offset_of(linear), values);
  }
};

// Accumulator state in shared memory has the element type T of OptimizerOptions.accumulator_dtype
// (float by default; __half or __nv_bfloat16 halve its shared memory): sinks read it into fp32
// registers, update it there, and store it back converted to T (for T = float: no conversion).
template <class T, class L>
struct AddSink {
  dev::SharedTile<T, L> acc;
  MIRAGE_DEVICE void operator()(int linear, float value) const {
    T& target = acc.at_linear(linear);
    target = dev::from_float<T>(dev::to_float(target) + value);
  }
  template <int C>
  MIRAGE_DEVICE void chunk(int linear, const float (&values)[C]) const {
    T* target = acc.data + L::offset_of(linear);
    float sums[C];
    read_chunk<L::pitch>(target, sums);
#pragma unroll
    for (int e = 0; e < C; ++e) sums[e] += values[e];
    write_chunk<L::pitch>(target, sums);
  }
};

template <class T, class L>
struct MaxSink : ElementwiseChunks<MaxSink<T, L>> {
  dev::SharedTile<T, L> acc;
  MIRAGE_DEVICE MaxSink(dev::SharedTile<T, L> tile) : acc(tile) {}
  MIRAGE_DEVICE void operator()(int linear, float value) const {
    T& target = acc.at_linear(linear);
    target = dev::from_float<T>(fmaxf(dev::to_float(target), value));
  }
};

// The running maximum keeps its value before this iteration's update, for rescaling accumulators.
template <class T, class L>
struct RunningMaxSink : ElementwiseChunks<RunningMaxSink<T, L>> {
  dev::SharedTile<T, L> current;
  dev::SharedTile<T, L> previous;
  MIRAGE_DEVICE RunningMaxSink(dev::SharedTile<T, L> now, dev::SharedTile<T, L> before)
      : current(now), previous(before) {}
  MIRAGE_DEVICE void operator()(int linear, float value) const {
    const T old = current.at_linear(linear);
    previous.at_linear(linear) = old;
    current.at_linear(linear) = dev::from_float<T>(fmaxf(dev::to_float(old), value));
  }
};

// exp(m_previous − m_current) at an element of AccLayout, the maxima broadcast to it. The maxima's
// element type (accumulator_dtype: float, __half or __nv_bfloat16) is taken from the tiles it is
// made of, `RescaleFactor<AccLayout, MaxLayout>{current, previous}`; it is a constant of the
// inlined caller, so only its load remains.
template <class AccLayout, class MaxLayout>
struct RescaleFactor {
  enum class Element { kFloat, kHalf, kBfloat16 };
  const void* current;
  const void* previous;
  Element element;
  template <class T>
  MIRAGE_DEVICE RescaleFactor(dev::SharedTile<T, MaxLayout> now, dev::SharedTile<T, MaxLayout> before)
      : current(now.data), previous(before.data), element(element_of<T>()) {}
  // One factor per row: a chunk (consecutive elements of a row) shares it.
  static constexpr bool kPerRow = MaxLayout::dim3 == 1;
  MIRAGE_DEVICE float operator()(int linear) const {
    static_assert(dev::kBroadcastsTo<MaxLayout, AccLayout>, "the maxima must broadcast to the accumulator");
    int index[4];
    AccLayout::coordinates(linear, index);
    const int m = dev::broadcast_offset<MaxLayout>(index);
    return dev::rescale_factor(load(previous, m), load(current, m));
  }

 private:
  template <class T>
  static constexpr Element element_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                  "maxima are float, __half or __nv_bfloat16");
    return std::is_same_v<T, float> ? Element::kFloat : std::is_same_v<T, __half> ? Element::kHalf : Element::kBfloat16;
  }
  MIRAGE_DEVICE float load(const void* maxima, int m) const {
    switch (element) {
      case Element::kHalf: return dev::to_float(static_cast<const __half*>(maxima)[m]);
      case Element::kBfloat16: return dev::to_float(static_cast<const __nv_bfloat16*>(maxima)[m]);
      default: return static_cast<const float*>(maxima)[m];
    }
  }
};

// acc = acc · exp(m_previous − m_current) + value (online softmax).
template <class T, class L, class MaxLayout>
struct RescaleSink {
  dev::SharedTile<T, L> acc;
  RescaleFactor<L, MaxLayout> factor;
  MIRAGE_DEVICE void operator()(int linear, float value) const {
    T& target = acc.at_linear(linear);
    target = dev::from_float<T>(dev::to_float(target) * factor(linear) + value);
  }
  template <int C>
  MIRAGE_DEVICE void chunk(int linear, const float (&values)[C]) const {
    if constexpr (RescaleFactor<L, MaxLayout>::kPerRow) {
      const float scale = factor(linear);
      T* target = acc.data + L::offset_of(linear);
      float sums[C];
      read_chunk<L::pitch>(target, sums);
#pragma unroll
      for (int e = 0; e < C; ++e) sums[e] = sums[e] * scale + values[e];
      write_chunk<L::pitch>(target, sums);
    } else {
#pragma unroll
      for (int e = 0; e < C; ++e) (*this)(linear + e, values[e]);
    }
  }
};

// A one-iteration kernel's result that only its output saver reads, written by its chain straight
// into the device output (no shared tile, no barrier, no saver pass): `target` is the output plus
// the block's base, rows placed by `strides` (L: the result's dims); chunks of rows that are
// contiguous and 16-byte aligned (the saver's condition) take one vector store each.
template <class T, class L>
struct GlobalSink {
  T* target;
  dev::Strides strides;
  bool vectors;
  MIRAGE_DEVICE T* at(int linear) const {
    return target + dev::strided_row_offset<L>(strides, linear / L::cols) +
           static_cast<int64_t>(linear % L::cols) * strides.stride[3];
  }
  MIRAGE_DEVICE void operator()(int linear, float value) const { *at(linear) = dev::from_float<T>(value); }
  // elements linear and linear + 1 of a row (linear even): one 4- or 8-byte store where rows are
  // contiguous and aligned (an online-softmax chain's output fragments: two neighbouring columns a lane)
  MIRAGE_DEVICE void pair(int linear, float a, float b) const {
    if constexpr (L::cols % 2 == 0 && sizeof(T) <= 4) {
      if (vectors) {
        const float values[2] = {a, b};
        uint32_t words[2 * sizeof(T) / 4];
        dev::pack_words<T>(values, words);
        if constexpr (sizeof(T) == 2) {
          *reinterpret_cast<uint32_t*>(at(linear)) = words[0];
        } else {
          *reinterpret_cast<uint2*>(at(linear)) = make_uint2(words[0], words[1]);
        }
        return;
      }
    }
    (*this)(linear, a);
    (*this)(linear + 1, b);
  }
  // element e of `values` at (row e, col): a column-local loop's column
  template <int C>
  MIRAGE_DEVICE void column(int col, const float (&values)[C]) const {
    static_assert(C <= L::dim2, "a column of one [rows, cols] tile");
    T* place = at(col);
#pragma unroll
    for (int e = 0; e < C; ++e, place += strides.stride[2]) *place = dev::from_float<T>(values[e]);
  }
  template <int C>
  MIRAGE_DEVICE void chunk(int linear, const float (&values)[C]) const {
    if (vectors) {  // rows 16-byte aligned
      constexpr int kVector = dev::kVectorElements<T>;
      if constexpr (C % kVector == 0) {  // whole 16-byte stores, in PTX (a uint4 store may be split)
#pragma unroll
        for (int v = 0; v < C / kVector; ++v)
          dev::store_global_values<T>(at(linear + v * kVector),
                                      *reinterpret_cast<const float (*)[kVector]>(&values[v * kVector]));
      } else if constexpr (C * sizeof(T) == 8 && sizeof(T) == 2) {  // one 8-byte store
        dev::store_global_values<T>(at(linear), values);
      } else {
        write_chunk<kVector>(at(linear), values);
      }
      return;
    }
#pragma unroll
    for (int e = 0; e < C; ++e) (*this)(linear + e, values[e]);
  }
};

template <class T, class L>
MIRAGE_DEVICE StoreSink<T, L> store_into(dev::SharedTile<T, L> tile) { return {tile}; }
template <class L, class T>
MIRAGE_DEVICE GlobalSink<T, L> store_global(T* global, const dev::Strides& strides, int64_t base) {
  return {global + base, strides, dev::OutputSaver<T, L, 1>::aligned(global, strides, base)};
}
template <class T, class L>
MIRAGE_DEVICE AddSink<T, L> add_into(dev::SharedTile<T, L> acc) { return {acc}; }
template <class T, class L>
MIRAGE_DEVICE MaxSink<T, L> max_into(dev::SharedTile<T, L> acc) { return MaxSink<T, L>(acc); }
template <class T, class L>
MIRAGE_DEVICE RunningMaxSink<T, L> running_max_into(dev::SharedTile<T, L> current, dev::SharedTile<T, L> previous) {
  return RunningMaxSink<T, L>(current, previous);
}
template <class T, class L, class TM, class MaxLayout>
MIRAGE_DEVICE RescaleSink<T, L, MaxLayout> rescale_into(dev::SharedTile<T, L> acc, dev::SharedTile<TM, MaxLayout> current,
                                                        dev::SharedTile<TM, MaxLayout> previous) {
  return {acc, RescaleFactor<L, MaxLayout>(current, previous)};
}

// ---- accumulator state ----------------------------------------------------------------------------

// Accumulator state of element type T (OptimizerOptions.accumulator_dtype), computed in fp32.
template <int NumThreads, class T, class L>
MIRAGE_DEVICE void fill(dev::SharedTile<T, L> tile, float value) {
  const T stored = dev::from_float<T>(value);
  for (int i = dev::thread_index(); i < L::size; i += NumThreads) tile.at_linear(i) = stored;
}

// acc = acc / count (a mean accumulator after the loop).
template <int NumThreads, class T, class L>
MIRAGE_DEVICE void finalize_mean(dev::SharedTile<T, L> acc, float count) {
  for (int i = dev::thread_index(); i < L::size; i += NumThreads) acc.store(i, acc.load(i) / count);
}

// acc = sqrt(acc / count + eps) (an rms accumulator, which summed squares, after the loop).
template <int NumThreads, class T, class L>
MIRAGE_DEVICE void finalize_rms(dev::SharedTile<T, L> acc, float count, float eps) {
  for (int i = dev::thread_index(); i < L::size; i += NumThreads) acc.store(i, sqrtf(acc.load(i) / count + eps));
}

// What a row-sum accumulator's sum becomes after the loop: itself, a mean, or an rms.
struct FinishSum {
  MIRAGE_DEVICE float operator()(float sum) const { return sum; }
};
struct FinishMean {
  float count;
  MIRAGE_DEVICE float operator()(float sum) const { return sum / count; }
};
struct FinishRms {
  float count, eps;
  MIRAGE_DEVICE float operator()(float sum) const { return sqrtf(sum / count + eps); }
};

// Threads per row of a row-sum accumulator: a power of two up to a warp, as many as the block has
// for every row (rows longer than that take several rounds of the block).
constexpr int row_sum_lanes(int rows, int cols, int threads) {
  int lanes = dev::kWarpSize;
  while (lanes > 1 && (rows * lanes > threads || lanes > cols)) lanes /= 2;
  return lanes;
}

// A for-loop accumulator of sums over the last dim (sum, mean, rms) kept in registers: each thread
// owns a fixed slice of one row of every iteration's tile (kLanes consecutive threads a row, kChunk
// consecutive elements per shared-memory vector read) and adds it to its partial sum; the lanes of
// a row combine once, after the loop (write_back). Per iteration there is no shuffle, no barrier
// and no shared-memory write, where a block reduction per iteration would add into a shared tile.
template <int NumThreads, class T, class L, class Prologue>
struct RowSums {
  static_assert(dev::read_by_pitch<L>());
  static constexpr int kCols = L::cols;
  static constexpr int kRows = L::rows;
  static constexpr int kLanes = row_sum_lanes(kRows, kCols, NumThreads);
  static constexpr int kRowsPerRound = NumThreads / kLanes;
  static constexpr int kRounds = dev::ceil_div(kRows, kRowsPerRound);
  static constexpr int kChunk = kCols % (8 * kLanes) == 0   ? 8
                                : kCols % (4 * kLanes) == 0 ? 4
                                : kCols % (2 * kLanes) == 0 ? 2
                                                            : 1;
  static_assert(dev::kWarpSize % kLanes == 0, "a row's lanes stay within one warp");
  float partial[kRounds];

  static MIRAGE_DEVICE int lane() { return dev::thread_index() % kLanes; }
  static MIRAGE_DEVICE int row(int round) { return round * kRowsPerRound + dev::thread_index() / kLanes; }

  MIRAGE_DEVICE void clear() {
#pragma unroll
    for (int r = 0; r < kRounds; ++r) partial[r] = 0.0f;
  }

  // partial += Σ prologue(x) over this thread's elements of the tile.
  MIRAGE_DEVICE void add(dev::SharedTile<T, L> tile) {
    const Prologue prologue{};
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      if (kRows % kRowsPerRound != 0 && row(r) >= kRows) continue;
      const T* source = tile.data + row(r) * L::pitch;
      float sums[kChunk] = {};
#pragma unroll 4
      for (int col = lane() * kChunk; col < kCols; col += kLanes * kChunk) {
        float values[kChunk];
        read_chunk<L::pitch>(source + col, values);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) sums[e] += prologue(values[e]);
      }
#pragma unroll
      for (int e = 0; e < kChunk; ++e) partial[r] += sums[e];
    }
  }

  // out[row] = finish(Σ of the row over the loop): collective (every thread shuffles).
  template <class Out, class OutLayout, class Finish>
  MIRAGE_DEVICE void write_back(dev::SharedTile<Out, OutLayout> out, Finish finish) const {
    static_assert(OutLayout::size == kRows, "one result per row");
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      float value = partial[r];
#pragma unroll
      for (int offset = kLanes / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
      if (lane() == 0 && row(r) < kRows) out.store(row(r), finish(value));
    }
  }
};

MIRAGE_DEVICE float negative_infinity() { return dev::MaxReduce::identity(); }

// Where running maxima start (RUNNING_MAX_FLOOR in mirage/mugraph/ops.py): finite, so that rows whose
// scores so far are all −inf (masked) give exp(s − m) = 0 and a rescale of 1, not NaN.
MIRAGE_DEVICE constexpr float running_max_floor() { return -1e30f; }

// ---- matmul -------------------------------------------------------------------------------------

// dev::SimtMatmul with different element types for A and B (an accumulator times a tile).
template <class TA, class TB, class ALayout, class BLayout, int NumThreads>
struct MixedSimtMatmul {
  static constexpr int M = ALayout::rows;
  static constexpr int K = ALayout::cols;
  static constexpr int N = BLayout::cols;
  static_assert(BLayout::rows == K, "A is M x K and B is K x N");
  static constexpr int kRounds = dev::ceil_div(M * N, NumThreads);

  struct Accumulator {
    float value[kRounds];
    MIRAGE_DEVICE void clear() {
#pragma unroll
      for (int round = 0; round < kRounds; ++round) value[round] = 0.0f;
    }
  };

  static MIRAGE_DEVICE int output(int round) { return dev::thread_index() + round * NumThreads; }
  static MIRAGE_DEVICE bool owns(int round) { return (M * N) % NumThreads == 0 || output(round) < M * N; }

  static MIRAGE_DEVICE void run(Accumulator& acc, dev::SharedTile<TA, ALayout> a, dev::SharedTile<TB, BLayout> b) {
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      if (!owns(round)) continue;
      const int row = output(round) / N;
      const int col = output(round) % N;
      float sum = acc.value[round];
      for (int k = 0; k < K; ++k)
        sum = fmaf(dev::to_float(a.data[row * ALayout::pitch + k]), dev::to_float(b.data[BLayout::element_offset(k, col)]), sum);
      acc.value[round] = sum;
    }
  }

  template <class Function>
  static MIRAGE_DEVICE void for_each(Accumulator& acc, Function function) {
#pragma unroll
    for (int round = 0; round < kRounds; ++round)
      if (owns(round)) function(output(round) / N, output(round) % N, acc.value[round]);
  }

  template <class RowFactor>
  static MIRAGE_DEVICE void scale_rows(Accumulator& acc, RowFactor factor) {
    for_each(acc, [&](int row, int, float& value) { value *= factor(row); });
  }
};

// One product A · B of a (batched) block matmul: A [batch..., M, K], B [batch..., K, N].
template <class TA, class TB, class ALayout, class BLayout>
struct Product {
  static_assert(dev::read_by_pitch<ALayout>() && dev::read_by_pitch_or_transposed<BLayout>());
  using A = TA;
  using B = TB;
  static constexpr int kBatch = ALayout::dim0 * ALayout::dim1;
  static constexpr int M = ALayout::dim2;
  static constexpr int K = ALayout::dim3;
  static constexpr int N = BLayout::dim3;
  static_assert(BLayout::dim0 == ALayout::dim0 && BLayout::dim1 == ALayout::dim1, "batch dims differ");
  static_assert(BLayout::dim2 == K, "inner dims differ");
  using ASlice = dev::Layout<1, 1, M, K, ALayout::pitch>;
  using BSlice = typename dev::MatrixOf<BLayout, K, N>::type;  // B may be read transposed (dev::Transposed)

  static MIRAGE_DEVICE dev::SharedTile<TA, ASlice> a_slice(dev::SharedTile<TA, ALayout> a, int batch) {
    return {a.data + batch * M * ALayout::pitch};
  }
  static MIRAGE_DEVICE dev::SharedTile<TB, BSlice> b_slice(dev::SharedTile<TB, BLayout> b, int batch) {
    return {b.data + batch * dev::MatrixOf<BLayout, K, N>::stride};
  }

  template <int NumThreads>
  static constexpr bool tensor_cores() {
    if constexpr (std::is_same_v<TA, TB>) {
      return dev::TensorCoreMatmul<TA, ASlice, BSlice, NumThreads>::kSupported;
    } else {
      return false;
    }
  }
};

// Σ_i A_i · B_i over the products (one for matmul, two for concat_matmul), batch by batch, on
// tensor cores when every product can use them, else on SIMT cores. All products share one
// accumulator type (the same M, N and engine give the same fragment layout).
//
// A register accumulator (Registers: accumulate, write_back) may split K across warp groups
// (dev::detail::choose_split_warp_grid over the products' k-steps together): each group keeps a
// partial sum in its registers for the whole for-loop, and write_back adds the partials once,
// through the write-back tile's memory. That is exact for `accumulate` and for `scale` (a linear
// factor); `accumulate_with` (a non-linear transform of each term) runs every term whole in group
// 0, whose registers then hold the value while the other groups' stay zero. One Registers value
// takes either accumulate or accumulate_with updates, not both (one register chain per accumulator).
template <int NumThreads, class... Products>
struct BlockMatmul {
  using First = std::tuple_element_t<0, std::tuple<Products...>>;
  static constexpr bool kTensorCores = (Products::template tensor_cores<NumThreads>() && ...);
  static constexpr int kBatch = First::kBatch;
  static constexpr int M = First::M;
  static constexpr int N = First::N;
  static_assert(((Products::M == M && Products::N == N && Products::kBatch == kBatch) && ...),
                "the products of one matmul must have one result shape");

  template <class P>
  using Engine = std::conditional_t<
      kTensorCores, dev::TensorCoreMatmul<typename P::A, typename P::ASlice, typename P::BSlice, NumThreads>,
      std::conditional_t<std::is_same_v<typename P::A, typename P::B>,
                         dev::SimtMatmul<typename P::A, typename P::ASlice, typename P::BSlice, NumThreads>,
                         MixedSimtMatmul<typename P::A, typename P::B, typename P::ASlice, typename P::BSlice, NumThreads>>>;
  using Accumulator = typename Engine<First>::Accumulator;
  static constexpr int kValues = sizeof(Accumulator) / sizeof(float);

  // The register accumulator's warp grid, for all products together.
  template <class P>
  static constexpr int atom_k() {
    return dev::detail::MmaAtom<typename P::A>::kK;
  }
  template <class P>
  static constexpr int operand_bytes() {
    return kBatch * (P::ASlice::storage * int(sizeof(typename P::A)) + P::BSlice::storage * int(sizeof(typename P::B)));
  }
  static constexpr int kSteps = ((dev::ceil_div(Products::K, atom_k<Products>())) + ...);
  static constexpr dev::detail::WarpGrid kRegisterGrid =
      kTensorCores ? dev::detail::choose_split_warp_grid(dev::detail::SplitQuery{
                         dev::round_up(M, 16),
                         dev::TensorCoreMatmul<typename First::A, typename First::ASlice, typename First::BSlice, NumThreads>::kCols,
                         kSteps, NumThreads / dev::kWarpSize, kBatch,
                         atom_k<First>() * int(sizeof(typename First::A)),
                         dev::ceil_div((operand_bytes<Products>() + ...), dev::kVectorBytes * NumThreads)})
                   : dev::detail::WarpGrid{1, 1, 1};
  static constexpr bool kSplitK = MIRAGE_SPLIT_K && kTensorCores && kRegisterGrid.k > 1;
  template <class P>
  using RegisterEngine = std::conditional_t<
      kSplitK,
      dev::TensorCoreMatmul<typename P::A, typename P::ASlice, typename P::BSlice, NumThreads,
                            dev::FixedWarpGrid<kRegisterGrid.m, kRegisterGrid.n, kRegisterGrid.k>>,
      Engine<P>>;
  using RegisterAccumulator = typename RegisterEngine<First>::Accumulator;
  static constexpr int kRegisterValues = sizeof(RegisterAccumulator) / sizeof(float);

  // A matmul accumulator kept in registers: one fragment per batch.
  struct Registers {
    RegisterAccumulator part[kBatch];
  };

  // How multiply runs each product: one block matmul (apply), the register grid's slice of K
  // (accumulate), the register grid's group 0 over all of K (accumulate_with: whole products).
  enum class Pass { kApply, kPartial, kWhole };

  // acc += Σ_i A_i · B_i for one batch; tiles are a_0, b_0, a_1, b_1, ...
  template <Pass Mode, int I = 0, class Acc, class TA, class AL, class TB, class BL, class... Rest>
  static MIRAGE_DEVICE void multiply(Acc& acc, int batch, dev::SharedTile<TA, AL> a, dev::SharedTile<TB, BL> b,
                                     Rest... rest) {
    using P = std::tuple_element_t<I, std::tuple<Products...>>;
    using E = std::conditional_t<Mode == Pass::kApply, Engine<P>, RegisterEngine<P>>;
    static_assert(sizeof(typename E::Accumulator) == sizeof(Acc), "products need one fragment layout");
    auto& target = reinterpret_cast<typename E::Accumulator&>(acc);
    if constexpr (Mode == Pass::kWhole && kSplitK) {
      E::run_whole(target, P::a_slice(a, batch), P::b_slice(b, batch));
    } else {
      E::run(target, P::a_slice(a, batch), P::b_slice(b, batch));
    }
    if constexpr (sizeof...(Rest) > 0) multiply<Mode, I + 1>(acc, batch, rest...);
  }

  // function(linear, value&) for every element of one batch's fragment this thread holds (for a
  // register accumulator with a K split: its group-0 elements).
  template <class E = Engine<First>, class Function>
  static MIRAGE_DEVICE void for_each(typename E::Accumulator& acc, int batch, Function function) {
    E::for_each(acc, [&](int row, int col, float& value) { function((batch * M + row) * N + col, value); });
  }

  // emit(linear, chunk) for every element of Σ_i A_i · B_i: chunks of the two consecutive elements of
  // a row that a tensor-core fragment holds together, else of one element.
  template <class Emit, class... Tiles>
  static MIRAGE_DEVICE void apply(Emit emit, Tiles... tiles) {
    for (int batch = 0; batch < kBatch; ++batch) {
      Accumulator acc;
      acc.clear();
      multiply<Pass::kApply>(acc, batch, tiles...);
      if constexpr (kTensorCores && N % 2 == 0) {
        Engine<First>::for_each_pair(acc, [&](int row, int col, float& first, float& second) {
          float values[2] = {first, second};
          emit((batch * M + row) * N + col, values);
        });
      } else {
        for_each(acc, batch, [&](int linear, float& value) {
          float values[1] = {value};
          emit(linear, values);
        });
      }
    }
  }

  // ---- register accumulators (per thread, no barrier needed, except in write_back) ----

  // Group 0 (all threads without a split) starts at `value`, the other groups' partial sums at 0.
  static MIRAGE_DEVICE void fill(Registers& registers, float value) {
    float start = value;
    if constexpr (kSplitK) start = RegisterEngine<First>::owner() ? value : 0.0f;
#pragma unroll
    for (int batch = 0; batch < kBatch; ++batch) {
      float* values = reinterpret_cast<float*>(&registers.part[batch]);
#pragma unroll
      for (int k = 0; k < kRegisterValues; ++k) values[k] = start;
    }
  }

  // registers += Σ_i A_i · B_i (the products run into the registers directly; with a K split, each
  // warp group into its partial sum).
  template <class... Tiles>
  static MIRAGE_DEVICE void accumulate(Registers& registers, Tiles... tiles) {
#pragma unroll
    for (int batch = 0; batch < kBatch; ++batch) multiply<Pass::kPartial>(registers.part[batch], batch, tiles...);
  }

  // registers += (A · diag(scale)) · B for one product of one batch on tensor cores: A's columns
  // scaled by the row vector `scale` in the A fragments (no A · diag(scale) tile is stored).
  template <class TS, class LS, class TA, class AL, class TB, class BL>
  static MIRAGE_DEVICE void accumulate_scaled(Registers& registers, dev::SharedTile<TS, LS> scale,
                                              dev::SharedTile<TA, AL> a, dev::SharedTile<TB, BL> b) {
    static_assert(sizeof...(Products) == 1 && kBatch == 1 && kTensorCores && std::is_same_v<TS, TA>,
                  "a column-scaled A operand needs one tensor-core product of one batch; prepare with "
                  "OptimizerOptions(fold_operand_scale=False)");
    static_assert(LS::size == First::K, "the scale holds one value per column of A");
    using E = RegisterEngine<First>;
    E::template run<true>(reinterpret_cast<typename E::Accumulator&>(registers.part[0]), First::a_slice(a, 0),
                          First::b_slice(b, 0), scale.data);
  }

  // registers = combine(registers, transform(linear, Σ_i A_i · B_i)).
  template <class Transform, class Combine, class... Tiles>
  static MIRAGE_DEVICE void accumulate_with(Registers& registers, Transform transform, Combine combine, Tiles... tiles) {
    using E = RegisterEngine<First>;
    if constexpr (kSplitK) {
      if (!E::owner()) return;
    }
#pragma unroll
    for (int batch = 0; batch < kBatch; ++batch) {
      RegisterAccumulator term;
      term.clear();
      multiply<Pass::kWhole>(term, batch, tiles...);
      for_each<E>(term, batch, [&](int linear, float& value) { value = transform(linear, value); });
      float* total = reinterpret_cast<float*>(&registers.part[batch]);
      const float* values = reinterpret_cast<const float*>(&term);
#pragma unroll
      for (int k = 0; k < kRegisterValues; ++k) total[k] = combine(total[k], values[k]);
    }
  }

  // registers[linear] *= factor(linear) (online-softmax rescale); a factor that is one per row
  // (Factor::kPerRow) is computed once per row a thread holds. Every partial sum is scaled.
  template <class Factor>
  static MIRAGE_DEVICE void scale(Registers& registers, Factor factor) {
    using E = RegisterEngine<First>;
#pragma unroll
    for (int batch = 0; batch < kBatch; ++batch) {
      if constexpr (Factor::kPerRow) {
        E::scale_rows(registers.part[batch], [&](int row) { return factor((batch * M + row) * N); });
      } else if constexpr (kSplitK) {
        E::for_each_partial(registers.part[batch], [&](int row, int col, float& value) {
          value *= factor((batch * M + row) * N + col);
        });
      } else {
        for_each<E>(registers.part[batch], batch, [&](int linear, float& value) { value *= factor(linear); });
      }
    }
  }

  // tile[linear] = registers[linear]. Without a K split each thread writes its elements (no
  // barrier); with one, the groups' partial sums are first added through the tile's memory
  // (collective, kRegisterGrid.k − 1 barriers, more for a 16-bit tile; no extra shared memory).
  template <class T, class L>
  static MIRAGE_DEVICE void write_back(Registers& registers, dev::SharedTile<T, L> tile) {
    static_assert(L::size == kBatch * M * N, "the write-back tile must hold the whole result");
    using E = RegisterEngine<First>;
    if constexpr (kSplitK) E::sum_partials_through(registers.part, tile);
#pragma unroll
    for (int batch = 0; batch < kBatch; ++batch)
      for_each<E>(registers.part[batch], batch, [&](int linear, float& value) { tile.store(linear, value); });
  }
};

}  // namespace mirage::gen
