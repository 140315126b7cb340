// Chunks: a few consecutive elements of one tile row that one thread handles together.
//
// Generated kernels hand values from producers to sinks in chunks (`float values[C]`, C = 1, 2, 4
// or 8 consecutive elements of a row of the result): a thread loads each operand's chunk with one
// shared-memory vector access (LDS.64 / LDS.128) instead of C scalar ones, computes the index of
// the chunk once, and stores the result chunk with one vector access. Consecutive threads take
// consecutive chunks, so a warp's vector accesses cover a contiguous run of the row (no bank
// conflicts beyond the minimum wavefronts).
#pragma once

#include <type_traits>

#include "../mirage.cuh"

namespace mirage::gen {

// Elements per chunk for a pass over a row-major result of `cols` columns and `size` elements by
// `threads` threads: 8, 4 or 2 when the rows hold whole chunks and every thread still gets one,
// else 1.
constexpr int chunk_elements(int cols, int size, int threads) {
  for (int chunk = 8; chunk > 1; chunk /= 2)
    if (cols % chunk == 0 && size / chunk >= threads) return chunk;
  return 1;
}

// The chunk size of a `float (&)[C]` argument (in generic lambdas: chunk_of<decltype(values)>).
template <class Values>
constexpr int chunk_of = static_cast<int>(std::extent_v<std::remove_reference_t<Values>>);

namespace detail {

// Bytes of the widest access (16, 8, 4 or the element size) that moves a chunk of `Chunk`
// elements of T starting at any chunk-aligned column of rows `Pitch` elements apart.
template <class T, int Chunk, int Pitch>
constexpr int access_bytes() {
  constexpr int kBytes = Chunk * static_cast<int>(sizeof(T));
  for (int width = 16; width > static_cast<int>(sizeof(T)); width /= 2)
    if (kBytes % width == 0 && (Pitch * static_cast<int>(sizeof(T))) % width == 0) return width;
  return static_cast<int>(sizeof(T));
}

template <int Bytes>
struct Access;
template <>
struct Access<16> {
  using type = uint4;
};
template <>
struct Access<8> {
  using type = uint2;
};
template <>
struct Access<4> {
  using type = uint32_t;
};
template <>
struct Access<2> {
  using type = uint16_t;
};

}  // namespace detail

// values[e] = source[e] for C consecutive elements of a row (`source` chunk-aligned in a tile whose
// rows are Pitch elements apart), converted to fp32.
template <int Pitch, class T, int C>
MIRAGE_DEVICE void read_chunk(const T* source, float (&values)[C]) {
  constexpr int kBytes = detail::access_bytes<T, C, Pitch>();
  using Word = typename detail::Access<kBytes>::type;
  constexpr int kPerWord = kBytes / static_cast<int>(sizeof(T));
#pragma unroll
  for (int w = 0; w < C / kPerWord; ++w) {
    const Word word = reinterpret_cast<const Word*>(source)[w];
    const T* elements = reinterpret_cast<const T*>(&word);
#pragma unroll
    for (int e = 0; e < kPerWord; ++e) values[w * kPerWord + e] = dev::to_float(elements[e]);
  }
}

// target[e] = values[e] (converted to T), the inverse of read_chunk.
template <int Pitch, class T, int C>
MIRAGE_DEVICE void write_chunk(T* target, const float (&values)[C]) {
  constexpr int kBytes = detail::access_bytes<T, C, Pitch>();
  using Word = typename detail::Access<kBytes>::type;
  constexpr int kPerWord = kBytes / static_cast<int>(sizeof(T));
#pragma unroll
  for (int w = 0; w < C / kPerWord; ++w) {
    Word word;
    T* elements = reinterpret_cast<T*>(&word);
#pragma unroll
    for (int e = 0; e < kPerWord; ++e) elements[e] = dev::from_float<T>(values[w * kPerWord + e]);
    reinterpret_cast<Word*>(target)[w] = word;
  }
}

// The chunk of `tile` at logical `index` of a (possibly larger) result shape: index[3] is the
// chunk's first column. A tile broadcast along the last dim gives one value for the whole chunk.
template <class T, class L, int C>
MIRAGE_DEVICE void load_chunk(dev::SharedTile<T, L> tile, const int (&index)[4], float (&values)[C]) {
  const T* source = tile.data + dev::broadcast_offset<L>(index);
  if constexpr (L::dim3 == 1) {
    const float value = dev::to_float(*source);
#pragma unroll
    for (int e = 0; e < C; ++e) values[e] = value;
  } else {
    read_chunk<L::pitch>(source, values);
  }
}

// Calls body(chunk_first_linear_index) for every chunk of C consecutive elements of Layout, chunks
// t, t + NumThreads, ... for thread t.
template <int NumThreads, class Layout, int C, class Body>
MIRAGE_DEVICE void for_each_chunk(Body body) {
  static_assert(Layout::cols % C == 0, "a chunk lies within one row");
  constexpr int kChunks = Layout::size / C;
  for (int chunk = dev::thread_index(); chunk < kChunks; chunk += NumThreads) body(chunk * C);
}

// An emit function of single elements, emit(linear, value), as a chunk emit of one element.
template <class Emit>
struct SingleElement {
  Emit emit;
  MIRAGE_DEVICE void operator()(int linear, float value) const {
    float values[1] = {value};
    emit(linear, values);
  }
};

template <class Emit>
MIRAGE_DEVICE SingleElement<Emit> single(Emit emit) {
  return {emit};
}

}  // namespace mirage::gen
