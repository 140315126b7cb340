"""The K split of register-accumulated tensor-core matmuls, checked without a GPU.

``dev::detail::choose_split_warp_grid`` (matmul.cuh) picks warp grids (m × n warps, k groups that
split K); ``gen::BlockMatmul`` (gen/kernel.cuh) uses it for accumulators kept in registers across
the for-loop and adds the groups' partial sums once, at write-back. Here: the chooser on a table
of named shapes and its invariants on a sweep (a host program), the grids of the generated
benchmark kernels, their SASS (the split unrolled, no local memory, the write-back's barriers),
the test kernels of ``test_matmul_split_kernels.cu`` and the library's compile-time checks.
tests/gpu/test_matmul_split_gpu.py runs the kernels against float64.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from codegen_helpers import assert_each_is_rejected, build_host_program, needs_nvcc

from benchmarks.mugraphs import CASES
from benchmarks.variants import family
from mirage.codegen.compile import CompileOptions, Stage, compile_source, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.errors import MirageError
from mirage.mugraph.target import TARGETS
from mirage.optimizer.pipeline import OptimizerOptions

HERE = Path(__file__).parent
OPTIONS = CompileOptions(target=TARGETS["H100"])
UNSPLIT = CompileOptions(target=TARGETS["H100"], defines=(("MIRAGE_SPLIT_K", "0"),))
STEP_BYTES = 32  # one k-step of one operand row: 16 fp16/bf16 or 8 fp32 elements



pytestmark = needs_nvcc


# ---- the chooser --------------------------------------------------------------------------------

PLAN_PROGRAM = r"""
#include <cstdio>
#include <mirage/matmul.cuh>
using namespace mirage::dev;
int main() {
  detail::SplitQuery q{};
  while (std::scanf("%d %d %d %d %d %d %d", &q.rows, &q.cols, &q.k_steps, &q.warps, &q.batch, &q.step_bytes,
                    &q.copy_chunks) == 7) {
    using Model = detail::MmaCostModel;
    const detail::WarpGrid grid = detail::choose_split_warp_grid(q);
    const detail::WarpGrid base = detail::choose_warp_grid(q.rows, q.cols, q.warps, 16, 8);
    const int cycles = grid.m > 0 ? Model::cycles(grid, q.rows, q.cols, q.k_steps, q.step_bytes) : 0;
    const int base_cycles = base.m > 0 ? Model::cycles(base, q.rows, q.cols, q.k_steps, q.step_bytes) : 0;
    std::printf("%d %d %d %d %d %d %d %d\n", grid.m, grid.n, grid.k, cycles, base.m, base.n, base_cycles,
                detail::RegisterBudget::split_values(q.warps, q.copy_chunks));
  }
}
"""


@dataclass(frozen=True)
class Plan:
    grid: tuple[int, int, int]
    cycles: int
    base: tuple[int, int]
    base_cycles: int
    value_limit: int


@dataclass(frozen=True)
class Shape:
    rows: int  # a multiple of 16 (M padded)
    cols: int
    k_steps: int
    warps: int
    batch: int = 1
    copy_chunks: int = 8  # 16-byte chunks of the operand tiles each thread copies per stage


@pytest.fixture(scope="module")
def plan_program(tmp_path_factory) -> Path:
    return build_host_program(tmp_path_factory.mktemp("plan"), PLAN_PROGRAM)


def plans(program: Path, shapes: list[Shape]) -> list[Plan]:
    lines = [
        f"{s.rows} {s.cols} {s.k_steps} {s.warps} {s.batch} {STEP_BYTES} {s.copy_chunks}" for s in shapes
    ]
    run = subprocess.run([str(program)], input="\n".join(lines), capture_output=True, text=True, check=True)
    out = []
    for line in run.stdout.splitlines():
        m, n, k, cycles, base_m, base_n, base_cycles, limit = (int(v) for v in line.split())
        out.append(Plan((m, n, k), cycles, (base_m, base_n), base_cycles, limit))
    assert len(out) == len(shapes)
    return out


# (what, shape, expected grid (m, n, k)); copy chunks as the benchmark tiles have them
PLAN_CASES = [
    (
        "rmsnorm_b1 tile, K 512, 8 warps: A read once, 6 chains of 8",
        Shape(16, 48, 32, 8, copy_chunks=15),
        (1, 1, 4),
    ),
    ("rmsnorm tile, K 256, 8 warps", Shape(16, 48, 16, 8, copy_chunks=8), (1, 1, 4)),
    (
        "rmsnorm tile, K 512, 16 warps: 16 accumulator values at most",
        Shape(16, 48, 32, 16, copy_chunks=8),
        (1, 2, 4),
    ),
    ("rmsnorm tile, K 256, 16 warps", Shape(16, 48, 16, 16, copy_chunks=4), (1, 2, 4)),
    (
        "K 1024 per iteration, 29 copy chunks: 21 values at most",
        Shape(16, 48, 64, 8, copy_chunks=29),
        (1, 2, 4),
    ),
    ("gatedmlp tile, K 256, 4 warps", Shape(16, 32, 16, 4, copy_chunks=11), (1, 1, 4)),
    ("gatedmlp tile, K 128, 8 warps", Shape(16, 32, 8, 8, copy_chunks=2), (1, 1, 4)),
    (
        "128 threads copying 36 chunks each: 3 tiles per warp, not 6",
        Shape(16, 48, 32, 4, copy_chunks=36),
        (1, 2, 2),
    ),
    ("two fragments per thread (batch 2)", Shape(16, 32, 16, 8, batch=2), (1, 2, 4)),
    ("lora concat tile (K 256 + 16), 8 warps", Shape(16, 128, 17, 8, copy_chunks=8), (1, 4, 2)),
    ("one n8 tile, 4 warps", Shape(16, 8, 32, 4), (1, 1, 4)),
    ("two row tiles, N 16", Shape(32, 16, 8, 8), (1, 1, 4)),
    ("one k-step: nothing to split", Shape(16, 16, 1, 4), (1, 2, 1)),
    ("square tile, two k-steps: chains already parallel", Shape(64, 64, 2, 4), (2, 2, 1)),
    ("48 x 24, two k-steps", Shape(48, 24, 2, 4), (3, 1, 1)),
]


def test_chooser_picks_the_expected_grids(plan_program: Path) -> None:
    got = plans(plan_program, [shape for _, shape, _ in PLAN_CASES])
    for (what, _, expected), plan in zip(PLAN_CASES, got, strict=True):
        assert plan.grid == expected, f"{what}: {plan}"


def test_chooser_invariants_over_a_sweep(plan_program: Path) -> None:
    """Every grid fits the block and the shape, never costs more than the unsplit grid, keeps the
    unsplit (m, n) when it does not split, and respects the accumulator budget."""
    shapes = [
        Shape(rows, cols, steps, warps, batch, chunks)
        for rows, cols, steps, warps, batch, chunks in itertools.product(
            (16, 32, 64), (8, 16, 24, 48, 64, 128), (1, 2, 3, 8, 17, 32), (1, 2, 4, 8, 16), (1, 2), (4, 40)
        )
    ]
    splits = 0
    for shape, plan in zip(shapes, plans(plan_program, shapes), strict=True):
        m, n, k = plan.grid
        assert m >= 1 and n >= 1 and k >= 1, (shape, plan)
        assert m * n * k <= shape.warps and shape.rows % (16 * m) == 0 and shape.cols % (8 * n) == 0
        assert k <= max(1, shape.k_steps)
        assert plan.cycles <= plan.base_cycles, (shape, plan)
        if k == 1:
            assert (m, n) == plan.base, (shape, plan)
            continue
        splits += 1
        values = shape.batch * (shape.rows // (16 * m)) * (shape.cols // (8 * n)) * 4
        base_values = (
            shape.batch * (shape.rows // (16 * plan.base[0])) * (shape.cols // (8 * plan.base[1])) * 4
        )
        assert values <= max(plan.value_limit, base_values), (shape, plan)
    assert 100 < splits < len(shapes)


# ---- the generated benchmark kernels -----------------------------------------------------------


def register_matmuls(code: str) -> list[str]:
    """The BlockMatmul types of a generated module that keep an accumulator in registers (kThreads
    substituted), in order."""
    threads = int(re.search(r"constexpr int kThreads = (\d+);", code).group(1))
    found = []
    for name, type_name in re.findall(r"using (mm\d+) = (mirage::gen::BlockMatmul<.*?>);\n", code):
        if re.search(name + r"::accumulate(_with|_scaled)?\(", code):
            found.append(type_name.replace("kThreads", str(threads)))
    return found


def grids_of(directory: Path, type_names: list[str]) -> list[tuple[int, int, int]]:
    lines = "\n".join(
        f'  {{ using B = {t}; std::printf("%d %d %d\\n", B::kRegisterGrid.m, B::kRegisterGrid.n, '
        f"B::kSplitK ? B::kRegisterGrid.k : 1); }}"
        for t in type_names
    )
    program = build_host_program(
        directory, f"#include <cstdio>\n#include <mirage/gen/kernel.cuh>\nint main() {{\n{lines}\n}}\n"
    )
    run = subprocess.run([str(program)], capture_output=True, text=True, check=True)
    return [tuple(int(v) for v in line.split()) for line in run.stdout.splitlines()]


def generated(case: str, label: str) -> str:
    for variant, graph in family(case):
        if variant.label == label:
            return generate_cuda_program(graph, 90, options=OptimizerOptions(stages=variant.stages[-1])).code
    raise KeyError(f"{case} has no member {label}")


# (case, family member, grid of each register accumulator)
FAMILY_GRIDS = [
    ("rmsnorm_b1", "grid=128,iters=8,threads=256", [(1, 1, 4)]),
    ("rmsnorm_b1", "grid=128,iters=8,threads=512", [(1, 2, 4)]),
    ("rmsnorm_b1", "grid=128,iters=16,threads=256", [(1, 1, 4)]),
    ("rmsnorm_b8", "grid=128,iters=16,threads=256", [(1, 1, 4)]),
    ("rmsnorm_b8", "grid=128,iters=16,threads=512", [(1, 2, 4)]),
    ("gatedmlp_m1", "grid=128,iters=16,threads=128", [(1, 1, 4), (1, 1, 4)]),
    ("gatedmlp_m8", "grid=128,iters=32,threads=256", [(1, 1, 4), (1, 1, 4)]),
    ("lora_m16", "grid=64,concat=True,threads=128", [(1, 2, 2)]),
    # 4 warps of 16 values each already: a split would pass the accumulator budget
    ("lora_m16", "grid=32,concat=True,threads=128", [(1, 4, 1)]),
    # X·LA has one k-step: accumulate_with on the unsplit grid
    ("lora_m16", "grid=64,concat=False,threads=128", [(1, 4, 1)]),
]


def test_benchmark_family_grids(tmp_path: Path) -> None:
    types, expected = [], []
    for case, label, grids in FAMILY_GRIDS:
        found = register_matmuls(generated(case, label))
        assert len(found) == len(grids), (case, label)
        types += found
        expected += grids
    assert grids_of(tmp_path, types) == expected


def test_every_weight_streaming_member_splits(tmp_path: Path) -> None:
    """Every rmsnorm and gatedmlp family member that fits in shared memory splits K."""
    types = []
    for case in ("rmsnorm_b1", "rmsnorm_b8", "gatedmlp_m1", "gatedmlp_m8"):
        for variant, graph in family(case):
            try:
                program = generate_cuda_program(
                    graph, 90, options=OptimizerOptions(stages=variant.stages[-1])
                )
            except MirageError:
                continue
            types += register_matmuls(program.code)
    assert len(types) >= 20
    assert all(k > 1 for _, _, k in grids_of(tmp_path, types))


def function_sass(sass: str) -> str:
    """The instructions of a module's kernels (one for the FAMILY_BUILDS members)."""
    return "\n".join(re.split(r"^\s+Function : \S+\s*$", sass, flags=re.MULTILINE)[1:])


