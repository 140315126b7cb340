"""Split-row norms on the GPU (mirage.generator.split_norms): every candidate against float64 for
Stable Diffusion's group norm and a style network's instance norm, with a mean far from 0, and
``silu(GroupNorm(32, 320))`` through ``mirage.superoptimize``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.generator import split_norms  # noqa: E402
from tests.unit.generator.test_split_norms import group_norm_reference  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = {"sd_group_norm": (64, 40960, "value"), "instance_norm": (64, 65536, "row"),
         "long_rms_norm": (8, 16384, "column")}


@pytest.mark.parametrize("offset", [0.0, 40.0])
@pytest.mark.parametrize("case", CASES)
def test_split_norm_candidates_match_float64(case, offset):
    rows, cols, per = CASES[case]
    reference = group_norm_reference(rows, cols, per, centered=case != "long_rms_norm")
    graphs = split_norms.candidates(reference)
    assert graphs
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [(torch.randn(t.shape, device="cuda", generator=generator) * (3 if i == 0 else 1)
               + (offset if i == 0 else 0)).half() for i, t in enumerate(reference.input_types)]
    for program in build_many([generate_cuda_program(g) for g in graphs]):
        assert not isinstance(program, Exception), program
        result = check_on_gpu(reference, program.with_poison(), inputs=inputs)
        assert result.passed, result.as_dict()


def test_stable_diffusions_group_norm_through_superoptimize():
    norm = torch.nn.GroupNorm(32, 320).cuda().half()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
        norm.bias.normal_(0.0, 0.2)
    model = torch.nn.Sequential(norm, torch.nn.SiLU()).eval()
    x = torch.randn(2, 320, 64, 64, device="cuda", dtype=torch.float16) * 2 + 1
    fast = mi.superoptimize(model, (x,), time_limit_s=5, progress=False, use_cache=False)
    assert "split-row µGraph(s) float-checked" in fast.report()
    with torch.no_grad():
        want = torch.nn.functional.silu(torch.nn.functional.group_norm(
            x.double(), 32, norm.weight.double(), norm.bias.double(), norm.eps))
        torch.testing.assert_close(fast(x).double(), want, rtol=2e-3, atol=2e-2)
