// Hopper warpgroup MMAs (wgmma) for the online-softmax chain's warpgroup form (gen/softmax.cuh):
// the m64n64k16 instructions (CuTe's SM90::GMMA atoms), the descriptors of operands in
// dev::Swizzled128Layout tiles, and the operand fences that pin registers an asynchronous wgmma
// reads or writes.
#pragma once

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include <type_traits>

#include "../mirage.cuh"

namespace mirage::gen::wgmma {

// Warpgroup MMAs m64n64k16 with fp32 accumulators and B from shared memory, MN-major
// (dev::Swizzled128Layout) or, KMajorB, K-major (a tile stored transposed: dev::Transposed's stored
// rows are B's columns): Rs takes A from registers (K-major, the layout of mma.sync's A fragments,
// 16 rows a warp), Ss from shared memory, K-major (the same swizzled form).
template <class T, bool KMajorB = false>
struct Wgmma64;
template <bool KMajorB>
struct Wgmma64<__half, KMajorB> {
  static constexpr auto kB = KMajorB ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN;
  using Rs = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_RS<cute::SM90::GMMA::Major::K, kB>;
  using Ss = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<cute::SM90::GMMA::Major::K, kB>;
};
template <bool KMajorB>
struct Wgmma64<__nv_bfloat16, KMajorB> {
  static constexpr auto kB = KMajorB ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN;
  using Rs = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, kB>;
  using Ss = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, kB>;
};

// c (+)= A · B, c a warp's 16 x 64 slice of the warpgroup's accumulator (eight 16 x 8 C fragments),
// A a register fragment or (uint64_t) a descriptor.
template <class T, bool KMajorB = false, class A>
MIRAGE_DEVICE void wgmma64(float (&c)[8][4], const A& a, uint64_t b, bool accumulate) {
  const auto scale = accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero;
  if constexpr (std::is_same_v<A, uint64_t>) {
    Wgmma64<T, KMajorB>::Ss::fma(a, b, c[0][0], c[0][1], c[0][2], c[0][3], c[1][0], c[1][1], c[1][2], c[1][3], c[2][0],
                        c[2][1], c[2][2], c[2][3], c[3][0], c[3][1], c[3][2], c[3][3], c[4][0], c[4][1], c[4][2],
                        c[4][3], c[5][0], c[5][1], c[5][2], c[5][3], c[6][0], c[6][1], c[6][2], c[6][3], c[7][0],
                        c[7][1], c[7][2], c[7][3], scale);
  } else {
    Wgmma64<T, KMajorB>::Rs::fma(a[0], a[1], a[2], a[3], b, c[0][0], c[0][1], c[0][2], c[0][3], c[1][0], c[1][1], c[1][2],
                        c[1][3], c[2][0], c[2][1], c[2][2], c[2][3], c[3][0], c[3][1], c[3][2], c[3][3], c[4][0],
                        c[4][1], c[4][2], c[4][3], c[5][0], c[5][1], c[5][2], c[5][3], c[6][0], c[6][1], c[6][2],
                        c[6][3], c[7][0], c[7][1], c[7][2], c[7][3], scale);
  }
}

// Pins registers that an asynchronous wgmma reads or writes in place until here (called after the
// wgmma.wait_group that completes it): the compiler may neither read them earlier nor reuse them
// for other values before.
MIRAGE_DEVICE void fence(float& value) { cute::warpgroup_fence_operand(value); }
MIRAGE_DEVICE void fence(uint32_t& value) { cute::warpgroup_fence_operand(value); }
template <class A, int N>
MIRAGE_DEVICE void fence(A (&values)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence(values[i]);
}

// The descriptor of a 64 x 16 operand of a swizzled tile at (row, col), row % 8 == 0. MN-major (B:
// K rows [row, row + 16) x N columns [col, col + 64), col % 64 == 0): 8-row groups 1024 bytes apart
// (stride offset), blocks of 64 columns kBlockElements apart (leading offset). K-major (A: M rows
// [row, row + 64) x K columns [col, col + 16), col % 16 == 0): rows 128 bytes apart in 8-row groups
// 1024 bytes apart (stride offset; the leading offset is unused), the start moving along the
// swizzled row. 128-byte swizzle either way. Whole: the start address computed per operand rather
// than as the tile's plus a constant (see the branches below).
template <class L, bool KMajor = false, bool Whole = false, class T>
MIRAGE_DEVICE uint64_t wgmma_descriptor(const T* tile, int row, int col) {
  static_assert(L::swizzled && sizeof(T) == 2, "wgmma reads 16-bit tiles in the 128-byte swizzled form");
  cute::GmmaDescriptor descriptor;
  descriptor.bitfield.start_address_ = 0;
  descriptor.bitfield.leading_byte_offset_ = KMajor ? 1 : static_cast<uint16_t>(L::kBlockElements * sizeof(T) >> 4);
  descriptor.bitfield.stride_byte_offset_ = static_cast<uint16_t>(8 * L::pitch * sizeof(T) >> 4);
  descriptor.bitfield.base_offset_ = 0;
  descriptor.bitfield.layout_type_ = static_cast<uint8_t>(cute::SM90::GMMA::LayoutType::B128);
  // The start address field (bits 0-13) holds address >> 4; shared memory ends below 256 KiB, so the
  // field takes a sum without a carry and the tile's 1024-byte alignment keeps the operand's offset
  // whole in 16-byte units.
  const uint32_t base = cute::cast_smem_ptr_to_uint(tile);
  const uint32_t offset = static_cast<uint32_t>(L::element_offset(row, col)) * sizeof(T);
  if constexpr (Whole) {  // the operand's address computed whole: no value held per tile
    descriptor.reg32_[0] |= (base + offset) >> 4;
  } else {  // the tile's descriptor plus the offset: computed once a tile, a constant added per operand
    descriptor.reg32_[0] |= base >> 4;
    descriptor.reg32_[0] += offset >> 4;
  }
  return descriptor.desc_;
}

// The descriptor of B's 16 x 64 operand at (k, n) of tile L: MN-major, or K-major where L is a
// dev::Transposed tile (a tile read in place: its stored rows are B's columns, K contiguous).
template <class L, bool Whole = false, class T>
MIRAGE_DEVICE uint64_t b_descriptor(const T* tile, int k, int n) {
  if constexpr (L::transposed) {
    return wgmma_descriptor<typename L::Stored, true, Whole>(tile, n, k);
  } else {
    return wgmma_descriptor<L, false, Whole>(tile, k, n);
  }
}

}  // namespace mirage::gen::wgmma