def count(sass: str, pattern: str) -> int:
    return len(re.findall(pattern, sass))


# (case, family member, HMMAs in the split kernel (each group's slice unrolled; None: not checked),
# write-back barriers: k − 1 per fp32 register accumulator)
FAMILY_BUILDS = [
    ("rmsnorm_b1", "grid=128,iters=8,threads=256", 8 * 6, 3),
    ("rmsnorm_b8", "grid=128,iters=16,threads=512", 4 * 3, 3),
    ("gatedmlp_m1", "grid=128,iters=16,threads=128", 2 * 4 * 4, 6),
    ("lora_m16", "grid=64,concat=True,threads=128", None, 1),
]


@pytest.fixture(scope="module")
def benchmark_builds() -> dict[str, list]:
    """Builds (or cubin-cache hits) of every benchmark case's default µGraph, and of the
    FAMILY_BUILDS members with and without the split: name → [split, unsplit]."""
    defaults = {name: generate_cuda_program(case.fused(), 90).code for name, case in CASES.items()}
    members = {f"{case} {label}": generated(case, label) for case, label, *_ in FAMILY_BUILDS}
    sources = {**defaults, **members}
    split = compile_sources(list(sources.values()), OPTIONS, dumps={Stage.SASS}, return_exceptions=True)
    unsplit = compile_sources(list(members.values()), UNSPLIT, dumps={Stage.SASS}, return_exceptions=True)
    builds = {name: [result, None] for name, result in zip(sources, split, strict=True)}
    for name, result in zip(members, unsplit, strict=True):
        builds[name][1] = result
    return builds


