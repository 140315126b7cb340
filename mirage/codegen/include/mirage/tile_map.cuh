// Where a block's tile lies in a device tensor: the imap / fmap / omap semantics.
//
// Dims are numbered in the tensor's own rank in the µGraph; the library works on four dims,
// so a rank-n tensor gets 4 - n leading dims of size 1 and each dim index d becomes
// d + 4 - n (`rank4_dim`). Device tensors are addressed with element strides (row-major
// tensors have strides (d1*d2*d3, d2*d3, d3, 1)).
//
// Input tile of block (bx, by, bz) at forloop iteration r (tile shape T, forloop range R):
//   off[d] = b_a                    for the grid axis a with imap_a == d (-1: replicated)
//   off[f] = off[f] * R + r         for the forloop dim f (block-major, then iteration)
//   element offset = Σ_d off[d] * T[d] * stride[d]   (a split dim: dim_offset)
// which is `base + r * iteration_step` with base and step computed once per block.
// If several grid axes name the same dim, the last of x, y, z wins (as in Mirage's loader).
//
// Output tile of block b (tile shape S): off[d] = b_a * S[d] for omap_a == d.
//
// A grid axis that does not divide its dim (an uneven axis, BlockGraph.spans) gives tiles of
// ceil(span / blocks) entries; the last block's tile starts at span - T[d] instead of past the end,
// overlapping the one before it (TileEnds: the element index min(off[d] * T[d], last[d]); EvenStarts elsewhere). Both blocks
// write the shared entries with the same values: such a dim is never reduced inside a block.
#pragma once

#include "config.cuh"

namespace mirage::dev {

// Element strides of a device tensor, padded to four dims. A dim that one stride cannot step (the
// (batch · heads) dim of a head split at batch > 1) is split: index i of dim d lies at
// (i / inner[d]) * outer[d] + (i % inner[d]) * stride[d]; inner[d] == 0 for a dim of one stride. A tile
// never straddles the split (its extent divides inner[d]) and the for-loop never steps such a dim, so
// only a block's base offset sees it (locate_input_tile, locate_output_tile).
struct Strides {
  int64_t stride[4];
  int64_t outer[4] = {0, 0, 0, 0};
  int64_t inner[4] = {0, 0, 0, 0};
};

// Element offset of index `index` along dim d.
MIRAGE_HOST_DEVICE int64_t dim_offset(const Strides& strides, int d, int64_t index) {
  return strides.inner[d] == 0 ? index * strides.stride[d]
                               : index / strides.inner[d] * strides.outer[d] + index % strides.inner[d] * strides.stride[d];
}

// Element offset of row `row` of a tile of layout L (rows over its first three dims) in a tensor of
// these strides.
template <class L>
MIRAGE_DEVICE int64_t strided_row_offset(const Strides& strides, int row) {
  const int i2 = row % L::dim2;
  const int i1 = (row / L::dim2) % L::dim1;
  const int i0 = row / (L::dim2 * L::dim1);
  return i0 * strides.stride[0] + i1 * strides.stride[1] + i2 * strides.stride[2];
}

// Where a block's tile starts along dim d (an element index): `offset` tiles of `extent`.
struct EvenStarts {
  MIRAGE_HOST_DEVICE int64_t operator()(int, int64_t offset, int64_t extent) const { return offset * extent; }
};

// The same on uneven grid axes: per (four-dim) dim, the element index where the last tile starts,
// kEven where the grid divides the dim.
constexpr int64_t kEven = INT64_MAX;
struct TileEnds {
  int64_t last[4] = {kEven, kEven, kEven, kEven};

  MIRAGE_HOST_DEVICE int64_t operator()(int d, int64_t offset, int64_t extent) const {
    const int64_t start = offset * extent;
    return start < last[d] ? start : last[d];
  }
};

// For each grid axis x, y, z: the (four-dim) data dim it partitions, or -1 (replica).
struct DimMap {
  int x;
  int y;
  int z;
};

// The tile of one block in a device tensor: element offset at iteration 0 and the
// offset added per forloop iteration.
struct TileCoordinate {
  int64_t base;
  int64_t iteration_step;

  MIRAGE_HOST_DEVICE int64_t at(int iteration) const { return base + iteration_step * iteration; }
};

MIRAGE_HOST_DEVICE constexpr int rank4_dim(int rank, int dim) { return dim < 0 ? -1 : dim + 4 - rank; }

MIRAGE_HOST_DEVICE constexpr DimMap rank4_map(int rank, int x, int y, int z) {
  return DimMap{rank4_dim(rank, x), rank4_dim(rank, y), rank4_dim(rank, z)};
}

// Strides of a dense row-major tensor with (four-dim) shape d0 x d1 x d2 x d3.
MIRAGE_HOST_DEVICE constexpr Strides row_major_strides(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  (void)d0;
  return Strides{{d1 * d2 * d3, d2 * d3, d3, 1}};
}

namespace detail {
// The block offset of dim d (last of x, y, z wins). Selects on compile-time d only, no arrays:
// maps known only at run time must not index memory (that would move it to local memory).
MIRAGE_HOST_DEVICE int64_t block_offset(DimMap map, uint3 block, int d) {
  int64_t offset = 0;
  offset = map.x == d ? static_cast<int64_t>(block.x) : offset;
  offset = map.y == d ? static_cast<int64_t>(block.y) : offset;
  offset = map.z == d ? static_cast<int64_t>(block.z) : offset;
  return offset;
}
}  // namespace detail

// `block` with its index along grid axis `axis` (0: x, 1: y, 2: z) counted from the other end: the
// blocks the hardware starts first then compute the tiles at the axis's far end.
MIRAGE_DEVICE uint3 reversed_along(uint3 block, dim3 grid, int axis) {
  if (axis == 0) block.x = grid.x - 1 - block.x;
  if (axis == 1) block.y = grid.y - 1 - block.y;
  if (axis == 2) block.z = grid.z - 1 - block.z;
  return block;
}

// Tile of an input iterator with tile layout L, input map `imap`, forloop dim `forloop_dim`
// (-1: the same tile at every iteration) and forloop range `forloop_range`.
template <class L, class Starts = EvenStarts>
MIRAGE_HOST_DEVICE TileCoordinate locate_input_tile(const Strides& strides, DimMap imap, int forloop_dim,
                                                    int forloop_range, uint3 block, const Starts& starts = {}) {
  TileCoordinate coordinate{0, 0};
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    const int64_t tile_stride = static_cast<int64_t>(L::dim(d)) * strides.stride[d];
    const bool looped = d == forloop_dim;
    const int64_t offset = detail::block_offset(imap, block, d) * (looped ? forloop_range : 1);
    coordinate.iteration_step = looped ? tile_stride : coordinate.iteration_step;
    coordinate.base += dim_offset(strides, d, starts(d, offset, L::dim(d)));
  }
  return coordinate;
}

// Element offset of the tile (layout L) that block `block` of an output saver writes.
template <class L, class Starts = EvenStarts>
MIRAGE_HOST_DEVICE int64_t locate_output_tile(const Strides& strides, DimMap omap, uint3 block,
                                              const Starts& starts = {}) {
  int64_t base = 0;
#pragma unroll
  for (int d = 0; d < 4; ++d) base += dim_offset(strides, d, starts(d, detail::block_offset(omap, block, d), L::dim(d)));
  return base;
}

}  // namespace mirage::dev
