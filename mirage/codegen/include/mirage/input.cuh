// Input iterators: copy a block's tile of a device tensor into shared memory, pipelined over
// the forloop with cp.async.
//
// Protocol for a forloop of range R with S stages (all pipelined inputs share one commit):
//
//   for (int s = 0; s < S - 1; ++s) { in0.load(s); in1.load(s); Pipeline<S>::commit(); }
//   for (int r = 0; r < R; ++r) {
//     in0.load(r + S - 1); in1.load(r + S - 1); Pipeline<S>::commit();  // no-op past R
//     Pipeline<S>::wait();                                               // stage r is ready
//     ... use in0.stage(r), in1.stage(r) ...
//     __syncthreads();                                                  // stage r may be reused
//   }
//
// Copies are 16-byte cp.async (LDGSTS.128 in SASS), consecutive threads taking consecutive
// 16-byte chunks of a row, when the tile rows are whole vectors and the tensor is suitably
// aligned (checked once per block at run time). Otherwise each element is loaded on its own:
// small tiles (at most kStagedPerThread elements per thread, such as a split-KV combine's [rows, 1]
// slices) through registers, the loads of `load(r)` landing in shared memory at the next `load`
// call (one iteration later, still before the stage's wait), so that they overlap the loop like
// cp.async does; larger tiles synchronously: correct for any shape and stride, without overlap.
#pragma once

#include <cute/arch/copy_sm80.hpp>

#include "layout.cuh"
#include "tile_map.cuh"

namespace mirage::dev {

template <int Stages>
struct Pipeline {
  static_assert(Stages >= 1, "a pipeline has at least one stage");
  // Close the group of copies issued since the last commit.
  static MIRAGE_DEVICE void commit() { cute::cp_async_fence(); }
  // Wait until the oldest outstanding group has landed and make it visible to the block.
  static MIRAGE_DEVICE void wait() {
    cute::cp_async_wait<Stages - 1>();
    __syncthreads();
  }
  // Wait for every outstanding group.
  static MIRAGE_DEVICE void wait_all() {
    cute::cp_async_wait<0>();
    __syncthreads();
  }
};

// The protocol above as one call: body(r) runs once per iteration with every iterator's
// stage r ready, and a barrier follows it.
template <int Stages, class Body, class... Iterators>
MIRAGE_DEVICE void pipelined_forloop(int forloop_range, Body body, const Iterators&... inputs) {
  for (int s = 0; s < Stages - 1; ++s) {
    (inputs.load(s), ...);
    Pipeline<Stages>::commit();
  }
  for (int r = 0; r < forloop_range; ++r) {
    (inputs.load(r + Stages - 1), ...);
    Pipeline<Stages>::commit();
    Pipeline<Stages>::wait();
    body(r);
    __syncthreads();
  }
}

template <class T, class L, int Stages, int NumThreads>
class InputIterator {
 public:
  using Element = T;
  using TileLayout = L;
  static constexpr int kVector = kVectorElements<T>;
  static constexpr bool kVectorizableShape = L::cols % kVector == 0 && L::pitch % kVector == 0;
  // Each stage starts 16-byte aligned.
  static constexpr int kStageElements = round_up(L::storage, kVector);
  static constexpr int kSharedBytes = Stages * kStageElements * static_cast<int>(sizeof(T));
  // elements per thread of a tile that the element path stages through registers
  static constexpr int kStagedPerThread = 4;
  static constexpr int kStaged = ceil_div(L::size, NumThreads);
  static constexpr bool kRegisterStaged = Stages > 1 && kStaged <= kStagedPerThread;

  MIRAGE_DEVICE InputIterator(const T* global, const Strides& strides, TileCoordinate coordinate,
                              int forloop_range, T* shared)
      : global_(global),
        strides_(strides),
        coordinate_(coordinate),
        forloop_range_(forloop_range),
        shared_(shared),
        vectorized_(kVectorizableShape && aligned(global, strides, coordinate)) {}

  MIRAGE_DEVICE SharedTile<T, L> stage(int iteration) const {
    return SharedTile<T, L>{shared_ + (iteration % Stages) * kStageElements};
  }