def sass_of(result) -> str:
    assert not isinstance(result, BaseException), str(result)
    return function_sass(result.sass())


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_cases_compile_without_local_memory(benchmark_builds, name: str) -> None:
    assert count(sass_of(benchmark_builds[name][0]), r"\bLDL|\bSTL") == 0


@pytest.mark.parametrize(("case", "label", "hmma", "barriers"), FAMILY_BUILDS)
def test_split_kernels_unroll_the_slices_and_add_partials_once(
    benchmark_builds, case: str, label: str, hmma: int | None, barriers: int
) -> None:
    split, unsplit = (sass_of(result) for result in benchmark_builds[f"{case} {label}"])
    assert count(split, r"\bLDL|\bSTL") == 0 and count(unsplit, r"\bLDL|\bSTL") == 0
    if hmma is not None:
        assert count(split, r"HMMA\.16816") == hmma
        assert count(unsplit, r"HMMA\.16816") < hmma  # unsplit matmuls loop, two k-steps per trip
    assert count(split, r"BAR\.SYNC") - count(unsplit, r"BAR\.SYNC") == barriers


# ---- the test kernels and the compile-time checks ---------------------------------------------

# (kernel, HMMAs of the busiest group's slice, unrolled; even slices; write-back barriers). Even
# slices give exactly that many HMMAs; uneven ones also get the shorter slice's copy from nvcc.
SPLIT_KERNELS = [
    ("split_f16_2x48x512_auto", 8 * 6, True, 3),  # 1 x 1 x 4
    ("split_f16_16x48x256_auto_f16out", 4 * 6, True, 2 * 4),  # 1 x 1 x 4, two rounds through fp16
    ("split_bf16_8x48x128_auto", 4 * 3, True, 1),  # 1 x 2 x 2 of 16 warps (capped accumulators)
    ("split_f32_32x16x64_3groups", 3 * 1 * 2, False, 2),  # 2 x 1 x 3, TF32 m16n8k8, slices 2 + 3 + 3
    ("split_bf16_4x32x96_4groups", 2 * 4, False, 2 * 4),  # 1 x 1 x 4, slices 1 + 2 + 1 + 2, two rounds
]


