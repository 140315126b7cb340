// Multicast input iterators: a tile that every block of a thread-block cluster loads alike (the X
// of a weight-streaming GEMV, which every block reads whole) is read from L2 once per cluster
// instead of once per block (sm_90).
//
// Block r of a cluster of C copies the tile rows r, r + C, r + 2C, ... with one bulk copy per row
// (cp.async.bulk ... .multicast::cluster), which lands at the same offset of every block's shared
// memory. The tiles go round a ring of Slots slots, each with two barriers
// (cutlass::arch::ClusterBarrier): `full` counts the bytes landed in this block (thread 0 arrives
// expecting the whole tile, each copy completes its bytes on every destination's barrier), and
// `empty` counts the blocks of the cluster done with the slot (thread c of each block arrives on
// block c's barrier after the block's end-of-iteration barrier). A block's copy into a slot waits
// until every block has released the slot's previous use, so no block waits for the others at a
// cluster-wide barrier each iteration; a ring longer than the pipeline (Slots > Stages) makes that
// wait a formality. Protocol (the InputIterator's, plus init, wait, release and done):
//
//   in0.init(); mirage::dev::cluster_sync();
//   for (s < S - 1) { in0.load(s); in1.load(s); Pipeline<S>::commit(); }
//   for (r < R) {
//     in0.load(r + S - 1); in1.load(r + S - 1); Pipeline<S>::commit();
//     Pipeline<S>::wait(); in0.wait(r);
//     ... use in0.stage(r), in1.stage(r) ...
//     __syncthreads(); in0.release(r);
//   }
//   in0.done();  ... the rest of the kernel ...  mirage::dev::cluster_wait();
//
// done() and the final wait keep every block resident until the other blocks' last arrivals on its
// barriers have landed. Tiles whose rows cannot be bulk-copied (rows not a multiple of 16 bytes, or
// a global row not 16-byte aligned: checked once at run time, alike in every block of the cluster)
// are copied by each block for itself, element by element.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cluster.cuh"
#include "input.cuh"
#include "layout.cuh"
#include "tile_map.cuh"

namespace mirage::dev {

template <class T, class L, int Slots, int NumThreads, int ClusterSize>
class MulticastIterator {
 public:
  using Element = T;
  using TileLayout = L;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  static constexpr int kVector = kVectorElements<T>;
  static constexpr int kRowBytes = L::cols * static_cast<int>(sizeof(T));
  static_assert(!L::swizzled, "multicast copies whole rows: no swizzled tiles");
  static constexpr bool kBulkShape = kRowBytes % 16 == 0 && (L::pitch * sizeof(T)) % 16 == 0;
  static constexpr int kStageElements = round_up(L::storage, kVector);
  static constexpr int kSharedBytes = Slots * kStageElements * static_cast<int>(sizeof(T));
  static constexpr int kBarrierBytes = 2 * Slots * static_cast<int>(sizeof(uint64_t));
  static_assert(ClusterSize >= 2 && ClusterSize <= 16, "a multicast spans 2 to 16 blocks");
  static_assert(ClusterSize <= NumThreads, "one thread per block of the cluster releases a slot");

  // `barriers`: kBarrierBytes of shared memory (8-byte aligned), the same offset in every block.
  MIRAGE_DEVICE MulticastIterator(const T* global, const Strides& strides, TileCoordinate coordinate,
                                  int forloop_range, T* shared, uint64_t* barriers)
      : global_(global),
        strides_(strides),
        coordinate_(coordinate),
        forloop_range_(forloop_range),
        shared_(shared),
        barriers_(barriers),
        rank_(static_cast<int>(cute::block_rank_in_cluster())),
        bulk_(kBulkShape && rows_aligned<L>(global, strides, coordinate)) {}

  // One thread initializes the barriers; the caller then meets the cluster (cluster_sync).
  MIRAGE_DEVICE void init() const {
    if (thread_index() == 0) {
#pragma unroll
      for (int s = 0; s < Slots; ++s) {
        Barrier::init(full(s), 1);
        Barrier::init(empty(s), ClusterSize);
      }
      cutlass::arch::fence_barrier_init();
    }
  }

  MIRAGE_DEVICE SharedTile<T, L> stage(int iteration) const {
    return SharedTile<T, L>{shared_ + (iteration % Slots) * kStageElements};
  }

  // Issue this block's rows of the tile of `iteration` to every block; nothing past the range.
  MIRAGE_DEVICE void load(int iteration) const {
    if (iteration >= forloop_range_) return;
    const int slot = iteration % Slots;
    const T* source = global_ + coordinate_.at(iteration);
    T* target = stage(iteration).data;
    if (!bulk_) {
      for (int element = thread_index(); element < L::size; element += NumThreads) {
        const int row = element / L::cols, col = element % L::cols;
        target[L::element_offset(row, col)] = source[strided_row_offset<L>(strides_, row) + col * strides_.stride[3]];
      }
      if (thread_index() == 0) Barrier::arrive(full(slot));
      return;
    }
    if (thread_index() == 0) Barrier::arrive_and_expect_tx(full(slot), L::rows * kRowBytes);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr uint16_t kAllBlocks = static_cast<uint16_t>((1u << ClusterSize) - 1);
    const int first = rank_ + ClusterSize * thread_index();
    if (first < L::rows && iteration >= Slots) Barrier::wait(empty(slot), (iteration / Slots - 1) & 1);
    for (int row = first; row < L::rows; row += ClusterSize * NumThreads) {
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
          " [%0], [%1], %2, [%3], %4;" ::"r"(cute::cast_smem_ptr_to_uint(target + row * L::pitch)),
          "l"(source + strided_row_offset<L>(strides_, row)), "r"(kRowBytes),
          "r"(cute::cast_smem_ptr_to_uint(full(slot))), "h"(kAllBlocks)
          : "memory");
    }
#endif
  }

  // Every thread: wait until the tile of `iteration` has landed in this block.
  MIRAGE_DEVICE void wait(int iteration) const {
    Barrier::wait(full(iteration % Slots), (iteration / Slots) & 1);
  }

  // After the block's barrier that ends `iteration`: tell every block of the cluster that this block
  // is done with the slot (only for slots that are loaded again).
  MIRAGE_DEVICE void release(int iteration) const {
    if (bulk_ && thread_index() < ClusterSize && iteration + Slots < forloop_range_) {
      Barrier::arrive(empty(iteration % Slots), static_cast<uint32_t>(thread_index()), 1u);
    }
  }

  // After the for-loop: arrive at the cluster barrier that the kernel waits for at its end.
  MIRAGE_DEVICE void done() const { cute::cluster_arrive(); }

 private:
  MIRAGE_DEVICE uint64_t* full(int slot) const { return barriers_ + slot; }
  MIRAGE_DEVICE uint64_t* empty(int slot) const { return barriers_ + Slots + slot; }

  const T* global_;
  Strides strides_;
  TileCoordinate coordinate_;
  int forloop_range_;
  T* shared_;
  uint64_t* barriers_;
  int rank_;
  bool bulk_;
};

}  // namespace mirage::dev
