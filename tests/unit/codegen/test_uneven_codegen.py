"""Uneven grids in the generated code: every block's tile starts at ``min(block · tile, span - tile)``
along an uneven axis (``dev::TileEnds``), for input iterators and output savers alike, and the µGraphs
of benchmarks/mugraphs/uneven.py compile for sm_90a without local memory
(tests/gpu/test_padded_products_gpu.py runs them). Even grids keep the code they had (no clamp)."""

from __future__ import annotations

from codegen_helpers import compile_collection, needs_nvcc

from benchmarks.mugraphs.padded import GRAPHS as EVEN
from benchmarks.mugraphs.uneven import GRAPHS
from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.target import TARGETS


def test_the_tiles_of_an_uneven_axis_end_at_the_dim():
    code = generate_cuda_program(GRAPHS["vit_attention"](), 90).code
    # Q (12, 197, 64) in tiles of 50 rows, the last starting at row 147; the output likewise
    ends = "mirage::dev::TileEnds{ {mirage::dev::kEven, mirage::dev::kEven, 147, mirage::dev::kEven} }"
    assert code.count(ends) == 2
    code = generate_cuda_program(GRAPHS["vit_projection"](), 90).code
    assert code.count("TileEnds{ {mirage::dev::kEven, mirage::dev::kEven, 147, mirage::dev::kEven} }") == 2
    assert "TileEnds" not in generate_cuda_program(EVEN["odd_n"](), 90).code


@needs_nvcc
def test_uneven_graphs_compile_without_local_memory():
    results = compile_collection(GRAPHS)
    for name, result in results.items():
        sass = result.sass()
        assert "LDL" not in sass and "STL" not in sass, f"{name} spills"
    assert "HMMA" in results["vit_attention"].sass()


# (real keys, key groups) → the keys the warp-form chain runs (gen/softmax_detail.cuh, padded_keys)
PADDED_KEYS = {(197, 1): 256, (197, 4): 256, (77, 1): 80, (77, 4): 128, (100, 1): 112, (208, 1): 208,
               (64, 1): 64, (40, 2): 64}
# (real query rows, warps) → the rows it runs (padded_rows): tiles the warps divide, or a multiple of them
PADDED_ROWS = {(15, 4): 16, (25, 4): 32, (50, 4): 64, (48, 4): 64, (64, 4): 64, (80, 4): 128, (100, 4): 128,
               (197, 4): 256, (16, 8): 16, (48, 8): 64, (33, 2): 64, (200, 8): 256}


def test_the_chain_pads_the_keys_and_rows_as_the_device_library_does():
    from mirage.optimizer.softmax_chain import padded_keys, padded_rows

    assert {key: padded_keys(*key) for key in PADDED_KEYS} == PADDED_KEYS
    assert {key: padded_rows(*key) for key in PADDED_ROWS} == PADDED_ROWS


@needs_nvcc
def test_the_device_library_pads_the_keys_and_rows_as_the_chain_does():
    checks = "\n".join([f"static_assert(mirage::gen::softmax_detail::padded_keys({k}, {g}) == {n});"
                        for (k, g), n in PADDED_KEYS.items()]
                       + [f"static_assert(mirage::gen::softmax_detail::padded_rows({r}, {w}) == {n});"
                          for (r, w), n in PADDED_ROWS.items()])
    source = f'#include "mirage/gen/softmax.cuh"\n{checks}\n__global__ void padded_keys_checked() {{}}\n'
    (result,) = compile_sources([source], CompileOptions(target=TARGETS["H100"]), return_exceptions=True)
    assert not isinstance(result, Exception), str(result)


