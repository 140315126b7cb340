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
// small tiles (such as a split-KV combine's [rows, 1] slices) through a ring of registers: the
// loads of `load(r)` land in shared memory at the call `load(r + Stages - 1)`, just before the
// stage's wait, so that Stages - 1 iterations of loads are in flight like cp.async groups; larger
// tiles synchronously: correct for any shape and stride, without overlap.
#pragma once

#include <cute/arch/copy_sm80.hpp>
#include <cutlass/arch/barrier.h>

#include <type_traits>

#include "layout.cuh"
#include "tile_map.cuh"

// The L2 prefetch size that the 16-byte copies ask for (128 or 256 bytes, or 0 for no hint): a tile
// row narrower than a line leaves the rest of the line to the neighbouring blocks' copies.
#ifndef MIRAGE_CP_ASYNC_L2_BYTES
#define MIRAGE_CP_ASYNC_L2_BYTES 128
#endif
// Mark every copied line first to leave L2 (the iterators' EvictFirst, for all inputs; a probe's switch).
#ifndef MIRAGE_CP_ASYNC_EVICT_FIRST
#define MIRAGE_CP_ASYNC_EVICT_FIRST 0
#endif
#if MIRAGE_CP_ASYNC_L2_BYTES == 256
#define MIRAGE_CP_ASYNC_PREFETCH ".L2::256B"
#elif MIRAGE_CP_ASYNC_L2_BYTES == 128
#define MIRAGE_CP_ASYNC_PREFETCH ".L2::128B"
#else
#define MIRAGE_CP_ASYNC_PREFETCH ""
#endif

namespace mirage::dev {

// Whether every row of every tile of L that `coordinate` locates starts on a 16-byte boundary with
// unit-stride elements: what 16-byte copies of whole rows need (checked once per block).
template <class L, class T>
MIRAGE_DEVICE bool rows_aligned(const T* global, const Strides& strides, TileCoordinate coordinate) {
  constexpr int kVector = kVectorElements<T>;
  bool ok = reinterpret_cast<uintptr_t>(global) % kVectorBytes == 0 && strides.stride[3] == 1 &&
            coordinate.base % kVector == 0 && coordinate.iteration_step % kVector == 0;
  ok = ok && (L::dim0 == 1 || strides.stride[0] % kVector == 0);
  ok = ok && (L::dim1 == 1 || strides.stride[1] % kVector == 0);
  return ok && (L::dim2 == 1 || strides.stride[2] % kVector == 0);
}

// AsyncReaders: tiles of the pipeline are read by sm_90's warpgroup MMA (wgmma), which reads shared
// memory through the async proxy: each thread orders its landed copies before those reads
// (fence.proxy.async) ahead of the barrier that publishes them.
template <int Stages, bool AsyncReaders = false>
struct Pipeline {
  static_assert(Stages >= 1, "a pipeline has at least one stage");
  // Close the group of copies issued since the last commit.
  static MIRAGE_DEVICE void commit() { cute::cp_async_fence(); }
  // Wait until the oldest outstanding group has landed and make it visible to the block.
  static MIRAGE_DEVICE void wait() {
    cute::cp_async_wait<Stages - 1>();
    publish();
  }
  // The same before this iteration's loads are issued (Stages − 1 groups outstanding, not Stages):
  // the barrier also tells that every thread is done with the previous iteration's stage.
  static MIRAGE_DEVICE void wait_before_loads() {
    static_assert(Stages >= 2, "a pipeline that loads ahead has at least two stages");
    cute::cp_async_wait<Stages - 2>();
    publish();
  }
  // Wait for every outstanding group.
  static MIRAGE_DEVICE void wait_all() {
    cute::cp_async_wait<0>();
    publish();
  }