  // Issue the copy of the tile of `iteration` into its stage; nothing past the forloop range.
  MIRAGE_DEVICE void load(int iteration) const {
    if constexpr (kRegisterStaged) land();
    if (iteration >= forloop_range_) return;
    const T* source = global_ + coordinate_.at(iteration);
    T* target = stage(iteration).data;
    if constexpr (kVectorizableShape) {
      if (vectorized_) {
        copy_vectorized(source, target);
        return;
      }
    }
    if constexpr (kRegisterStaged) {
      issue_elements(source, iteration);
    } else {
      copy_elements(source, target);
    }
  }

  MIRAGE_DEVICE bool vectorized() const { return vectorized_; }

 private:
  static MIRAGE_DEVICE bool aligned(const T* global, const Strides& strides, TileCoordinate coordinate) {
    bool ok = reinterpret_cast<uintptr_t>(global) % kVectorBytes == 0 && strides.stride[3] == 1 &&
              coordinate.base % kVector == 0 && coordinate.iteration_step % kVector == 0;
    ok = ok && (L::dim0 == 1 || strides.stride[0] % kVector == 0);
    ok = ok && (L::dim1 == 1 || strides.stride[1] % kVector == 0);
    ok = ok && (L::dim2 == 1 || strides.stride[2] % kVector == 0);
    return ok;
  }

  MIRAGE_DEVICE int64_t row_offset(int row) const {
    const int i2 = row % L::dim2;
    const int i1 = (row / L::dim2) % L::dim1;
    const int i0 = row / (L::dim2 * L::dim1);
    return i0 * strides_.stride[0] + i1 * strides_.stride[1] + i2 * strides_.stride[2];
  }

  MIRAGE_DEVICE void copy_vectorized(const T* source, T* target) const {
    constexpr int kChunksPerRow = L::cols / kVector;
    constexpr int kChunks = L::rows * kChunksPerRow;
    constexpr int kRounds = ceil_div(kChunks, NumThreads);
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      const int chunk = thread_index() + round * NumThreads;
      if (kChunks % NumThreads == 0 || chunk < kChunks) {
        const int row = chunk / kChunksPerRow;
        const int col = (chunk % kChunksPerRow) * kVector;
        const auto* from = reinterpret_cast<const cute::uint128_t*>(source + row_offset(row) + col);
        auto* to = reinterpret_cast<cute::uint128_t*>(target + row * L::pitch + col);
        cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>::copy(*from, *to);
      }
    }
  }

  // Register staging of small element-wise tiles: loads now, shared-memory stores at land().
  MIRAGE_DEVICE void issue_elements(const T* source, int iteration) const {
#pragma unroll
    for (int k = 0; k < kStaged; ++k) {
      const int element = thread_index() + k * NumThreads;
      if (L::size % NumThreads == 0 || element < L::size)
        staged_[k] = source[row_offset(element / L::cols) + (element % L::cols) * strides_.stride[3]];
    }
    staged_iteration_ = iteration;
  }

  MIRAGE_DEVICE void land() const {
    if (staged_iteration_ < 0) return;
    T* target = stage(staged_iteration_).data;
#pragma unroll
    for (int k = 0; k < kStaged; ++k) {
      const int element = thread_index() + k * NumThreads;
      if (L::size % NumThreads == 0 || element < L::size)
        target[(element / L::cols) * L::pitch + element % L::cols] = staged_[k];
    }
    staged_iteration_ = -1;
  }

  MIRAGE_DEVICE void copy_elements(const T* source, T* target) const {
    for (int element = thread_index(); element < L::size; element += NumThreads) {
      const int row = element / L::cols;
      const int col = element % L::cols;
      target[row * L::pitch + col] = source[row_offset(row) + col * strides_.stride[3]];
    }
  }

  const T* global_;
  Strides strides_;
  TileCoordinate coordinate_;
  int forloop_range_;
  T* shared_;
  bool vectorized_;
  mutable T staged_[kRegisterStaged ? kStaged : 1];
  mutable int staged_iteration_ = -1;  // the iteration whose elements wait in staged_, or -1
};

}  // namespace mirage::dev
