"""RMSNorm's member with the pre-defined matmul (``mlp.rmsnorm_two_kernels(library_product=True)``) on a
GPU: the generated normalization kernel, then the kernel-level matmul through torch. The program must
pass the float check against the float64 reference at both sizes, and give the eager call's outputs
(to fp16 rounding: the library may pick another GEMM under capture) when replayed from a CUDA graph with
new inputs copied in."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

from benchmarks.variants import family  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402

pytestmark = pytest.mark.gpu


def _program(case: str):
    (graph,) = [g for v, g in family(case) if "library_product=True" in v.label]
    (program,) = build_many([generate_cuda_program(graph, None)])
    return graph, program


@pytest.mark.parametrize("case", ["rmsnorm_b1", "rmsnorm_b8"])
def test_library_product_member_passes_the_float_check(case):
    graph, program = _program(case)
    result = check_on_gpu(graph, program.with_poison(), inputs=random_inputs(graph, seed=7))
    assert result.passed, result.as_dict()


def test_library_product_member_replays_from_a_cuda_graph():
    graph, program = _program("rmsnorm_b8")
    first, second = random_inputs(graph, seed=1), random_inputs(graph, seed=2)
    expected = program(*second)[0].clone()
    static = [x.clone() for x in first]
    program(*static)  # warm-up outside the capture
    torch.cuda.synchronize()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        (out,) = program(*static)
    for s, x in zip(static, second, strict=True):
        s.copy_(x)
    captured.replay()
    torch.cuda.synchronize()
    assert not torch.allclose(program(*first)[0], expected, atol=1e-2)  # the inputs tell the runs apart
    torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)  # the library may pick another GEMM
