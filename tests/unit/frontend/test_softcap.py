"""Gemma 2's soft-capped attention (``benchmarks.unseen``'s ``softcap_attention``): its one-kernel
µGraph, written by hand (which the search reaches too since its block budget counts the cap's ops:
``tests/unit/generator/test_flash_decoding.py``), verifies against the captured subprogram, computes
what float64 eager computes, and generates one kernel whose online-softmax chain applies the cap in
its score, reading the keys in place."""

import shutil

import pytest
import torch

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel
from benchmarks.unseen import SoftcapAttention
from mirage.codegen import generate_cuda_program


def softcap_mugraph() -> mi.KernelGraph:
    """FlashAttention's one kernel with ``exp(cap · tanh(S / (sqrt(dim) · cap)))`` as its scores."""
    return one_kernel(heads=8, queries=256, keys=256, dim=64, rows=64, key_tile=64, cap=50.0)


def test_a_given_softcap_mugraph_is_verified_and_runs_as_one_chain():
    model = SoftcapAttention().eval()
    q, k, v = ((torch.randn(1, 8, 256, 64) * 4).half() for _ in range(3))  # scores large enough to be capped
    fast = mi.superoptimize(model, (q, k, v), search=False, candidates=[softcap_mugraph()], use_cache=False,
                            progress=False)
    (choice,) = fast.specializations[0].choices.values()
    assert choice.source == "candidate", fast.report()
    with torch.no_grad():
        want = model.double()(q.double(), k.double(), v.double())
        torch.testing.assert_close(fast(q, k, v).double(), want, rtol=2e-3, atol=2e-3)
    program = generate_cuda_program(choice.graph, 90)
    assert len(program.kernels) == 1 and "mirage::gen::OnlineSoftmax<" in program.code
    assert "mirage::dev::Tanh{}" in program.code and program.transposed_inputs == (1,)


def test_the_capped_scores_take_one_product_by_a_number_before_the_tanh():
    from mirage.frontend import capture, partition
    from mirage.mugraph.ops import Op

    inputs = tuple(torch.randn(1, 8, 256, 64) for _ in range(3))
    (sub,) = partition(capture(SoftcapAttention(), inputs, {})).subprograms
    ops = [n.op for n in sub.graph.nodes if n.op is not Op.INPUT]
    assert ops[:4] == [Op.MATMUL, Op.MUL_SCALAR, Op.TANH, Op.MUL_SCALAR], ops
    assert [n.attrs.value for n in sub.graph.nodes if n.op is Op.MUL_SCALAR] == pytest.approx([1 / 400, 50.0])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_softcap_kernel_compiles_for_sm90a():
    from mirage.codegen.compile import CompileOptions, compile_source
    from mirage.mugraph.target import TARGETS

    program = generate_cuda_program(softcap_mugraph(), 90)
    result = compile_source(program.code, CompileOptions(target=TARGETS["H100"]))
    assert result.cubin()[:4] == b"\x7fELF"
