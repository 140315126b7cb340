// Test kernels for tile_map.cuh, input.cuh and output.cuh (built by test_device_lib.py).
#include <mirage/mirage.cuh>

using namespace mirage::dev;

// For every block and forloop iteration r, copies the block's input tile through a
// `Stages`-deep cp.async pipeline and writes it to out[block][r][tile] (dense).
// flags[0] = 1 when the iterator took the 16-byte path.
template <class T, class L, int Stages, int NumThreads>
__device__ void copy_tiles(T* out, const T* in, long long s0, long long s1, long long s2, long long s3, int imap_x,
                           int imap_y, int imap_z, int forloop_dim, int forloop_range, int* flags) {
  extern __shared__ __align__(128) char shared[];
  const Strides strides{{s0, s1, s2, s3}};
  const TileCoordinate coordinate =
      locate_input_tile<L>(strides, DimMap{imap_x, imap_y, imap_z}, forloop_dim, forloop_range, blockIdx);
  const InputIterator<T, L, Stages, NumThreads> input(in, strides, coordinate, forloop_range, shared_at<T>(shared, 0));
  const long long block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * (long long)blockIdx.z);
  const Strides dense = row_major_strides(L::dim0, L::dim1, L::dim2, L::dim3);
  for (int s = 0; s < Stages - 1; ++s) {
    input.load(s);
    Pipeline<Stages>::commit();
  }
  for (int r = 0; r < forloop_range; ++r) {
    input.load(r + Stages - 1);
    Pipeline<Stages>::commit();
    Pipeline<Stages>::wait();
    OutputSaver<T, L, NumThreads>::save(out, dense, (block * forloop_range + r) * L::size, input.stage(r));
    __syncthreads();
  }
  if (threadIdx.x == 0 && block == 0) flags[0] = input.vectorized();
}

// Reads block b's tile from in[b][tile] (dense) and saves scale * tile at the block's omap
// place in `out` (strides s0..s3), through shared memory or (use_registers) a RegisterTile.
template <class T, class L, int NumThreads>
__device__ void save_tiles(T* out, const T* in, long long s0, long long s1, long long s2, long long s3, int omap_x,
                           int omap_y, int omap_z, float scale, int use_registers) {
  extern __shared__ __align__(128) char shared[];
  const long long block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * (long long)blockIdx.z);
  const Strides dense = row_major_strides(L::dim0, L::dim1, L::dim2, L::dim3);
  const InputIterator<T, L, 1, NumThreads> input(in, dense, TileCoordinate{block * L::size, 0}, 1, shared_at<T>(shared, 0));
  input.load(0);
  Pipeline<1>::commit();
  Pipeline<1>::wait_all();
  const Strides strides{{s0, s1, s2, s3}};
  const long long base = locate_output_tile<L>(strides, DimMap{omap_x, omap_y, omap_z}, blockIdx);
  using Saver = OutputSaver<T, L, NumThreads>;
  if (use_registers) {
    constexpr int kVector = L::cols % kVectorElements<T> == 0 ? kVectorElements<T> : 1;
    RegisterTile<L, NumThreads, kVector> registers;
    registers.load(input.stage(0));
    registers.apply(MulScalar{scale});
    Saver::save(out, strides, base, registers);
  } else {
    Saver::save(out, strides, base, input.stage(0), MulScalar{scale});
  }
}

#define COPY_TILES(NAME, T, L, STAGES, THREADS)                                                               \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                       \
      NAME(T* out, const T* in, long long s0, long long s1, long long s2, long long s3, int imap_x, int imap_y, \
           int imap_z, int forloop_dim, int forloop_range, int* flags) {                                       \
    copy_tiles<T, L, STAGES, THREADS>(out, in, s0, s1, s2, s3, imap_x, imap_y, imap_z, forloop_dim,          \
                                      forloop_range, flags);                                                  \
  }

#define SAVE_TILES(NAME, T, L, THREADS)                                                                       \
  extern "C" __global__ void __launch_bounds__(THREADS)                                                       \
      NAME(T* out, const T* in, long long s0, long long s1, long long s2, long long s3, int omap_x, int omap_y, \
           int omap_z, float scale, int use_registers) {                                                       \
    save_tiles<T, L, THREADS>(out, in, s0, s1, s2, s3, omap_x, omap_y, omap_z, scale, use_registers);        \
  }

using Tile16x64 = WithPitch<RowMajor<16, 64>, 72>;  // padded pitch
using Tile2x3x4x16 = WithPitch<RowMajor<2, 3, 4, 16>, 24>;
using Tile8x32 = RowMajor<8, 32>;
using Tile6x10 = RowMajor<6, 10>;  // rows of 10 halves are not whole 16-byte vectors

COPY_TILES(copy_tiles_f16_16x64, __half, Tile16x64, 3, 128)
COPY_TILES(copy_tiles_bf16_2x3x4x16, __nv_bfloat16, Tile2x3x4x16, 2, 64)
COPY_TILES(copy_tiles_f32_8x32, float, Tile8x32, 2, 128)
COPY_TILES(copy_tiles_f16_6x10, __half, Tile6x10, 2, 64)

SAVE_TILES(save_tiles_f16_16x64, __half, Tile16x64, 128)
SAVE_TILES(save_tiles_bf16_2x3x4x16, __nv_bfloat16, Tile2x3x4x16, 64)
SAVE_TILES(save_tiles_f32_8x32, float, Tile8x32, 128)
SAVE_TILES(save_tiles_f16_6x10, __half, Tile6x10, 64)
