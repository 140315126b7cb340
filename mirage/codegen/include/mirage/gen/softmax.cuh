// The online-softmax chain of an attention µGraph, kept in registers (FlashAttention-2's scheme).
//
// The online-softmax rewrite (mirage/optimizer/softmax.py) turns the loop body of an attention
// block graph into this chain over a query tile Q [R, D], a key tile K [D, N] (keys contiguous, as
// the benchmark stores them) and a value tile V [N, E]:
//
//   S = score(Q · K)                         score: the fused element-wise ops on the product
//   m = running_max(reduction_max(S))        the row maximum over the keys seen so far
//   P = exp(S − m)
//   l = l · exp(m_prev − m) + Σ_keys P        accum_rescale (sum), optional
//   O = O · exp(m_prev − m) + P · V           accum_rescale of the second matmul
//   M = max over iterations of reduction_max(S)   accum (max), optional
//
// S and P stay in the tensor-core fragments (S is the C fragment of `mma.sync` m16n8k16, a row's
// maxima and sums are quad shuffles, P is converted in registers into the A fragments of P · V), with
// no shared round trip or barrier between the ops. Warps take 16-row tiles and, when there are more
// warps than row tiles, split each tile's keys in `kGroups` groups, merged after the loop.
//
//   using Chain = OnlineSoftmax<NumThreads, __half, QLayout, KLayout, VLayout, Score>;
//   typename Chain::State state;  Chain::clear(state);         before the loop
//   Chain::step(state, q, k, v[, columns]);                    every iteration (no barrier inside)
//   Chain::write_back(state, scratch, max_tile, running_tile, sum_tile, out_tile);  after the loop;
//                                                              a barrier must follow before others read
//
// `columns`: per-key factors of a score f(Q·K, c) linear in the product (QKNorm's S / rms(K) · 0.125),
// multiplied into each product before the row maxima (a tile of f(1, c), or KeyNorms: from K itself).
// The warpgroup form (sm_90a), chosen by K and V tiles in dev::Swizzled128Layout, runs both products
// as warpgroup MMAs (gen/wgmma.cuh), B (K or V) from shared memory through descriptors, A from Q's
// tile or fragments and from P; each warpgroup takes whole 64-row tiles and the same softmax code runs
// between the products. docs/codegen.md §2.3a has the details.
//
// Keys that no 16 keys a warp divide (ViT's 197, CLIP's 77; warp form, plain or masked scores): the
// chain runs over N padded keys (kRealKeys rounded up, further to whole 64-key sub-tiles where that is
// all that gives sub-tiles of 64 or more); the scores of the padded keys are −∞ before the row maxima,
// so their P is 0, and the K columns and V rows that their fragments would read past the tiles are the
// last real ones (finite values times 0). Query rows run padded likewise (kPaddedRows, below).
#pragma once

#include <type_traits>

#include <cute/arch/copy_sm75.hpp>

#include "../mirage.cuh"
#include "kernel.cuh"
#include "softmax_columns.cuh"
#include "softmax_detail.cuh"
#include "softmax_key_norms.cuh"
#include "wgmma.cuh"

