"""Where the generated GEMV's time goes: the same generated kernel, built as it is and with parts of
its for-loop taken out, timed in one run (timing only: the cut builds compute nothing useful).

* ``as_generated``: the kernel the family builds;
* ``no_x``: X's copies removed (its tiles hold whatever shared memory held): what X's 128 re-reads
  cost at b = 8;
* ``no_compute``: the matmul (and the norm's row sums) removed: a pipelined copy of the same tiles
  with the same barriers;
* ``no_barrier``: the barrier at the end of each iteration removed;
* ``copy_only``: both removed;
* ``l2_256``, ``l2_none``: nothing removed, the copies ask L2 for 256-byte prefetches instead of
  128, or for none (``MIRAGE_CP_ASYNC_L2_BYTES``); ``evict_first``: no prefetch hint, and every copied
  line marked first to leave L2 (``MIRAGE_CP_ASYNC_EVICT_FIRST``);
* ``tma_w`` (plain GEMV only): W's tiles copied by one TMA tensor copy each (a tensor map per W),
  into unpadded rows, which must match ``as_generated`` bit for bit;
* ``multicast2``: the kernel built with X read once per cluster of 2 blocks
  (``OptimizerOptions.multicast_cluster``), which must match ``as_generated`` bit for bit.

Also names the kernels that cuBLAS (``torch.mm``) and torch.compile run for rmsnorm's shapes.
Prints a line per build and writes gemv_isolate_<date>.json into ``--out``."""

from __future__ import annotations

import argparse
import dataclasses
import re

import torch

import mirage as mi
from benchmarks.mugraphs import mlp
from benchmarks.rms_forms import gemv
from benchmarks.stream_floor import write_record
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

# what each cut removes from the generated loop (regular expressions over whole statements; those
# marked "?" may match nothing: the plain GEMV has no row sums)
CUTS = {
    "as_generated": (),
    "no_x": (r"in0\.load\([^;]*\);",),
    "no_compute": (r"mm\d+::accumulate\w*\([^;]*\);", r"?row_sums\d+\.add\([^;]*\);"),
    "no_barrier": (r"__syncthreads\(\);  // end of iteration",),
    "copy_only": (r"mm\d+::accumulate\w*\([^;]*\);", r"?row_sums\d+\.add\([^;]*\);",
                  r"__syncthreads\(\);  // end of iteration"),
    "l2_256": (),
    "l2_none": (),
    "evict_first": (),
}
DEFINES = {"l2_256": "#define MIRAGE_CP_ASYNC_L2_BYTES 256\n",
           "l2_none": "#define MIRAGE_CP_ASYNC_L2_BYTES 0\n",
           "evict_first": "#define MIRAGE_CP_ASYNC_L2_BYTES 0\n#define MIRAGE_CP_ASYNC_EVICT_FIRST 1\n"}


def cut(code: str, patterns: tuple[str, ...]) -> str:
    for pattern in patterns:
        optional = pattern.startswith("?")
        code, count = re.subn(pattern.removeprefix("?"), "", code)
        if not count and not optional:
            raise ValueError(f"{pattern!r} matches nothing in the generated kernel")
    return code


# W's tiles copied by one TMA tensor copy each (a probe: the tensor map's device address is compiled in)
TENSOR_TILES = r"""
#include <cutlass/arch/barrier.h>
template <int Rows, int Cols, int Stages>
struct TensorTiles {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  const void* map; __half* shared; uint64_t* barriers; int range; int col0;
  __device__ void init() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < Stages; ++s) Barrier::init(&barriers[s], 1);
      cutlass::arch::fence_barrier_init();
    }
  }
  using Tile = mirage::dev::SharedTile<__half, mirage::dev::Layout<1, 1, Rows, Cols, Cols>>;
  __device__ Tile stage(int it) const { return {shared + (it % Stages) * Rows * Cols}; }
  __device__ void load(int it) const {
    if (it >= range || threadIdx.x != 0) return;
    uint64_t* barrier = &barriers[it % Stages];
    Barrier::arrive_and_expect_tx(barrier, Rows * Cols * 2);
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(cute::cast_smem_ptr_to_uint(stage(it).data)), "l"(map), "r"(col0), "r"(it * Rows),
                    "r"(cute::cast_smem_ptr_to_uint(barrier)) : "memory");
  }
  __device__ void wait(int it) const { Barrier::wait(&barriers[it % Stages], (it / Stages) & 1); }
};
"""


