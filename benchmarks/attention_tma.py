"""Would TMA copies of K and V pay in the warpgroup attention kernels? A probe: the generated kernel of
each GQA member in the warpgroup form, as generated (K and V copied by every thread with 16-byte
``cp.async``) and with K's and V's tiles copied by one TMA tensor copy each (a 3-d tensor map per
input, 128-byte swizzle, which is the layout the kernel's wgmma reads), counted on a transaction
barrier per stage. The kernel's loop, barriers and softmax chain are unchanged, so the difference is
the copy instructions that every thread issues (about a quarter of the b = 8 kernel's instructions).

Both builds must give the same bits.  The tensor maps live in device memory and their addresses are
compiled in (a probe, not a lowering).  Writes attention_tma_<date>.json into ``--out``."""

from __future__ import annotations

import argparse
import dataclasses
import re

import torch

import mirage as mi
from benchmarks.mugraphs import CASES
from benchmarks.stream_floor import write_record
from benchmarks.variants import family
from mirage.codegen import tensor_maps
from mirage.codegen.gpu_check import check_on_gpu, random_inputs
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.profile import device_facts, time_graph
from mirage.codegen.runtime import build_many
from mirage.optimizer import OptimizerOptions

# One tile of a 3-d tensor (a 4-d map, its outermost dim 1) per stage, copied by thread 0 with one TMA
# tensor copy per 64 columns. `Keys` says which
# coordinate the for-loop and grid y advance: 0 for K (keys innermost), 1 for V (keys second).
TENSOR_TILES = r"""
#include <cutlass/arch/barrier.h>
template <class L, int Stages, int Keys>
struct TensorTiles3 {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  static constexpr int kTileKeys = Keys == 0 ? L::cols : L::rows;
  const void* map; __half* shared; uint64_t* barriers; int range;
  __device__ void init() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < Stages; ++s) Barrier::init(&barriers[s], 1);
      cutlass::arch::fence_barrier_init();
    }
  }
  __device__ mirage::dev::SharedTile<__half, L> stage(int it) const {
    return {shared + (it % Stages) * L::storage};
  }
  __device__ void load(int it) const {
    if (it >= range || threadIdx.x != 0) return;
    uint64_t* barrier = &barriers[it % Stages];
    Barrier::arrive_and_expect_tx(barrier, L::storage * 2);
    const int key0 = (static_cast<int>(blockIdx.y) * range + it) * kTileKeys;
    const int c1 = Keys == 0 ? 0 : key0;
    for (int block = 0; block < L::cols / 64; ++block) {  // one box per 64 columns (128 bytes)
      const int c0 = (Keys == 0 ? key0 : 0) + 64 * block;
      asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                   " [%0], [%1, {%2, %3, %4, %5}], [%6];"
                   :: "r"(cute::cast_smem_ptr_to_uint(stage(it).data + block * L::rows * 64)), "l"(map),
                      "r"(c0), "r"(c1), "r"(static_cast<int>(blockIdx.x)), "r"(0),
                      "r"(cute::cast_smem_ptr_to_uint(barrier)) : "memory");
    }
  }
  __device__ void wait(int it) const { Barrier::wait(&barriers[it % Stages], (it / Stages) & 1); }
};
"""


def tensor_map(x: torch.Tensor, box: tuple[int, int]) -> torch.Tensor:
    """A device buffer holding the TMA tensor map of the 3-d ``x`` (heads, rows, cols) in boxes of
    ``box`` = (rows, cols) of one head, 128-byte swizzled (the generator's encoding, 4-d)."""
    encoded = tensor_maps.encode(x, tensor_maps.TensorMapSpec(0, (1, 1, *box)))
    return torch.frombuffer(bytearray(encoded), dtype=torch.int64).to("cuda")


def box(code: str, name: str) -> tuple[int, int]:
    """(rows, 64): the box of the input iterator ``name``'s tiles (one per 64 columns, 128 bytes)."""
    rows, cols = re.search(rf"InputIterator<__half, mirage::dev::Swizzled128Layout<1, 1, (\d+), (\d+)>, \d+, "
                           rf"kThreads> {name}\(", code).groups()
    if int(cols) % 64:
        raise ValueError(f"{name}'s tiles have {cols} columns, not whole 128-byte boxes")
    return int(rows), 64


