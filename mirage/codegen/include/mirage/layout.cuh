// Compile-time layouts of shared-memory tiles.
//
// A tile has four logical dims (leading dims of size 1 pad lower ranks: a 2-D tile [M, N] is
// Layout<1, 1, M, N>). It is stored row-major with the last dim contiguous; consecutive rows
// (a "row" is one index of the first three dims) are `Pitch` elements apart, Pitch >= D3.
// Padding the pitch by 16 bytes keeps ldmatrix and row-wise accesses free of bank conflicts.
#pragma once

#include <type_traits>

#include "config.cuh"

namespace mirage::dev {

// The four coordinates of row-major index `linear` in dims [*, D1, D2, D3].
template <int D1, int D2, int D3>
MIRAGE_HOST_DEVICE void split_index(int linear, int (&index)[4]) {
  index[3] = linear % D3;
  int row = linear / D3;
  index[2] = row % D2;
  row /= D2;
  index[1] = row % D1;
  index[0] = row / D1;
}

template <int D0, int D1, int D2, int D3, int Pitch = D3>
struct Layout {
  static_assert(D0 >= 1 && D1 >= 1 && D2 >= 1 && D3 >= 1, "tile dims must be positive");
  static_assert(Pitch >= D3, "the pitch of a row must be at least its length");

  static constexpr int dim0 = D0;
  static constexpr int dim1 = D1;
  static constexpr int dim2 = D2;
  static constexpr int dim3 = D3;
  static constexpr int rows = D0 * D1 * D2;
  static constexpr int cols = D3;
  static constexpr int pitch = Pitch;
  // Number of logical elements, and number of elements the stored tile spans.
  static constexpr int size = rows * cols;
  static constexpr int storage = rows * Pitch;

  static MIRAGE_HOST_DEVICE constexpr int dim(int d) {
    return d == 0 ? D0 : d == 1 ? D1 : d == 2 ? D2 : D3;
  }

  static constexpr bool swizzled = false;
  static constexpr bool transposed = false;

  // Storage offset of element `col` of row `row` (a row: one index of the first three dims).
  static MIRAGE_HOST_DEVICE constexpr int element_offset(int row, int col) { return row * Pitch + col; }

  static MIRAGE_HOST_DEVICE constexpr int offset(int i0, int i1, int i2, int i3) {
    return element_offset((i0 * D1 + i1) * D2 + i2, i3);
  }

  // Storage offset of the element with logical row-major index `linear`.
  static MIRAGE_HOST_DEVICE constexpr int offset_of(int linear) {
    return element_offset(linear / D3, linear % D3);
  }

  // Logical coordinates of the element with row-major index `linear`.
  static MIRAGE_HOST_DEVICE void coordinates(int linear, int (&index)[4]) { split_index<D1, D2, D3>(linear, index); }
};

// A tile of 16-bit elements in the canonical 128-byte swizzled form of sm_90's warpgroup MMA
// operands read "MN-major" (contiguous along N: a K tile [D, keys], a V tile [keys, E]). The columns
// come in blocks of 64 (128 bytes); a block holds every row, 128 bytes apart, and the 16-byte chunks
// of row r are permuted by XOR with r mod 8 (CuTe's Swizzle<3, 4, 3>), so the eight rows of a core
// matrix fall in eight different bank groups. Rows % 8 == 0, cols % 64 == 0, 1024-byte aligned;
// `pitch` is the 64 elements of a swizzle row, not a stride of the tile. Only wgmma (through
// descriptors: detail::wgmma_descriptor) and the input iterators' copies touch such a tile.
template <int D0, int D1, int D2, int D3>
struct Swizzled128Layout : Layout<D0, D1, D2, D3> {
  using Dense = Layout<D0, D1, D2, D3>;
  static constexpr int pitch = 64;
  // whole 1024-byte spans of 16-bit elements, so that every stage of a ring starts on the swizzle's
  // boundary (the hardware swizzles by address bits 7-9; a one-row tile alone is smaller)
  static constexpr int storage = (Dense::size + 511) / 512 * 512;
  static constexpr bool swizzled = true;
  static constexpr int kBlockElements = Dense::rows * 64;  // one block of 64 columns
  // (or one row of 64: a chain's per-key values, which the swizzle leaves in place at a 1024-byte boundary)
  static_assert((Dense::rows % 8 == 0 || (Dense::rows == 1 && D3 == 64)) && D3 % 64 == 0,
                "a 128-byte swizzled tile has rows % 8 == 0 (or is one row of 64), cols % 64 == 0");