namespace mirage::gen {

template <int NumThreads, class T, class QLayout, class KLayout, class VLayout, class Score,
          class Columns = NoTile, bool DeferValues = false, bool QFragments = false, int PingPong = 0>
struct OnlineSoftmax {
  using Atom = dev::detail::MmaAtom<T>;
  static constexpr int kWarps = NumThreads / dev::kWarpSize;
  static constexpr int kRealRows = QLayout::rows;
  // the rows the chain runs: whole 16-row tiles that the warps divide or that divide the warps
  static constexpr int R = softmax_detail::padded_rows(kRealRows, kWarps);
  static constexpr bool kPaddedRows = R != kRealRows;
  // the depth the products run: whole 16-wide k-steps (Stable Diffusion 1.5's heads of 40 run 48; the
  // last step's padded half is 0 in Q's and K's fragments: load_q, load_k)
  static constexpr int kRealDepth = QLayout::cols;
  static constexpr int D = (kRealDepth + 15) / 16 * 16;
  static constexpr bool kPaddedDepth = D != kRealDepth;
  static constexpr int kRealKeys = KLayout::cols;
  static constexpr int E = VLayout::cols;
  static constexpr int kRowTiles = R / 16;
  static constexpr int kGroups = kWarps >= kRowTiles && kRowTiles > 0 ? kWarps / kRowTiles : 1;
  static constexpr int N = softmax_detail::padded_keys(kRealKeys, kGroups);  // the keys the chain runs
  static constexpr bool kPadded = N != kRealKeys;
  static constexpr int kTilesPerWarp = kWarps >= kRowTiles ? 1 : kRowTiles / kWarps;
  static constexpr int kKeys = N / kGroups;  // keys of every tile that one warp takes
  // Keys of one S sub-tile per warp: at most 128 scores a row, over all of the warp's row tiles
  // (which share every K and V fragment that the warp loads), a multiple of 16 dividing kKeys.
  static constexpr int sub_keys() {
    if (KLayout::swizzled) {  // the warpgroup form: key blocks of 64 (wgmma n64), see MIRAGE_WARPGROUP_SUB_KEYS
      if (IsKeyNorms<Columns>::value && kKeys % 128 == 0 && MIRAGE_WARPGROUP_SUB_KEYS < 128) return 128;
      return kKeys % MIRAGE_WARPGROUP_SUB_KEYS == 0 ? MIRAGE_WARPGROUP_SUB_KEYS : 64;
    }
    const int cap = 128 / kTilesPerWarp < 16 ? 16 : 128 / kTilesPerWarp;
    for (int keys = (kKeys < cap ? kKeys : cap) / 16 * 16; keys > 16; keys -= 16)
      if (kKeys % keys == 0) return keys;
    return 16;
  }
  static constexpr int kSubKeys = sub_keys();
  static constexpr int kKeyTiles = kSubKeys / 8;
  static constexpr int kOutTiles = E / 8;
  static_assert(Atom::kLdmatrix, "the register chain runs on fp16 / bf16 tensor cores");
  static_assert(kRealRows > 0 && kRealDepth % 8 == 0 && E % 8 == 0 && kKeys % 16 == 0 && N % kGroups == 0,
                "tile shapes the register chain does not cover (the lowering checks them first)");
  static_assert(kKeys % kSubKeys == 0, "a warp's keys must be whole sub-tiles");
  static_assert(kWarps % kRowTiles == 0 || kRowTiles % kWarps == 0,
                "the warps must divide the row tiles or be a multiple of them (every warp works)");
  static_assert(KLayout::rows == kRealDepth && VLayout::rows == kRealKeys, "Q [R, D], K [D, N], V [N, E]");
  static constexpr bool kKeyNorms = IsKeyNorms<Columns>::value;
  using QTile = dev::SharedTile<T, QLayout>;
  using KTile = dev::SharedTile<T, KLayout>;
  using ColumnOp = Columns;
  using KeyNormSteps = ChainKeyNorms<OnlineSoftmax>;  // QKNorm's factors from K (softmax_key_norms.cuh)
  // the warpgroup form (see the top of the file): K and V in 128-byte swizzled tiles
  static constexpr bool kWarpgroup = KLayout::swizzled;
  static_assert(!KLayout::transposed || !kKeyNorms, "K in place: no key norms");
  static_assert(VLayout::swizzled == kWarpgroup && (kWarpgroup || !QLayout::swizzled),
                "K and V swizzled together; Q (read from shared memory by wgmma) only with them");
  static_assert(!kWarpgroup || (kWarps % 4 == 0 && kRowTiles % kWarps == 0 && kKeys % 64 == 0 &&
                                E % 64 == 0 && (!kKeyNorms || kSubKeys <= 128)),
                "the warpgroup form: whole warpgroups of whole 64-row tiles, keys and E in blocks of 64, "
                "key norms in sub-tiles of at most 128 keys (the lowering checks them first)");
  static constexpr bool kMasked = IsMaskTile<Columns>::value;
  static constexpr float kInverseScale = 1.0f / softmax_detail::LinearScore<Score>::scale;  // a mask's 1 / c
  static_assert(!kMasked || softmax_detail::LinearScore<Score>::value,
                "a masked chain's score is c · S + M: its functor is the linear part c · S");
  template <class C>
  static constexpr bool covers_keys() {
    if constexpr (std::is_same_v<C, NoTile> || IsKeyNorms<C>::value || std::is_same_v<C, CausalMask>) {
      return true;
    } else if constexpr (IsMaskTile<C>::value) {  // one value a score, or one a key (key padding)
      return C::TileLayout::size == kRealRows * kRealKeys || C::TileLayout::size == kRealKeys;
    } else {
      return C::TileLayout::size == kRealKeys;
    }
  }
  static_assert(covers_keys<Columns>(), "per-key factors: one value for each of the N keys (a mask: each score)");
  static_assert((QLayout::pitch * sizeof(T)) % 16 == 0 && (KLayout::pitch * sizeof(T)) % 16 == 0 &&
                    (VLayout::pitch * sizeof(T)) % 16 == 0,
                "ldmatrix needs 16-byte aligned rows");

  // (a mask, computed or read, hides the padded keys: their scores are −∞ after it as without it)
  static_assert(!kPadded || ((std::is_same_v<Columns, NoTile> || IsMaskTile<Columns>::value) &&
                             !KLayout::swizzled),
                "padded keys: plain or masked scores, the warp form (the lowering checks them first)");
  // Rows that no 16-row tiles divide (a block of 15 or 50 query rows): the chain runs R, the padded
  // rows' Q fragments read the last real row, and their results are never written back
  static_assert(!kPaddedRows || (!QLayout::swizzled && !KLayout::swizzled),
                "padded rows: the warp form (the lowering checks them first)");
  static_assert((!kPaddedDepth && E % 16 == 0) || !KLayout::swizzled,
                "head dims of no whole 16: the warp form (the lowering checks them first)");
  static_assert(!kPadded || KLayout::transposed || KLayout::pitch >= (kRealKeys + 7) / 8 * 8,
                "padded keys: K's rows hold the last 16-byte chunk of keys");
  // The last K column chunk (8 keys) that holds a real key: padded keys' fragments read it instead.
  static constexpr int kLastKeyChunk = (kRealKeys - 1) / 8 * 8;

  // Scratch floats for write_back's merge of the key groups (0 with one group).
  static constexpr int kScratchFloats = kGroups > 1 ? kGroups * R * (E + 2) : 0;