def with_tma(program, maps: dict[str, torch.Tensor]):
    """``program`` with the iterators named in ``maps`` (in1: K, in2: V) copied by TMA."""
    first, *rest = program.kernels
    code = program.code
    barriers = (first.smem_bytes + 15) // 16 * 16
    init = []
    for index, (name, buffer) in enumerate(maps.items()):
        declaration = (rf"const mirage::dev::InputIterator<__half, (mirage::dev::Swizzled128Layout<[^>]*>), "
                       rf"(\d+), kThreads> {name}\(([^;]*?)shared_at<__half>\(shared, (\d+)\)\);")
        match = re.search(declaration, code, flags=re.S)
        if match is None:
            raise ValueError(f"{name} is not a swizzled input iterator")
        layout, stages, arguments, offset = match.groups()
        keys = 0 if name == "in1" else 1
        expected = "DimMap{1, 3, -1}, 3" if keys == 0 else "DimMap{1, 2, -1}, 2"
        if expected not in arguments:  # heads on grid x, keys on grid y and the for-loop
            raise ValueError(f"{name} is not mapped as the probe assumes: {arguments}")
        code = code.replace(match.group(0), (
            f"const TensorTiles3<{layout}, {stages}, {keys}> {name}{{reinterpret_cast<const void*>("
            f"{buffer.data_ptr()}ull), mirage::dev::shared_at<__half>(shared, {offset}), "
            f"mirage::dev::shared_at<uint64_t>(shared, {barriers + 64 * index}), kForloopRange}};"))
        init.append(f"{name}.init();")
    code = code.replace("mirage::dev::wait_for_prerequisite_grids();",
                        " ".join(init) + " __syncthreads(); mirage::dev::wait_for_prerequisite_grids();", 1)
    waits = " ".join(f"{name}.wait(iteration);" for name in maps)
    head, loop = code.split("// ---- the for-loop", 1)
    loop, count = re.subn(r"(mirage::dev::Pipeline<\d+, true>::wait\(\);)", rf"\1 {waits}", loop, count=1)
    if count != 1:
        raise ValueError("no pipeline wait in the loop")
    code = head + "// ---- the for-loop" + loop
    header = "#include <mirage/gen/softmax.cuh>\n"
    code = code.replace(header, header + TENSOR_TILES, 1)
    kernels = (dataclasses.replace(first, smem_bytes=barriers + 64 * len(maps)), *rest)
    return dataclasses.replace(program, code=code, kernels=kernels)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON record")
    parser.add_argument("--cases", default="gqa_b8,gqa_b1", help="comma-separated GQA cases")
    args = parser.parse_args(argv)
    rows, programs, results = [], [], {}
    inputs = {case: random_inputs(CASES[case].reference(), seed=0) for case in args.cases.split(",")}
    for case in inputs:
        q, k, v = inputs[case]
        for variant, graph in family(case):
            for stages in (3, 4):
                options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=True, stages=stages)
                try:
                    program = generate_cuda_program(graph, None, options=options)
                except mi.MirageError as error:
                    print("skipped", case, variant.label, stages, error)
                    continue
                if "Swizzled128Layout" not in program.code:
                    continue
                maps = {name: tensor_map(x, box(program.code, name)) for name, x in (("in1", k), ("in2", v))}
                for form, build in (("cp_async", program), ("tma", with_tma(program, maps))):
                    programs.append(build)
                    rows.append({"case": case, "label": variant.label, "stages": stages, "form": form,
                                 "_maps": maps})
    built = build_many(programs)
    for row, program in zip(rows, built, strict=True):
        row.pop("_maps")
        if isinstance(program, Exception):
            row["failure"] = str(program).splitlines()[0]
            print(row, flush=True)
            continue
        x = inputs[row["case"]]
        program.load()
        out = program(*x)[0]
        torch.cuda.synchronize()
        check = check_on_gpu(CASES[row["case"]].reference(), program, inputs=x)
        row["passed"], row["relative_error"] = check.passed, check.worst_error
        results[(row["case"], row["label"], row["stages"], row["form"])] = out
        row["us"] = time_graph(lambda p=program, x=x: p.launch(x), replays=100).median_us
        print(row, flush=True)
    same = [torch.equal(out, results[(c, lab, s, "cp_async")])
            for (c, lab, s, f), out in results.items() if f == "tma" and (c, lab, s, "cp_async") in results]
    print(f"tma bit-identical to cp_async: {sum(same)} of {len(same)}")
    rows.append({"bit_identical": [sum(same), len(same)]})
    write_record(args.out, "attention_tma", device_facts(), rows)


if __name__ == "__main__":
    try:
        main()
    except mi.MirageError as error:
        raise SystemExit(str(error)) from error
