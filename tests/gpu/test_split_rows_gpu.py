"""Split-row log_softmax, logsumexp and softmax on the GPU (mirage.generator.split_rows): every candidate
against float64 with logits far outside exp's half and float32 range and rows of −inf, and a sampler's
``log_softmax(logits / 0.7)`` through ``mirage.superoptimize``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.generator import split_rows  # noqa: E402
from tests.unit.generator.test_split_rows import lse_reference, softmax_reference  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = {"llama2": (8, 32000), "llama3": (4, 128256), "gpt2": (8, 50257)}  # GPT-2's: 29 slices of 1,733


@pytest.mark.parametrize("form", ["log_softmax", "logsumexp", "softmax"])
@pytest.mark.parametrize("shape", SHAPES)
def test_split_candidates_match_float64_far_outside_exps_range(shape, form):
    # the softmax's scale is exact in float16: x / 0.7 rounded to float16 (the reference's
    # intermediate, as PyTorch's) is off by up to 1/16 at ±250, which exp makes a 6 % error of the
    # probability against float64's unrounded quotient, in PyTorch's own softmax as in ours
    reference = (softmax_reference(*SHAPES[shape], scale=0.5) if form == "softmax"
                 else lse_reference(*SHAPES[shape], form == "log_softmax"))
    graphs = split_rows.candidates(reference)
    assert graphs
    x = torch.randn(*SHAPES[shape], device="cuda") * 40  # x / 0.7 reaches ±250
    x[1] -= 300.0
    x[2, ::2] = -torch.inf
    x[3, -SHAPES[shape][1] // 5:] = -torch.inf  # a masked tail: whole slices of −inf
    x = x.half()
    for program in build_many([generate_cuda_program(g) for g in graphs]):
        assert not isinstance(program, Exception), program
        result = check_on_gpu(reference, program.with_poison(), inputs=[x])
        assert result.passed, result.as_dict()


def test_a_samplers_log_probs_through_superoptimize():
    logits = torch.randn(8, 32000, device="cuda", dtype=torch.float16) * 8

    def log_probs(z):
        return torch.log_softmax(z / 0.7, -1)

    fast = mi.superoptimize(log_probs, (logits,), time_limit_s=5, progress=False)
    assert "split-row µGraph(s) float-checked" in fast.report()
    want = log_probs(logits.double())
    torch.testing.assert_close(fast(logits).double(), want, rtol=2e-3, atol=2e-2)