 private:
  static MIRAGE_DEVICE void publish() {
    if constexpr (AsyncReaders) cutlass::arch::fence_view_async_shared();
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

// Coherent: direct reads of data written earlier in the same kernel (a cluster fold's partials)
// go through L2 (ld.global.cg) instead of the read-only, non-coherent path (ld.global.nc).
// Staggered: a tile that several blocks load (the same rows of X for every block of a GEMV) is
// copied starting at row `rotation mod rows` (the block's index), so that the blocks do not all ask
// L2 for the same lines at the same moment; every row is still copied once per block.
// EvictFirst: the 16-byte copies mark their lines first to leave L2 (an L2 cache policy): a tile that
// no other block reads (a GEMV's weight strip) streams through L2 without pushing out what is read
// again (X, the outputs).
// BroadcastRows: the source's last dim is split over a broadcast (its inner part of stride 0: a group
// norm's gain over rows of channels · positions); see column_offset.
template <class T, class L, int Stages, int NumThreads, bool Coherent = false, bool Staggered = false,
          bool EvictFirst = false, bool BroadcastRows = false>
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
  static constexpr int kStaged = ceil_div(L::size, NumThreads);
  static constexpr int kRing = Stages > 1 ? Stages - 1 : 1;  // iterations of loads in flight
  static constexpr int kStagedRegisters = 32;                 // at most this many per thread
  static constexpr bool kRegisterStaged = !kVectorizableShape && Stages > 1 && kStaged * kRing <= kStagedRegisters;

  MIRAGE_DEVICE InputIterator(const T* global, const Strides& strides, TileCoordinate coordinate,
                              int forloop_range, T* shared, int rotation = 0)
      : global_(global),
        strides_(strides),
        coordinate_(coordinate),
        forloop_range_(forloop_range),
        shared_(shared),
        vectorized_(kVectorizableShape && aligned(global, strides, coordinate)),
        first_row_(Staggered ? rotation % L::rows : 0) {
    if constexpr (kEvictFirst) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy_));
  }

  MIRAGE_DEVICE SharedTile<T, L> stage(int iteration) const {
    return SharedTile<T, L>{shared_ + (iteration % Stages) * kStageElements};
  }

