// The mirage device library: everything a generated kernel includes.
//
//   config.cuh       element types, conversions, constants
//   layout.cuh       compile-time tile layouts, SharedTile
//   tile_map.cuh     imap / fmap / omap: where a block's tile lies in a device tensor
//   input.cuh        InputIterator (cp.async, multi-stage), Pipeline
//   elementwise.cuh  unary / binary functors, Chain, element-wise ops, RegisterTile
//   reduction.cuh    reduce (sum, max) along a dim, reduce_to_dimx
//   matmul.cuh       TensorCoreMatmul (mma.sync + ldmatrix), SimtMatmul, Matmul
//   accumulator.cuh  forloop accumulators, including the online-softmax rescale
//   output.cuh       OutputSaver (16-byte stores)
//   cluster.cuh      the barriers of folds: a cluster barrier (sm_90), a counter in device memory
//
// Included by the kernels that need it, not here:
//   multicast.cuh    MulticastIterator: a tile read once per cluster, multicast to its blocks (sm_90)
#pragma once

#include "accumulator.cuh"
#include "cluster.cuh"
#include "config.cuh"
#include "elementwise.cuh"
#include "input.cuh"
#include "layout.cuh"
#include "matmul.cuh"
#include "output.cuh"
#include "reduction.cuh"
#include "tile_map.cuh"