  static constexpr bool kFoldScale = MIRAGE_SOFTMAX_FOLD_SCALE && softmax_detail::LinearScore<Score>::value;
  // S · kUnits − m is the exponent in log2 units: the raw product's scale c · log2(e) with
  // kFoldScale, else 1 (S is scaled element by element first)
  static constexpr float kUnits =
      kFoldScale ? softmax_detail::kLog2e * softmax_detail::LinearScore<Score>::scale : 1.0f;

  // the warpgroup form with deferred P·V (DeferValues): each sub-tile's P·V issued with the next
  // sub-tile's Q·K, the tensor cores meant to run it while the warps compute that sub-tile's
  // exponentials (FlashAttention-3's intra-warpgroup overlap). The V tile is then read one iteration
  // late: its input must keep one ring slot more than the pipeline (the memory plan gives it one).
  // The results are the same either way, bit for bit.
  static constexpr bool kDeferred = kWarpgroup && DeferValues;
  static constexpr bool kLookahead = kWarpgroup && !kDeferred && std::is_same_v<Columns, NoTile> &&
                                     kKeys / kSubKeys >= 2 && MIRAGE_SOFTMAX_LOOKAHEAD;
  // Descriptors computed whole per operand in the deferred form (its registers are at the limit with
  // two row tiles a warp: the tile bases that the other forms hold per sub-tile would spill there).
  static constexpr bool kWholeDescriptors = kDeferred;
  // QFragments (the warpgroup form): the Q·K products read Q's A fragments from registers, loaded from
  // its tile by ldmatrix at each sub-tile, instead of Q's tile from shared memory through descriptors.
  // (Fragments loaded once and held across the loop were faster still, but ptxas (CUDA 13.0) gave
  // their registers to P where the loop also branches or calls: wrong results.)
  static constexpr bool kQFragments = kWarpgroup && QFragments;
  // none for the chain that computes the key norms itself: at 255 registers, the settle spills
  static constexpr float kRescaleSlack = kKeyNorms ? 0.0f : MIRAGE_SOFTMAX_RESCALE_SLACK;
  using Turn = softmax_detail::Turns<kWarpgroup && kWarps == 8 ? PingPong : 0, kDeferred>;  // PingPong

  struct State {
    float out[kTilesPerWarp][kOutTiles][4];
    float maximum[kTilesPerWarp][2];  // rows group and group + 8 of each row tile, in log2 units: the
                                      // reference m of O and l (at most kRescaleSlack below the maxima)
    float sum[kTilesPerWarp][2];      // this thread's columns only (quad-summed at write-back)
    // kDeferred: the P of the last sub-tile, whose P·V is not issued yet, its V tile (nullptr: none)
    // and its first key
    uint32_t p[kDeferred ? kKeyTiles / 2 : 1][kTilesPerWarp][4];
    const T* v;
    int key0;
    int parity;  // the warpgroup form's key norms: the scratch buffer of the last sub-tile's factors
  };

  static MIRAGE_DEVICE int warp() { return dev::thread_index() / dev::kWarpSize; }
  static MIRAGE_DEVICE int lane() { return dev::thread_index() % dev::kWarpSize; }
  static MIRAGE_DEVICE int key_group() { return kGroups > 1 ? warp() / kRowTiles : 0; }
  // The 16-row tile of the warp's tile t (in the warpgroup form: warp w of warpgroup g takes rows
  // 16 w .. 16 w + 15 of the warpgroup's 64-row tiles g · kTilesPerWarp + t).
  static MIRAGE_DEVICE int row_tile(int t) {
    if constexpr (kWarpgroup) return ((warp() / 4) * kTilesPerWarp + t) * 4 + warp() % 4;
    return kWarps >= kRowTiles ? warp() % kRowTiles : warp() * kTilesPerWarp + t;
  }

