// The barriers of folds (mirage.optimizer.cluster_fold): the blocks that wrote a combine's partials
// meet before they read them back. A cluster fold meets at a thread-block cluster's barrier (sm_90);
// a counter fold at a counter in device memory (no clusters: sm_70 and later; grids of one wave).
#pragma once

#include <cute/arch/cluster_sm90.hpp>

#include "config.cuh"

namespace mirage::dev {

// Every thread of every block of the cluster arrives (release) and waits (acquire): what any of
// them stored before, to shared or global memory, is visible to all of them after. The empty asm
// statements keep the compiler from moving memory accesses across the barrier.
MIRAGE_DEVICE void cluster_sync() {
  asm volatile("" ::: "memory");
  cute::cluster_arrive();
  cute::cluster_wait();
  asm volatile("" ::: "memory");
}

// The wait half of a cluster barrier whose arrival came earlier (a multicast iterator's done()).
MIRAGE_DEVICE void cluster_wait() {
  cute::cluster_wait();
  asm volatile("" ::: "memory");
}

// The `blocks` blocks of a group meet at `*arrivals`, a counter in device memory that starts at 0
// when the module loads and only grows: each launch adds `blocks` to it. Thread 0 of each block
// publishes the block's stores (fence, after the block barrier) and adds one; the block then waits
// until the counter reaches the end of its launch's round, and fences again before the block
// barrier releases its threads, so that the group's stores are visible to all of them. Every block
// of the group must be running at once (the fold allows grids of at most one block per SM).
MIRAGE_DEVICE void group_sync(unsigned long long* arrivals, unsigned long long blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long arrived = atomicAdd(arrivals, 1ull);
    const unsigned long long round_end = (arrived / blocks + 1) * blocks;
    while (*static_cast<volatile unsigned long long*>(arrivals) < round_end) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
}

}  // namespace mirage::dev
