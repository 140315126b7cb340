"""The CUDA device library on a GPU: the test kernels of tests/unit/codegen/test_device_lib_*.cu,
built with mirage.codegen.compile for the current GPU, launched through CuPy on torch tensors and
compared with references computed in float64 on the CPU. Outputs are poisoned with NaN first so
that unwritten elements show.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

from mirage.codegen.compile import CompileError, CompileOptions, compile_sources  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

KERNEL_DIR = Path(__file__).parents[1] / "unit" / "codegen"
KERNEL_FILES = ("io", "matmul", "elementwise", "accumulator")
SHARED_BYTES = 48 * 1024
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


@pytest.fixture(scope="module")
def kernels():
    sources = [(KERNEL_DIR / f"test_device_lib_{name}.cu").read_text() for name in KERNEL_FILES]
    results = compile_sources(sources, CompileOptions())
    modules = []
    for result in results:
        assert not isinstance(result, CompileError)
        modules.append(cupy.RawModule(path=str(result.cubin_path)))
    return modules


def _argument(value):
    if isinstance(value, torch.Tensor):
        assert value.is_cuda
        return cupy.asarray(value.view(torch.int16) if value.dtype == torch.bfloat16 else value)
    return value


def launch(modules, name: str, grid: tuple[int, int, int], threads: int, *args) -> None:
    function = None
    for module in modules:
        try:
            function = module.get_function(name)
            break
        except cupy.cuda.driver.CUDADriverError:
            continue
    assert function is not None, f"no kernel {name}"
    function(grid, (threads, 1, 1), tuple(_argument(a) for a in args), shared_mem=SHARED_BYTES)
    torch.cuda.synchronize()


def i64(value: int) -> np.int64:
    return np.int64(value)


def i32(value: int) -> np.int32:
    return np.int32(value)


def f32(value: float) -> np.float32:
    return np.float32(value)


def random_tensor(shape, dtype: torch.dtype, low: float = -1.0, high: float = 1.0, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    values = torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low
    return values.to(dtype).cuda()


def poisoned(shape, dtype: torch.dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def as_float64(tensor) -> np.ndarray:
    return tensor.detach().double().cpu().numpy()


def assert_close(got, expected: np.ndarray, rtol: float, atol: float) -> None:
    got = as_float64(got) if isinstance(got, torch.Tensor) else got
    assert got.shape == expected.shape
    assert not np.isnan(got).any(), "unwritten (NaN) outputs"
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


# ---- tiling: input iterators and output savers ----------------------------------------------


def tensor_shape(tile, grid, space_map, forloop_dim=-1, forloop_range=1):
    shape = list(tile)
    for size, dim in zip(grid, space_map, strict=True):
        if dim >= 0:
            shape[dim] *= size
    if forloop_dim >= 0:
        shape[forloop_dim] *= forloop_range
    return tuple(shape)


def input_tile(tensor: np.ndarray, tile, imap, forloop_dim, forloop_range, block, iteration) -> np.ndarray:
    """The notes' formula (§1.3): imap offsets, then block-major-then-iteration on the fmap dim."""
    offset = [0, 0, 0, 0]
    for index, dim in zip(block, imap, strict=True):
        if dim >= 0:
            offset[dim] = index
    if forloop_dim >= 0:
        offset[forloop_dim] = offset[forloop_dim] * forloop_range + iteration
    return tensor[tuple(slice(o * t, (o + 1) * t) for o, t in zip(offset, tile, strict=True))]


def padded(shape, dtype, pad: int, seed: int):
    """A tensor of `shape` whose rows are `pad` elements longer in memory than they are."""
    storage = random_tensor((*shape[:-1], shape[-1] + pad), dtype, seed=seed)
    return storage[..., : shape[-1]]


