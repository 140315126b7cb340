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
// the output as WarpsM x WarpsN (chosen at compile time); needs 16-byte aligned rows for ldmatrix,
// and N % 8 == 0 and K % 16 (fp16, bf16) or % 8 (fp32), except where the CUDA cores would compute
// more than kMaxSimtRounds outputs a thread: then N and K are padded (see kPadded). M is padded to
// a multiple of 16: the missing rows of A are read as copies of its last row and their results are
// never written, so a GEMV-like tile (M = 1 ... 15) still runs on tensor cores. Its last template argument picks
// the warp grid: DefaultWarpGrid (the most warps), SplitKWarpGrid (warp groups also split K where
// a cost model expects it to pay: weight-streaming tiles with few output tiles per warp and long
// dependent HMMA chains; write_back then adds the groups' partial sums through C's memory, with
// barriers), or FixedWarpGrid<WarpsM, WarpsN, WarpsK>.
// SimtMatmul: one thread per output element, fp32 FMA; for tiny or odd shapes.
#pragma once

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/mma_sm80.hpp>
#include <type_traits>

#include "elementwise.cuh"

namespace mirage::dev {

namespace detail {

// The warps of a tensor-core matmul: m x n warps tile the output; k groups of such m x n warps
// split the K range, each group's accumulators holding a partial sum (k = 1: no split).
struct WarpGrid {
  int m;
  int n;
  int k;
};

// The warp grid that uses the most warps, then loads the fewest operand rows per warp (no K split).
constexpr WarpGrid choose_warp_grid(int rows, int cols, int warps, int atom_m, int atom_n) {
  WarpGrid best{0, 0, 1};
  int best_cost = 0;
  for (int wm = 1; wm <= warps; ++wm) {
    for (int wn = 1; wm * wn <= warps; ++wn) {
      if (rows % (atom_m * wm) != 0 || cols % (atom_n * wn) != 0) continue;
      const int cost = rows / wm + cols / wn;
      const int used = wm * wn;
      if (used > best.m * best.n || (used == best.m * best.n && cost < best_cost)) {
        best = WarpGrid{wm, wn, 1};
        best_cost = cost;
      }
    }
  }
  return best;
}

// N as a padded product computes it (TensorCoreMatmul::kPadded): rounded up to whole n8 atoms, or
// further where that lets more warps share the output (a prime number of n8 atoms, 25 for N = 200
// over 80 rows, would leave all but one warp of a row of warps idle).
constexpr int padded_cols(int rows, int cols, int warps) {
  int best = round_up(cols, 8);
  WarpGrid grid = choose_warp_grid(rows, best, warps, 16, 8);
  int best_used = grid.m * grid.n;
  for (int w = 2; w <= warps; w *= 2) {
    const int padded = round_up(cols, 8 * w);
    grid = choose_warp_grid(rows, padded, warps, 16, 8);
    if (grid.m * grid.n > best_used) {
      best = padded;
      best_used = grid.m * grid.n;
    }
  }
  return best;
}

// A model of one run() of an m16n8 tensor-core matmul on one SM, in cycles, to decide on a K
// split. Three bounds: a warp's HMMAs into one accumulator tile form a dependent chain (one link
// per k-step; the tiles a warp owns are independent chains); the warps of one sub-partition share
// its tensor pipe; all warps share the shared-memory bandwidth that the ldmatrix fragment loads
// use. The estimate is the largest bound plus a quarter of the two others (overlap is not
// perfect), plus the split's write-back, k − 1 barriered rounds once per accumulator lifetime,
// spread over kCallsPerWriteBack runs (the for-loops that keep accumulators in registers run
// 8–32 iterations in the benchmark families). Latency and issue figures: mma.sync m16n8k16 with
// fp32 accumulation on sm_80–sm_90 (about 1/8 HMMA per cycle per sub-partition at peak).
struct MmaCostModel {
  static constexpr int kLatency = 32;          // cycles from an HMMA to the HMMA that reads its result
  static constexpr int kIssue = 8;             // cycles between two HMMAs of one sub-partition
  static constexpr int kSubPartitions = 4;     // warp schedulers (and tensor pipes) per SM
  static constexpr int kSharedBytesPerCycle = 128;
  static constexpr int kWriteBackRoundCycles = 100;  // a barrier, a shared load and store per round
  static constexpr int kCallsPerWriteBack = 8;

