"""K-split register accumulators on a GPU, against float64 references.

Warp groups that split K keep partial sums in registers for the whole for-loop and add them once, at
write-back (``dev::TensorCoreMatmul`` with a split grid, ``gen::BlockMatmul``). Checked here:

* the test kernels of tests/unit/codegen/test_matmul_split_kernels.cu (fp16, bf16, TF32; fp32 and
  16-bit output tiles; even and uneven slices; a per-row rescale of every partial each iteration);
* the benchmark family members whose accumulators split (rmsnorm, gatedmlp, LoRA), built with and
  without the split (``-DMIRAGE_SPLIT_K=0``): both match float64, and each other;
* GEMV-like µGraphs of random shapes, plain sums (``accumulate``) and the forms that fall back to
  whole products in group 0 (``exp`` before the sum and a running max: ``accumulate_with``), with
  and without a batch dim inside the block.

Outputs are poisoned with NaN first (unwritten elements show). Tolerances are tighter than the
suite's (mirage.codegen.gpu_check.TOLERANCES): a lost or doubled partial sum moves the result by
whole percents. tests/unit/codegen/test_matmul_split.py checks on the CPU that every µGraph here
keeps a split accumulator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import mirage as mi
from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import KernelGraph

pytestmark = pytest.mark.gpu

KERNEL_SOURCE = Path(__file__).parents[1] / "unit" / "codegen" / "test_matmul_split_kernels.cu"
SHARED_BYTES = 160 * 1024  # the largest test kernel needs 119 KiB
SPLIT_TOLERANCES = {DType.FLOAT16: 3e-3, DType.BFLOAT16: 2e-2, DType.FLOAT32: 5e-3}


# ---- µGraphs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemvCase:
    """Y = accumulate over the for-loop of (X · W) tiles, blocks splitting N, iterations K."""

    kind: str  # "sum", "exp" (sum of exp(x / 64)), "max" (running maximum), "silu" (silu of the sum)
    rows: int  # M
    k_tile: int  # K per iteration
    n_tile: int  # N per block
    blocks: int
    iterations: int
    threads: int
    batch: int = 0  # 0: 2-D operands; else a leading dim kept whole inside each block
    dtype: str = "float16"
    stages: int = 2

    @property
    def label(self) -> str:
        batch = f"b{self.batch}_" if self.batch else ""
        return (
            f"{self.kind}_{batch}{self.rows}x{self.k_tile * self.iterations}x{self.n_tile * self.blocks}"
            f"_k{self.k_tile}_t{self.threads}_{self.dtype}"
        )

    def graph(self) -> KernelGraph:
        dtype = getattr(mi, self.dtype)
        k, n = self.k_tile * self.iterations, self.n_tile * self.blocks
        lead = (self.batch,) if self.batch else ()
        g = mi.new_kernel_graph(f"split_{self.kind}")
        x = g.new_input(dims=(*lead, self.rows, k), dtype=dtype, name="X")
        w = g.new_input(dims=(*lead, k, n), dtype=dtype, name="W")
        tb = mi.new_threadblock_graph(
            grid_dim=(self.blocks, 1, 1), block_dim=(self.threads, 1, 1), forloop_range=self.iterations
        )
        last = len(lead) + 1
        bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=last)
        bw = tb.new_input(w, input_map=(last, -1, -1), forloop_dim=last - 1)
        y = tb.matmul(bx, bw)
        match self.kind:
            case "sum":
                result = tb.forloop_accum(y)
            case "exp":
                result = tb.forloop_accum(tb.exp(tb.mul_scalar(y, 1.0 / 64)))
            case "max":
                result = tb.forloop_accum_max(y)
            case "silu":
                result = tb.silu(tb.forloop_accum(y))
            case _:
                raise ValueError(f"unknown kind {self.kind!r}")
        tb.new_output(result, output_map=(last, -1, -1))
        (out,) = g.customized([x, w], tb)
        g.mark_output(out)
        return g.freeze()


def _random_cases(count: int, seed: int = 8) -> list[GemvCase]:
    """Shapes drawn from the GEMV range the split is for: few rows, narrow N tiles, long K tiles."""
    draw = random.Random(seed)
    kinds = ["sum", "sum", "silu", "exp", "max"]
    cases = []
    while len(cases) < count:
        dtype = draw.choice(["float16", "float16", "bfloat16", "float32"])
        wide = dtype != "float32"  # TF32 tiles take twice the bytes: keep them short
        case = GemvCase(
            kind=kinds[len(cases) % len(kinds)],
            rows=draw.choice([1, 2, 5, 8, 16]),
            k_tile=draw.choice([128, 256, 512] if wide else [64, 128]),
            n_tile=draw.choice([16, 32, 48] if wide else [16, 32]),
            blocks=draw.choice([2, 4, 6]),
            iterations=draw.choice([2, 3, 8]),
            threads=draw.choice([128, 256, 512]),
            batch=draw.choice([0, 0, 0, 2]),
            dtype=dtype,
        )
        if case.batch and case.k_tile * case.n_tile > 256 * 32:
            continue  # two batches of a long tile would not fit shared memory
        cases.append(case)
    return cases


RANDOM_CASES = _random_cases(24)

# benchmark family members whose register accumulators split K (test_matmul_split.FAMILY_GRIDS)
FAMILY_MEMBERS = [
    ("rmsnorm_b1", "grid=128,iters=8,threads=256"),
    ("rmsnorm_b1", "grid=128,iters=16,threads=512"),
    ("rmsnorm_b8", "grid=128,iters=16,threads=256"),
    ("rmsnorm_b8", "grid=128,iters=16,threads=512"),
    ("gatedmlp_m1", "grid=128,iters=16,threads=128"),
    ("gatedmlp_m1", "grid=128,iters=32,threads=256"),
    ("gatedmlp_m8", "grid=128,iters=32,threads=256"),
    ("lora_m16", "grid=64,concat=True,threads=128"),
    ("lora_m16", "grid=32,concat=True,threads=256"),
]


# ---- the test kernels -----------------------------------------------------------------------------

# (kernel, input dtype, output dtype, M, N, K, threads, grid (x, y), forloop range, tolerance)
KERNEL_CASES = [
    ("split_f16_2x48x512_auto", "f16", "f32", 2, 48, 512, 256, (3, 2), 4, 1e-4),
    ("split_f16_2x48x512_default", "f16", "f32", 2, 48, 512, 256, (3, 2), 4, 1e-4),
    ("split_f16_16x48x256_auto_f16out", "f16", "f16", 16, 48, 256, 256, (2, 2), 3, 2e-3),
    ("split_bf16_8x48x128_auto", "bf16", "f32", 8, 48, 128, 512, (2, 1), 5, 1e-4),
    ("split_f32_32x16x64_3groups", "f32", "f32", 32, 16, 64, 256, (2, 2), 3, 3e-3),  # TF32 inputs
    ("split_bf16_4x32x96_4groups", "bf16", "bf16", 4, 32, 96, 128, (2, 3), 2, 1.6e-2),
]
TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


@pytest.fixture(scope="module")
def split_module():
    pytest.importorskip("cupy")
    import cupy

    from mirage.codegen.compile import CompileOptions, compile_source

    result = compile_source(KERNEL_SOURCE.read_text(), CompileOptions())
    return cupy.RawModule(path=str(result.cubin_path))


def _reference(a: np.ndarray, b: np.ndarray, k: int, forloop_range: int, decay: float) -> np.ndarray:
    total = np.zeros((a.shape[0], b.shape[1]))
    for r in range(forloop_range):
        total = decay * total + a[:, r * k : (r + 1) * k] @ b[r * k : (r + 1) * k, :]
    return total


@pytest.mark.parametrize("decay", [1.0, 0.75])
@pytest.mark.parametrize(
    ("kernel", "dtype", "out_dtype", "m", "n", "k", "threads", "grid", "forloop_range", "tolerance"),
    KERNEL_CASES,
)
def test_split_kernel_matches_float64(
    split_module, kernel, dtype, out_dtype, m, n, k, threads, grid, forloop_range, tolerance, decay
) -> None:
    import cupy
    import torch

    generator = torch.Generator().manual_seed(11)
    element = getattr(torch, TORCH_DTYPES[dtype])
    a = (torch.rand((m * grid[1], k * forloop_range), generator=generator, dtype=torch.float64) * 2 - 1).to(
        element
    )
    b = (torch.rand((k * forloop_range, n * grid[0]), generator=generator, dtype=torch.float64) * 2 - 1).to(
        element
    )
    c = torch.full((m * grid[1], n * grid[0]), float("nan"), dtype=getattr(torch, TORCH_DTYPES[out_dtype]))
    a, b, c = a.cuda(), b.cuda(), c.cuda()

    def pointer(t):
        return cupy.asarray(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)

    function = split_module.get_function(kernel)
    function.max_dynamic_shared_size_bytes = SHARED_BYTES
    arguments = (pointer(c), pointer(a), pointer(b), np.int32(forloop_range), np.float32(decay))
    function((grid[0], grid[1], 1), (threads, 1, 1), arguments, shared_mem=SHARED_BYTES)
    torch.cuda.synchronize()
    got = c.double().cpu().numpy()
    expected = _reference(a.double().cpu().numpy(), b.double().cpu().numpy(), k, forloop_range, decay)
    assert not np.isnan(got).any(), "unwritten (NaN) outputs"
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * scale)


# ---- generated programs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def programs():
    """Every µGraph of this file built twice: with the split and with -DMIRAGE_SPLIT_K=0."""
    pytest.importorskip("cupy")
    from benchmarks.variants import family
    from mirage.codegen.compile import CompileOptions
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import build_many
    from mirage.optimizer.pipeline import OptimizerOptions

    graphs = {}
    for case, label in FAMILY_MEMBERS:
        variant, graph = next((v, g) for v, g in family(case) if v.label == label)
        graphs[f"{case} {label}"] = (graph, variant.stages[-1])
    for case in RANDOM_CASES:
        graphs[case.label] = (case.graph(), case.stages)
    cudas = [generate_cuda_program(g, None, options=OptimizerOptions(stages=s)) for g, s in graphs.values()]
    split = build_many(cudas)
    unsplit = build_many(cudas, CompileOptions(defines=(("MIRAGE_SPLIT_K", "0"),)))
    return {
        name: (graph, a, b) for (name, (graph, _)), a, b in zip(graphs.items(), split, unsplit, strict=True)
    }


def _check_both(programs, name: str, scale: float, dtype: DType) -> None:
    from mirage.codegen.gpu_check import check_on_gpu, random_inputs
    from mirage.codegen.runtime import Program

    graph, split, unsplit = programs[name]
    assert isinstance(split, Program), split
    assert isinstance(unsplit, Program), unsplit
    inputs = random_inputs(graph, 3, scale)
    with_split = check_on_gpu(graph, split, inputs=inputs, tolerances=SPLIT_TOLERANCES, name=name)
    assert with_split.passed, with_split.as_dict()
    without = check_on_gpu(graph, unsplit, inputs=inputs, tolerances=SPLIT_TOLERANCES, name=name)
    assert without.passed, without.as_dict()
    for a, b in zip(split(*inputs), unsplit(*inputs), strict=True):
        a, b = a.double().cpu().numpy(), b.double().cpu().numpy()
        # two summation orders of the same fp32 sums, rounded to the output type
        assert np.abs(a - b).max() <= 2 * SPLIT_TOLERANCES[dtype] * max(np.abs(b).max(), 1e-30)


@pytest.mark.parametrize(("case", "label"), FAMILY_MEMBERS)
def test_benchmark_member_matches_float64(programs, case: str, label: str) -> None:
    from mirage.codegen.gpu_check import BENCHMARK_SCALE

    _check_both(programs, f"{case} {label}", BENCHMARK_SCALE, DType.FLOAT16)


@pytest.mark.parametrize("case", RANDOM_CASES, ids=lambda c: c.label)
def test_random_gemv_graph_matches_float64(programs, case: GemvCase) -> None:
    _check_both(programs, case.label, 0.5, DType[case.dtype.upper()])
