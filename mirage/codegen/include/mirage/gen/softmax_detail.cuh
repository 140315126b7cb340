// The online-softmax chain's parts (gen/softmax.cuh): its build switches, the quad reductions and
// conversions of its register fragments, the functors and traits of its per-key factors, and the
// merge of its key groups.
#pragma once

#include <type_traits>

#include "../mirage.cuh"
#include "kernel.cuh"

// The chain's build switches (each measured; docs/performance.md §3).

// 1: each 16 keys' exponentials, then their P·V products, so the SFU and the tensor cores overlap;
// 0: all exponentials of a sub-tile, then all its products (build with -DMIRAGE_SOFTMAX_INTERLEAVE=0
// to compare: the results are the same)
#ifndef MIRAGE_SOFTMAX_INTERLEAVE
#define MIRAGE_SOFTMAX_INTERLEAVE 1
#endif

// 1: the warpgroup form issues each sub-tile's Q·K before the softmax of the sub-tile before it, where
// an iteration has several and no per-key factors (the tensor cores run it meanwhile); 0: each Q·K
// issued and waited for at its own sub-tile
#ifndef MIRAGE_SOFTMAX_LOOKAHEAD
#define MIRAGE_SOFTMAX_LOOKAHEAD 1
#endif

// 1: a masked chain (MaskTile) skips the rest of a sub-step whose mask hides every key of the rows it
// holds (−inf throughout: causal attention's tiles past the diagonal); the products and sums are
// exactly those it would have added (0, and a rescale of 1). 0 (the default): every sub-step runs
// whole. Measured on causal prefill of one wave of blocks, the skip cost ~1 µs (its vote or barrier
// each sub-step) and saved nothing: the kernel lasts as long as its last row block, which sees every
// key (docs/performance.md §2)
#ifndef MIRAGE_SOFTMAX_SKIP_HIDDEN
#define MIRAGE_SOFTMAX_SKIP_HIDDEN 0
#endif

// 1: a score x · c (c > 0, the functor's kLinearScale) is not applied element by element: the row
// maxima are taken over the raw products and c · log2(e) goes into the exponent's FFMA, so a score
// costs FMNMX, FFMA, MUFU instead of FMUL, FMUL, FMNMX, FADD, MUFU; 0: the functor, then log2(e)
#ifndef MIRAGE_SOFTMAX_FOLD_SCALE
#define MIRAGE_SOFTMAX_FOLD_SCALE 1
#endif

// How far (in log2 units) a row's maximum may pass the reference m before m is raised: while it does
// not, P = 2^(S·log2e − m) stays below 2^slack in fp32 accumulators, O and l keep their scale, and a
// warp whose rows all keep theirs skips O's rescale (FlashAttention-4's lazy rescale). After the loop
// O and l are normalized once and m becomes the rows' log-sum-exp (settle): the saved M is then a
// reference of the same range as the maximum, which a combine takes like one. The results are those
// of slack 0 in exact arithmetic. 0: m is every row's running maximum, as FlashAttention-2 keeps it.
#ifndef MIRAGE_SOFTMAX_RESCALE_SLACK
#define MIRAGE_SOFTMAX_RESCALE_SLACK 0
#endif

// Keys of a sub-tile in the warpgroup form where a warpgroup's keys of an iteration come in multiples of
// it (else 64): 128 issues the Q·K products of two independent 64-key blocks together and waits once,
// at twice S's registers. Chains with key norms take 128 where they can (half the trades: −0.5 µs).
#ifndef MIRAGE_WARPGROUP_SUB_KEYS
#define MIRAGE_WARPGROUP_SUB_KEYS 64
#endif
static_assert(MIRAGE_WARPGROUP_SUB_KEYS % 64 == 0, "warpgroup sub-tiles are whole blocks of 64 keys");

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

// Timing probes of the warpgroup form (wrong results; benchmarks/attention_isolate.py): bit 1 skips the
// Q·K warpgroup MMAs (the scores come from an opaque move of 0), bit 2 the P·V ones (P is kept live),
// bit 4 the key norms of a chain that computes them (each factor 1)
#ifndef MIRAGE_PROBE_CHAIN
#define MIRAGE_PROBE_CHAIN 0
#endif

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

// Σ_d K[d][n]² of 16 keys n from the tensor cores: K's B fragments b0..b3 of K[d : d + 16, 16 keys]
// (ldmatrix.trans) are, as {b0, b2, b1, b3}, the A fragment of their transpose, so Kᵀ·K of those keys
// (exact 16-bit products, fp32 sums) accumulates into squares[0] (keys 0..7 as columns) and
// squares[1] (keys 8..15). Mma: the mma.sync m16n8k16 operation.
template <class Mma>
MIRAGE_DEVICE void accumulate_key_squares(const uint32_t (&b)[4], float (&squares)[2][4]) {
  const uint32_t transposed[4] = {b[0], b[2], b[1], b[3]};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float(&c)[4] = squares[h];
    Mma::fma(c[0], c[1], c[2], c[3], transposed[0], transposed[1], transposed[2], transposed[3], b[2 * h],
             b[2 * h + 1], c[0], c[1], c[2], c[3]);
  }
}