  // grid: the warps; rows (a multiple of 16), cols (of 8); k_steps: atoms along K; step_bytes: bytes
  // of one atom's K extent of one operand row (16 · 2 for fp16 and bf16, 8 · 4 for TF32).
  static constexpr int cycles(WarpGrid grid, int rows, int cols, int k_steps, int step_bytes) {
    const int tiles_m = rows / (16 * grid.m);
    const int tiles_n = cols / (8 * grid.n);
    const int steps = ceil_div(k_steps, grid.k);
    const int warps = grid.m * grid.n * grid.k;
    const int chain = steps * kLatency;
    const int tensor_pipe = ceil_div(warps, kSubPartitions) * tiles_m * tiles_n * steps * kIssue;
    const int fragment_bytes = warps * steps * (tiles_m * 16 + tiles_n * 8) * step_bytes;
    const int shared = ceil_div(fragment_bytes, kSharedBytesPerCycle);
    const int pair = chain > tensor_pipe ? chain : tensor_pipe;
    const int largest = pair > shared ? pair : shared;
    const int write_back = (grid.k - 1) * kWriteBackRoundCycles / kCallsPerWriteBack;
    return largest + (chain + tensor_pipe + shared - largest) / 4 + write_back;
  }
};

// A split's accumulators stay live through the whole for-loop, beside what the rest of the kernel
// keeps there, of which the input iterators' copies are the part a matmul can see: registers that
// remain after kRegistersPerCopyChunk per 16-byte chunk of its operand tiles that a thread copies
// per stage; the split's accumulator values may take an eighth of them (31 values at 256 threads
// and few chunks, 16 at 512 threads).
struct RegisterBudget {
  static constexpr int kRegistersPerSm = 65536;  // 32-bit registers per SM (sm_80 … sm_90)
  static constexpr int kMaxRegistersPerThread = 255;
  static constexpr int kRegistersPerCopyChunk = 3;  // a source offset (64-bit) and a target offset

  static constexpr int split_values(int warps, int copy_chunks) {
    const int registers = kRegistersPerSm / (warps * kWarpSize);
    const int left = (registers < kMaxRegistersPerThread ? registers : kMaxRegistersPerThread) -
                     kRegistersPerCopyChunk * copy_chunks;
    return left > 0 ? left / 8 : 0;
  }
};

// What the choice of a warp grid with a K split looks at.
struct SplitQuery {
  int rows;         // M rounded up to whole 16-row atoms
  int cols;         // N
  int k_steps;      // atoms along K, every product of the accumulator together
  int warps;        // of the block
  int batch;        // fragments a thread holds per output tile it owns (batched block matmuls)
  int step_bytes;   // of one atom's K extent of one operand row
  int copy_chunks;  // 16-byte chunks of the operand tiles one thread copies per stage
};

// The warp grid with a K split that MmaCostModel expects to be fastest; choose_warp_grid's when no
// split beats it. Ties: the smaller k (fewer partial sums to add), then the most warps. A split holds
// at most RegisterBudget::split_values accumulator values per thread (`batch` fragments each)
// unless the unsplit grid already holds more.
constexpr WarpGrid choose_split_warp_grid(SplitQuery q) {
  const WarpGrid base = choose_warp_grid(q.rows, q.cols, q.warps, 16, 8);
  if (base.m == 0 || q.k_steps < 2) return base;
  const int base_values = q.batch * (q.rows / (16 * base.m)) * (q.cols / (8 * base.n)) * 4;
  const int split_limit = RegisterBudget::split_values(q.warps, q.copy_chunks);
  const int value_limit = base_values > split_limit ? base_values : split_limit;
  WarpGrid best = base;
  int best_cycles = MmaCostModel::cycles(base, q.rows, q.cols, q.k_steps, q.step_bytes);
  for (int wk = 2; wk <= q.warps && wk <= q.k_steps; ++wk) {
    for (int wm = 1; wm * wk <= q.warps; ++wm) {
      for (int wn = 1; wm * wn * wk <= q.warps; ++wn) {
        if (q.rows % (16 * wm) != 0 || q.cols % (8 * wn) != 0) continue;
        if (q.batch * (q.rows / (16 * wm)) * (q.cols / (8 * wn)) * 4 > value_limit) continue;
        const WarpGrid grid{wm, wn, wk};
        const int estimate = MmaCostModel::cycles(grid, q.rows, q.cols, q.k_steps, q.step_bytes);
        const bool more_warps = wm * wn * wk > best.m * best.n * best.k;
        if (estimate < best_cycles || (estimate == best_cycles && wk == best.k && more_warps)) {
          best = grid;
          best_cycles = estimate;
        }
      }
    }
  }
  return best;
}

// Two packed 16-bit values times two others, each product rounded once to the type (HMUL2).
template <class T>
MIRAGE_DEVICE uint32_t multiply_pairs(uint32_t a, uint32_t b) {
  using Pair = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "16-bit pairs only");
  const Pair product = __hmul2(*reinterpret_cast<const Pair*>(&a), *reinterpret_cast<const Pair*>(&b));
  return *reinterpret_cast<const uint32_t*>(&product);
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

// B fragments of two n8 tiles (b0, b1 of columns n … n + 7, then b0, b1 of n + 8 … n + 15) over
// k … k + 15 from a tile stored transposed (dev::Transposed: stored rows are B's columns, K
// contiguous): ldmatrix .x4 without .trans, lanes 0-7 at columns n … n + 7 from k, 8-15 from k + 8,
// 16-31 the next 8 columns.
// With Rows and Length (a padded product: B's columns beyond Rows, its K beyond Length), each lane's
// stored row is clamped to the last real one and its 16-byte chunk to the last that starts in the
// row, so that no address leaves the tile; what those lanes read is masked or never written.
template <class Stored, class T, int Rows = 0, int Length = 0>
MIRAGE_DEVICE void load_stored_b(const T* data, int n, int k, uint32_t& b0, uint32_t& b1, uint32_t& b2,
                                 uint32_t& b3) {
  const int lane = thread_index() % kWarpSize;
  int row = n + (lane / 16) * 8 + lane % 8;
  int col = k + ((lane / 8) % 2) * 8;
  if constexpr (Rows > 0) row = min(row, Rows - 1);
  if constexpr (Length > 0) col = min(col, round_up(Length, 8) - 8);
  const T* address = data + Stored::element_offset(row, col);
  cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(address), b0, b1, b2, b3);
}

}  // namespace detail

