// Tensor-map input iterators (sm_90): a pipelined input whose tiles are 128-byte swizzled (the K and
// V of a warpgroup softmax chain) is copied by the TMA unit, one tensor copy per 64 columns of a
// tile, issued by one thread, instead of by every thread with 16-byte cp.async. Each stage has a
// transaction barrier (cutlass::arch::ClusterTransactionBarrier): the issuing thread arrives expecting
// the tile's bytes, the copies complete them, and every thread waits for the stage's phase before it
// reads the tile. The tensor map (CUtensorMap, encoded at launch by mirage.codegen.tensor_maps) is a
// __grid_constant__ kernel parameter over the input's four dims, innermost first, with boxes of
// (64, D2, D1, D0) elements and the 128-byte swizzle, which is Swizzled128Layout's arrangement.
//
// Protocol (the InputIterator's, plus init and wait):
//
//   in1.init(); __syncthreads();
//   for (s < S - 1) { in1.load(s); ...; Pipeline<S>::commit(); }
//   for (r < R) {
//     in1.load(r + S - 1); ...; Pipeline<S>::commit(); Pipeline<S, true>::wait(); in1.wait(r);
//     ... use in1.stage(r) ...
//     __syncthreads();  // stage r may be refilled
//   }
//
// With Releasers > 0 (OptimizerOptions.tma_release) each stage also has an `empty` barrier that
// Releasers threads arrive on when done with it (release), and the copying thread waits for it before
// refilling the stage: the loop needs no block barrier (nor the cp.async wait's):
//
//   for (r < R) { in1.load(r + S - 1); in1.wait(r); ... use in1.stage(r) ...; in1.release(r); }
//   __syncthreads();  // before the stages' memory is reused
//
// Copier is the thread that issues the copies: thread 0, which also computes, or the first thread of a
// producer warp after the Releasers computing threads (OptimizerOptions.producer_warp). That warp issues
// the first S stages, meets the computing threads at each of their block barriers before the loop, then
// issues stage r once it is released (load(r) waits for its `empty` barrier) and leaves; the computing
// threads' load() calls do nothing, and they only wait, read and release.
#pragma once

#include <cuda.h>
#include <cutlass/arch/barrier.h>

#include "layout.cuh"
#include "tile_map.cuh"

namespace mirage::dev {

template <class T, class L, int Stages, int Releasers = 0, int Copier = 0>
class TensorMapIterator {
 public:
  using Element = T;
  using TileLayout = L;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  static_assert(sizeof(T) == 2, "tensor-map copies here are of 16-bit elements");
  static_assert(L::swizzled, "tensor-map copies land 128-byte swizzled tiles (Swizzled128Layout)");
  static_assert(L::dim0 <= 256 && L::dim1 <= 256 && L::dim2 <= 256, "a TMA box has at most 256 rows a dim");
  static constexpr int kBoxes = L::cols / 64;  // one copy per 64 columns (128 bytes)
  static constexpr int kBoxElements = L::rows * 64;
  static constexpr int kBarrierBytes = (Releasers > 0 ? 2 : 1) * Stages * static_cast<int>(sizeof(uint64_t));

  // `map`: the input's tensor map (a kernel parameter); `barriers`: kBarrierBytes of shared memory;
  // `iterations`: the loop's steps that run, when fewer than the range (no tile past them is copied).
  // `starts`: where tiles start (TileEnds on uneven grid axes).
  template <class Starts = EvenStarts>
  MIRAGE_DEVICE TensorMapIterator(const CUtensorMap* map, DimMap imap, int forloop_dim, int forloop_range,
                                  uint3 block, T* shared, uint64_t* barriers, int iterations = -1,
                                  const Starts& starts = {})
      : map_(map), forloop_dim_(forloop_dim), forloop_range_(iterations < 0 ? forloop_range : iterations),
        shared_(shared), barriers_(barriers) {
#pragma unroll
    for (int d = 0; d < 4; ++d) {
      const int64_t blocks = detail::block_offset(imap, block, d) * (d == forloop_dim ? forloop_range : 1);
      origin_[d] = static_cast<int>(starts(d, blocks, L::dim(d)));
    }
  }

  static_assert(Copier == 0 || Copier == Releasers, "the copies are issued by thread 0 or by a producer warp");

  // One thread initializes the stages' barriers; the caller then meets the block (__syncthreads).
  MIRAGE_DEVICE void init() const {
    if (thread_index() == 0) {
#pragma unroll
      for (int s = 0; s < Stages; ++s) {
        Barrier::init(barrier(s), 1);
        if constexpr (Releasers > 0) Barrier::init(empty(s), Releasers);
      }
      cutlass::arch::fence_barrier_init();
    }
  }

  MIRAGE_DEVICE SharedTile<T, L> stage(int iteration) const {
    return SharedTile<T, L>{shared_ + (iteration % Stages) * L::storage};
  }

  // Thread Copier issues the tile of `iteration` (nothing past the range).
  MIRAGE_DEVICE void load(int iteration) const {
    if (iteration >= forloop_range_ || thread_index() != Copier) return;
    uint64_t* full = barrier(iteration % Stages);
    // the stage's last use (iteration - Stages) is over in every thread
    if constexpr (Releasers > 0) {
      if (iteration >= Stages) Barrier::wait(empty(iteration % Stages), (iteration / Stages - 1) & 1);
    }
    Barrier::arrive_and_expect_tx(full, L::size * static_cast<int>(sizeof(T)));
    int c[4] = {origin_[0], origin_[1], origin_[2], origin_[3]};
#pragma unroll
    for (int d = 0; d < 4; ++d) c[d] += d == forloop_dim_ ? iteration * L::dim(d) : 0;
    T* target = stage(iteration).data;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
    for (int box = 0; box < kBoxes; ++box) {
      asm volatile(
          "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
          " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(cute::cast_smem_ptr_to_uint(target + box * kBoxElements)),
          "l"(map_), "r"(c[3] + 64 * box), "r"(c[2]), "r"(c[1]), "r"(c[0]),
          "r"(cute::cast_smem_ptr_to_uint(full))
          : "memory");
    }
#endif
  }

  // Every thread: wait until the tile of `iteration` has landed.
  MIRAGE_DEVICE void wait(int iteration) const {
    Barrier::wait(barrier(iteration % Stages), (iteration / Stages) & 1);
  }

  // Every thread, after its last read of the tile of `iteration` (Releasers > 0): the stage may be
  // refilled once all have arrived.
  MIRAGE_DEVICE void release(int iteration) const {
    static_assert(Releasers > 0, "release() belongs to the barrier-free protocol (Releasers > 0)");
    Barrier::arrive(empty(iteration % Stages));
  }

 private:
  MIRAGE_DEVICE uint64_t* barrier(int slot) const { return barriers_ + slot; }
  MIRAGE_DEVICE uint64_t* empty(int slot) const { return barriers_ + Stages + slot; }

  const CUtensorMap* map_;
  int origin_[4];
  int forloop_dim_;
  int forloop_range_;
  T* shared_;
  uint64_t* barriers_;
};

}  // namespace mirage::dev
