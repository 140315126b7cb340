// Matmul of shared-memory tiles: C[M, N] (+)= A[M, K] · B[K, N], fp32 accumulation.
//
// A is stored row-major (K contiguous) and B row-major (N contiguous); leading dims of the
// layouts are folded into rows. Two implementations with one interface:
//
//   using Mm = Matmul<half, ALayout, BLayout, NumThreads>;   // picks one of the two below
//   typename Mm::Accumulator acc;  acc.clear();             // fp32 registers
//   Mm::run(acc, a_tile, b_tile);                           // acc += A · B (every thread calls)
//   Mm::write_back(acc, c_tile, epilogue);                  // C = epilogue(acc)
//   Mm::accumulate_into(acc, c_tile, epilogue);             // C += epilogue(acc)
//   Mm::rescale_rows(acc, scale_tile);                      // acc[m][:] *= scale[m]
//   Mm::for_each(acc, [](int m, int n, float& value) {...});
//
// Keeping `acc` alive across the forloop keeps the matmul accumulator in registers.
//
// TensorCoreMatmul: warp-level mma.sync through CuTe's SM80 atoms (HMMA in SASS):
// m16n8k16 for fp16/bf16 with ldmatrix (LDSM) fragment loads, m16n8k8 TF32 for fp32. Warps tile
// the output as WarpsM x WarpsN (chosen at compile time); needs N % 8 == 0, K % 16 (fp16, bf16)
// or % 8 (fp32), and 16-byte aligned rows for ldmatrix. M is padded to a multiple of 16: the
// missing rows of A are read as copies of its last row and their results are never written, so
// a GEMV-like tile (M = 1 ... 15) still runs on tensor cores.
// SimtMatmul: one thread per output element, fp32 FMA; for tiny or odd shapes.
#pragma once

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <type_traits>

#include "elementwise.cuh"

namespace mirage::dev {

namespace detail {

struct WarpGrid {
  int m;
  int n;
};

// The warp grid that uses the most warps, then loads the fewest operand rows per warp.
constexpr WarpGrid choose_warp_grid(int rows, int cols, int warps, int atom_m, int atom_n) {
  WarpGrid best{0, 0};
  int best_cost = 0;
  for (int wm = 1; wm <= warps; ++wm) {
    for (int wn = 1; wm * wn <= warps; ++wn) {
      if (rows % (atom_m * wm) != 0 || cols % (atom_n * wn) != 0) continue;
      const int cost = rows / wm + cols / wn;
      const int used = wm * wn;
      if (used > best.m * best.n || (used == best.m * best.n && cost < best_cost)) {
        best = WarpGrid{wm, wn};
        best_cost = cost;
      }
    }
  }
  return best;
}

MIRAGE_DEVICE uint32_t to_tf32(float value) {
  uint32_t result;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(result) : "f"(value));
  return result;
}

template <class T>
struct MmaAtom;

template <>
struct MmaAtom<__half> {
  using Operation = cute::SM80_16x8x16_F32F16F16F32_TN;
  static constexpr int kK = 16;
  static constexpr bool kLdmatrix = true;
};

template <>
struct MmaAtom<__nv_bfloat16> {
  using Operation = cute::SM80_16x8x16_F32BF16BF16F32_TN;
  static constexpr int kK = 16;
  static constexpr bool kLdmatrix = true;
};

template <>
struct MmaAtom<float> {
  using Operation = cute::SM80_16x8x8_F32TF32TF32F32_TN;
  static constexpr int kK = 8;
  static constexpr bool kLdmatrix = false;
};

}  // namespace detail

