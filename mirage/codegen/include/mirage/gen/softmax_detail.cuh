// The online-softmax chain's parts (gen/softmax.cuh): its build switches, the quad reductions and
// conversions of its register fragments, the key norms' sums from the tensor cores, and the merge of
// its key groups (its second score operands: gen/softmax_columns.cuh).
#pragma once

#include <type_traits>

#include <cute/arch/copy_sm75.hpp>

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
// 128 by default: gqa_b8 and qknorm_b8 −0.6 to −0.9 µs on an H200 (define_ab_h200_2026-11-28_sub_keys.json).
#ifndef MIRAGE_WARPGROUP_SUB_KEYS
#define MIRAGE_WARPGROUP_SUB_KEYS 128
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

// The keys the warp-form chain runs for `keys` real ones over `groups` key groups: whole 16-key
// fragments a group, and whole 64-key sub-tiles a group where a group's keys would otherwise have no
// multiple of 16 from 64 to 128 dividing them (ViT's 197: 208 is 13 · 16, so 256). mirage's Python
// side holds the same rule (optimizer/softmax_chain.py, padded_keys).
constexpr int padded_keys(int keys, int groups) {
  const int whole = (keys + 16 * groups - 1) / (16 * groups) * (16 * groups);
  if (whole == keys || whole / groups <= 64) return whole;
  for (int sub = 64; sub <= 128; sub += 16)
    if ((whole / groups) % sub == 0) return whole;
  return (keys + 64 * groups - 1) / (64 * groups) * (64 * groups);
}

// The query rows the warp-form chain runs for `rows` real ones over `warps` warps: whole 16-row tiles,
// as many as the warps divide (every warp takes whole key groups of one tile) or a multiple of the
// warps (every warp takes as many tiles): 50 rows on 4 warps run 64, 48 run 64, 100 run 128.
// mirage's Python side holds the same rule (optimizer/softmax_chain.py, padded_rows).
constexpr int padded_rows(int rows, int warps) {
  int tiles = (rows + 15) / 16;
  if (tiles > warps) return (tiles + warps - 1) / warps * warps * 16;
  while (warps % tiles) ++tiles;
  return tiles * 16;
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

// OnlineSoftmax's PingPong (the warpgroup form with two warpgroups; 0 elsewhere): the warpgroups take
// turns issuing their products (FlashAttention-3's ping-pong), so that the tensor cores run one's
// products while the other computes its softmax. kScores: a turn around each Q·K issue (with a deferred
// P·V behind it: PingPong 1, and 2 in the deferred form); kSpan (2): from a sub-tile's Q·K issue to the
// end of its P·V issue. take(g) waits for warpgroup g's turn (barrier 3 + g, which the other's pass
// completes), pass(g) hands it over (arrive at 4 − g). The second warpgroup passes once before the loop
// (`start`) and the first takes that last pass after it (`finish`): no arrival is left on a barrier.
// The sums and their order do not change.
template <int PingPong, bool Deferred>
struct Turns {
  static constexpr bool kScores = PingPong == 1 || (PingPong == 2 && Deferred);
  static constexpr bool kSpan = PingPong == 2 && !Deferred;
  static MIRAGE_DEVICE void take(int g) { turn<false, 3, 4>(g); }
  static MIRAGE_DEVICE void pass(int g) { turn<true, 4, 3>(g); }
  // bar.sync (take) or bar.arrive (pass) of the two warpgroups, on barrier First for warpgroup 0 and
  // Second for 1 (constant ids)
  template <bool Arrive, int First, int Second>
  static MIRAGE_DEVICE void turn(int g) {
    if constexpr (PingPong != 0) {
      if (g == 0) {
        barrier<Arrive, First>();
      } else {
        barrier<Arrive, Second>();
      }
    }
  }
  template <bool Arrive, int Id>
  static MIRAGE_DEVICE void barrier() {
    if constexpr (Arrive) {
      asm volatile("bar.arrive %0, 256;" ::"n"(Id) : "memory");
    } else {
      asm volatile("bar.sync %0, 256;" ::"n"(Id) : "memory");
    }
  }
  static MIRAGE_DEVICE void start(int g) {
    if (g == 1) pass(g);
  }
  static MIRAGE_DEVICE void finish(int g) {
    if (g == 0) take(g);
  }
  static MIRAGE_DEVICE void leave(int g) {  // a sub-step left early: its span's turn passed
    if constexpr (kSpan) pass(g);
  }
};

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
// a result that only its output saver reads, written by the chain into the device output
template <class T, class L>
MIRAGE_DEVICE void store(const GlobalSink<T, L>& sink, int linear, float value) {
  sink(linear, value);
}
// two neighbouring columns of a row (`linear` even)
template <class Tile>
MIRAGE_DEVICE void store_pair(Tile tile, int linear, float a, float b) {
  store(tile, linear, a);
  store(tile, linear + 1, b);
}
template <class T, class L>
MIRAGE_DEVICE void store_pair(const GlobalSink<T, L>& sink, int linear, float a, float b) {
  sink.pair(linear, a, b);
}

}  // namespace softmax_detail

namespace softmax_detail {

// After the loop, the key groups' merge (OnlineSoftmax::write_back with Groups > 1): `scratch` holds
// each group's row maxima (log2 units) [Groups][R], row sums [Groups][R] and outputs [Groups][R][E],
// written before a barrier; every thread then takes elements of the merged rows in turn (the first
// RealRows of the R: padded rows are not written).
template <int Groups, int R, int RealRows, int E, int NumThreads, class MaxTile, class RunningTile, class SumTile,
          class OutTile>
MIRAGE_DEVICE void merge_key_groups(const float* scratch, MaxTile max_tile, RunningTile running_tile,
                                    SumTile sum_tile, OutTile out_tile) {
  const float* maxima = scratch;
  const float* sums = scratch + Groups * R;
  const float* outs = scratch + 2 * Groups * R;
  for (int linear = dev::thread_index(); linear < RealRows * E; linear += NumThreads) {
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

// This lane's 16 bytes of an ldmatrix of rows first_row … + 15 from column col of a tile of layout L:
// columns col + 8 for lanes 16 on (8 elements the 128-byte swizzle keeps together).
template <class L, class T>
MIRAGE_DEVICE const cute::uint128_t& fragment_row(const T* data, int first_row, int col) {
  const int lane = dev::thread_index() % dev::kWarpSize;
  const int row = first_row + lane % 16;
  return *reinterpret_cast<const cute::uint128_t*>(data + L::element_offset(row, col + (lane / 16) * 8));
}

}  // namespace softmax_detail

}  // namespace mirage::gen