  // Issue the copy of the tile of `iteration` into its stage; nothing past the forloop range.
  MIRAGE_DEVICE void load(int iteration) const {
    if constexpr (kRegisterStaged) land(iteration - kRing);
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

  // A hint: pull the tile of `iteration` into L2, one bulk prefetch per row (rows of contiguous
  // elements only; nothing otherwise). No shared memory, nothing to wait for, and safe anywhere,
  // before the kernel's dependency wait too: L2 is where every write lands, so a prefetched line
  // is never stale. A kernel launched early (programmatic dependent launch) so streams its first
  // tiles while the kernel before it finishes.
  MIRAGE_DEVICE void prefetch_l2(int iteration) const {
    if (iteration >= forloop_range_ || strides_.stride[3] != 1) return;
    constexpr int kRowBytes = L::cols * static_cast<int>(sizeof(T));
    const T* source = global_ + coordinate_.at(iteration);
    for (int row = thread_index(); row < L::rows; row += NumThreads) {
      const char* address = reinterpret_cast<const char*>(source + row_offset(row));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if (kRowBytes % 16 == 0 && reinterpret_cast<uintptr_t>(address) % 16 == 0) {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(address), "r"(kRowBytes) : "memory");
        continue;
      }
#endif
      for (int offset = 0; offset < kRowBytes; offset += 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(address + offset));
      }
    }
  }

  // Direct reads, for a loop body that each thread runs on its own elements (a row-local loop):
  // element (row, col) of the tile of `iteration`, or N consecutive ones from (row, col), read
  // from global memory as floats, no shared stage (the iterator's `shared` may be null). With
  // Vectors (the caller checked vectorized() once, outside its loop, so that the loop has no
  // branch and the compiler may hoist its loads), the N elements are loaded as 16- or 8-byte
  // vectors where N · sizeof(T) allows (col a multiple of N).
  MIRAGE_DEVICE float read(int iteration, int row, int col) const {
    return to_float(global_[coordinate_.at(iteration) + row_offset(row) + column_offset(col)]);
  }

  template <bool Vectors, int N>
  MIRAGE_DEVICE void read(int iteration, int row, int col, float (&out)[N]) const {
    if constexpr (BroadcastRows) {  // the row's elements repeat over spans: no vectors
      const T* row_start = global_ + coordinate_.at(iteration) + row_offset(row);
      if (strides_.inner[3] % N == 0 && col % N == 0) {  // N columns of one span: one element
        const float value = to_float(row_start[column_offset(col)]);
#pragma unroll
        for (int e = 0; e < N; ++e) out[e] = value;
        return;
      }
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = to_float(row_start[column_offset(col + e)]);
      return;
    }
    const T* source = global_ + coordinate_.at(iteration) + row_offset(row) + col * strides_.stride[3];
    constexpr int kBytes = N * static_cast<int>(sizeof(T));
    if constexpr (Vectors && kVectorizableShape && kBytes % 8 == 0) {
      using Word = std::conditional_t<kBytes % 16 == 0, uint4, uint2>;
      constexpr int kPerWord = static_cast<int>(sizeof(Word) / sizeof(T));
#pragma unroll
      for (int w = 0; w < N / kPerWord; ++w) {
        const Word* address = reinterpret_cast<const Word*>(source) + w;
        const Word word = Coherent ? __ldcg(address) : __ldg(address);
        T elements[kPerWord];
        memcpy(elements, &word, sizeof(Word));
#pragma unroll
        for (int e = 0; e < kPerWord; ++e) out[w * kPerWord + e] = to_float(elements[e]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = to_float(source[e * strides_.stride[3]]);
    }
  }

  // The same N elements where col + e < width, 0 past it (a ragged row's padding), element by element.
  template <int N>
  MIRAGE_DEVICE void read_masked(int iteration, int row, int col, int width, float (&out)[N]) const {
    const T* source = global_ + coordinate_.at(iteration) + row_offset(row);
#pragma unroll
    for (int e = 0; e < N; ++e) out[e] = col + e < width ? to_float(source[column_offset(col + e)]) : 0.0f;
  }

  // Element `col` of each of the tile's first N rows (a column-local loop: a thread's whole column);
  // the threads of a warp hold consecutive columns, so each row's loads are coalesced.
  template <int N>
  MIRAGE_DEVICE void read_column(int iteration, int col, float (&out)[N]) const {
    static_assert(N <= L::dim2, "a column of one [rows, cols] tile");
    const T* source = global_ + coordinate_.at(iteration) + column_offset(col);
#pragma unroll
    for (int e = 0; e < N; ++e, source += strides_.stride[2]) out[e] = to_float(*source);
  }

  // Whether direct reads may take vector loads: the tiles' rows aligned for them (vectorized()), or
  // rows that repeat their elements over spans, which read element by element whatever the others do.
  MIRAGE_DEVICE bool direct_vectors() const { return vectorized_ || broadcast_rows(); }

 private:
  static MIRAGE_DEVICE bool aligned(const T* global, const Strides& strides, TileCoordinate coordinate) {
    return rows_aligned<L>(global, strides, coordinate);
  }

  MIRAGE_DEVICE int64_t row_offset(int row) const { return strided_row_offset<L>(strides_, row); }

  // Element offset of column `col` of a tile: of a split last dim (a broadcast inner part, stride 0:
  // a group norm's gain over a row of channels · positions), tiles start at a span's start or lie
  // in one span (mirage.codegen.column_major.split_reads), so the split applies within the tile.
  MIRAGE_DEVICE int64_t column_offset(int col) const {
    if constexpr (BroadcastRows) return col / strides_.inner[3] * strides_.outer[3];
    return col * strides_.stride[3];
  }

  // Whether the rows repeat their elements (a split last dim): never copied or read by vectors.
  static constexpr MIRAGE_DEVICE bool broadcast_rows() { return BroadcastRows; }

  MIRAGE_DEVICE void copy_vectorized(const T* source, T* target) const {
    constexpr int kChunksPerRow = L::cols / kVector;
    constexpr int kChunks = L::rows * kChunksPerRow;
    constexpr int kRounds = ceil_div(kChunks, NumThreads);
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      const int chunk = thread_index() + round * NumThreads;
      if (kChunks % NumThreads == 0 || chunk < kChunks) {
        int row = chunk / kChunksPerRow;
        if constexpr (Staggered) {
          row += first_row_;
          if (row >= L::rows) row -= L::rows;
        }
        const int col = (chunk % kChunksPerRow) * kVector;
        const auto* from = reinterpret_cast<const cute::uint128_t*>(source + row_offset(row) + col);
        auto* to = reinterpret_cast<cute::uint128_t*>(target + L::element_offset(row, col));
        const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(to));
        if constexpr (kEvictFirst) {
          asm volatile("cp.async.cg.shared.global.L2::cache_hint" MIRAGE_CP_ASYNC_PREFETCH " [%0], [%1], 16, %2;\n"
                       ::"r"(address), "l"(from), "l"(policy_));
        } else {
          asm volatile("cp.async.cg.shared.global" MIRAGE_CP_ASYNC_PREFETCH " [%0], [%1], 16;\n"
                       ::"r"(address), "l"(from));
        }
      }
    }
  }

  // Register staging of small element-wise tiles: loads now into the ring slot of `iteration`,
  // shared-memory stores at land(iteration), kRing load calls later. Slots are picked by unrolled
  // compare-and-select so that the ring stays in registers (a runtime index would put it in local
  // memory, whose stores wait for the loads).
  MIRAGE_DEVICE void issue_elements(const T* source, int iteration) const {
    for_staged(iteration, [&](T& value, int element) {
      value = source[row_offset(element / L::cols) + column_offset(element % L::cols)];
    });
  }

  MIRAGE_DEVICE void land(int iteration) const {
    if (iteration < 0 || iteration >= forloop_range_) return;
    T* target = stage(iteration).data;
    for_staged(iteration, [&](T& value, int element) {
      target[L::element_offset(element / L::cols, element % L::cols)] = value;
    });
  }

  // f(register, element) for this thread's elements of the ring slot of `iteration`.
  template <class F>
  MIRAGE_DEVICE void for_staged(int iteration, F f) const {
    const int ring = iteration % kRing;
#pragma unroll
    for (int slot = 0; slot < kRing; ++slot) {
      if (slot != ring) continue;
#pragma unroll
      for (int k = 0; k < kStaged; ++k) {
        const int element = thread_index() + k * NumThreads;
        if (L::size % NumThreads == 0 || element < L::size) f(staged_[slot][k], element);
      }
    }
  }

  MIRAGE_DEVICE void copy_elements(const T* source, T* target) const {
    for (int element = thread_index(); element < L::size; element += NumThreads) {
      const int row = element / L::cols;
      const int col = element % L::cols;
      target[L::element_offset(row, col)] = source[row_offset(row) + column_offset(col)];
    }
  }

  static constexpr bool kEvictFirst = EvictFirst || MIRAGE_CP_ASYNC_EVICT_FIRST;

  const T* global_;
  Strides strides_;
  TileCoordinate coordinate_;
  int forloop_range_;
  T* shared_;
  bool vectorized_;
  int first_row_;  // Staggered: the row this block copies first
  uint64_t policy_ = 0;  // EvictFirst: the L2 cache policy of the copies
  mutable T staged_[kRegisterStaged ? kRing : 1][kRegisterStaged ? kStaged : 1];
};

}  // namespace mirage::dev