  static MIRAGE_HOST_DEVICE constexpr int element_offset(int row, int col) {
    return (col / 64) * kBlockElements + row * 64 + (((col % 64) / 8) ^ (row % 8)) * 8 + col % 8;
  }
  static MIRAGE_HOST_DEVICE constexpr int offset(int i0, int i1, int i2, int i3) {
    return element_offset((i0 * D1 + i1) * D2 + i2, i3);
  }
  static MIRAGE_HOST_DEVICE constexpr int offset_of(int linear) { return element_offset(linear / D3, linear % D3); }
};

// For readers that take a tile's rows by their pitch (matmuls, row reductions, savers): true, or a
// compile error when a layout is swizzled, whose rows are not `pitch` apart as stored.
//   static_assert(dev::read_by_pitch<ALayout, BLayout>());
template <class... Layouts>
constexpr bool read_by_pitch() {
  static_assert((!Layouts::swizzled && ...),
                "a swizzled tile (wgmma's form) is read by pitch here: only the softmax chain, the input "
                "iterators and steps that address elements through the layout's offsets may read one");
  return true;
}

// For matmuls' B operands: read by pitch, or transposed (Transposed below, swizzled or not).
template <class L>
constexpr bool read_by_pitch_or_transposed() {
  if constexpr (L::transposed) {
    return true;
  } else {
    return read_by_pitch<L>();
  }
}

// A tile read as the transpose of how it is stored: logical [D0, D1, R, C] kept as the layout
// `Stored` of [D0, D1, C, R] (row-major with a pitch, or 128-byte swizzled). It is how a transposed
// view of a row-major tensor (nn.Linear's weight.T, column-major in its last two dims) is copied in
// place: row by row as it lies in memory, 16 bytes at a time. Steps that address elements through
// the layout's offsets read it as any tile; a tensor-core matmul reads it as its B operand with
// ldmatrix without .trans (the stored rows are B's columns, K contiguous, as mma's B fragment
// wants); readers by pitch refuse it (read_by_pitch).
template <class Stored_>
struct Transposed {
  using Stored = Stored_;
  static constexpr int dim0 = Stored::dim0;
  static constexpr int dim1 = Stored::dim1;
  static constexpr int dim2 = Stored::dim3;
  static constexpr int dim3 = Stored::dim2;
  static constexpr int rows = dim0 * dim1 * dim2;
  static constexpr int cols = dim3;
  static constexpr int size = rows * cols;
  static constexpr int storage = Stored::storage;
  static constexpr int pitch = Stored::pitch;  // of the stored rows, not a stride of this tile
  static constexpr bool swizzled = Stored::swizzled;
  static constexpr bool transposed = true;

