// The online-softmax chain's second score operands (gen/softmax.cuh): per-key factors of a score
// linear in the product (QKNorm's S / rms(k)) and additive masks of the scores (causal attention's
// 0 and −inf), their tile types, and how a warp applies them to its score fragments. A thread's
// scores of row tile t and key tile j sit at rows rows[t] (+ 8 for e ≥ 2) and keys
// key0 + 8 j + 2 (lane % 4) (+ 1 for odd e), in the warp and the warpgroup form alike.
#pragma once

#include <type_traits>

#include "../mirage.cuh"
#include "kernel.cuh"
#include "softmax_detail.cuh"

namespace mirage::gen {

// f(1, c): the factor of a key whose value is c, for a score f linear in the product Q·K, which is
// argument QkArgument of f (the other is c).
template <class Score, int QkArgument>
struct ColumnFactor {
  MIRAGE_DEVICE float operator()(float c) const {
    if constexpr (QkArgument == 0) {
      return Score{}(1.0f, c);
    } else {
      return Score{}(c, 1.0f);
    }
  }
};

// A [1, N] shared tile of per-key values c read as the factors F(c) (F a ColumnFactor): the tile of
// an input, which no step of the kernel rewrites, so the chain applies F on each read.
template <class Tile, class F>
struct FactorTile : Tile {
  MIRAGE_DEVICE FactorTile(Tile tile) : Tile(tile) {}  // NOLINT: converts the shared tile the step passes
  MIRAGE_DEVICE float load(int linear) const { return F{}(Tile::load(linear)); }
};

template <class C>
struct IsFactorTile : std::false_type {};
template <class Tile, class F>
struct IsFactorTile<FactorTile<Tile, F>> : std::true_type {};

// A [1, R, N] shared tile M of an additive mask of the scores (c · S + M, causal attention's 0 and
// −inf): the chain adds M[row][key] / c to each product before its row maxima. A [1, 1, N] tile is a
// mask of one value a key (a key-padding mask), which every row adds: M[key] / c. The running maxima
// start finite (running_max_floor), so rows whose keys of a sub-tile are all hidden stay NaN-free.
template <class Tile>
struct MaskTile : Tile {
  MIRAGE_DEVICE MaskTile(Tile tile) : Tile(tile) {}  // NOLINT: converts the shared tile the step passes
};

// The causal mask of one iteration's [1, R, N] tile, computed instead of read (an input that names the
// causal pattern, mirage/mugraph/patterns.py): 0 where key j <= query i, -inf where j > i. Row r of
// the tile is row row0 + r of the source (its dims before the keys flattened), whose query is that row
// modulo `period` (grouped-query heads folded into the rows repeat the queries); its key n is key0 + n.
struct CausalMask {
  int row0;
  int key0;
  int period;
  // The last key of the tile that row `row` sees (tile-relative; below 0: none).
  MIRAGE_DEVICE int last_key(int row) const { return (row0 + row) % period - key0; }
  // The last key of the tile that any of rows first … last sees (tile-relative): the rows' largest
  // query, or the period's last where they wrap around it.
  MIRAGE_DEVICE int last_key_of_rows(int first, int last) const {
    const int a = (row0 + first) % period;
    const int b = (row0 + last) % period;
    return (b < a || last - first + 1 >= period ? period - 1 : b) - key0;
  }
};

// Each iteration's CausalMask of a block, from where its tile would lie in the source (keys: the
// source's last dim, row-major); the tile has `rows` rows and `step_keys` keys.
struct CausalMasks {
  dev::TileCoordinate tile;
  int keys;
  int period;
  int rows;
  int step_keys;
  MIRAGE_DEVICE CausalMask at(int iteration) const {
    const int64_t first = tile.at(iteration);
    return CausalMask{static_cast<int>(first / keys), static_cast<int>(first % keys), period};
  }
  // How many of the loop's first steps show some key to some row of the block, when the tile moves
  // along the keys with the loop: the later steps show none (their keys lie past every row's last).
  MIRAGE_DEVICE int iterations(int forloop_range) const {
    if (tile.iteration_step != step_keys) return forloop_range;
    const int last = at(0).last_key_of_rows(0, rows - 1);
    const int visible = last < 0 ? 0 : last / step_keys + 1;
    return visible < forloop_range ? visible : forloop_range;
  }
};

template <class C>
struct IsMaskTile : std::false_type {};
template <class Tile>
struct IsMaskTile<MaskTile<Tile>> : std::true_type {};
template <>
struct IsMaskTile<CausalMask> : std::true_type {};

// The score of a chain with per-key factors: the product times its factor, nothing more.
struct ColumnScore {
  static constexpr float kLinearScale = 1.0f;
  MIRAGE_DEVICE float operator()(float x) const { return x; }
};

// Per-key factors computed by the chain itself from its K tile: Factor(Σ_d K[d][n]²) for key n (the
// factor f(1, g(c)) of a score that divides by a function g of each key's sum of squares, QKNorm's
// rms). The sums come from the tensor cores: the K fragments a warp loads for Q·K are, reordered,
// the A fragments of Kᵀ, so Kᵀ·K runs on them with no load of its own, and its diagonal (exact
// fp16 / bf16 products, fp32 sums) is each key's sum of squares. No shared tile, no barrier.
// In the warpgroup form each warp sums a quarter of a sub-tile's keys and the warpgroup trades the
// factors through `scratch` (two buffers of the sub-tile's keys per warpgroup: the lowering's
// scratch, 2 · warpgroups · 128 floats) and a barrier of its own 128 threads.
template <class Factor>
struct KeyNorms {
  float* scratch = nullptr;
};

// Keys whose sums of squares KeyNorms accumulates at a time (a multiple of 16): more interleave
// more independent products, and hold more accumulators.
#ifndef MIRAGE_SOFTMAX_NORM_KEYS
#define MIRAGE_SOFTMAX_NORM_KEYS 32
#endif

template <class C>
struct IsKeyNorms : std::false_type {};
template <class Factor>
struct IsKeyNorms<KeyNorms<Factor>> : std::true_type {};
template <class C>
struct KeyFactor {
  using type = ColumnScore;  // unused: no key norms
};
template <class Factor>
struct KeyFactor<KeyNorms<Factor>> {
  using type = Factor;
};

// The factor for a key's value v: f(1, g(v)), g and the ColumnFactor f as functors.
template <class G, class F>
struct Compose {
  MIRAGE_DEVICE float operator()(float v) const { return F{}(G{}(v)); }
};

namespace softmax_detail {

// The two factors of keys `key` and `key + 1` (even) of a [1, N] tile of per-key factors (a shared
// tile, or a FactorTile).
template <class Columns>
MIRAGE_DEVICE void column_pair(Columns columns, int key, float (&factor)[2]) {
  factor[0] = columns.load(key);
  factor[1] = columns.load(key + 1);
}

// Whether `pred` holds on every one of warpgroup g's 128 threads (g < Groups): a bar.red.and on barrier
// 1 + g, the id warpgroup_barrier uses (never both in one chain: the key norms' chains have no mask).
template <int Groups, int G = 0>
MIRAGE_DEVICE bool warpgroup_all(int g, bool pred) {
  if constexpr (G < Groups) {
    if (g == G) {
      uint32_t all;
      asm volatile(
          "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.and.pred q, %2, 128, p;\n"
          " selp.u32 %0, 1, 0, q;\n}"
          : "=r"(all)
          : "r"(static_cast<uint32_t>(pred)), "n"(1 + G)
          : "memory");
      return all != 0;
    }
    return warpgroup_all<Groups, G + 1>(g, pred);
  }
  return pred;
}

// Each product plus its mask value over the score's scale c (c · (S + M / c) = c · S + M; M an
// [1, Rows, N] tile or a CausalMask, rows[t] the row of the thread's first score of row tile t); returns
// whether every value added was −∞. Padded keys and rows (N, Rows or past, where the chain runs more:
// Padded) are hidden, not read.
template <int N, int Rows, bool Padded, int Tiles, int KeyTiles, class Mask>
MIRAGE_DEVICE bool add_mask(Mask mask, float inverse_scale, const int (&rows)[Tiles], int key0,
                            float (&score)[Tiles][KeyTiles][4]) {
  const int lane = dev::thread_index() % dev::kWarpSize;
  bool hidden = true;
#pragma unroll
  for (int t = 0; t < Tiles; ++t) {
    int last[2] = {0, 0};  // a causal mask's last key seen by the thread's two rows of the tile
    if constexpr (std::is_same_v<Mask, CausalMask>) {
#pragma unroll
      for (int h = 0; h < 2; ++h) last[h] = mask.last_key(rows[t] + 8 * h);
    }
#pragma unroll
    for (int j = 0; j < KeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * j + 2 * (lane % 4) + e % 2;
        if constexpr (std::is_same_v<Mask, CausalMask>) {
          const bool past = key > last[e / 2];
          hidden = hidden && past;
          score[t][j][e] = past ? negative_infinity() : score[t][j][e];
        } else {
          const int row = rows[t] + 8 * (e / 2);
          const bool outside = Padded && (key >= N || row >= Rows);
          constexpr bool kPerKey = Mask::TileLayout::size == N && Rows > 1;  // [1, 1, N]: one value a key
          const float value = outside ? negative_infinity() : mask.load(kPerKey ? key : row * N + key);
          hidden = hidden && value == negative_infinity();
          score[t][j][e] += value * inverse_scale;
        }
      }
  }
  return hidden;
}

// Each product times its key's factor. From a FactorTile, whose functor maps each value it reads,
// every lane maps the pair of keys 2 lane, 2 lane + 1 of each 64 keys once, and the lanes that scale
// those keys take them by shuffles (two values a lane instead of sixteen).
template <int Tiles, int KeyTiles, class Columns>
MIRAGE_DEVICE void scale_keys(Columns columns, int key0, float (&score)[Tiles][KeyTiles][4]) {
  const int lane = dev::thread_index() % dev::kWarpSize;
#pragma unroll
  for (int g = 0; g < (KeyTiles + 7) / 8; ++g) {  // 64 keys (8 key tiles) at a time
    const int tiles = KeyTiles - 8 * g < 8 ? KeyTiles - 8 * g : 8;
    float own[2];
    if constexpr (IsFactorTile<Columns>::value) {
      column_pair(columns, key0 + g * 64 + min(2 * lane, tiles * 8 - 2), own);
    }
#pragma unroll
    for (int j = g * 8; j < g * 8 + tiles; ++j) {
      float factor[2];
      if constexpr (IsFactorTile<Columns>::value) {
#pragma unroll
        for (int c = 0; c < 2; ++c) factor[c] = __shfl_sync(0xffffffffu, own[c], (j % 8) * 4 + lane % 4);
      } else {
        column_pair(columns, key0 + j * 8 + (lane % 4) * 2, factor);
      }
#pragma unroll
      for (int t = 0; t < Tiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) score[t][j][e] *= factor[e % 2];
    }
  }
}

}  // namespace softmax_detail
}  // namespace mirage::gen
