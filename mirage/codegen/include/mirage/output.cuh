// Output savers: write a block's tile (shared memory or a RegisterTile) to its place in a
// device tensor (omap; see tile_map.cuh, locate_output_tile).
//
//   const int64_t base = locate_output_tile<L>(strides, omap, blockIdx);
//   OutputSaver<half, L, NumThreads>::save(out_ptr, strides, base, tile, epilogue);
//
// Stores are 16-byte vectors (STG.128), consecutive threads writing consecutive chunks of a
// row, when tile rows are whole vectors and the tensor is suitably aligned (checked at run
// time); otherwise element by element. The epilogue (e.g. a fused Chain) and the conversion to
// the output type happen in registers.
#pragma once

#include "elementwise.cuh"
#include "tile_map.cuh"

namespace mirage::dev {

template <class T, class L, int NumThreads>
struct OutputSaver {
  static constexpr int kVector = kVectorElements<T>;
  static constexpr bool kVectorizableShape = L::cols % kVector == 0;

  static MIRAGE_DEVICE bool aligned(const T* global, const Strides& strides, int64_t base) {
    bool ok = reinterpret_cast<uintptr_t>(global) % kVectorBytes == 0 && strides.stride[3] == 1 && base % kVector == 0;
    ok = ok && (L::dim0 == 1 || strides.stride[0] % kVector == 0);
    ok = ok && (L::dim1 == 1 || strides.stride[1] % kVector == 0);
    ok = ok && (L::dim2 == 1 || strides.stride[2] % kVector == 0);
    return ok;
  }

  template <class Source, class SourceLayout, class Epilogue = Identity>
  static MIRAGE_DEVICE void save(T* global, const Strides& strides, int64_t base, SharedTile<Source, SourceLayout> tile,
                                 Epilogue epilogue = {}) {
    static_assert(kSameShape<SourceLayout, L>, "the saved tile must have the saver's shape");
    static_assert(read_by_pitch<SourceLayout>());
    T* target = global + base;
    if constexpr (kVectorizableShape) {
      if (aligned(global, strides, base)) {
        constexpr int kChunksPerRow = L::cols / kVector;
        constexpr int kChunks = L::rows * kChunksPerRow;
        constexpr int kRounds = ceil_div(kChunks, NumThreads);
#pragma unroll
        for (int round = 0; round < kRounds; ++round) {
          const int chunk = thread_index() + round * NumThreads;
          if (kChunks % NumThreads != 0 && chunk >= kChunks) continue;
          const int row = chunk / kChunksPerRow;
          const int col = (chunk % kChunksPerRow) * kVector;
          float values[kVector];
          load_chunk<Source, SourceLayout>(tile.data + row * SourceLayout::pitch + col, values);
          store_vector(target + row_offset(strides, row) + col, values, epilogue);
        }
        return;
      }
    }
    for (int element = thread_index(); element < L::size; element += NumThreads) {
      const int row = element / L::cols;
      const int col = element % L::cols;
      target[row_offset(strides, row) + col * strides.stride[3]] = from_float<T>(epilogue(tile.load(element)));
    }
  }

  template <int Vector, class Epilogue = Identity>
  static MIRAGE_DEVICE void save(T* global, const Strides& strides, int64_t base,
                                 const RegisterTile<L, NumThreads, Vector>& tile, Epilogue epilogue = {}) {
    using Tile = RegisterTile<L, NumThreads, Vector>;
    T* target = global + base;
    if constexpr (Vector == kVector) {
      if (aligned(global, strides, base)) {
#pragma unroll
        for (int round = 0; round < Tile::kRounds; ++round) {
          if (!Tile::owns(round)) continue;
          const int first = Tile::first_element(round);
          store_vector(target + row_offset(strides, first / L::cols) + first % L::cols, tile.value[round], epilogue);
        }
        return;
      }
    }
#pragma unroll
    for (int round = 0; round < Tile::kRounds; ++round) {
      if (!Tile::owns(round)) continue;
#pragma unroll
      for (int v = 0; v < Vector; ++v) {
        const int element = Tile::first_element(round) + v;
        const int row = element / L::cols;
        const int col = element % L::cols;
        target[row_offset(strides, row) + col * strides.stride[3]] = from_float<T>(epilogue(tile.value[round][v]));
      }
    }
  }

 private:
  static MIRAGE_DEVICE int64_t row_offset(const Strides& strides, int row) {
    return strided_row_offset<L>(strides, row);
  }

  // Reads kVector consecutive shared elements, with 16-byte loads when they are aligned.
  template <class Source, class SourceLayout>
  static MIRAGE_DEVICE void load_chunk(const Source* source, float (&values)[kVector]) {
    constexpr int kBytes = kVector * static_cast<int>(sizeof(Source));
    constexpr bool kAligned = kBytes % kVectorBytes == 0 && (SourceLayout::pitch * sizeof(Source)) % kVectorBytes == 0;
    if constexpr (kAligned) {
      constexpr int kLoads = kBytes / kVectorBytes;
      constexpr int kPerLoad = kVectorElements<Source>;
#pragma unroll
      for (int load = 0; load < kLoads; ++load) {
        const uint4 bits = reinterpret_cast<const uint4*>(source)[load];
        const Source* elements = reinterpret_cast<const Source*>(&bits);
#pragma unroll
        for (int e = 0; e < kPerLoad; ++e) values[load * kPerLoad + e] = to_float(elements[e]);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVector; ++e) values[e] = to_float(source[e]);
    }
  }

  template <class Epilogue>
  static MIRAGE_DEVICE void store_vector(T* target, const float (&values)[kVector], Epilogue epilogue) {
    float converted[kVector];
#pragma unroll
    for (int e = 0; e < kVector; ++e) converted[e] = epilogue(values[e]);
    store_global_values<T>(target, converted);
  }
};

}  // namespace mirage::dev