# (kernel, dtype, threads, tile, grid, imap, forloop_dim, forloop_range, row padding, 16-byte path)
COPY_CASES = [
    ("copy_tiles_f16_16x64", "f16", 128, (1, 1, 16, 64), (4, 2, 1), (3, 2, -1), 3, 2, 0, True),
    ("copy_tiles_f16_16x64", "f16", 128, (1, 1, 16, 64), (2, 1, 3), (2, -1, 0), 2, 5, 0, True),
    ("copy_tiles_f16_16x64", "f16", 128, (1, 1, 16, 64), (1, 1, 1), (-1, -1, -1), -1, 2, 0, True),
    ("copy_tiles_f16_16x64", "f16", 128, (1, 1, 16, 64), (2, 1, 1), (2, -1, -1), 3, 2, 3, False),
    ("copy_tiles_bf16_2x3x4x16", "bf16", 64, (2, 3, 4, 16), (2, 2, 1), (0, 1, -1), 2, 2, 0, True),
    ("copy_tiles_f32_8x32", "f32", 128, (1, 1, 8, 32), (2, 2, 1), (-1, 2, -1), 3, 4, 0, True),
    ("copy_tiles_f16_6x10", "f16", 64, (1, 1, 6, 10), (2, 1, 1), (3, -1, -1), 2, 3, 0, False),
]


@pytest.mark.parametrize(
    (
        "kernel",
        "dtype",
        "threads",
        "tile",
        "grid",
        "imap",
        "forloop_dim",
        "forloop_range",
        "pad",
        "vectorized",
    ),
    COPY_CASES,
)
def test_input_iterator_tiles(
    kernels, kernel, dtype, threads, tile, grid, imap, forloop_dim, forloop_range, pad, vectorized
) -> None:
    shape = tensor_shape(tile, grid, imap, forloop_dim, forloop_range)
    source = padded(shape, DTYPES[dtype], pad, seed=1)
    blocks = grid[0] * grid[1] * grid[2]
    out = poisoned((blocks, forloop_range, *tile), DTYPES[dtype])
    flags = torch.full((1,), -1, dtype=torch.int32, device="cuda")
    strides = [i64(s) for s in source.stride()]
    maps = [*map(i32, imap), i32(forloop_dim), i32(forloop_range)]
    launch(kernels, kernel, grid, threads, out, source, *strides, *maps, flags)
    assert flags.item() == int(vectorized)
    reference = as_float64(source)
    got = as_float64(out)
    for bz, by, bx in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
        block = bx + grid[0] * (by + grid[1] * bz)
        for iteration in range(forloop_range):
            expected = input_tile(reference, tile, imap, forloop_dim, forloop_range, (bx, by, bz), iteration)
            np.testing.assert_array_equal(got[block, iteration], expected)


# (kernel, dtype, threads, tile, grid, omap, through a register tile, row padding)
SAVE_CASES = [
    ("save_tiles_f16_16x64", "f16", 128, (1, 1, 16, 64), (2, 3, 1), (3, 2, -1), 0, 0),
    ("save_tiles_f16_16x64", "f16", 128, (1, 1, 16, 64), (2, 3, 1), (3, 2, -1), 1, 0),
    ("save_tiles_f16_16x64", "f16", 128, (1, 1, 16, 64), (2, 1, 1), (2, -1, -1), 1, 5),
    ("save_tiles_bf16_2x3x4x16", "bf16", 64, (2, 3, 4, 16), (2, 1, 2), (0, -1, 2), 1, 0),
    ("save_tiles_f32_8x32", "f32", 128, (1, 1, 8, 32), (3, 1, 1), (2, -1, -1), 0, 4),
    ("save_tiles_f16_6x10", "f16", 64, (1, 1, 6, 10), (2, 2, 1), (3, 2, -1), 1, 0),
    ("save_tiles_f16_6x10", "f16", 64, (1, 1, 6, 10), (2, 2, 1), (3, 2, -1), 0, 3),
]


