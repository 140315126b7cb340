// The online-softmax chain's parts (gen/softmax.cuh): the quad reductions and conversions of its
// register fragments, and the functors and traits of its per-key factors.
#pragma once

#include <type_traits>

#include "../mirage.cuh"
#include "kernel.cuh"

namespace mirage::gen {

// A result the chain does not write (its node is absent from the µGraph).
struct NoTile {};

namespace softmax_detail {

constexpr float kLog2e = 1.4426950408889634f;

MIRAGE_DEVICE float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

MIRAGE_DEVICE float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// The maximum of v[Lo, Hi) as a balanced tree: log2 dependent FMNMX instead of a chain of Hi − Lo.
template <int Lo, int Hi, int N>
MIRAGE_DEVICE float tree_max(const float (&v)[N]) {
  if constexpr (Hi - Lo == 1) {
    return v[Lo];
  } else {
    constexpr int kMiddle = (Lo + Hi) / 2;
    return fmaxf(tree_max<Lo, kMiddle>(v), tree_max<kMiddle, Hi>(v));
  }
}

// Two fp32 values as one 32-bit register of two 16-bit elements (the A-fragment packing).
template <class T>
MIRAGE_DEVICE uint32_t pack(float low, float high) {
  const float values[2] = {low, high};
  uint32_t word[1];
  dev::pack_words<T>(values, word);
  return word[0];
}

// A timing probe (wrong results): 1 makes exp2_fast one FMUL instead of the SFU's instruction, so that
// a build shows what its exponentials cost (benchmarks/attention_isolate.py)
#ifndef MIRAGE_PROBE_NO_EXP2
#define MIRAGE_PROBE_NO_EXP2 0
#endif

// 2^x by the SFU's approximation (MUFU.EX2, flushing denormal results to 0): one instruction where
// exp2f adds range handling; its relative error (~2^-22) is far below the fp16 P it feeds.
MIRAGE_DEVICE float exp2_fast(float x) {
  if constexpr (MIRAGE_PROBE_NO_EXP2) return x * 0.5f;
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Score::kLinearScale when the score functor declares one (the function is x · kLinearScale, > 0)
template <class Score, class = void>
struct LinearScore {
  static constexpr bool value = false;
  static constexpr float scale = 1.0f;
};
template <class Score>
struct LinearScore<Score, std::void_t<decltype(Score::kLinearScale)>> {
  static constexpr bool value = true;
  static constexpr float scale = Score::kLinearScale;
};

// The two factors of keys `key` and `key + 1` (even) of a [1, N] tile of per-key factors (a shared
// tile, or a FactorTile).
template <class Columns>
MIRAGE_DEVICE void column_pair(Columns columns, int key, float (&factor)[2]) {
  factor[0] = columns.load(key);
  factor[1] = columns.load(key + 1);
}

template <class T, class L>
MIRAGE_DEVICE void store(dev::SharedTile<T, L> tile, int linear, float value) {
  tile.store(linear, value);
}
MIRAGE_DEVICE void store(NoTile, int, float) {}

}  // namespace softmax_detail

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
template <class Factor>
struct KeyNorms {};

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

}  // namespace mirage::gen