def test_attention_over_keys_that_no_fragment_divides_runs_the_chain():
    """ViT's 197 keys (16-row blocks, four warps of 64 keys: 256 run), CLIP's 77 (also causal, the mask
    computed), 100 a step."""
    for name, build in (("vit_attention_16", GRAPHS["vit_attention_16"]),
                        ("vit_attention_16_rows", GRAPHS["vit_attention_16_rows"]),
                        ("clip_attention", GRAPHS["clip_attention"]),
                        ("clip_causal_attention", GRAPHS["clip_causal_attention"]),
                        ("keys_100_attention", EVEN["keys_100_attention"])):
        code = generate_cuda_program(build(), 90).code
        assert "mirage::gen::OnlineSoftmax<" in code, name
        assert ("mirage::gen::CausalMask>" in code) == ("causal" in name), name  # computed, not read
        in_place = name != "vit_attention_16_rows" and "keys" not in name  # K in place: stored rows are keys
        assert ("mirage::dev::Transposed<" in code) == in_place, name


# ---- dev::TileEnds on the host, against mirage.mugraph.build.tile_start ----------------------------

TILE_ENDS_PROGRAM = r"""
#include <cstdio>
#include <mirage/tile_map.cuh>
#include <mirage/layout.cuh>
using namespace mirage::dev;
using Tile = Layout<2, 3, 4, 5>;
int main() {
  long long s[4], last[4];
  int map[3], block[3];
  while (std::scanf("%lld %lld %lld %lld %d %d %d %d %d %d %lld %lld %lld %lld", &s[0], &s[1], &s[2], &s[3],
                    &map[0], &map[1], &map[2], &block[0], &block[1], &block[2], &last[0], &last[1], &last[2],
                    &last[3]) == 14) {
    const Strides strides{{s[0], s[1], s[2], s[3]}};
    const uint3 b{unsigned(block[0]), unsigned(block[1]), unsigned(block[2])};
    TileEnds ends;
    for (int d = 0; d < 4; ++d) ends.last[d] = last[d] < 0 ? kEven : last[d];
    const DimMap dims{map[0], map[1], map[2]};
    std::printf("%lld %lld\n", (long long)locate_input_tile<Tile>(strides, dims, -1, 1, b, ends).at(0),
                (long long)locate_output_tile<Tile>(strides, dims, b, ends));
  }
}
"""


@needs_nvcc
def test_tile_ends_start_each_tile_where_the_interpreter_does(tmp_path):
    import itertools
    import subprocess

    from codegen_helpers import build_host_program

    from mirage.mugraph.build import tile_extent, tile_start

    tile = (2, 3, 4, 5)
    shape = (2, 3, 10, 13)  # dims 2 and 3 split unevenly: 3 blocks of 4 over 10, 3 of 5 over 13
    strides = (390, 130, 13, 1)
    cases = []
    for dim_map in ((-1, 2, 3), (3, -1, 2), (2, 3, -1)):
        for block in itertools.product(range(3), repeat=3):
            last = [-1] * 4
            for d in dim_map:
                if d >= 0:
                    assert tile_extent(shape[d], 3, shape[d]) == tile[d]
                    last[d] = shape[d] - tile[d]
            want = sum(tile_start(block[a], tile[d], shape[d]) * strides[d]
                       for a, d in enumerate(dim_map) if d >= 0)
            cases.append((dim_map, block, last, want))
    program = build_host_program(tmp_path, TILE_ENDS_PROGRAM, "tile_ends")
    lines = [" ".join(map(str, (*strides, *m, *b, *last))) for m, b, last, _ in cases]
    run = subprocess.run([str(program)], input="\n".join(lines), capture_output=True, text=True, check=True)
    got = [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()]
    assert len(got) == len(cases) == 81
    assert all(g == (want, want) for g, (_, _, _, want) in zip(got, cases, strict=True))
    assert {c[3] for c in cases} >= {6 * 13 + 8, 6 * 13}  # the last tiles start at 6 and 8, not 8 and 10


# (keys, rows a block, threads, K read in place): key groups of 1 to 8 warps, padded to 64–256 keys
CHAIN_SHAPES = [(33, 16, 64, True), (77, 32, 128, False), (100, 64, 256, True), (130, 16, 256, False),
                (197, 64, 128, True), (197, 32, 64, False)]