template <class T, class ALayout, class BLayout, int NumThreads>
struct TensorCoreMatmul {
  using Atom = detail::MmaAtom<T>;
  static constexpr int M = ALayout::rows;
  static constexpr int K = ALayout::cols;
  static constexpr int N = BLayout::cols;
  static constexpr int kWarps = NumThreads / kWarpSize;
  // M rounded up to whole 16-row atoms.
  static constexpr int kRows = round_up(M, 16);
  static constexpr detail::WarpGrid kGrid = detail::choose_warp_grid(kRows, N, kWarps, 16, 8);
  static constexpr bool kAlignedRows = !Atom::kLdmatrix || ((ALayout::pitch * sizeof(T)) % kVectorBytes == 0 &&
                                                            (BLayout::pitch * sizeof(T)) % kVectorBytes == 0);
  static constexpr bool kSupported =
      BLayout::rows == K && kGrid.m > 0 && K % Atom::kK == 0 && kAlignedRows && NumThreads % kWarpSize == 0;
  static constexpr int kWarpsM = kGrid.m > 0 ? kGrid.m : 1;
  static constexpr int kWarpsN = kGrid.n > 0 ? kGrid.n : 1;
  static constexpr int kTilesM = kRows / (16 * kWarpsM) > 0 ? kRows / (16 * kWarpsM) : 1;
  static constexpr int kTilesN = N / (8 * kWarpsN) > 0 ? N / (8 * kWarpsN) : 1;

  struct Accumulator {
    float value[kTilesM][kTilesN][4];
    MIRAGE_DEVICE void clear() {
#pragma unroll
      for (int i = 0; i < kTilesM; ++i)
#pragma unroll
        for (int j = 0; j < kTilesN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) value[i][j][e] = 0.0f;
    }
  };

  static MIRAGE_DEVICE int warp() { return thread_index() / kWarpSize; }
  static MIRAGE_DEVICE int lane() { return thread_index() % kWarpSize; }
  static MIRAGE_DEVICE bool active() { return warp() < kWarpsM * kWarpsN; }
  static MIRAGE_DEVICE int warp_row() { return (warp() % kWarpsM) * (kRows / kWarpsM); }
  // A row of A to read: padding rows read the last real row.
  static MIRAGE_DEVICE int a_row(int row) { return M % 16 == 0 ? row : min(row, M - 1); }
  static MIRAGE_DEVICE int warp_col() { return (warp() / kWarpsM) * (N / kWarpsN); }

