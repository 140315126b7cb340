"""The CUDA device library (mirage/codegen/include/mirage/*.cuh), checked without a GPU.

The test kernels in ``test_device_lib_*.cu`` (beside this file) are built for sm_90a and their
SASS is checked for the instructions each piece is meant to produce: LDGSTS.128 for cp.async
input iterators, STG.128 for output savers, HMMA + LDSM for tensor-core matmuls, SHFL for warp
reductions, and no local memory anywhere. tests/gpu/test_device_lib_gpu.py runs the same kernels.
The tiling formula (tile_map.cuh) is also built into a host program and compared with the
formula of the reference notes, and the library's compile-time checks are shown to fire.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest
from codegen_helpers import assert_each_is_rejected, build_host_program, needs_nvcc, sass_by_function

from mirage.codegen.compile import CompileError, CompileOptions, Stage, compile_source, compile_sources
from mirage.mugraph.target import TARGETS

KERNEL_DIR = Path(__file__).parent
KERNEL_FILES = ("io", "matmul", "elementwise", "accumulator", "reduction")
OPTIONS = CompileOptions(target=TARGETS["H100"])



pytestmark = needs_nvcc


def opcodes(function_sass: str) -> set[str]:
    """Opcodes with modifiers (``LDGSTS.E.BYPASS.LTC128B.128``), predicates stripped."""
    found = set()
    for line in function_sass.splitlines():
        match = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if match:
            found.add(match.group(1))
    return found


@pytest.fixture(scope="module")
def kernels() -> dict[str, set[str]]:
    """Opcodes of every test kernel, built (or taken from the cubin cache) in parallel."""
    sources = [(KERNEL_DIR / f"test_device_lib_{name}.cu").read_text() for name in KERNEL_FILES]
    results = compile_sources(sources, OPTIONS, dumps={Stage.SASS})
    functions: dict[str, set[str]] = {}
    for result in results:
        assert not isinstance(result, CompileError)
        for name, text in sass_by_function(result.sass()).items():
            functions[name] = opcodes(text)
    return functions


def has(opcode_set: set[str], prefix: str) -> bool:
    return any(op == prefix or op.startswith(prefix + ".") for op in opcode_set)


CP_ASYNC_128 = "LDGSTS.E.BYPASS.LTC128B.128"
STORE_128 = "STG.E.128"

# (kernel, opcodes it must contain, opcode prefixes it must not contain)
KERNEL_EXPECTATIONS = [
    ("copy_tiles_f16_16x64", {CP_ASYNC_128, STORE_128, "LDGDEPBAR", "DEPBAR.LE"}, set()),
    ("copy_tiles_bf16_2x3x4x16", {CP_ASYNC_128, STORE_128}, set()),
    ("copy_tiles_f32_8x32", {CP_ASYNC_128, STORE_128}, set()),
    ("copy_tiles_f16_6x10", {"LDG.E.U16", "STG.E.U16"}, {"LDGSTS"}),  # fallback only
    ("save_tiles_f16_16x64", {STORE_128, "LDS.128"}, set()),
    ("save_tiles_f32_8x32", {STORE_128}, set()),
    ("save_tiles_f16_6x10", {"STG.E.U16"}, {"LDGSTS"}),
    ("mm_tc_f16_64x64x32", {"HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", CP_ASYNC_128}, {"FFMA"}),
    ("mm_tc_bf16_32x64x16", {"HMMA.16816.F32.BF16", "LDSM.16.M88.4", "LDSM.16.MT88.4"}, set()),
    ("mm_tc_f32_32x32x16", {"HMMA.1688.F32.TF32"}, {"LDSM"}),
    ("mm_tc_f16_16x8x16", {"HMMA.16816.F32", "LDSM.16.MT88.2"}, set()),
    ("mm_tc_f16_48x24x32", {"HMMA.16816.F32", "LDSM.16.MT88.4", "LDSM.16.MT88.2"}, set()),
    ("mm_tc_f16_8x64x32", {"HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4"}, {"FFMA"}),
    ("mm_tc_f32_4x32x16", {"HMMA.1688.F32.TF32"}, set()),
    ("mm_tc_bf16_20x16x16", {"HMMA.16816.F32.BF16", "LDSM.16.MT88.2"}, set()),
    ("mm_simt_f16_10x12x6", {"FFMA"}, {"HMMA", "LDSM", "LDGSTS"}),
    ("mm_simt_bf16_32x32x32", {"FFMA", CP_ASYNC_128}, {"HMMA"}),
    # B transposed (dev::Transposed): its fragments by ldmatrix without .trans
    ("mmt_tc_f16_64x64x32", {"HMMA.16816.F32", "LDSM.16.M88.4", CP_ASYNC_128}, {"FFMA", "LDSM.16.MT88"}),
    ("mmt_tc_f16_48x24x32", {"HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.M88.2"}, {"LDSM.16.MT88"}),
    ("mmt_tc_bf16_8x128x64", {"HMMA.16816.F32.BF16", "LDSM.16.M88.4", CP_ASYNC_128}, {"LDSM.16.MT88"}),
    ("mmt_tc_f16_16x32x32", {"HMMA.16816.F32", "LDSM.16.M88.4"}, {"LDSM.16.MT88"}),
    ("mmt_simt_f16_10x12x8", {"FFMA", CP_ASYNC_128}, {"HMMA", "LDSM"}),
    # padded products (K or N no whole atom): tensor cores, no CUDA-core product
    ("mm_pad_f16_48x197x24", {"HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4"}, {"FFMA"}),
    ("mm_pad_f16_64x72x37", {"HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4"}, {"FFMA"}),
    ("mm_pad_bf16_32x150x26", {"HMMA.16816.F32.BF16"}, {"FFMA"}),
    ("mm_pad_f32_80x110x5", {"HMMA.1688.F32.TF32"}, {"LDSM"}),
    ("mmt_pad_f16_48x197x21", {"HMMA.16816.F32", "LDSM.16.M88.4"}, {"FFMA", "LDSM.16.MT88"}),
    ("mmt_pad_f16_48x100x32", {"HMMA.16816.F32", "LDSM.16.M88.4"}, {"FFMA", "LDSM.16.MT88"}),
    (
        "attention_f16_d64_kb32",
        {"HMMA.16816.F32", "LDSM.16.M88.4", CP_ASYNC_128, "SHFL.BFLY", STORE_128},
        set(),
    ),
    ("unary_f16", {CP_ASYNC_128, STORE_128, "MUFU.EX2"}, set()),
    ("binary_broadcast_bf16", {STORE_128}, set()),
    ("reduce_2x3x8x64", {"SHFL.BFLY"}, set()),
    ("rms_1x2048", {"SHFL.BFLY", "MUFU.RSQ"}, set()),
    ("accumulators_f16", {CP_ASYNC_128, "SHFL.BFLY"}, set()),
    # block-wide reductions: 16-byte shared reads, warp shuffles, a barrier around the combine
    ("reduce_2x4096_t512", {"LDS.128", "SHFL.BFLY", "BAR.SYNC.DEFER_BLOCKING"}, set()),
    ("reduce_1x1024_t128", {"LDS.128", "SHFL.BFLY", "BAR.SYNC.DEFER_BLOCKING"}, set()),
    ("reduce_3x2048_t256", {"LDS.128", "SHFL.BFLY", "BAR.SYNC.DEFER_BLOCKING"}, set()),
    ("rms_norm_1x4096_t1024", {"LDS.128", "SHFL.BFLY", "MUFU.RSQ"}, set()),
    ("rms_norm_2x4096_t256", {"LDS.128", "SHFL.BFLY", "MUFU.RSQ"}, set()),
]


@pytest.mark.parametrize(("kernel", "required", "forbidden"), KERNEL_EXPECTATIONS)
def test_kernel_sass(
    kernels: dict[str, set[str]], kernel: str, required: set[str], forbidden: set[str]
) -> None:
    found = kernels[kernel]
    assert required <= found, f"{kernel} lacks {sorted(required - found)}"
    assert not [prefix for prefix in forbidden if has(found, prefix)], f"{kernel}: {sorted(found)}"


# (kernel, barriers: one after the load, two per block-wide combine; the reduce kernels have a sum
# and a max branch, the rms_norm kernels two calls)
BLOCK_REDUCTION_BARRIERS = [
    ("reduce_2x4096_t512", 5),
    ("reduce_1x1024_t128", 5),
    ("reduce_3x2048_t256", 5),
    ("rms_norm_1x4096_t1024", 5),  # two rms_norm calls
    ("rms_norm_2x4096_t256", 5),
    ("reduce_2x4096_t512_warps", 1),  # no scratch: a warp per row
]


@pytest.mark.parametrize(("kernel", "barriers"), BLOCK_REDUCTION_BARRIERS)
def test_few_long_rows_are_reduced_by_several_warps(kernel: str, barriers: int) -> None:
    source = (KERNEL_DIR / "test_device_lib_reduction.cu").read_text()
    sass = sass_by_function(compile_source(source, OPTIONS, dumps={Stage.SASS}).sass())[kernel]
    assert len(re.findall(r"\bBAR\.SYNC", sass)) == barriers


def test_every_test_kernel_is_checked_and_uses_no_local_memory(kernels: dict[str, set[str]]) -> None:
    assert len(kernels) >= 25
    spilling = [name for name, found in kernels.items() if has(found, "LDL") or has(found, "STL")]
    assert spilling == []


# ---- compile-time checks --------------------------------------------------------------------

STATIC_CHECKS = [
    # (declaration that must not compile, message the library gives)
    (
        "elementwise_binary<128>(make_shared_tile<RowMajor<4, 8>>(f), make_shared_tile<RowMajor<4, 8>>(f),"
        " make_shared_tile<RowMajor<3, 8>>(f), Add{});",
        "the second input does not broadcast to the output",
    ),
    (
        "elementwise_unary<128>(make_shared_tile<RowMajor<4, 8>>(f),"
        " make_shared_tile<RowMajor<8, 4>>(f), Exp{});",
        "a unary op keeps the shape of its input",
    ),
    (
        "reduce_sum<128, 3>(make_shared_tile<RowMajor<4, 2>>(f), make_shared_tile<RowMajor<4, 8>>(f));",
        "the output must be the input with dim Dim of size 1",
    ),
    (
        "reduce_to_dimx<128, 3>(make_shared_tile<RowMajor<4, 3>>(f), make_shared_tile<RowMajor<4, 8>>(f));",
        "reduction_to_dimx needs the extent to be a multiple of dimx",
    ),
    (
        "TensorCoreMatmul<__half, RowMajor<16, 16>, RowMajor<16, 12>, 128>::Accumulator acc;"
        " TensorCoreMatmul<__half, RowMajor<16, 16>, RowMajor<16, 12>, 128>::run(acc,"
        " make_shared_tile<RowMajor<16, 16>>(h), make_shared_tile<RowMajor<16, 12>>(h));",
        "shape not supported by tensor cores",
    ),
    ("RegisterTile<RowMajor<4, 6>, 128, 4> r;", "a chunk must lie within one row"),
    (
        "TensorCoreMatmul<__half, RowMajor<16, 64>, Swizzled128Layout<1, 1, 64, 64>, 128>::Accumulator acc;",
        "a swizzled tile (wgmma's form) is read by pitch here",
    ),
]


def test_static_checks_reject_bad_instantiations() -> None:
    assert_each_is_rejected(STATIC_CHECKS, OPTIONS)


def test_the_documented_kernel_compiles() -> None:
    """The generated-kernel example of docs/codegen.md §3 builds, with the instructions it promises."""
    doc = (KERNEL_DIR.parents[2] / "docs" / "codegen.md").read_text()
    section = doc[doc.index("## 3. A generated kernel") :]
    source = section[
        section.index("```cpp") + len("```cpp") : section.index("```\n", section.index("```cpp") + 6)
    ]
    found = opcodes(
        sass_by_function(compile_source(source, OPTIONS, dumps={Stage.SASS}).sass())["custom_kernel_0"]
    )
    assert {"HMMA.16816.F32", CP_ASYNC_128, STORE_128, "MUFU.EX2"} <= found
    assert not has(found, "LDL") and not has(found, "STL")


# ---- tiling formula on the host -------------------------------------------------------------

TILE_MAP_PROGRAM = r"""
#include <cstdio>
#include <mirage/tile_map.cuh>
#include <mirage/layout.cuh>
using namespace mirage::dev;
using Tile = Layout<2, 3, 4, 5>;
int main() {
  long long s[4];
  int imap[3], omap[3], forloop_dim, range, block[3], r;
  while (std::scanf("%lld %lld %lld %lld %d %d %d %d %d %d %d %d %d %d %d %d", &s[0], &s[1], &s[2], &s[3],
                    &imap[0], &imap[1], &imap[2], &omap[0], &omap[1], &omap[2], &forloop_dim, &range,
                    &block[0], &block[1], &block[2], &r) == 16) {
    const Strides strides{{s[0], s[1], s[2], s[3]}};
    const uint3 b{unsigned(block[0]), unsigned(block[1]), unsigned(block[2])};
    const DimMap input_map{imap[0], imap[1], imap[2]};
    const TileCoordinate c = locate_input_tile<Tile>(strides, input_map, forloop_dim, range, b);
    const long long out = locate_output_tile<Tile>(strides, DimMap{omap[0], omap[1], omap[2]}, b);
    std::printf("%lld %lld\n", (long long)c.at(r), out);
  }
}
"""
TILE = (2, 3, 4, 5)


def reference_input_offset(strides, imap, forloop_dim, forloop_range, block, iteration) -> int:
    """The notes' formula (§1.3): block offset per imap, then block-major-then-iteration on fmap."""
    offset = [0, 0, 0, 0]
    for axis_block, dim in zip(block, imap, strict=True):
        if dim >= 0:
            offset[dim] = axis_block
    if forloop_dim >= 0:
        offset[forloop_dim] = offset[forloop_dim] * forloop_range + iteration
    return sum(o * t * s for o, t, s in zip(offset, TILE, strides, strict=True))