@pytest.mark.parametrize(
    ("kernel", "dtype", "threads", "tile", "grid", "omap", "registers", "pad"), SAVE_CASES
)
def test_output_saver_places_tiles(kernels, kernel, dtype, threads, tile, grid, omap, registers, pad) -> None:
    blocks = grid[0] * grid[1] * grid[2]
    source = random_tensor((blocks, *tile), DTYPES[dtype], seed=2)
    shape = tensor_shape(tile, grid, omap)
    storage = poisoned((*shape[:-1], shape[-1] + pad), DTYPES[dtype])
    out = storage[..., : shape[-1]]
    strides = [i64(s) for s in out.stride()]
    launch(kernels, kernel, grid, threads, out, source, *strides, *map(i32, omap), f32(2.0), i32(registers))
    got = as_float64(out)
    assert not np.isnan(got).any(), "unwritten (NaN) outputs"
    assert np.isnan(as_float64(storage)[..., shape[-1] :]).all(), "wrote into the row padding"
    reference = as_float64(source)
    for bz, by, bx in itertools.product(range(grid[2]), range(grid[1]), range(grid[0])):
        block = bx + grid[0] * (by + grid[1] * bz)
        placed = input_tile(got, tile, omap, -1, 1, (bx, by, bz), 0)
        np.testing.assert_array_equal(placed, 2.0 * reference[block])


# ---- matmul ---------------------------------------------------------------------------------

# (kernel, input dtype, output dtype, M, N, K, threads, grid (x, y), forloop range, tolerance)
MATMUL_CASES = [
    ("mm_tc_f16_64x64x32", "f16", "f16", 64, 64, 32, 128, (2, 2), 4, 4e-3),
    ("mm_tc_bf16_32x64x16", "bf16", "f32", 32, 64, 16, 128, (1, 2), 3, 1e-4),
    ("mm_tc_f32_32x32x16", "f32", "f32", 32, 32, 16, 128, (2, 1), 2, 3e-3),  # TF32 inputs
    ("mm_tc_f16_16x8x16", "f16", "f32", 16, 8, 16, 128, (3, 2), 5, 1e-4),
    ("mm_tc_f16_48x24x32", "f16", "f16", 48, 24, 32, 128, (1, 1), 2, 4e-3),
    ("mm_tc_f16_8x64x32", "f16", "f32", 8, 64, 32, 128, (2, 3), 2, 1e-4),
    ("mm_tc_f32_4x32x16", "f32", "f32", 4, 32, 16, 128, (1, 2), 3, 3e-3),
    ("mm_tc_bf16_20x16x16", "bf16", "bf16", 20, 16, 16, 128, (2, 2), 2, 1.6e-2),
    ("mm_simt_f16_10x12x6", "f16", "f32", 10, 12, 6, 64, (2, 3), 3, 1e-5),
    ("mm_simt_bf16_32x32x32", "bf16", "bf16", 32, 32, 32, 128, (1, 1), 2, 1.6e-2),
    # padded products: N or K no whole atom (the padding columns unwritten, the elements past K zeroed)
    ("mm_pad_f16_48x197x24", "f16", "f16", 48, 197, 24, 128, (2, 2), 3, 4e-3),
    ("mm_pad_f16_64x72x37", "f16", "f16", 64, 72, 37, 64, (2, 1), 3, 4e-3),
    ("mm_pad_bf16_32x150x26", "bf16", "f32", 32, 150, 26, 64, (1, 2), 2, 1e-4),
    ("mm_pad_f32_80x110x5", "f32", "f32", 80, 110, 5, 128, (2, 1), 3, 3e-3),
]
# B given transposed (dev::Transposed: Bᵀ row-major, copied as it lies)
MATMUL_BT_CASES = [
    ("mmt_tc_f16_64x64x32", "f16", "f16", 64, 64, 32, 128, (2, 2), 4, 4e-3),
    ("mmt_tc_f16_48x24x32", "f16", "f32", 48, 24, 32, 128, (2, 1), 3, 1e-4),
    ("mmt_tc_bf16_8x128x64", "bf16", "f32", 8, 128, 64, 128, (3, 2), 2, 1e-4),
    ("mmt_tc_f16_16x32x32", "f16", "f32", 16, 32, 32, 128, (2, 2), 3, 1e-4),
    ("mmt_simt_f16_10x12x8", "f16", "f32", 10, 12, 8, 64, (2, 3), 3, 1e-5),
    ("mmt_pad_f16_48x197x21", "f16", "f16", 48, 197, 21, 128, (2, 2), 3, 4e-3),
    ("mmt_pad_f16_48x100x32", "f16", "f16", 48, 100, 32, 64, (2, 1), 2, 4e-3),
]


