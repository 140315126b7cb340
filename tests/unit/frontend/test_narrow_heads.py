"""Attention over heads of no whole 16 (Stable Diffusion 1.5's 40) through ``superoptimize``: a one-kernel
µGraph of 40-dim heads serves the captured program and computes what float64 eager computes, on the CPU
(the interpreter) and on a GPU (its generated kernel: the online-softmax chain's warp form, Q·K's depth
padded to 48 with zeroed fragments, V's five column tiles, K read in place)."""

import pytest
import torch

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel
from benchmarks.mugraphs.uneven import keys_in_place
from benchmarks.unseen import PrefillAttention

SHAPE = (1, 4, 128, 40)  # 4 heads of 128 tokens, 40 dims


def _check(device: str) -> None:
    q, k, v = (torch.randn(SHAPE, device=device).half() for _ in range(3))
    model = PrefillAttention()
    candidate = keys_in_place(one_kernel(4, 128, 128, 40, rows=64, key_tile=64))
    fast = mi.superoptimize(model, (q, k, v), search=False, candidates=[candidate], use_cache=False,
                            progress=False)
    (choice,) = fast.specializations[0].choices.values()
    assert choice.source == "candidate", fast.report()
    with torch.no_grad():
        want = model(q.double(), k.double(), v.double())
        torch.testing.assert_close(fast(q, k, v).double(), want, rtol=2e-3, atol=2e-3)
    code = mi.codegen.generate_cuda_program(choice.graph, 90).code
    assert "mirage::gen::OnlineSoftmax<" in code and "Layout<1, 1, 64, 40," in code


def test_a_narrow_head_attention_mugraph_serves_the_program_on_the_cpu():
    _check("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_a_narrow_head_attention_mugraph_serves_the_program_on_the_gpu():
    _check("cuda")