// Warp grids of TensorCoreMatmul (its last template argument).
struct DefaultWarpGrid {};  // detail::choose_warp_grid: the most warps, no K split
struct SplitKWarpGrid {};   // detail::choose_split_warp_grid: a K split where the cost model expects a gain
template <int WarpsM, int WarpsN, int WarpsK>
struct FixedWarpGrid {};    // exactly this grid (the caller chose it, e.g. for several products)

namespace detail {

template <class Policy>
struct ResolveWarpGrid;

template <>
struct ResolveWarpGrid<DefaultWarpGrid> {
  static constexpr WarpGrid grid(SplitQuery q) { return choose_warp_grid(q.rows, q.cols, q.warps, 16, 8); }
};

template <>
struct ResolveWarpGrid<SplitKWarpGrid> {
  static constexpr WarpGrid grid(SplitQuery q) { return choose_split_warp_grid(q); }
};

template <int WarpsM, int WarpsN, int WarpsK>
struct ResolveWarpGrid<FixedWarpGrid<WarpsM, WarpsN, WarpsK>> {
  static constexpr WarpGrid grid(SplitQuery q) {
    // Groups may outnumber k-steps (a short product among several): the extra groups' sums stay 0.
    const bool valid = WarpsM >= 1 && WarpsN >= 1 && WarpsK >= 1 && WarpsM * WarpsN * WarpsK <= q.warps &&
                       q.rows % (16 * WarpsM) == 0 && q.cols % (8 * WarpsN) == 0;
    return valid ? WarpGrid{WarpsM, WarpsN, WarpsK} : WarpGrid{0, 0, 1};
  }
};

}  // namespace detail

// Outputs a thread computes at most on the CUDA cores (SimtMatmul; Python's
// tensor_cores.MAX_SIMT_ROUNDS): a product beyond it runs on tensor cores, padded where its shape needs.
inline constexpr int kMaxSimtRounds = 64;