  static MIRAGE_DEVICE void run(Accumulator& acc, SharedTile<T, ALayout> a, SharedTile<T, BLayout> b) {
    static_assert(kSupported, "shape not supported by tensor cores: use SimtMatmul (or Matmul)");
    if (!active()) return;
#pragma unroll 2
    for (int k0 = 0; k0 < K; k0 += Atom::kK) {
      uint32_t a_fragment[kTilesM][4];
      uint32_t b_fragment[kTilesN][2];
      load_a(a, k0, a_fragment);
      load_b(b, k0, b_fragment);
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
#pragma unroll
        for (int j = 0; j < kTilesN; ++j) {
          float* c = acc.value[i][j];
          Atom::Operation::fma(c[0], c[1], c[2], c[3], a_fragment[i][0], a_fragment[i][1], a_fragment[i][2],
                               a_fragment[i][3], b_fragment[j][0], b_fragment[j][1], c[0], c[1], c[2], c[3]);
        }
      }
    }
  }

  // f(row, col, value&) for every accumulator element this thread holds.
  template <class Function>
  static MIRAGE_DEVICE void for_each(Accumulator& acc, Function function) {
    if (!active()) return;
    const int group = lane() / 4;
    const int pair = (lane() % 4) * 2;
#pragma unroll
    for (int i = 0; i < kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp_row() + i * 16 + group + (e / 2) * 8;
          if (M % 16 == 0 || row < M) function(row, warp_col() + j * 8 + pair + e % 2, acc.value[i][j][e]);
        }
  }

  // f(row, col, value0&, value1&) for every pair of accumulator elements (row, col), (row, col + 1)
  // this thread holds (col even): a fragment's elements come in such pairs.
  template <class Function>
  static MIRAGE_DEVICE void for_each_pair(Accumulator& acc, Function function) {
    if (!active()) return;
    const int group = lane() / 4;
    const int pair = (lane() % 4) * 2;
#pragma unroll
    for (int i = 0; i < kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = warp_row() + i * 16 + group + half * 8;
          float* values = acc.value[i][j] + 2 * half;
          if (M % 16 == 0 || row < M) function(row, warp_col() + j * 8 + pair, values[0], values[1]);
        }
  }

  // acc[m][:] *= factor(m), calling factor once per row this thread holds.
  template <class RowFactor>
  static MIRAGE_DEVICE void scale_rows(Accumulator& acc, RowFactor factor) {
    if (!active()) return;
    const int group = lane() / 4;
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
      const int row = warp_row() + i * 16 + group;
      const float upper = (M % 16 == 0 || row < M) ? factor(row) : 1.0f;
      const float lower = (M % 16 == 0 || row + 8 < M) ? factor(row + 8) : 1.0f;
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        acc.value[i][j][0] *= upper;
        acc.value[i][j][1] *= upper;
        acc.value[i][j][2] *= lower;
        acc.value[i][j][3] *= lower;
      }
    }
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  static MIRAGE_DEVICE void write_back(Accumulator& acc, SharedTile<Out, OutLayout> c, Epilogue epilogue = {}) {
    static_assert(OutLayout::rows == M && OutLayout::cols == N, "the output tile must be M x N");
    for_each(acc, [&](int row, int col, float& value) {
      c.data[row * OutLayout::pitch + col] = from_float<Out>(epilogue(value));
    });
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  static MIRAGE_DEVICE void accumulate_into(Accumulator& acc, SharedTile<Out, OutLayout> c, Epilogue epilogue = {}) {
    static_assert(OutLayout::rows == M && OutLayout::cols == N, "the output tile must be M x N");
    for_each(acc, [&](int row, int col, float& value) {
      Out& target = c.data[row * OutLayout::pitch + col];
      target = from_float<Out>(to_float(target) + epilogue(value));
    });
  }

  // acc[m][n] *= scale[m] for a tile `scale` of M rows and one column.
  template <class S, class ScaleLayout>
  static MIRAGE_DEVICE void rescale_rows(Accumulator& acc, SharedTile<S, ScaleLayout> scale) {
    static_assert(ScaleLayout::rows == M && ScaleLayout::cols == 1, "the scale tile must be M x 1");
    for_each(acc, [&](int row, int, float& value) { value *= to_float(scale.data[row * ScaleLayout::pitch]); });
  }

 private:
  static MIRAGE_DEVICE void load_a(SharedTile<T, ALayout> a, int k0, uint32_t (&fragment)[kTilesM][4]) {
    if constexpr (Atom::kLdmatrix) {
      const int row = warp_row() + lane() % 16;
      const int col = k0 + (lane() / 16) * 8;
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
        const T* address = a.data + a_row(row + i * 16) * ALayout::pitch + col;
        cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(address), fragment[i][0],
                                      fragment[i][1], fragment[i][2], fragment[i][3]);
      }
    } else {
      const int row = warp_row() + lane() / 4;
      const int col = k0 + lane() % 4;
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
        const float* upper = a.data + a_row(row + i * 16) * ALayout::pitch + col;
        const float* lower = a.data + a_row(row + i * 16 + 8) * ALayout::pitch + col;
        fragment[i][0] = detail::to_tf32(upper[0]);
        fragment[i][1] = detail::to_tf32(lower[0]);
        fragment[i][2] = detail::to_tf32(upper[4]);
        fragment[i][3] = detail::to_tf32(lower[4]);
      }
    }
  }

  static MIRAGE_DEVICE void load_b(SharedTile<T, BLayout> b, int k0, uint32_t (&fragment)[kTilesN][2]) {
    if constexpr (Atom::kLdmatrix) {
      const int row = k0 + lane() % 16;
      const int col = warp_col() + (lane() / 16) * 8;
#pragma unroll
      for (int j = 0; j + 1 < kTilesN; j += 2) {
        const T* address = b.data + row * BLayout::pitch + col + j * 8;
        cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(address), fragment[j][0],
                                      fragment[j][1], fragment[j + 1][0], fragment[j + 1][1]);
      }
      if constexpr (kTilesN % 2 == 1) {
        const T* address = b.data + row * BLayout::pitch + warp_col() + (kTilesN - 1) * 8;
        cute::SM75_U16x4_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(address), fragment[kTilesN - 1][0],
                                      fragment[kTilesN - 1][1]);
      }
    } else {
      const int row = k0 + lane() % 4;
      const int col = warp_col() + lane() / 4;
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        const float* base = b.data + row * BLayout::pitch + col + j * 8;
        fragment[j][0] = detail::to_tf32(base[0]);
        fragment[j][1] = detail::to_tf32(base[4 * BLayout::pitch]);
      }
    }
  }
};