@pytest.fixture(scope="module")
def split_kernels() -> dict[str, str]:
    sass = compile_source(
        (HERE / "test_matmul_split_kernels.cu").read_text(), OPTIONS, dumps={Stage.SASS}
    ).sass()
    parts = re.split(r"^\s+Function : (\S+)\s*$", sass, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize(("kernel", "hmma", "even", "write_back_barriers"), SPLIT_KERNELS)
def test_split_test_kernels(
    split_kernels: dict[str, str], kernel: str, hmma: int, even: bool, write_back_barriers: int
) -> None:
    text = split_kernels[kernel]
    reference = split_kernels["split_f16_2x48x512_default"]
    assert count(text, r"\bLDL|\bSTL") == 0
    found = count(text, r"HMMA\.")
    assert (found == hmma) if even else (hmma <= found <= 2 * hmma), found
    # the for-loop's barriers are the unsplit kernel's (same pipeline); the rest is the write-back
    assert count(text, r"BAR\.SYNC") - count(reference, r"BAR\.SYNC") == write_back_barriers
    assert count(reference, r"HMMA\.16816") == 2  # the unsplit loop: two k-steps per trip


STATIC_CHECKS = [
    (
        "using Mm = TensorCoreMatmul<__half, RowMajor<16, 64>, WithPitch<RowMajor<64, 32>, 40>, 128, "
        "FixedWarpGrid<1, 1, 4>>; typename Mm::Accumulator acc; acc.clear(); "
        "Mm::accumulate_into(acc, make_shared_tile<RowMajor<16, 32>>(f));",
        "C += epilogue(A · B) needs whole sums",
    ),
    (
        "using Mm = TensorCoreMatmul<__half, RowMajor<16, 64>, WithPitch<RowMajor<64, 32>, 40>, 128, "
        "FixedWarpGrid<1, 1, 5>>; typename Mm::Accumulator acc; "
        "Mm::run(acc, make_shared_tile<RowMajor<16, 64>>(h), "
        "make_shared_tile<WithPitch<RowMajor<64, 32>, 40>>(h));",
        "shape not supported by tensor cores",
    ),
]


def test_static_checks_reject_whole_sum_updates_of_a_split() -> None:
    assert_each_is_rejected(STATIC_CHECKS, OPTIONS)


# ---- the GPU test's µGraphs ------------------------------------------------------------------------


def gpu_test_module():
    path = HERE.parents[1] / "gpu" / "test_matmul_split_gpu.py"
    spec = importlib.util.spec_from_file_location("matmul_split_gpu_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_gpu_test_graphs_exercise_the_split(tmp_path: Path) -> None:
    """The random-shape µGraphs of the GPU test generate, and each keeps a split accumulator."""
    module = gpu_test_module()
    types, names = [], []
    for case in module.RANDOM_CASES:
        options = OptimizerOptions(stages=case.stages)
        found = register_matmuls(generate_cuda_program(case.graph(), 90, options=options).code)
        assert len(found) == 1, case
        types += found
        names.append(case)
    grids = grids_of(tmp_path, types)
    assert len(names) >= 20
    unsplit = [case for case, (_, _, k) in zip(names, grids, strict=True) if k == 1]
    assert not unsplit, unsplit
    assert {case.kind for case in names} == {"sum", "exp", "max", "silu"}