// With a K split (kWarpsK > 1), warp group g (warps g·WarpsM·WarpsN, ...) runs the k-steps
// [g·S/kWarpsK, (g+1)·S/kWarpsK) of every run() and holds a partial sum; group 0's fragments hold
// the result once sum_partials has added the others (write_back does it). Linear updates
// (rescale_rows, scale_rows) apply to every partial; for_each and for_each_pair see group 0 only.
template <class T, class ALayout, class BLayout, int NumThreads, class Grid = DefaultWarpGrid>
struct TensorCoreMatmul {
  // B is read by pitch, or transposed (dev::Transposed: its stored rows are B's columns)
  static_assert(read_by_pitch<ALayout>() && read_by_pitch_or_transposed<BLayout>());
  using Atom = detail::MmaAtom<T>;
  static constexpr int M = ALayout::rows;
  static constexpr int K = ALayout::cols;
  static constexpr int N = BLayout::cols;
  static constexpr int kWarps = NumThreads / kWarpSize;
  // M rounded up to whole 16-row atoms.
  static constexpr int kRows = round_up(M, 16);
  // A shape the atoms take exactly; otherwise a padded product (only where the CUDA cores' product
  // would be too large): N rounded up (detail::padded_cols; the extra columns read real columns and
  // are never written) and K rounded up to whole atoms, the last step's fragments past K zeroed in
  // both operands (0 · 0, whatever the tiles hold there).
  static constexpr bool kExact = K % Atom::kK == 0 && N % 8 == 0;
  static constexpr bool kPadded = !kExact && ceil_div(M * N, NumThreads) > kMaxSimtRounds;
  static constexpr int kCols = kPadded ? detail::padded_cols(kRows, N, kWarps) : N;
  static constexpr int kSteps = ceil_div(K, Atom::kK);
  static constexpr detail::WarpGrid kGrid = detail::ResolveWarpGrid<Grid>::grid(detail::SplitQuery{
      kRows, kCols, kSteps, kWarps, 1, Atom::kK * static_cast<int>(sizeof(T)),
      ceil_div((ALayout::storage + BLayout::storage) * static_cast<int>(sizeof(T)), kVectorBytes * NumThreads)});
  static constexpr bool kAlignedRows = !Atom::kLdmatrix || ((ALayout::pitch * sizeof(T)) % kVectorBytes == 0 &&
                                                            (BLayout::pitch * sizeof(T)) % kVectorBytes == 0);
  static constexpr bool kSupported =
      BLayout::rows == K && kGrid.m > 0 && (kExact || kPadded) && kAlignedRows && NumThreads % kWarpSize == 0 &&
      (!BLayout::transposed || Atom::kLdmatrix);
  static constexpr int kWarpsM = kGrid.m > 0 ? kGrid.m : 1;
  static constexpr int kWarpsN = kGrid.n > 0 ? kGrid.n : 1;
  static constexpr int kWarpsK = kGrid.m > 0 ? kGrid.k : 1;
  static constexpr int kGroupWarps = kWarpsM * kWarpsN;
  static constexpr int kTilesM = kRows / (16 * kWarpsM) > 0 ? kRows / (16 * kWarpsM) : 1;
  static constexpr int kTilesN = kCols / (8 * kWarpsN) > 0 ? kCols / (8 * kWarpsN) : 1;
  // k-steps of the busiest group, and how far to unroll them (a split's slices are short).
  static constexpr int kGroupSteps = ceil_div(kSteps, kWarpsK);
  static constexpr int kUnroll = kWarpsK > 1 && kGroupSteps <= 8 ? (kGroupSteps > 0 ? kGroupSteps : 1) : 2;

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
  // The warp's place in its K group, and its K group.
  static MIRAGE_DEVICE int group_warp() { return warp() % kGroupWarps; }
  static MIRAGE_DEVICE int k_group() { return warp() / kGroupWarps; }
  // Warps that multiply, and those (group 0) that hold the result.
  static MIRAGE_DEVICE bool active() { return warp() < kGroupWarps * kWarpsK; }
  static MIRAGE_DEVICE bool owner() { return warp() < kGroupWarps; }
  static MIRAGE_DEVICE int warp_row() { return (group_warp() % kWarpsM) * (kRows / kWarpsM); }
  // A row of A to read: padding rows read the last real row.
  static MIRAGE_DEVICE int a_row(int row) { return M % 16 == 0 ? row : min(row, M - 1); }
  static MIRAGE_DEVICE int warp_col() { return (group_warp() / kWarpsM) * (kCols / kWarpsN); }
  // Whether an output element is real (not a padding row or column).
  static MIRAGE_DEVICE bool real(int row, int col) { return (M % 16 == 0 || row < M) && (kCols == N || col < N); }

