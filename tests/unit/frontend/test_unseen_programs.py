"""Every program of ``benchmarks.unseen`` (but the three largest) captured, partitioned, lowered and
run through the compiled-kernel executor (reference graphs interpreted, outputs at the addresses the
GPU's allocator would give), three calls on fresh inputs, against float64 eager PyTorch."""

import copy

import pytest
import torch

import mirage as mi
from benchmarks.unseen import PROGRAMS
from tests.unit.frontend.frontend_calls import float64_calls

LARGE = {"long_causal_attention", "wide_head_attention", "decode_attention",  # minutes in float64
         "sd15_self_attention"}  # a minute (16 heads of 4,096 tokens); sd15_cross_attention stays


@pytest.mark.parametrize("name", sorted(set(PROGRAMS) - LARGE))
def test_an_unseen_program_gives_what_eager_float64_gives_call_after_call(name, gpu_like):
    cls, shapes = PROGRAMS[name]
    torch.manual_seed(0)
    model = cls().eval()
    reference = copy.deepcopy(model).double()
    fast = mi.superoptimize(model, tuple(torch.randn(s) for s in shapes), search=False, use_cache=False,
                            progress=False)
    fresh = lambda: tuple(torch.randn(s) for s in shapes)  # noqa: E731
    for got, want in float64_calls(fast, reference, fresh, calls=3):
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5, name