def tensor_map(weight: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A device buffer holding the TMA tensor map of ``weight`` (K, N) in boxes of ``rows`` × ``cols``."""
    from cuda.bindings import driver

    k, n = weight.shape
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    error, descriptor = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, weight.data_ptr(), [u64(n), u64(k)],
        [u64(n * weight.element_size())], [u32(cols), u32(rows)], [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled: {error}")
    words = [int(w) for w in descriptor.opaque]  # as signed 64-bit words
    return torch.tensor([w - (1 << 64) if w >= 1 << 63 else w for w in words], dtype=torch.int64,
                        device="cuda")


def tensor_tiles(program, map_buffer: torch.Tensor):
    """``program`` (a plain GEMV, W its second input, split along grid x) with W's tiles copied by one TMA
    tensor copy each, into unpadded rows, counted on a transaction barrier per stage."""
    (launch,) = program.kernels
    code = program.code
    name, rows, cols, pitch, stages = re.search(
        r"InputIterator<__half, mirage::dev::Layout<1, 1, (\d+), (\d+), (\d+)>, (\d+), kThreads> "
        r"(in\d+)\([^;]*?DimMap\{3, -1, -1\}", code, flags=re.S).group(5, 1, 2, 3, 4)
    code = code.replace(f"Layout<1, 1, {rows}, {cols}, {pitch}>", f"Layout<1, 1, {rows}, {cols}, {cols}>")
    barriers = (launch.smem_bytes + 15) // 16 * 16
    declaration = (rf"const mirage::dev::Strides {name}_strides[^;]*;\s*"
                   rf"const mirage::dev::InputIterator<[^;]*?> {name}\("
                   r"[^;]*?shared_at<__half>\(shared, (\d+)\)\);")
    code = re.sub(declaration,
                  rf"const TensorTiles<{rows}, {cols}, {stages}> {name}{{reinterpret_cast<const void*>("
                  rf"{map_buffer.data_ptr()}ull), mirage::dev::shared_at<__half>(shared, \1), "
                  rf"mirage::dev::shared_at<uint64_t>(shared, {barriers}), kForloopRange, "
                  rf"static_cast<int>(blockIdx.x) * {cols}}};", code, flags=re.S)
    code = code.replace("mirage::dev::wait_for_prerequisite_grids();",
                        f"{name}.init(); __syncthreads(); mirage::dev::wait_for_prerequisite_grids();")
    code = re.sub(r"(mirage::dev::Pipeline<\d+>::wait\(\);)", rf"\1 {name}.wait(iteration);", code)
    kernel_header = "#include <mirage/gen/kernel.cuh>\n"
    code = code.replace(kernel_header, kernel_header + TENSOR_TILES, 1)
    return dataclasses.replace(program, code=code,
                               kernels=(dataclasses.replace(launch, smem_bytes=barriers + 8 * int(stages)),))


def _with(program, name: str) -> str:
    """The code of ``program`` as the cut ``name`` makes it."""
    return DEFINES.get(name, "") + cut(program.code, CUTS[name])


def kernel_names(fn, *args) -> list[str]:
    """The CUDA kernels one call of ``fn(*args)`` runs (after a warm-up call)."""
    fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    args = parser.parse_args(argv)
    facts = device_facts()
    rows = []
    for b in (1, 8):
        x, g, w = (torch.randn(s, device="cuda").half() for s in mlp.rmsnorm_shapes(b))
        rows.append({"b": b, "what": "torch.mm kernels", "names": kernel_names(torch.mm, x, w)})

        def rms(x, g, w):
            return ((x / torch.sqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6).half()) * g) @ w
        compiled = torch.compile(rms, mode="max-autotune-no-cudagraphs")
        rows.append({"b": b, "what": "torch.compile kernels", "names": kernel_names(compiled, x, g, w)})
        print(rows[-2], rows[-1], flush=True)
    inputs = {b: [torch.randn(s, device="cuda").half() for s in mlp.rmsnorm_shapes(b)] for b in (1, 8)}
    maps = {}  # (b, rows) → the tensor map buffer of that b's W in boxes of rows × 48 (kept alive)
    builds, programs = [], []
    for b in (1, 8):
        for form in ("gemv", "rmsnorm"):
            for iters, threads, stages in ((16, 512, 2), (16, 512, 3), (8, 512, 3)):
                graph = (gemv(b, 128, iters, threads) if form == "gemv"
                         else mlp.rmsnorm_fused(b, grid=128, iters=iters, threads=threads))
                try:
                    program = generate_cuda_program(graph, None, options=dataclasses.replace(
                        OptimizerOptions(), stages=stages))
                except mi.MirageError as error:  # a member that does not fit in shared memory
                    print("skipped", b, form, iters, threads, stages, error)
                    continue
                variants = {name: dataclasses.replace(program, code=_with(program, name)) for name in CUTS}
                if form == "gemv" and 4096 // iters <= 256:  # a TMA box has at most 256 rows
                    rows_per_tile = 4096 // iters
                    buffer = maps.setdefault((b, rows_per_tile), tensor_map(inputs[b][2], rows_per_tile, 48))
                    variants["tma_w"] = tensor_tiles(program, buffer)
                try:  # X's ring has a slot more: it may not fit where the plain build does
                    variants["multicast2"] = generate_cuda_program(graph, None, options=dataclasses.replace(
                        OptimizerOptions(), stages=stages, multicast_cluster=2))
                except mi.MirageError as error:
                    print("skipped multicast", b, form, iters, threads, stages, error)
                for name, variant in variants.items():
                    programs.append(variant)
                    builds.append({"b": b, "form": form, "iters": iters, "threads": threads, "stages": stages,
                                   "cut": name})
    reference = {}  # the as-generated build's output, which the multicast builds must match
    for row, program in zip(builds, build_many(programs), strict=True):
        x = inputs[row["b"]]
        program.load()
        key = (row["b"], row["form"], row["iters"], row["threads"], row["stages"])
        if row["cut"] == "as_generated" or any(k in row["cut"] for k in ("multicast", "tma")):
            (out,) = program.launch(x)
            torch.cuda.synchronize()
            reference.setdefault(key, out.float())
            row["max_abs_diff"] = float((out.float() - reference[key]).abs().max())
        row["us"] = time_graph(lambda p=program, x=x: p.launch(x), replays=100).median_us
        rows.append(row)
        print(row, flush=True)
    write_record(args.out, "gemv_isolate", facts, rows)


if __name__ == "__main__":
    try:
        main()
    except mi.MirageError as error:
        raise SystemExit(str(error)) from error