  // acc += A · B over this warp's K slice (all of K without a split). With Scaled, A's column k
  // is first multiplied by scale[k] (16-bit types: in its fragments, one rounding per product,
  // as a stored A · diag(scale) would have).
  template <bool Scaled = false>
  static MIRAGE_DEVICE void run(Accumulator& acc, SharedTile<T, ALayout> a, SharedTile<T, BLayout> b,
                                const T* scale = nullptr) {
    static_assert(kSupported, "shape not supported by tensor cores: use SimtMatmul (or Matmul)");
    static_assert(!Scaled || Atom::kLdmatrix, "column-scaled A operands need 16-bit tensor-core fragments");
    static_assert(!Scaled || kExact, "column-scaled A operands need a K of whole atoms");
    if (!active()) return;
    if constexpr (kWarpsK == 1) {
#pragma unroll 2
      for (int k0 = 0; k0 < K; k0 += Atom::kK) step<Scaled>(acc, a, b, k0, scale);
    } else {
      const int first = k_group() * kSteps / kWarpsK;
      const int last = (k_group() + 1) * kSteps / kWarpsK;
#pragma unroll kUnroll
      for (int s = 0; s < kGroupSteps; ++s) {
        if (kSteps % kWarpsK != 0 && first + s >= last) break;
        step<Scaled>(acc, a, b, (first + s) * Atom::kK, scale);
      }
    }
  }

  // acc += A · B over all of K in group 0 (its fragments then hold a whole product, as non-linear
  // epilogues need); the other groups do nothing. The same as run without a split.
  static MIRAGE_DEVICE void run_whole(Accumulator& acc, SharedTile<T, ALayout> a, SharedTile<T, BLayout> b) {
    static_assert(kSupported, "shape not supported by tensor cores: use SimtMatmul (or Matmul)");
    if (!owner()) return;
#pragma unroll 2
    for (int k0 = 0; k0 < K; k0 += Atom::kK) step(acc, a, b, k0);
  }

  // f(row, col, value&) for every accumulator element this thread holds in group 0.
  template <class Function>
  static MIRAGE_DEVICE void for_each(Accumulator& acc, Function function) {
    if (owner()) visit(acc, function);
  }

  // f(row, col, value&) for every element of this thread's partial sum, in every K group.
  template <class Function>
  static MIRAGE_DEVICE void for_each_partial(Accumulator& acc, Function function) {
    if (active()) visit(acc, function);
  }