@pytest.mark.parametrize(
    ("kernel", "dtype", "out_dtype", "m", "n", "k", "threads", "grid", "forloop_range", "tolerance",
     "transposed"),
    [(*case, False) for case in MATMUL_CASES] + [(*case, True) for case in MATMUL_BT_CASES],
)
def test_matmul(kernels, kernel, dtype, out_dtype, m, n, k, threads, grid, forloop_range, tolerance,
                transposed) -> None:
    a = random_tensor((m * grid[1], k * forloop_range), DTYPES[dtype], seed=3)
    b = random_tensor((k * forloop_range, n * grid[0]), DTYPES[dtype], seed=4)
    c = poisoned((m * grid[1], n * grid[0]), DTYPES[out_dtype])
    launch(kernels, kernel, (grid[0], grid[1], 1), threads, c, a, b.T.contiguous() if transposed else b,
           i32(forloop_range))
    expected = as_float64(a) @ as_float64(b)
    scale = np.abs(expected).max()
    assert_close(c, expected, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize("scale", [0.125, 4.0])
def test_attention_with_online_softmax(kernels, scale: float) -> None:
    rows, keys, depth = 16 * 3, 32 * 4, 64
    q = torch.randn((rows, depth), generator=torch.Generator().manual_seed(5)).half().cuda()
    k = torch.randn((keys, depth), generator=torch.Generator().manual_seed(6)).half().cuda()
    v = torch.randn((keys, depth), generator=torch.Generator().manual_seed(7)).half().cuda()
    o = poisoned((rows, depth), torch.float16)
    launch(kernels, "attention_f16_d64_kb32", (1, 3, 1), 128, o, q, k.t().contiguous(), v, i32(4), f32(scale))
    logits = scale * as_float64(q) @ as_float64(k).T
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected = (weights / weights.sum(axis=1, keepdims=True)) @ as_float64(v)
    assert_close(o, expected, rtol=1e-2, atol=1e-2)


def test_documented_kernel(kernels) -> None:
    """The generated-kernel example of docs/codegen.md §3: C = silu(A · B), 4096 x 512 x 4096."""
    doc = (Path(__file__).parents[2] / "docs" / "codegen.md").read_text()
    section = doc[doc.index("## 3. A generated kernel") :]
    start = section.index("```cpp") + len("```cpp")
    (result,) = compile_sources([section[start : section.index("```\n", start)]], CompileOptions())
    module = cupy.RawModule(path=str(result.cubin_path))
    a = random_tensor((4096, 512), torch.float16, seed=15)
    b = random_tensor((512, 4096), torch.float16, seed=16)
    c = poisoned((4096, 4096), torch.float16)
    launch([module], "custom_kernel_0", (64, 64, 1), 128, c, a, b)
    expected = torch.nn.functional.silu(a.float() @ b.float()).double().cpu().numpy()
    assert_close(c, expected, rtol=1e-2, atol=1e-2)


# ---- element-wise ---------------------------------------------------------------------------

SCALAR, LOW, HIGH = 0.75, -0.5, 0.25


def _silu(x):
    return x / (1 + np.exp(-x))


def _gelu(x):
    return torch.nn.functional.gelu(torch.from_numpy(x)).numpy()


# (name, index in unary_ops, reference, input range)
UNARY_OPS = [
    ("exp", 0, np.exp, (-3, 3)),
    ("log", 1, np.log, (0.1, 4)),
    ("sqrt", 2, np.sqrt, (0, 4)),
    ("square", 3, np.square, (-3, 3)),
    ("sigmoid", 4, lambda x: 1 / (1 + np.exp(-x)), (-6, 6)),
    ("silu", 5, _silu, (-6, 6)),
    ("gelu", 6, _gelu, (-4, 4)),
    ("relu", 7, lambda x: np.maximum(x, 0), (-2, 2)),
    ("mul_scalar", 8, lambda x: SCALAR * x, (-2, 2)),
    ("clamp", 9, lambda x: np.clip(x, LOW, HIGH), (-2, 2)),
    ("chain", 10, lambda x: np.square(_silu(SCALAR * x)), (-3, 3)),
    ("chain_in_registers", 11, lambda x: np.square(_silu(SCALAR * x)), (-3, 3)),
    ("exp_in_place", 12, np.exp, (-3, 3)),
    ("tanh", 13, np.tanh, (-4, 4)),
]
TOLERANCE = {"f16": 2e-3, "bf16": 1.6e-2, "f32": 2e-6}


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize(
    ("name", "index", "reference", "domain"), UNARY_OPS, ids=[row[0] for row in UNARY_OPS]
)
def test_unary_ops(kernels, dtype, name, index, reference, domain) -> None:
    x = random_tensor((8, 64), DTYPES[dtype], *domain, seed=8)
    y = poisoned((8, 64), DTYPES[dtype])
    launch(kernels, f"unary_{dtype}", (1, 1, 1), 128, y, x, i32(index), f32(SCALAR), f32(LOW), f32(HIGH))
    tolerance = TOLERANCE[dtype]
    assert_close(y, reference(as_float64(x)), rtol=tolerance, atol=tolerance)


# (name, index in binary_ops, reference)
BINARY_OPS = [
    ("add", 0, np.add),
    ("sub", 1, np.subtract),
    ("mul", 2, np.multiply),
    ("div", 3, np.divide),
    ("pow", 4, np.power),
    ("maximum", 5, np.maximum),
    ("add_then_chain", 6, lambda a, b: np.maximum(SCALAR * (a + b), 0)),
    ("register_combine", 7, lambda a, b: (0 + a) * b),
]
BINARY_SHAPES = [
    # (kernel, dtype, a shape, b shape)
    ("binary_broadcast_f16", "f16", (2, 1, 4, 16), (1, 3, 4, 1)),
    ("binary_broadcast_bf16", "bf16", (2, 1, 4, 16), (1, 3, 4, 1)),
    ("binary_broadcast_f32", "f32", (2, 1, 4, 16), (1, 3, 4, 1)),
    ("binary_same_f32", "f32", (4, 32), (4, 32)),
]


@pytest.mark.parametrize(
    ("kernel", "dtype", "a_shape", "b_shape"), BINARY_SHAPES, ids=[r[0] for r in BINARY_SHAPES]
)
@pytest.mark.parametrize(("name", "index", "reference"), BINARY_OPS, ids=[row[0] for row in BINARY_OPS])
def test_binary_ops_with_broadcasting(
    kernels, kernel, dtype, a_shape, b_shape, name, index, reference
) -> None:
    a = random_tensor(a_shape, DTYPES[dtype], 0.5, 2.0, seed=9)
    b = random_tensor(b_shape, DTYPES[dtype], -2.0, 2.0, seed=10)
    if name == "div":  # keep divisors away from zero
        b = torch.where(b < 0, b - 0.5, b + 0.5)
    expected = reference(as_float64(a), as_float64(b))
    out = poisoned(expected.shape, DTYPES[dtype])
    launch(kernels, kernel, (1, 1, 1), 128, out, a, b, i32(index), f32(SCALAR))
    tolerance = TOLERANCE[dtype]
    assert_close(out, expected, rtol=tolerance, atol=tolerance)


# ---- reductions -----------------------------------------------------------------------------


def _to_dimx(x: np.ndarray, dim: int, dimx: int) -> np.ndarray:
    """out[j] = Σ_k x[j + dimx·k] along `dim`."""
    shape = list(x.shape)
    shape[dim : dim + 1] = [shape[dim] // dimx, dimx]
    return x.reshape(shape).sum(axis=dim)


# (index in reduce_2x3x8x64, reference)
REDUCTIONS = [
    *[(dim, lambda x, d=dim: x.sum(axis=d, keepdims=True)) for dim in range(4)],
    *[(4 + dim, lambda x, d=dim: x.max(axis=d, keepdims=True)) for dim in range(4)],
    (8, lambda x: _to_dimx(x, 3, 16)),
    (9, lambda x: _to_dimx(x, 2, 4)),
]


@pytest.mark.parametrize(("which", "reference"), REDUCTIONS, ids=[str(row[0]) for row in REDUCTIONS])
def test_reductions(kernels, which, reference) -> None:
    x = random_tensor((2, 3, 8, 64), torch.float16, seed=11)
    expected = reference(as_float64(x))
    out = poisoned(expected.shape, torch.float32)
    launch(kernels, "reduce_2x3x8x64", (1, 1, 1), 128, out, x, i32(which))
    assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("which", "axis"), [(0, 1), (1, 0)])
def test_reductions_with_many_or_few_outputs(kernels, which: int, axis: int) -> None:
    x = random_tensor((256, 8), torch.float32, seed=12)
    expected = as_float64(x).sum(axis=axis, keepdims=True)
    out = poisoned(expected.shape, torch.float32)
    launch(kernels, "reduce_256x8", (1, 1, 1), 128, out, x, i32(which))
    assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_rms_of_a_long_row(kernels) -> None:
    x = random_tensor((1, 2048), torch.bfloat16, seed=13)
    out = poisoned((1, 1), torch.float32)
    launch(kernels, "rms_1x2048", (1, 1, 1), 128, out, x)
    assert_close(out, np.sqrt(np.mean(as_float64(x) ** 2, keepdims=True)), rtol=1e-5, atol=1e-6)


# ---- forloop accumulators -------------------------------------------------------------------

RANGE = 3


def _tiles(x: np.ndarray) -> list[np.ndarray]:
    return [x[:, 64 * r : 64 * (r + 1)] for r in range(RANGE)]


def _softmax_terms(x: np.ndarray) -> np.ndarray:
    return np.exp(x - x.max(axis=1, keepdims=True))


# (name, kind in accumulators(), reference of x [16, 64 R])
ACCUMULATORS = [
    ("sum", 0, lambda x: sum(_tiles(x))),
    ("sum_of_silu", 1, lambda x: sum(_silu(t) for t in _tiles(x))),
    ("sum_last_dim", 2, lambda x: x.sum(axis=1, keepdims=True)),
    ("mean_last_dim", 3, lambda x: x.mean(axis=1, keepdims=True)),
    ("rms_last_dim", 4, lambda x: np.sqrt((x**2).mean(axis=1, keepdims=True))),
    ("sum_to_dimx", 5, lambda x: sum(_to_dimx(t, 1, 16) for t in _tiles(x))),
    ("max", 6, lambda x: np.maximum.reduce(_tiles(x))),
    ("rescaled_sum_last_dim", 7, lambda x: _softmax_terms(x).sum(axis=1, keepdims=True)),
    ("rescaled_sum", 8, lambda x: sum(_tiles(_softmax_terms(x)))),
]


@pytest.mark.parametrize("dtype", ["f16", "f32"])
@pytest.mark.parametrize(("name", "kind", "reference"), ACCUMULATORS, ids=[row[0] for row in ACCUMULATORS])
def test_forloop_accumulators(kernels, dtype, name, kind, reference) -> None:
    x = random_tensor((16, 64 * RANGE), DTYPES[dtype], -8.0, 8.0, seed=14)
    expected = reference(as_float64(x))
    out = poisoned(expected.shape, torch.float32)
    launch(kernels, f"accumulators_{dtype}", (1, 1, 1), 128, out, x, i32(RANGE), i32(kind))
    assert_close(out, expected, rtol=2e-5, atol=1e-4)