  static MIRAGE_DEVICE void clear(State& state) {
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) state.out[t][j][e] = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        state.maximum[t][h] = running_max_floor();
        state.sum[t][h] = 0.0f;
      }
    }
    state.v = nullptr;
    state.key0 = 0;
    state.parity = 0;
    Turn::start(warp() / 4);  // the first warpgroup takes the first turn
  }

  // One iteration of the chain over this iteration's K and V tiles, in sub-tiles of at most
  // kSubKeys keys per warp (each a step of the online softmax: the registers of S and P stay
  // bounded however many keys a warp takes per iteration).
  static MIRAGE_DEVICE void step(State& state, dev::SharedTile<T, QLayout> q, dev::SharedTile<T, KLayout> k,
                                 dev::SharedTile<T, VLayout> v, Columns columns = {}) {
    const int key0 = key_group() * kKeys;
    if constexpr (std::is_same_v<Columns, CausalMask> && !kDeferred) {
      // no row of the block sees a key of this step (a computed causal mask): its scores would all be
      // −∞, its P 0, and m, l and O unchanged. Uniform over the block (over a warp's key group).
      if (columns.last_key_of_rows(0, kRealRows - 1) < key0) return;
    }
    if constexpr (kLookahead) {
      step_ahead(state, q, k, v, key0);
      return;
    }
#pragma unroll 1
    for (int sub = 0; sub < kKeys / kSubKeys; ++sub) sub_step(state, q, k, v, columns, key0 + sub * kSubKeys);
  }

  // The merged results into shared tiles (any may be NoTile): the row maximum M (in the units of
  // S) into `max_tile` and `running_tile`, l into `sum_tile`, O into `out_tile`; accumulator tiles
  // are R x 1 and R x E. Collective; has a barrier inside when the key groups are merged.
  template <class MaxTile, class RunningTile, class SumTile, class OutTile>
  static MIRAGE_DEVICE void write_back(State& state, float* scratch, MaxTile max_tile, RunningTile running_tile,
                                       SumTile sum_tile, OutTile out_tile) {
    using softmax_detail::store;
    Turn::finish(warp() / 4);  // the second warpgroup's last pass (one more than its turns)
    if constexpr (kDeferred) {  // the last sub-tile's P·V
      if (state.v != nullptr) {
        cute::warpgroup_arrive();
        issue_values(state, state.p, state.v, state.key0);
        cute::warpgroup_wait<0>();
        wgmma::fence(state.p);
        wgmma::fence(state.out);
      }
      // Every warpgroup reads the whole of the last V tile, past the loop's last barrier, and the
      // memory plan may place the tiles written below over V's ring: all must be done reading first.
      __syncthreads();
    }
    settle(state);
    const int group = lane() / 4;
    const int pair = (lane() % 4) * 2;
    if constexpr (kGroups == 1) {
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row_tile(t) * 16 + group + h * 8;
          const float sum = softmax_detail::quad_sum(state.sum[t][h]);
          if (kPaddedRows && row >= kRealRows) continue;  // a padded row: nothing of it is written
          if (lane() % 4 == 0) {
            const float maximum = state.maximum[t][h] / softmax_detail::kLog2e;
            store(max_tile, row, maximum);
            store(running_tile, row, maximum);
            store(sum_tile, row, sum);
          }
#pragma unroll
          for (int j = 0; j < kOutTiles; ++j) {
            softmax_detail::store_pair(out_tile, row * E + j * 8 + pair, state.out[t][j][2 * h],
                                       state.out[t][j][2 * h + 1]);
          }
        }
    } else {
      // scratch: maxima [kGroups][R], sums [kGroups][R], outputs [kGroups][R][E]
      float* maxima = scratch;
      float* sums = scratch + kGroups * R;
      float* outs = scratch + 2 * kGroups * R;
      {
        const int g = key_group();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row_tile(0) * 16 + group + h * 8;
          const float sum = softmax_detail::quad_sum(state.sum[0][h]);
          if (lane() % 4 == 0) {
            maxima[g * R + row] = state.maximum[0][h];
            sums[g * R + row] = sum;
          }
#pragma unroll
          for (int j = 0; j < kOutTiles; ++j) {
            float* target = outs + (g * R + row) * E + j * 8 + pair;
            target[0] = state.out[0][j][2 * h];
            target[1] = state.out[0][j][2 * h + 1];
          }
        }
      }
      __syncthreads();
      softmax_detail::merge_key_groups<kGroups, R, kRealRows, E, NumThreads>(scratch, max_tile, running_tile,
                                                                             sum_tile, out_tile);
    }
  }

 private:
  friend KeyNormSteps;
  using Mma = typename Atom::Operation;

  // One online-softmax step over kSubKeys keys for every row tile of the warp. The deferred form's
  // sub-step in two straight-line versions, with a P·V pending from the last
  // sub-tile (Pending) and without (the first): a branch between the issue of a wgmma and its wait
  // would leave the compiler unsure which registers the asynchronous products still read.
  static MIRAGE_DEVICE void sub_step(State& state, dev::SharedTile<T, QLayout> q, dev::SharedTile<T, KLayout> k,
                                     dev::SharedTile<T, VLayout> v, Columns columns, int key0) {
    if constexpr (kDeferred) {
      if (state.v != nullptr) {
        sub_step<true>(state, q, k, v, columns, key0);
      } else {
        sub_step<false>(state, q, k, v, columns, key0);
      }
    } else {
      sub_step<false>(state, q, k, v, columns, key0);
    }
  }

  template <bool Pending>
  static MIRAGE_DEVICE void sub_step(State& state, dev::SharedTile<T, QLayout> q, dev::SharedTile<T, KLayout> k,
                                     dev::SharedTile<T, VLayout> v, Columns columns, int key0) {
    float score[kTilesPerWarp][kKeyTiles][4];
    if constexpr (Turn::kSpan) Turn::take(warp() / 4);  // passed after the P·V issue (in_step_values)
    if constexpr (kWarpgroup && kKeyNorms) {  // the keys' factors while the tensor cores run Q·K
      float factor[kKeyTiles][2];
      float squares[KeyNormSteps::kWarpKeys / 16][2][4];
      if constexpr ((MIRAGE_PROBE_CHAIN & 4) != 0) {
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j) factor[j][0] = factor[j][1] = 1.0f;
        warpgroup_scores<Pending>(state, q, k, key0, score, [] {});
      } else {
        KeyNormSteps::key_squares(k, key0, squares);  // before Q·K's warpgroup MMAs: 0.45 µs faster
        warpgroup_scores<Pending>(state, q, k, key0, score,
                                  [&] { KeyNormSteps::trade_key_factors(state, columns, squares, factor); });
      }
      softmax_detail::scale_columns(factor, score);
    } else if constexpr (kWarpgroup) {
      warpgroup_scores<Pending>(state, q, k, key0, score, [] {});
    } else if constexpr (kKeyNorms) {
      KeyNormSteps::scaled_scores(q, k, key0, score);
    } else {
      scores(q, k, key0, score);
    }
    if constexpr (kMasked) {
      int rows[kTilesPerWarp];
      fragment_rows(rows);
      const bool hidden = softmax_detail::add_mask<kRealKeys, kRealRows, kPadded || kPaddedRows>(
          columns, kInverseScale, rows, key0, score);
      if constexpr (!kDeferred && MIRAGE_SOFTMAX_SKIP_HIDDEN) {
        if (all_hidden(hidden)) return Turn::leave(warp() / 4);  // P = 0: m, l and O stay as they are
      }
    } else if constexpr (!kKeyNorms && !std::is_same_v<Columns, NoTile>) {
      softmax_detail::scale_keys(columns, key0, score);
    }
    float offset[kTilesPerWarp][2];
    float factor[kTilesPerWarp][2];
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) rescale(state, t, score[t], offset[t], factor[t], key0);
    if constexpr (kDeferred) {
      // the exponentials while the last sub-tile's P·V runs; then O's rescale and P's fragments (in
      // the registers that P·V read), once that is done
#pragma unroll
      for (int kk = 0; kk < kKeyTiles / 2; ++kk)
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) exponentials(state, t, score[t], kk, offset[t]);
      wgmma::fence(score);  // computed before the wait, not moved past it
      cute::warpgroup_wait<0>();
      wgmma::fence(state.p);  // the last P·V's A fragments, read until this wait
      wgmma::fence(state.out);
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) rescale_out(state, t, factor[t]);
#pragma unroll
      for (int kk = 0; kk < kKeyTiles / 2; ++kk)
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) pack_probabilities(score[t], kk, state.p[kk][t]);
      state.v = v.data;
      state.key0 = key0;
      return;
    }
    in_step_values(state, score, offset, factor, v, key0);
  }

  // The step's rest in step: O rescaled, P and its P·V products; returns with them done.
  static MIRAGE_DEVICE void in_step_values(State& state, float (&score)[kTilesPerWarp][kKeyTiles][4],
                                           const float (&offset)[kTilesPerWarp][2],
                                           const float (&factor)[kTilesPerWarp][2],
                                           dev::SharedTile<T, VLayout> v, int key0) {
    uint32_t p[kKeyTiles / 2][kTilesPerWarp][4];
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) rescale_out(state, t, factor[t]);
    // P of 16 keys, then its P·V products: the exponentials of the next 16 keys (SFU) issue while
    // the tensor cores run these (same operations and sums as the two-pass order, same results).
    // Every P fragment stays live until the products are done (a warpgroup MMA reads its A
    // registers asynchronously).
    constexpr bool kInterleave = MIRAGE_SOFTMAX_INTERLEAVE;
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) probabilities(state, t, score[t], kk, offset[t], p[kk][t]);
      if constexpr (kInterleave) accumulate_keys(state, p[kk], v, key0, kk);
    }
    if constexpr (!kInterleave) {
#pragma unroll
      for (int kk = 0; kk < kKeyTiles / 2; ++kk) accumulate_keys(state, p[kk], v, key0, kk);
    }
    if constexpr (Turn::kSpan) Turn::pass(warp() / 4);  // every product of the sub-tile issued
    if constexpr (kWarpgroup) {
      cute::warpgroup_wait<0>();  // O complete, K and V no longer read
      wgmma::fence(p);
      wgmma::fence(state.out);
    }
  }

  // The row of each row tile's first score this thread holds (rows 16 row_tile(t) + lane / 4, + 8).
  static MIRAGE_DEVICE void fragment_rows(int (&rows)[kTilesPerWarp]) {
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) rows[t] = row_tile(t) * 16 + lane() / 4;
  }

  // Whether the threads that run this sub-step's products together (a warp, or in the warpgroup form
  // the warpgroup, whose MMAs are collective) all found their mask values −∞.
  static MIRAGE_DEVICE bool all_hidden(bool hidden) {
    if constexpr (kWarpgroup) return softmax_detail::warpgroup_all<kWarps / 4>(warp() / 4, hidden);
    return __all_sync(0xffffffffu, hidden);
  }

  // Row tile t's new running maxima from its scores, the rescale of its l by factor = 2^(m_prev − m)
  // (rescale_out: of its O), and offset = −m for the exponentials.
  static MIRAGE_DEVICE void rescale(State& state, int t, float (&score)[kKeyTiles][4], float (&offset)[2],
                                    float (&factor)[2], int key0 = 0) {
    // S in log2 units: exp(S − m) = 2^(S·log2e − m·log2e). With kFoldScale, S = c · raw and the
    // maxima are over the raw products (c > 0 keeps their order); c · log2e is applied later.
    float row[2][2 * kKeyTiles];
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (!kFoldScale) score[j][e] = Score{}(score[j][e]) * softmax_detail::kLog2e;
      }
    if constexpr (kPadded) {  // the padded keys' scores −∞ (after the score's functor): P = 0 there
      if (key0 + kSubKeys > kRealKeys) {
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (key0 + 8 * j + 2 * (lane() % 4) + e % 2 >= kRealKeys) score[j][e] = negative_infinity();
      }
    }
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) row[e / 2][2 * j + e % 2] = score[j][e];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float seen = softmax_detail::quad_max(row_max(row[h]));
      if constexpr (kFoldScale) seen *= kUnits;
      const float previous = state.maximum[t][h];
      const float current = kRescaleSlack > 0 ? (seen > previous + kRescaleSlack ? seen : previous)
                                              : fmaxf(previous, seen);
      factor[h] = previous == current ? 1.0f : softmax_detail::exp2_fast(previous - current);
      state.maximum[t][h] = current;
      state.sum[t][h] *= factor[h];
      offset[h] = -current;
    }
  }

  // A row's maximum over this thread's scores: in the warpgroup form (16 a row) as a balanced tree,
  // which measured 0.15–0.35 µs faster on gqa_b8's warpgroup members; in the warp form as a chain (its
  // tree measured 0.1–0.3 µs slower: docs/performance.md §3).
  static MIRAGE_DEVICE float row_max(const float (&v)[2 * kKeyTiles]) {
    if constexpr (kWarpgroup) return softmax_detail::tree_max<0, 2 * kKeyTiles>(v);
    float m = negative_infinity();
#pragma unroll
    for (int i = 0; i < 2 * kKeyTiles; ++i) m = fmaxf(m, v[i]);
    return m;
  }

  // Before the write-back, with a slack: O and l divided by l, and m raised by log2 l (the rows'
  // log-sum-exp), so that O, l and M stay consistent and in range when saved in 16 bits: l is 1 and
  // O the softmax-weighted values, where with a stale m they could reach 2^slack times the keys.
  static MIRAGE_DEVICE void settle(State& state) {
    if constexpr (kRescaleSlack > 0) {
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) {
        float factor[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float total = softmax_detail::quad_sum(state.sum[t][h]);
          factor[h] = total > 0.0f ? 1.0f / total : 1.0f;  // none: no key seen, m is −∞
          if (total > 0.0f) state.maximum[t][h] += __log2f(total);
          state.sum[t][h] *= factor[h];
        }
        rescale_out(state, t, factor);
      }
    }
  }

  static MIRAGE_DEVICE void rescale_out(State& state, int t, const float (&factor)[2]) {
    if constexpr (kRescaleSlack > 0) {  // warp-uniform: skipped while no row of the warp raised m
      if (!__any_sync(0xffffffffu, factor[0] != 1.0f || factor[1] != 1.0f)) return;
    }
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) state.out[t][j][e] *= factor[e / 2];
  }

  // The A fragment of P[:, 16 kk : 16 kk + 16] = 2^(S · kUnits − m) from the C fragments of S
  // (score tiles 2 kk and 2 kk + 1; offset = −m): an FFMA and a MUFU per key, added to the
  // thread's row sums in fp32, then packed.
  static MIRAGE_DEVICE void probabilities(State& state, int t, float (&s)[kKeyTiles][4], int kk,
                                          const float (&offset)[2], uint32_t (&a)[4]) {
    exponentials(state, t, s, kk, offset);
    pack_probabilities(s, kk, a);
  }

  // The exponentials of score tiles 2 kk and 2 kk + 1, in place, added to the row sums.
  static MIRAGE_DEVICE void exponentials(State& state, int t, float (&s)[kKeyTiles][4], int kk,
                                         const float (&offset)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& x = s[2 * kk + half][e];
        x = softmax_detail::exp2_fast(fmaf(x, kUnits, offset[e / 2]));
        state.sum[t][e / 2] += x;
      }
  }

  // Those tiles as the A fragment of P[:, 16 kk : 16 kk + 16].
  static MIRAGE_DEVICE void pack_probabilities(const float (&s)[kKeyTiles][4], int kk, uint32_t (&a)[4]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      a[2 * half] = softmax_detail::pack<T>(s[2 * kk + half][0], s[2 * kk + half][1]);
      a[2 * half + 1] = softmax_detail::pack<T>(s[2 * kk + half][2], s[2 * kk + half][3]);
    }
  }

  static MIRAGE_DEVICE void clear(float (&score)[kTilesPerWarp][kKeyTiles][4]) {
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
      for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) score[t][j][e] = 0.0f;
  }

  // The A fragment of Q[16 row_tile(t) : +16, d : d + 16].
  static MIRAGE_DEVICE void load_q(dev::SharedTile<T, QLayout> q, int t, int d, uint32_t (&a)[4]) {
    if constexpr (kPaddedRows || kPaddedDepth) {
      // a padded row reads the last real one (its results are dropped), a padded column chunk the last
      // real chunk (zeroed below)
      int row = row_tile(t) * 16 + lane() % 16;
      int col = d + (lane() / 16) * 8;
      if constexpr (kPaddedRows) row = row < kRealRows ? row : kRealRows - 1;
      if constexpr (kPaddedDepth) col = col < kRealDepth ? col : kRealDepth - 8;
      const T* address = q.data + QLayout::element_offset(row, col);
      cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(address), a[0], a[1], a[2], a[3]);
      if constexpr (kPaddedDepth) {
        if (d + 16 > kRealDepth) a[2] = a[3] = 0u;  // columns d + 8 … d + 15: past the head dim
      }
    } else {
      cute::SM75_U32x4_LDSM_N::copy(softmax_detail::fragment_row<QLayout>(q.data, row_tile(t) * 16, d), a[0], a[1],
                                    a[2], a[3]);
    }
  }

  // The B fragments of K[d : d + 16, key : key + 8] (b0, b1) and K[d : d + 16, key + 8 : key + 16] (b2, b3)
  // (a K read in place, stored [keys, D] as keys lie in a row-major K: dev::detail::load_stored_b).
  // With a padded depth, rows d + 8 … d + 15 past the head dim read its last rows and are zeroed (b1, b3).
  static MIRAGE_DEVICE void load_k(dev::SharedTile<T, KLayout> k, int d, int key, uint32_t (&b)[4]) {
    if constexpr (KLayout::transposed) {  // padded keys read the last real key's stored row
      dev::detail::load_stored_b<typename KLayout::Stored, T, kPadded ? kRealKeys : 0,
                                 kPaddedDepth ? kRealDepth : 0>(k.data, key, d, b[0], b[1], b[2], b[3]);
    } else if constexpr (kPadded || kPaddedDepth) {  // a chunk of padded keys reads the last real chunk (its
                                                     // scores are −∞)
      const int column = key + (lane() / 16) * 8;
      const int row = d + lane() % 16;
      const T* address = k.data + KLayout::element_offset(kPaddedDepth && row >= kRealDepth ? kRealDepth - 1 : row,
                                                          !kPadded || column < kLastKeyChunk ? column
                                                                                             : kLastKeyChunk);
      cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(address), b[0], b[1], b[2], b[3]);
    } else {
      cute::SM75_U16x8_LDSM_T::copy(softmax_detail::fragment_row<KLayout>(k.data, d, key), b[0], b[1], b[2],
                                    b[3]);
    }
    if constexpr (kPaddedDepth) {
      if (d + 16 > kRealDepth) b[1] = b[3] = 0u;
    }
  }

  // score[t][j] = Q[16 row_tile(t) : +16, :] · K[:, key0 + 8 j : key0 + 8 j + 8]: each K fragment
  // loaded once for all of the warp's row tiles
  static MIRAGE_DEVICE void scores(dev::SharedTile<T, QLayout> q, dev::SharedTile<T, KLayout> k, int key0,
                                   float (&score)[kTilesPerWarp][kKeyTiles][4]) {
    clear(score);
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t a[kTilesPerWarp][4];
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) load_q(q, t, k0, a[t]);
#pragma unroll
      for (int j = 0; j < kKeyTiles; j += 2) {
        uint32_t b[4];
        load_k(k, k0, key0 + j * 8, b);
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) {
          mma(score[t][j], a[t], b[0], b[1]);
          mma(score[t][j + 1], a[t], b[2], b[3]);
        }
      }
    }
  }

  // The warpgroup form of scores: a wgmma per 64-row tile, 64 keys and 16 of D, Q read from its
  // swizzled tile through descriptors, or from registers (its fragments of every k-step first: a
  // wgmma reads them while the next ones issue).
  // `meanwhile` runs between their issue and the wait (it must not touch the scores).
  template <bool Pending, class Meanwhile>
  static MIRAGE_DEVICE void warpgroup_scores(State& state, dev::SharedTile<T, QLayout> q,
                                             dev::SharedTile<T, KLayout> k, int key0,
                                             float (&score)[kTilesPerWarp][kKeyTiles][4], Meanwhile meanwhile) {
    QOperand a[kTilesPerWarp][D / 16];
    q_operands(q, a);
    if constexpr (Turn::kScores) Turn::take(warp() / 4);
    issue_scores(a, k, key0, score);
    if constexpr (Pending) {  // the last sub-tile's P·V behind these; wait for the scores only
      wgmma::fence(state.out);
      wgmma::fence(state.p);
      cute::warpgroup_arrive();
      issue_values(state, state.p, state.v, state.key0);
      wgmma::fence(state.out);
      wgmma::fence(state.p);
      if constexpr (Turn::kScores) Turn::pass(warp() / 4);
      meanwhile();
      cute::warpgroup_wait<1>();
    } else {
      if constexpr (Turn::kScores) Turn::pass(warp() / 4);
      meanwhile();
      cute::warpgroup_wait<0>();
    }
    wgmma::fence(score);
    if constexpr (!kQDescriptors) wgmma::fence(a);  // read by the products until the wait
  }

  // Q·K's A operands: a descriptor per 64-row tile and 16 of D into Q's swizzled tile, or Q's fragments
  static constexpr bool kQDescriptors = QLayout::swizzled && !kQFragments;
  using QOperand = std::conditional_t<kQDescriptors, uint64_t, uint32_t[4]>;
  static MIRAGE_DEVICE void q_operands(dev::SharedTile<T, QLayout> q, QOperand (&a)[kTilesPerWarp][D / 16]) {
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
      for (int d = 0; d < D / 16; ++d) {
        if constexpr (kQDescriptors) {
          a[t][d] = wgmma::wgmma_descriptor<QLayout, true, kWholeDescriptors>(q.data, row_tile(t) / 4 * 64, d * 16);
        } else {
          load_q(q, t, d * 16, a[t][d]);
        }
      }
  }

  // Q·K's warpgroup MMAs of the sub-tile at key0 as one batch, not waited for: a wgmma per 64-row
  // tile, 64 keys and 16 of D (the key blocks' accumulators are independent: alternated)
  static MIRAGE_DEVICE void issue_scores(const QOperand (&a)[kTilesPerWarp][D / 16], dev::SharedTile<T, KLayout> k,
                                         int key0, float (&score)[kTilesPerWarp][kKeyTiles][4]) {
    cute::warpgroup_arrive();
    if constexpr ((MIRAGE_PROBE_CHAIN & 1) != 0) {
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
        for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) asm volatile("mov.b32 %0, 0;" : "=f"(score[t][j][e]));
    } else {
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
        for (int d = 0; d < D / 16; ++d)
#pragma unroll
          for (int b = 0; b < kSubKeys / 64; ++b)
            wgmma::wgmma64<T, KLayout::transposed>(
                *reinterpret_cast<float(*)[8][4]>(&score[t][8 * b]), a[t][d],
                wgmma::b_descriptor<KLayout, kWholeDescriptors>(k.data, d * 16, key0 + 64 * b), d > 0);
    }
    cute::warpgroup_commit_batch();
  }

  // kLookahead's step: each sub-tile's Q·K issued before the softmax of the one before it; the wait at
  // the end of that softmax (for its P·V) covers it, so the tensor cores run it meanwhile
  static MIRAGE_DEVICE void step_ahead(State& state, dev::SharedTile<T, QLayout> q, dev::SharedTile<T, KLayout> k,
                                       dev::SharedTile<T, VLayout> v, int key0) {
    constexpr int kSubs = kKeys / kSubKeys;
    QOperand a[kTilesPerWarp][D / 16];
    q_operands(q, a);
    float score[2][kTilesPerWarp][kKeyTiles][4];
    Turn::take(warp() / 4);  // (without turns, empty)
    issue_scores(a, k, key0, score[0]);
    Turn::pass(warp() / 4);
    cute::warpgroup_wait<0>();
    wgmma::fence(score[0]);
#pragma unroll
    for (int sub = 0; sub < kSubs; ++sub) {
      Turn::take(warp() / 4);  // with kSpan, passed in in_step_values
      if (sub + 1 < kSubs) issue_scores(a, k, key0 + (sub + 1) * kSubKeys, score[(sub + 1) % 2]);
      if constexpr (Turn::kScores) Turn::pass(warp() / 4);
      float offset[kTilesPerWarp][2];
      float factor[kTilesPerWarp][2];
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) rescale(state, t, score[sub % 2][t], offset[t], factor[t]);
      in_step_values(state, score[sub % 2], offset, factor, v, key0 + sub * kSubKeys);
      wgmma::fence(score[(sub + 1) % 2]);  // the next scores, complete at that wait
    }
    if constexpr (!kQDescriptors) wgmma::fence(a);
  }

  // The deferred form's P·V of a sub-tile: every wgmma of out += P · V[key0 : key0 + kSubKeys, :]
  // as one batch (after a warpgroup_arrive), not waited for.
  using DeferredP = uint32_t[kDeferred ? kKeyTiles / 2 : 1][kTilesPerWarp][4];
  static MIRAGE_DEVICE void issue_values(State& state, const DeferredP& p, const T* v, int key0) {
#pragma unroll
    for (int kk = 0; kk < kKeyTiles / 2; ++kk)
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
        for (int b = 0; b < E / 64; ++b)
          wgmma::wgmma64<T>(*reinterpret_cast<float(*)[8][4]>(&state.out[t][8 * b]), p[kk][t],
                                     wgmma::wgmma_descriptor<VLayout, false, kWholeDescriptors>(v, key0 + kk * 16, 64 * b), true);
    cute::warpgroup_commit_batch();
  }

  // out[t] += P[t][:, 16 kk : 16 kk + 16] · V[key0 + 16 kk : key0 + 16 kk + 16, :] for every row
  // tile t, P given as A fragments: each V fragment loaded once for all of them. In the warpgroup
  // form, one asynchronous batch of wgmmas (sub_step waits for them).
  static MIRAGE_DEVICE void accumulate_keys(State& state, const uint32_t (&a)[kTilesPerWarp][4],
                                            dev::SharedTile<T, VLayout> v, int key0, int kk) {
    if constexpr (kWarpgroup) {
      cute::warpgroup_arrive();
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
        for (int b = 0; b < E / 64; ++b) {
          if constexpr ((MIRAGE_PROBE_CHAIN & 2) != 0) {
            uint32_t p[4] = {a[t][0], a[t][1], a[t][2], a[t][3]};
            wgmma::fence(p);  // P computed, the product skipped
          } else {
            wgmma::wgmma64<T>(*reinterpret_cast<float(*)[8][4]>(&state.out[t][8 * b]), a[t],
                              wgmma::wgmma_descriptor<VLayout, false, kWholeDescriptors>(v.data, key0 + kk * 16, 64 * b), true);
          }
        }
      cute::warpgroup_commit_batch();
    } else {
      const int key = key0 + kk * 16 + lane() % 16;  // a padded key reads the last real row (P is 0)
      const T* row = v.data + (kPadded && key >= kRealKeys ? kRealKeys - 1 : key) * VLayout::pitch;
#pragma unroll
      for (int j = 0; j + 1 < kOutTiles; j += 2) {
        uint32_t b[4];
        cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(row + j * 8 + (lane() / 16) * 8),
                                      b[0], b[1], b[2], b[3]);
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) {
          mma(state.out[t][j], a[t], b[0], b[1]);
          mma(state.out[t][j + 1], a[t], b[2], b[3]);
        }
      }
      if constexpr (kOutTiles % 2 == 1) {  // a head dim of no whole 16 (40): its last 8 columns alone
        uint32_t b[2];
        cute::SM75_U16x4_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(row + (kOutTiles - 1) * 8), b[0],
                                      b[1]);
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) mma(state.out[t][kOutTiles - 1], a[t], b[0], b[1]);
      }
    }
  }

  static MIRAGE_DEVICE void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    Mma::fma(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3], b0, b1, c[0], c[1], c[2], c[3]);
  }
};

}  // namespace mirage::gen