  // f(row, col, value0&, value1&) for every pair of accumulator elements (row, col), (row, col + 1)
  // this thread holds in group 0 (col even): a fragment's elements come in such pairs.
  template <class Function>
  static MIRAGE_DEVICE void for_each_pair(Accumulator& acc, Function function) {
    static_assert(N % 2 == 0, "an odd N leaves the last pair half real: use for_each");
    if (!owner()) return;
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
          const int col = warp_col() + j * 8 + pair;
          if (real(row, col)) function(row, col, values[0], values[1]);
        }
  }

  // acc[m][:] *= factor(m), calling factor once per row this thread holds (every partial: linear).
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

  // Adds the other K groups' partial sums of `count` accumulators into group 0's, through `buffer`
  // (shared floats nobody else touches meanwhile): slot(index, row, col) is an element's place in
  // it, or −1 to leave the element out (a later round). Group g = 1, 2, ... adds in turn (the sum
  // is p0 + ((p1 + p2) + ...), the same on every run), a barrier after each: kWarpsK − 1 barriers.
  // Group 0 reads last, with no barrier after: sync before the buffer is written again, unless
  // each group-0 thread writes only its own slots. Collective; nothing to do without a split.
  template <int Count, class Slot>
  static MIRAGE_DEVICE void sum_partials(Accumulator (&accs)[Count], float* buffer, Slot slot) {
    if constexpr (kWarpsK > 1) {
      const int group = active() ? k_group() : -1;
#pragma unroll
      for (int adder = 1; adder < kWarpsK; ++adder) {
        if (group == adder) {
#pragma unroll
          for (int index = 0; index < Count; ++index)
            visit(accs[index], [&](int row, int col, float& value) {
              const int place = slot(index, row, col);
              if (place >= 0) buffer[place] = adder == 1 ? value : buffer[place] + value;
            });
        }
        __syncthreads();
      }
      if (group == 0) {
#pragma unroll
        for (int index = 0; index < Count; ++index)
          visit(accs[index], [&](int row, int col, float& value) {
            const int place = slot(index, row, col);
            if (place >= 0) value += buffer[place];
          });
      }
    }
  }

  // sum_partials with `tile`'s own memory as the buffer; accs[index] element (row, col) is the
  // tile's element (index·M + row)·N + col. An fp32 tile is summed in place (one round, each
  // element at its own position, so group 0 may store its results right after); a 16-bit tile
  // holds half as many floats as elements and is summed in rounds, a barrier after each.
  template <int Count, class Out, class OutLayout>
  static MIRAGE_DEVICE void sum_partials_through(Accumulator (&accs)[Count], SharedTile<Out, OutLayout> tile) {
    static_assert(OutLayout::size == Count * M * N, "the tile must hold every accumulator's result");
    if constexpr (kWarpsK > 1) {
      float* buffer = reinterpret_cast<float*>(tile.data);
      if constexpr (std::is_same_v<Out, float>) {
        sum_partials(accs, buffer, [](int index, int row, int col) {
          return OutLayout::offset_of((index * M + row) * N + col);
        });
      } else {
        constexpr int kCapacity = OutLayout::storage * static_cast<int>(sizeof(Out)) / static_cast<int>(sizeof(float));
        constexpr int kRounds = ceil_div(OutLayout::size, kCapacity);
#pragma unroll
        for (int round = 0; round < kRounds; ++round) {
          sum_partials(accs, buffer, [&](int index, int row, int col) {
            const int place = (index * M + row) * N + col - round * kCapacity;
            return place >= 0 && place < kCapacity ? place : -1;
          });
          __syncthreads();
        }
      }
    }
  }

  // C = epilogue(A · B); with a split, C's memory first serves to add the partial sums (collective).
  template <class Out, class OutLayout, class Epilogue = Identity>
  static MIRAGE_DEVICE void write_back(Accumulator& acc, SharedTile<Out, OutLayout> c, Epilogue epilogue = {}) {
    static_assert(OutLayout::rows == M && OutLayout::cols == N, "the output tile must be M x N");
    if constexpr (kWarpsK > 1) {
      Accumulator parts[1] = {acc};
      sum_partials_through(parts, c);
      acc = parts[0];
    }
    for_each(acc, [&](int row, int col, float& value) {
      c.data[row * OutLayout::pitch + col] = from_float<Out>(epilogue(value));
    });
  }

  template <class Out, class OutLayout, class Epilogue = Identity>
  static MIRAGE_DEVICE void accumulate_into(Accumulator& acc, SharedTile<Out, OutLayout> c, Epilogue epilogue = {}) {
    static_assert(OutLayout::rows == M && OutLayout::cols == N, "the output tile must be M x N");
    static_assert(kWarpsK == 1, "C += epilogue(A · B) needs whole sums: use write_back, or a grid without a K split");
    for_each(acc, [&](int row, int col, float& value) {
      Out& target = c.data[row * OutLayout::pitch + col];
      target = from_float<Out>(to_float(target) + epilogue(value));
    });
  }

  // acc[m][n] *= scale[m] for a tile `scale` of M rows and one column (every partial).
  template <class S, class ScaleLayout>
  static MIRAGE_DEVICE void rescale_rows(Accumulator& acc, SharedTile<S, ScaleLayout> scale) {
    static_assert(ScaleLayout::rows == M && ScaleLayout::cols == 1, "the scale tile must be M x 1");
    for_each_partial(acc, [&](int row, int, float& value) { value *= to_float(scale.data[row * ScaleLayout::pitch]); });
  }

 private:
  // f(row, col, value&) for every real element (row < M) of this thread's fragments.
  template <class Function>
  static MIRAGE_DEVICE void visit(Accumulator& acc, Function function) {
    const int group = lane() / 4;
    const int pair = (lane() % 4) * 2;
#pragma unroll
    for (int i = 0; i < kTilesM; ++i)
#pragma unroll
      for (int j = 0; j < kTilesN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = warp_row() + i * 16 + group + (e / 2) * 8;
          const int col = warp_col() + j * 8 + pair + e % 2;
          if (real(row, col)) function(row, col, acc.value[i][j][e]);
        }
  }

  // One k-step (k0 … k0 + Atom::kK) of this warp's tiles.
  template <bool Scaled = false>
  static MIRAGE_DEVICE void step(Accumulator& acc, SharedTile<T, ALayout> a, SharedTile<T, BLayout> b, int k0,
                                 const T* scale = nullptr) {
    uint32_t a_fragment[kTilesM][4];
    uint32_t b_fragment[kTilesN][2];
    load_a(a, k0, a_fragment);
    if constexpr (Scaled) scale_a(scale, k0, a_fragment);
    load_b(b, k0, b_fragment);
    if constexpr (K % Atom::kK != 0) {
      if (k0 + Atom::kK > K) mask_depth(k0, a_fragment, b_fragment);
    }
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

  // The last (partial) k-step: the fragment elements of k >= K set to 0 in A and in B. 16-bit
  // fragments hold pairs: A's registers 0, 1 columns k0 + 2·(lane % 4) + {0, 1}, registers 2, 3 the
  // same + 8, B's registers 0 and 1 those rows; TF32 ones hold one k each, k0 + lane % 4 and + 4.
  static MIRAGE_DEVICE void mask_depth(int k0, uint32_t (&a)[kTilesM][4], uint32_t (&b)[kTilesN][2]) {
    // the bits kept of registers 0, 1 (low) and 2, 3 (high) of A, and 0 (low) and 1 (high) of B
    uint32_t low, high;
    if constexpr (Atom::kLdmatrix) {
      const int k = k0 + (lane() % 4) * 2;
      const auto pair = [](int first) { return first + 1 < K ? 0xffffffffu : (first < K ? 0xffffu : 0u); };
      low = pair(k);
      high = pair(k + 8);
    } else {
      const int k = k0 + lane() % 4;
      low = k < K ? 0xffffffffu : 0u;
      high = k + 4 < K ? 0xffffffffu : 0u;
    }
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
      a[i][0] &= low;
      a[i][1] &= low;
      a[i][2] &= high;
      a[i][3] &= high;
    }
#pragma unroll
    for (int j = 0; j < kTilesN; ++j) {
      b[j][0] &= low;
      b[j][1] &= high;
    }
  }

  // A 16-byte chunk's first column along K, or along B's columns, kept inside the tile's rows (a
  // padded product's lanes past the end read the last chunk that starts in the row).
  static MIRAGE_DEVICE int depth_chunk(int k) {
    if constexpr (K % 16 != 0) k = min(k, round_up(K, 8) - 8);
    return k;
  }
  static MIRAGE_DEVICE int col_chunk(int n) {
    if constexpr (kCols != N) n = min(n, round_up(N, 8) - 8);
    return n;
  }

  // Registers 0 and 1 of an A fragment hold columns k0 + 2·(lane % 4) + {0, 1} (rows r, r + 8),
  // registers 2 and 3 the same columns + 8: two scale pairs cover them.
  static MIRAGE_DEVICE void scale_a(const T* scale, int k0, uint32_t (&fragment)[kTilesM][4]) {
    const int col = k0 + (lane() % 4) * 2;
    const uint32_t low = *reinterpret_cast<const uint32_t*>(scale + col);
    const uint32_t high = *reinterpret_cast<const uint32_t*>(scale + col + 8);
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) {
      fragment[i][0] = detail::multiply_pairs<T>(fragment[i][0], low);
      fragment[i][1] = detail::multiply_pairs<T>(fragment[i][1], low);
      fragment[i][2] = detail::multiply_pairs<T>(fragment[i][2], high);
      fragment[i][3] = detail::multiply_pairs<T>(fragment[i][3], high);
    }
  }

  static MIRAGE_DEVICE void load_a(SharedTile<T, ALayout> a, int k0, uint32_t (&fragment)[kTilesM][4]) {
    if constexpr (Atom::kLdmatrix) {
      const int row = warp_row() + lane() % 16;
      const int col = depth_chunk(k0 + (lane() / 16) * 8);
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
        const T* address = a.data + a_row(row + i * 16) * ALayout::pitch + col;
        cute::SM75_U32x4_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(address), fragment[i][0],
                                      fragment[i][1], fragment[i][2], fragment[i][3]);
      }
    } else {
      const int row = warp_row() + lane() / 4;
      const int col = k0 + lane() % 4;
      // a padded K's last step: columns past K are not read (mask_depth zeroes them)
      const bool low = K % Atom::kK == 0 || col < K, high = K % Atom::kK == 0 || col + 4 < K;
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
        const float* upper = a.data + a_row(row + i * 16) * ALayout::pitch + col;
        const float* lower = a.data + a_row(row + i * 16 + 8) * ALayout::pitch + col;
        fragment[i][0] = low ? detail::to_tf32(upper[0]) : 0u;
        fragment[i][1] = low ? detail::to_tf32(lower[0]) : 0u;
        fragment[i][2] = high ? detail::to_tf32(upper[4]) : 0u;
        fragment[i][3] = high ? detail::to_tf32(lower[4]) : 0u;
      }
    }
  }

  static MIRAGE_DEVICE void load_b(SharedTile<T, BLayout> b, int k0, uint32_t (&fragment)[kTilesN][2]) {
    if constexpr (BLayout::transposed) {  // stored rows are B's columns (detail::load_stored_b)
      using Stored = typename BLayout::Stored;
      const int k = depth_chunk(k0 + ((lane() / 8) % 2) * 8);
      constexpr int kRowsRead = kCols == N ? 0 : N;             // clamp B's columns past N
      constexpr int kLength = K % Atom::kK == 0 ? 0 : K;        // and its K past the last chunk
#pragma unroll
      for (int j = 0; j + 1 < kTilesN; j += 2) {
        detail::load_stored_b<Stored, T, kRowsRead, kLength>(b.data, warp_col() + j * 8, k0, fragment[j][0],
                                                            fragment[j][1], fragment[j + 1][0], fragment[j + 1][1]);
      }
      if constexpr (kTilesN % 2 == 1) {
        int column = warp_col() + (kTilesN - 1) * 8 + lane() % 8;
        if constexpr (kCols != N) column = min(column, N - 1);
        const T* address = b.data + Stored::element_offset(column, k);
        cute::SM75_U32x2_LDSM_N::copy(*reinterpret_cast<const cute::uint128_t*>(address), fragment[kTilesN - 1][0],
                                      fragment[kTilesN - 1][1]);
      }
    } else if constexpr (Atom::kLdmatrix) {
      int row = k0 + lane() % 16;
      if constexpr (K % Atom::kK != 0) row = min(row, K - 1);  // masked (mask_depth)
      const int col = warp_col() + (lane() / 16) * 8;
#pragma unroll
      for (int j = 0; j + 1 < kTilesN; j += 2) {
        const T* address = b.data + row * BLayout::pitch + col_chunk(col + j * 8);
        cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(address), fragment[j][0],
                                      fragment[j][1], fragment[j + 1][0], fragment[j + 1][1]);
      }
      if constexpr (kTilesN % 2 == 1) {
        const T* address = b.data + row * BLayout::pitch + col_chunk(warp_col() + (kTilesN - 1) * 8);
        cute::SM75_U16x4_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(address), fragment[kTilesN - 1][0],
                                      fragment[kTilesN - 1][1]);
      }
    } else {
      const int row = k0 + lane() % 4;
      const bool low = K % Atom::kK == 0 || row < K, high = K % Atom::kK == 0 || row + 4 < K;
#pragma unroll
      for (int j = 0; j < kTilesN; ++j) {
        int col = warp_col() + lane() / 4 + j * 8;
        if constexpr (kCols != N) col = min(col, N - 1);
        const float* base = b.data + row * BLayout::pitch + col;
        fragment[j][0] = low ? detail::to_tf32(base[0]) : 0u;
        fragment[j][1] = high ? detail::to_tf32(base[4 * BLayout::pitch]) : 0u;
      }
    }
  }
};

template <class T, class ALayout, class BLayout, int NumThreads>
struct SimtMatmul {
  static_assert(read_by_pitch<ALayout>() && read_by_pitch_or_transposed<BLayout>());
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
        sum = fmaf(to_float(a.data[row * ALayout::pitch + k]), to_float(b.data[BLayout::element_offset(k, col)]), sum);
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
