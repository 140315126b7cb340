// QKNorm's per-key factors computed by the online-softmax chain from its own K fragments (KeyNorms,
// gen/softmax.cuh): each key's sum of squares from Kᵀ·K on the tensor cores (the fragments a warp loads
// for Q·K are, reordered, Kᵀ's A fragments), its factor, and each product times its key's factor
// before the row maxima. `C` is the chain (OnlineSoftmax), complete where these are called.
#pragma once

#include "softmax_columns.cuh"
#include "softmax_detail.cuh"

namespace mirage::gen {

template <class C>
struct ChainKeyNorms {
  // The scores of per-key factors computed from K itself (KeyNorms), kNormKeys keys at a time: over
  // all of D for those keys, so that Kᵀ·K's accumulators live for kNormKeys keys only, with the
  // products of different keys (independent accumulators) interleaved in each step of D
  // (softmax_detail::accumulate_key_squares runs Kᵀ·K on the K fragments loaded for Q·K).
  // MIRAGE_SOFTMAX_NORM_KEYS where it divides the sub-tile's keys, else 16 (a sub-tile of 48 keys)
  static constexpr int kNormKeys = C::kSubKeys % MIRAGE_SOFTMAX_NORM_KEYS == 0 ? MIRAGE_SOFTMAX_NORM_KEYS : 16;
  static_assert(MIRAGE_SOFTMAX_NORM_KEYS == 16 || MIRAGE_SOFTMAX_NORM_KEYS == 32,
                "key norms are gathered onto one lane a key: 16 or 32 keys at a time");
  static_assert(C::kSubKeys % kNormKeys == 0, "a sub-tile is whole chunks of kNormKeys keys");
  static MIRAGE_DEVICE void scaled_scores(typename C::QTile q, typename C::KTile k, int key0,
                                          float (&score)[C::kTilesPerWarp][C::kKeyTiles][4]) {
    using Factor = typename KeyFactor<typename C::ColumnOp>::type;
    constexpr int kPairs = kNormKeys / 16;  // 16-key fragments per chunk
    C::clear(score);
#pragma unroll
    for (int first = 0; first < C::kKeyTiles; first += 2 * kPairs) {
      float squares[kPairs][2][4] = {};
#pragma unroll
      for (int d = 0; d < C::D / 16; ++d) {
        uint32_t a[C::kTilesPerWarp][4];
#pragma unroll
        for (int t = 0; t < C::kTilesPerWarp; ++t) C::load_q(q, t, d * 16, a[t]);
#pragma unroll
        for (int p = 0; p < kPairs; ++p) {
          const int j = first + 2 * p;
          uint32_t b[4];
          C::load_k(k, d * 16, key0 + j * 8, b);
#pragma unroll
          for (int t = 0; t < C::kTilesPerWarp; ++t) {
            C::mma(score[t][j], a[t], b[0], b[1]);
            C::mma(score[t][j + 1], a[t], b[2], b[3]);
          }
          softmax_detail::accumulate_key_squares<typename C::Mma>(b, squares[p]);
        }
      }
      // key n's factor computed once on lane n, then shuffled to the lanes whose columns it scales
      const float factor_of_lane = Factor{}(softmax_detail::gather_key_sums<kNormKeys>(squares, C::lane()));
#pragma unroll
      for (int tile = 0; tile < 2 * kPairs; ++tile) {
        float factor[2];
#pragma unroll
        for (int c = 0; c < 2; ++c)
          factor[c] = __shfl_sync(0xffffffffu, factor_of_lane, tile * 8 + (C::lane() % 4) * 2 + c);
#pragma unroll
        for (int t = 0; t < C::kTilesPerWarp; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) score[t][first + tile][e] *= factor[e % 2];
      }
    }
  }

  // The warpgroup form's key norms: warp w of a warpgroup sums keys w · kWarpKeys … of the sub-tile
  // (Kᵀ·K by mma.sync on K's fragments, ldmatrix from the swizzled tile), its lanes write their keys'
  // factors into the warpgroup's buffer of the scratch, and after a barrier of the warpgroup's 128
  // threads every thread reads the factors of its columns (keys 8 j + 2 (lane % 4), + 1). Two buffers
  // by turns: a buffer is written again only after every warp of the warpgroup passed the next
  // sub-tile's barrier, which each reaches after reading it.
  static constexpr int kWarpKeys = C::kWarpgroup ? C::kSubKeys / 4 : 16;
  static MIRAGE_DEVICE void key_squares(typename C::KTile k, int key0,
                                        float (&squares)[kWarpKeys / 16][2][4]) {
    const int first = key0 + (C::warp() % 4) * kWarpKeys;
#pragma unroll
    for (int p = 0; p < kWarpKeys / 16; ++p)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) squares[p][h][e] = 0.0f;
#pragma unroll
    for (int d = 0; d < C::D / 16; ++d)
#pragma unroll
      for (int p = 0; p < kWarpKeys / 16; ++p) {
        uint32_t b[4];
        C::load_k(k, d * 16, first + 16 * p, b);
        softmax_detail::accumulate_key_squares<typename C::Mma>(b, squares[p]);
      }
  }

  static MIRAGE_DEVICE void trade_key_factors(typename C::State& state, typename C::ColumnOp columns,
                                              const float (&squares)[kWarpKeys / 16][2][4],
                                              float (&factor)[C::kKeyTiles][2]) {
    using Factor = typename KeyFactor<typename C::ColumnOp>::type;
    const float own = Factor{}(softmax_detail::gather_key_sums<kWarpKeys>(squares, C::lane()));
    state.parity ^= 1;
    float* buffer = columns.scratch + (state.parity * (C::kWarps / 4) + C::warp() / 4) * C::kSubKeys;
    if (C::lane() < kWarpKeys) buffer[(C::warp() % 4) * kWarpKeys + C::lane()] = own;
    softmax_detail::warpgroup_barrier<C::kWarps / 4>(C::warp() / 4);
#pragma unroll
    for (int j = 0; j < C::kKeyTiles; ++j) {
      const float2 pair = *reinterpret_cast<const float2*>(buffer + 8 * j + (C::lane() % 4) * 2);
      factor[j][0] = pair.x;
      factor[j][1] = pair.y;
    }
  }
};

}  // namespace mirage::gen