  static MIRAGE_HOST_DEVICE constexpr int dim(int d) {
    return d == 0 ? dim0 : d == 1 ? dim1 : d == 2 ? dim2 : dim3;
  }
  static MIRAGE_HOST_DEVICE constexpr int element_offset(int row, int col) {
    return Stored::element_offset((row / dim2) * Stored::dim2 + col, row % dim2);
  }
  static MIRAGE_HOST_DEVICE constexpr int offset(int i0, int i1, int i2, int i3) {
    return element_offset((i0 * dim1 + i1) * dim2 + i2, i3);
  }
  static MIRAGE_HOST_DEVICE constexpr int offset_of(int linear) { return element_offset(linear / dim3, linear % dim3); }
  static MIRAGE_HOST_DEVICE void coordinates(int linear, int (&index)[4]) {
    split_index<dim1, dim2, dim3>(linear, index);
  }
};

// The [Rows, Cols] matrix of batch b of a tile read by a matmul: the same kind of layout with one
// batch, `matrix_storage` elements apart (a swizzled tile is one matrix).
template <class L, int Rows, int Cols>
struct MatrixOf {
  using type = Layout<1, 1, Rows, Cols, L::pitch>;
  static constexpr int stride = Rows * L::pitch;
};
template <class Stored, int Rows, int Cols>
struct MatrixOf<Transposed<Stored>, Rows, Cols> {
  static_assert(!Stored::swizzled || Stored::dim0 * Stored::dim1 == 1, "a swizzled transposed tile is one matrix");
  using StoredMatrix = std::conditional_t<Stored::swizzled, Swizzled128Layout<1, 1, Cols, Rows>,
                                          Layout<1, 1, Cols, Rows, Stored::pitch>>;
  using type = Transposed<StoredMatrix>;
  static constexpr int stride = Cols * Stored::pitch;
};

namespace detail {
template <int... Dims>
struct LayoutOf;
template <int A>
struct LayoutOf<A> {
  using type = Layout<1, 1, 1, A>;
};
template <int A, int B>
struct LayoutOf<A, B> {
  using type = Layout<1, 1, A, B>;
};
template <int A, int B, int C>
struct LayoutOf<A, B, C> {
  using type = Layout<1, A, B, C>;
};
template <int A, int B, int C, int D>
struct LayoutOf<A, B, C, D> {
  using type = Layout<A, B, C, D>;
};
}  // namespace detail

// Dense row-major layout of a tile of rank 1 to 4: RowMajor<64, 32> is Layout<1, 1, 64, 32>.
template <int... Dims>
using RowMajor = typename detail::LayoutOf<Dims...>::type;

// The same logical tile with another pitch.
template <class L, int NewPitch>
using WithPitch = Layout<L::dim0, L::dim1, L::dim2, L::dim3, NewPitch>;

// The layout with dim `Dim` replaced by `Size` (dense pitch): the output of a reduction.
template <class L, int Dim, int Size>
using Resized = Layout<Dim == 0 ? Size : L::dim0, Dim == 1 ? Size : L::dim1, Dim == 2 ? Size : L::dim2,
                       Dim == 3 ? Size : L::dim3>;

// A pitch for rows of `cols` elements of T that keeps 16-byte alignment and avoids bank
// conflicts: rows whose byte length is a multiple of 16 are padded by one 16-byte vector.
template <class T>
MIRAGE_HOST_DEVICE constexpr int padded_pitch(int cols) {
  return (cols * static_cast<int>(sizeof(T))) % kVectorBytes == 0 ? cols + kVectorElements<T> : cols;
}

// Two layouts describe the same logical shape.
template <class A, class B>
constexpr bool kSameShape = A::dim0 == B::dim0 && A::dim1 == B::dim1 && A::dim2 == B::dim2 && A::dim3 == B::dim3;

// `Source` broadcasts to `Target`: each dim is equal or 1.
template <class Source, class Target>
constexpr bool kBroadcastsTo = (Source::dim0 == Target::dim0 || Source::dim0 == 1) &&
                               (Source::dim1 == Target::dim1 || Source::dim1 == 1) &&
                               (Source::dim2 == Target::dim2 || Source::dim2 == 1) &&
                               (Source::dim3 == Target::dim3 || Source::dim3 == 1);

// Storage offset in `Source` of the element of `Target` at `index`, broadcasting dims of size 1.
template <class Source>
MIRAGE_HOST_DEVICE constexpr int broadcast_offset(const int (&index)[4]) {
  return Source::offset(Source::dim0 == 1 ? 0 : index[0], Source::dim1 == 1 ? 0 : index[1],
                        Source::dim2 == 1 ? 0 : index[2], Source::dim3 == 1 ? 0 : index[3]);
}

// A tile in shared memory: a pointer and a compile-time layout.
template <class T, class L>
struct SharedTile {
  using Element = T;
  using TileLayout = L;
  T* data;

  MIRAGE_DEVICE T& at(int i0, int i1, int i2, int i3) const { return data[L::offset(i0, i1, i2, i3)]; }
  MIRAGE_DEVICE T& at_linear(int linear) const { return data[L::offset_of(linear)]; }
  MIRAGE_DEVICE float load(int linear) const { return to_float(data[L::offset_of(linear)]); }
  MIRAGE_DEVICE void store(int linear, float value) const { data[L::offset_of(linear)] = from_float<T>(value); }
};

template <class L, class T>
MIRAGE_DEVICE SharedTile<T, L> make_shared_tile(T* data) {
  return SharedTile<T, L>{data};
}

}  // namespace mirage::dev
