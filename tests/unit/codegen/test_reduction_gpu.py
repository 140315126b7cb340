"""Block-wide reductions on a GPU: the kernels of test_device_lib_reduction.cu (several warps per
row, combined through shared memory) against float64 references, outputs poisoned with NaN."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

from mirage.codegen.compile import CompileOptions, compile_source  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SOURCE = Path(__file__).parent / "test_device_lib_reduction.cu"


@pytest.fixture(scope="module")
def module():
    return cupy.RawModule(path=str(compile_source(SOURCE.read_text(), CompileOptions()).cubin_path))


def _run(module, name: str, threads: int, out_elements: int, x: torch.Tensor, *extra) -> np.ndarray:
    out = torch.full((out_elements,), float("nan"), dtype=torch.float32, device="cuda")
    function = module.get_function(name)
    function.max_dynamic_shared_size_bytes = 64 * 1024
    function((1, 1, 1), (threads, 1, 1), (cupy.asarray(out), cupy.asarray(x), *extra), shared_mem=64 * 1024)
    torch.cuda.synchronize()
    return out.double().cpu().numpy()


# (kernel, threads, rows, cols)
REDUCTIONS = [
    ("reduce_2x4096_t512", 512, 2, 4096),
    ("reduce_1x1024_t128", 128, 1, 1024),
    ("reduce_3x2048_t256", 256, 3, 2048),
]


@pytest.mark.parametrize(("name", "threads", "rows", "cols"), REDUCTIONS)
@pytest.mark.parametrize("which", [0, 1])
def test_block_wide_reduction(module, name, threads, rows, cols, which):
    generator = torch.Generator().manual_seed(rows * cols + which)
    x = torch.randn(rows, cols, generator=generator).half().cuda()
    reference = x.double().cpu().numpy()
    expected = (reference**2).sum(axis=1) if which == 0 else reference.max(axis=1)
    got = _run(module, name, threads, rows, x, np.int32(which))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_warp_per_row_reduction_without_scratch(module):
    x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(3)).half().cuda()
    expected = (x.double().cpu().numpy() ** 2).sum(axis=1)
    np.testing.assert_allclose(
        _run(module, "reduce_2x4096_t512_warps", 512, 2, x), expected, rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize(
    ("name", "threads", "rows"), [("rms_norm_1x4096_t1024", 1024, 1), ("rms_norm_2x4096_t256", 256, 2)]
)
def test_block_wide_rms_norm(module, name, threads, rows):
    cols, eps = 4096, 1e-6
    x = (torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows)) * 3).half().cuda()
    reference = x.double().cpu().numpy()
    normalized = reference / np.sqrt((reference**2).mean(axis=1, keepdims=True) + eps)
    got = _run(module, name, threads, 2 * rows * cols, x, np.float32(eps))
    np.testing.assert_allclose(got[: rows * cols], normalized.ravel(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[rows * cols :], 2 * normalized.ravel(), rtol=1e-4, atol=1e-5)
