"""Outputs written with declared strides (``KernelGraph.output_strides``) on a GPU: each build hands
back its output laid out as declared, with the values of the row-major build of the same µGraph, bit
for bit; through the PyTorch path BERT's self-attention (one product of its stacked q, k, v weights,
mirage.frontend.products) merges its heads with a view, matches eager, and in a caller's CUDA graph
sees a weight updated in place."""

from __future__ import annotations

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from benchmarks.mugraphs.attention import one_kernel, rows_fused  # noqa: E402
from benchmarks.unseen import BertSelfAttention  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu

MERGED = (64, 768, 1)  # [12, 128, 64] laid out as [128, 12, 64]


@pytest.mark.parametrize(("form", "warpgroup", "tma"), [
    ("one_kernel", False, False), ("one_kernel", True, False), ("one_kernel", True, True),
    ("split", False, False),  # the combine kernel writes the output
])
def test_a_build_writing_its_output_strided_matches_the_row_major_build(form, warpgroup, tma):
    graph = (rows_fused(12, 128, 64, 128, 2, 2, 1, 128, 4) if form == "split"
             else one_kernel(12, 128, 128, 64, 64, 64))
    declared = dataclasses.replace(graph, output_strides=(MERGED,))
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=warpgroup, tma_copies=tma)
    ours, theirs = build_many([generate_cuda_program(g, None, options=options) for g in (declared, graph)])
    inputs = random_inputs(graph, seed=4)
    result = check_on_gpu(declared, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    (got,) = ours.with_poison()(*inputs)
    (expected,) = theirs(*inputs)
    assert got.stride() == MERGED and expected.is_contiguous()
    assert torch.equal(got, expected)
    merged = got.permute(1, 0, 2)
    assert merged.is_contiguous() and merged.reshape(128, 768).data_ptr() == got.data_ptr()


def test_bert_attention_merges_its_heads_with_a_view_and_matches_eager():
    torch.manual_seed(0)
    model = BertSelfAttention().cuda().half().eval()
    x = torch.randn(1, 128, 768, device="cuda").half()
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    (attention,) = [s for s in fast.partition.subprograms if s.graph.output_strides]
    assert attention.graph.output_strides == (MERGED,)
    with torch.no_grad():
        got = fast(x).double()
        want = copy.deepcopy(model).double()(x.double())
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


def test_bert_attention_in_a_cuda_graph_sees_a_weight_updated_in_place():
    from gpu_helpers import replayed

    from mirage.frontend.products import StackedParameters

    torch.manual_seed(0)
    model = BertSelfAttention().cuda().half().eval()
    x = torch.randn(1, 128, 768, device="cuda").half()
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    assert any(isinstance(m, StackedParameters) for m in fast.specializations[0].module.modules())
    with torch.no_grad():
        out = replayed(fast, (x,), lambda: (model.key.weight.mul_(-1), model.value.bias.add_(0.5)))
        want = model(x)
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2 * float(want.abs().max()))