template <class T, class ALayout, class BLayout, int NumThreads>
struct SimtMatmul {
  static constexpr int M = ALayout::rows;
  static constexpr int K = ALayout::cols;
  static constexpr int N = BLayout::cols;
  static_assert(BLayout::rows == K, "A is M x K and B is K x N");
  static constexpr bool kSupported = true;
  static constexpr int kRounds = ceil_div(M * N, NumThreads);

  struct Accumulator {
    float value[kRounds];
    MIRAGE_DEVICE void clear() {
#pragma unroll
      for (int round = 0; round < kRounds; ++round) value[round] = 0.0f;
    }
  };

  static MIRAGE_DEVICE int output(int round) { return thread_index() + round * NumThreads; }
  static MIRAGE_DEVICE bool owns(int round) { return (M * N) % NumThreads == 0 || output(round) < M * N; }

  static MIRAGE_DEVICE void run(Accumulator& acc, SharedTile<T, ALayout> a, SharedTile<T, BLayout> b) {
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      if (!owns(round)) continue;
      const int row = output(round) / N;
      const int col = output(round) % N;
      float sum = acc.value[round];
      for (int k = 0; k < K; ++k)
        sum = fmaf(to_float(a.data[row * ALayout::pitch + k]), to_float(b.data[k * BLayout::pitch + col]), sum);
      acc.value[round] = sum;
    }
  }

  template <class Function>
  static MIRAGE_DEVICE void for_each(Accumulator& acc, Function function) {
#pragma unroll
    for (int round = 0; round < kRounds; ++round)
      if (owns(round)) function(output(round) / N, output(round) % N, acc.value[round]);
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  static MIRAGE_DEVICE void write_back(Accumulator& acc, SharedTile<Out, OutLayout> c, Epilogue epilogue = {}) {
    static_assert(OutLayout::rows == M && OutLayout::cols == N, "the output tile must be M x N");
    for_each(acc, [&](int row, int col, float& value) {
      c.data[row * OutLayout::pitch + col] = from_float<Out>(epilogue(value));
    });
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  static MIRAGE_DEVICE void accumulate_into(Accumulator& acc, SharedTile<Out, OutLayout> c, Epilogue epilogue = {}) {
    static_assert(OutLayout::rows == M && OutLayout::cols == N, "the output tile must be M x N");
    for_each(acc, [&](int row, int col, float& value) {
      Out& target = c.data[row * OutLayout::pitch + col];
      target = from_float<Out>(to_float(target) + epilogue(value));
    });
  }

  template <class S, class ScaleLayout>
  static MIRAGE_DEVICE void rescale_rows(Accumulator& acc, SharedTile<S, ScaleLayout> scale) {
    static_assert(ScaleLayout::rows == M && ScaleLayout::cols == 1, "the scale tile must be M x 1");
    for_each(acc, [&](int row, int, float& value) { value *= to_float(scale.data[row * ScaleLayout::pitch]); });
  }

  // acc[m][:] *= factor(m) (one output per thread and round: a call per element).
  template <class RowFactor>
  static MIRAGE_DEVICE void scale_rows(Accumulator& acc, RowFactor factor) {
    for_each(acc, [&](int row, int, float& value) { value *= factor(row); });
  }
};

// Tensor cores when the shape allows it, SIMT otherwise.
template <class T, class ALayout, class BLayout, int NumThreads>
using Matmul = std::conditional_t<TensorCoreMatmul<T, ALayout, BLayout, NumThreads>::kSupported,
                                  TensorCoreMatmul<T, ALayout, BLayout, NumThreads>,
                                  SimtMatmul<T, ALayout, BLayout, NumThreads>>;

}  // namespace mirage::dev