def reference_output_offset(strides, omap, block) -> int:
    offset = [0, 0, 0, 0]
    for axis_block, dim in zip(block, omap, strict=True):
        if dim >= 0:
            offset[dim] = axis_block
    return sum(o * t * s for o, t, s in zip(offset, TILE, strides, strict=True))


def tile_map_cases() -> list[tuple]:
    strides_options = [(360, 120, 20, 1), (1000, 200, 32, 1), (7, 11, 13, 17)]
    imaps = [(-1, -1, -1), (3, 2, -1), (0, -1, 1), (2, 2, -1), (-1, 1, 0)]
    cases = []
    for strides, imap, forloop_dim, (range_, iteration) in itertools.product(
        strides_options, imaps, (-1, 0, 2, 3), ((1, 0), (4, 3), (3, 1))
    ):
        for block in ((0, 0, 0), (1, 2, 3), (3, 0, 1)):
            omap = imap[::-1]
            cases.append((strides, imap, omap, forloop_dim, range_, block, iteration))
    return cases


def test_tile_map_matches_the_reference_formula(tmp_path: Path) -> None:
    program = build_host_program(tmp_path, TILE_MAP_PROGRAM, "tile_map")
    cases = tile_map_cases()
    lines = [
        " ".join(str(v) for v in (*strides, *imap, *omap, forloop_dim, range_, *block, iteration))
        for strides, imap, omap, forloop_dim, range_, block, iteration in cases
    ]
    run = subprocess.run(
        [str(program)], input="\n".join(lines), capture_output=True, text=True, check=True
    )
    results = [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()]
    assert len(results) == len(cases) > 500
    for (strides, imap, omap, forloop_dim, range_, block, iteration), (got_in, got_out) in zip(
        cases, results, strict=True
    ):
        assert got_in == reference_input_offset(strides, imap, forloop_dim, range_, block, iteration)
        assert got_out == reference_output_offset(strides, omap, block)