// Key n's sum of squares (n < Keys, Keys 16 or 32 keys accumulated as Keys / 16 blocks of
// accumulate_key_squares) on lane n; 1 on lanes past Keys (a value whose factor takes no slow path).
// C[r][c] of Kᵀ·K is on lane 4 r + c / 2, element c % 2 (rows 8 on: elements 2 and 3), so key
// 8 h + r's diagonal is on lane 4 r + r / 2; the sums are valid on the diagonal's lanes only (a select:
// a register array takes no runtime index).
template <int Keys>
MIRAGE_DEVICE float gather_key_sums(const float (&squares)[Keys / 16][2][4], int lane) {
  static_assert(Keys == 16 || Keys == 32, "key sums are gathered onto one lane a key: 16 or 32 keys");
  const bool diagonal = (lane / 4) % 2;
  const int n = lane % Keys, r = n % 8;
  float sum = 1.0f;
#pragma unroll
  for (int p = 0; p < Keys / 16; ++p)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float own = diagonal ? squares[p][h][2 * h + 1] : squares[p][h][2 * h];
      const float gathered = __shfl_sync(0xffffffffu, own, 4 * r + r / 2);
      if (n / 16 == p && (n % 16) / 8 == h && lane < Keys) sum = gathered;
    }
  return sum;
}

// bar.sync of warpgroup g's 128 threads (g < Groups): barrier 1 + g (0 is __syncthreads'), a constant
// id, so that the kernel holds only the barriers it names
template <int Groups, int G = 0>
MIRAGE_DEVICE void warpgroup_barrier(int g) {
  if constexpr (G < Groups) {
    if (g == G) {
      asm volatile("bar.sync %0, 128;" ::"n"(1 + G) : "memory");
    } else {
      warpgroup_barrier<Groups, G + 1>(g);
    }
  }
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

// Each score of key tile j times its key's factor (a thread's columns 8 j + 2 (lane % 4), + 1).
template <int Tiles, int KeyTiles>
MIRAGE_DEVICE void scale_columns(const float (&factor)[KeyTiles][2], float (&score)[Tiles][KeyTiles][4]) {
#pragma unroll
  for (int t = 0; t < Tiles; ++t)
#pragma unroll
    for (int j = 0; j < KeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) score[t][j][e] *= factor[j][e % 2];
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

// A [1, R, N] shared tile M of an additive mask of the scores (c · S + M, causal attention's 0 and
// −inf): the chain adds M[row][key] / c to each product before its row maxima. The running maxima
// start finite (running_max_floor), so rows whose keys of a sub-tile are all hidden stay NaN-free.
template <class Tile>
struct MaskTile : Tile {
  MIRAGE_DEVICE MaskTile(Tile tile) : Tile(tile) {}  // NOLINT: converts the shared tile the step passes
};

template <class C>
struct IsMaskTile : std::false_type {};
template <class Tile>
struct IsMaskTile<MaskTile<Tile>> : std::true_type {};

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

// After the loop, the key groups' merge (OnlineSoftmax::write_back with Groups > 1): `scratch` holds
// each group's row maxima (log2 units) [Groups][R], row sums [Groups][R] and outputs [Groups][R][E],
// written before a barrier; every thread then takes elements of the merged rows in turn.
template <int Groups, int R, int E, int NumThreads, class MaxTile, class RunningTile, class SumTile,
          class OutTile>
MIRAGE_DEVICE void merge_key_groups(const float* scratch, MaxTile max_tile, RunningTile running_tile,
                                    SumTile sum_tile, OutTile out_tile) {
  const float* maxima = scratch;
  const float* sums = scratch + Groups * R;
  const float* outs = scratch + 2 * Groups * R;
  for (int linear = dev::thread_index(); linear < R * E; linear += NumThreads) {
    const int row = linear / E;
    float maximum = negative_infinity();
#pragma unroll
    for (int g = 0; g < Groups; ++g) maximum = fmaxf(maximum, maxima[g * R + row]);
    float out = 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < Groups; ++g) {
      const float m = maxima[g * R + row];
      const float factor = m == negative_infinity() ? 0.0f : exp2f(m - maximum);
      out += outs[(g * R + row) * E + linear % E] * factor;
      sum += sums[g * R + row] * factor;
    }
    store(out_tile, linear, out);
    if (linear % E == 0) {
      store(max_tile, row, maximum / kLog2e);
      store(running_tile, row, maximum / kLog2e);
      store(sum_tile, row, sum);
    }
  }
}

}  // namespace softmax_detail

}  // namespace mirage::gen
