// Thread-block clusters (sm_90): the barrier of a cluster fold (mirage.optimizer.cluster_fold).
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

}  // namespace mirage::dev