@needs_nvcc
def test_uneven_attention_of_any_key_count_runs_the_chain_and_compiles_without_spills():
    from benchmarks.mugraphs.attention import one_kernel
    from benchmarks.mugraphs.uneven import keys_in_place

    def build(keys, rows, threads, in_place):  # 4 uneven blocks of ``rows`` rows a head
        graph = one_kernel(2, 4 * rows - 3, keys, 64, rows=rows, key_tile=keys, threads=threads)
        return keys_in_place(graph) if in_place else graph

    builders = {shape: lambda shape=shape: build(*shape) for shape in CHAIN_SHAPES}
    for shape, build_graph in builders.items():
        assert "mirage::gen::OnlineSoftmax<" in generate_cuda_program(build_graph(), 90).code, shape
    for shape, result in compile_collection(builders).items():
        sass = result.sass()
        assert "LDL" not in sass and "STL" not in sass, shape


@needs_nvcc
def test_uneven_query_blocks_of_64_rows_take_the_warpgroup_chain():
    """253 queries in 4 blocks of 64 rows (the last at 189) over 256 keys: whole warpgroup tiles, so the
    chain's warpgroup form with K and V copied by TMA; Q's copy and the output clamp their starts."""
    from benchmarks.mugraphs.attention import one_kernel
    from mirage.optimizer import OptimizerOptions

    graph = one_kernel(4, 253, 256, 64, rows=64, key_tile=128, threads=128)
    options = OptimizerOptions(warpgroup_softmax=True, tma_copies=True)
    program = generate_cuda_program(graph, 90, options=options)
    assert "mirage::dev::TensorMapIterator<" in program.code and "Swizzled128Layout" in program.code
    assert program.code.count("mirage::dev::kEven, 189, mirage::dev::kEven} }") == 2
    sass = compile_collection({"uneven_warpgroup": lambda: graph}, options)["uneven_warpgroup"].sass()
    assert "LDL" not in sass and "STL" not in sass


def test_padded_keys_and_rows_take_a_mask_read_from_its_tile():
    """A mask read from its tile (a bias; the causal one with ``generated_masks=False``) runs on the
    chain over padded keys and rows: the padded ones are hidden, never read (gen/softmax_columns.cuh)."""
    from mirage.optimizer import OptimizerOptions

    graph = GRAPHS["clip_causal_attention"]()
    read = generate_cuda_program(graph, 90, options=OptimizerOptions(generated_masks=False)).code
    assert "mirage::gen::MaskTile<" in read and "mirage::gen::CausalMask>" not in read
    for name in ("biased_attention", "biased_attention_50"):
        assert "mirage::gen::MaskTile<" in generate_cuda_program(GRAPHS[name](), 90).code, name


def test_query_blocks_of_no_whole_16_row_tiles_run_the_chain_padded():
    """Blocks of 15, 50 and 25 query rows (uneven over 100 and 197 tokens, even over 100): the chain
    runs whole 16-row tiles, its Q tile holding the real rows only (gen/softmax.cuh's kPaddedRows)."""
    from mirage.optimizer.softmax_chain import warp_split

    for name, build, rows in (("tokens_100_attention", GRAPHS["tokens_100_attention"], 15),
                              ("causal_100_attention", GRAPHS["causal_100_attention"], 50),
                              ("vit_attention", GRAPHS["vit_attention"], 50),
                              ("rows_25_attention", EVEN["rows_25_attention"], 25)):
        code = generate_cuda_program(build(), 90).code
        (line,) = [line for line in code.splitlines() if "mirage::gen::OnlineSoftmax<" in line]
        assert f"mirage::dev::Layout<1, 1, {rows}, 64, " in line.split(",", 2)[2], name  # Q's tile
    assert warp_split(50, 100, 128) == 1 and warp_split(15, 197, 128) == 4
    assert warp_split(100, 64, 128) == 1  # 7 row tiles over 4 warps: 8 run, 2 a warp
