"""Inputs whose (batch · heads) dim takes two strides (``KernelInput.split_strides``) on a GPU: the
attention build reading Hugging Face's head splits at batch 2 in place passes the float check against
the float64 reference, equals the dense build, and takes either the view or a dense tensor of the
graph's shape; a tile that would straddle the split is copied instead and is as right; BERT's
self-attention at batch 2 through the PyTorch path matches float64."""

from __future__ import annotations

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from benchmarks.mugraphs.attention import one_kernel, with_head_splits, with_input_strides  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu, random_inputs  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402
from mirage.optimizer import OptimizerOptions  # noqa: E402

pytestmark = pytest.mark.gpu


def _close(x, y) -> None:
    torch.testing.assert_close(x.float(), y.float(), rtol=1e-2, atol=1e-2 * float(y.float().abs().max()))


@pytest.mark.parametrize(("warpgroup", "tma"), [(False, False), (True, False), (True, True)])
def test_an_attention_reading_split_heads_in_place_matches_the_dense_build(warpgroup, tma):
    graph = one_kernel(24, 128, 128, 64, 64, 64)
    declared = with_head_splits(graph, 2, 12, 128, 64)
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=warpgroup, tma_copies=tma)
    ours, theirs = build_many([generate_cuda_program(g, None, options=options) for g in (declared, graph)])
    assert ours.cuda.split_inputs == (0, 1, 2)
    assert not any(k.tensor_maps for k in ours.cuda.kernels)  # a split view is copied by threads
    inputs = random_inputs(declared, seed=3)
    assert [tuple(t.shape) for t in inputs] == [(2, 12, 128, 64), (2, 12, 64, 128), (2, 12, 128, 64)]
    result = check_on_gpu(declared, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    dense = [t.reshape(g.shape).contiguous() for t, g in zip(inputs, graph.input_types, strict=True)]
    expected = theirs(*dense)
    for given in (inputs, dense):  # dense ones are copied into the view
        for x, y in zip(ours.with_poison()(*given), expected, strict=True):
            _close(x, y)


@pytest.mark.parametrize(("warpgroup", "inputs_split"), [(False, False), (True, False), (False, True)])
def test_an_attention_writing_its_head_merge_in_place_matches_the_row_major_build(warpgroup, inputs_split):
    """The output of (b·h, s, d) written as (b, s, h, d) at batch 2 (a head merge), with its inputs dense
    or split heads themselves: the result is the view (2, 12, 128, 64) with strides (98304, 64, 768, 1),
    and equals the row-major build's."""
    merge = (((2, 128 * 768), (12, 64)), 768, 1)
    graph = one_kernel(24, 128, 128, 64, 64, 64)
    declared = one_kernel(24, 128, 128, 64, 64, 64, output_strides=merge)
    if inputs_split:
        declared = with_head_splits(declared, 2, 12, 128, 64)
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=warpgroup)
    ours, theirs = build_many([generate_cuda_program(g, None, options=options) for g in (declared, graph)])
    inputs = random_inputs(declared, seed=5)
    result = check_on_gpu(declared, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    (got,) = ours.with_poison()(*inputs)
    assert tuple(got.shape) == (2, 12, 128, 64) and got.stride() == (98304, 64, 768, 1)
    dense = [t.reshape(g.shape).contiguous() for t, g in zip(inputs, graph.input_types, strict=True)]
    (want,) = theirs(*dense)
    _close(got.reshape(24, 128, 64), want)


@pytest.mark.parametrize("tile", [4, 8])
def test_rows_within_the_split_read_in_place_and_straddling_rows_copied(tile):
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(24, 64, 64), strides=(((2, 64 * 2304), (12, 64)), 2304, 1))
    tb = mi.new_threadblock_graph(grid_dim=(24 // tile, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    t = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.exp(t)), output_map=(0, -1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(y)
    graph = g.freeze()
    (program,) = build_many([generate_cuda_program(graph, None)])
    assert program.cuda.split_inputs == ((0,) if tile == 4 else ())
    result = check_on_gpu(graph, program)
    assert result.passed, result.as_dict()


def test_bert_attention_at_batch_two_matches_float64_with_its_split_views():
    """The reference µGraphs (search off): their products run through torch, so the split views are
    copied dense (``split_reads``); the searched one-kernel attention reads them in place
    (``benchmarks.unseen``'s ``bert_attention_b2``)."""
    from benchmarks.unseen import BertSelfAttention

    model = BertSelfAttention().eval().half().cuda()
    x = torch.randn(2, 128, 768, dtype=torch.float16, device="cuda")
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
        for _ in range(2):
            _close(fast(x), want)


def test_a_grouped_query_fold_read_and_written_in_place_matches_the_dense_build():
    """Llama's q folded into 4 groups of key heads, (4, 4 · 256, 64), rows at g · 64 + t · 1536, and the
    result written as the head merge wants it: both through their split rows."""
    graph = one_kernel(4, 1024, 256, 64, 64, 64)
    merged = one_kernel(4, 1024, 256, 64, 64, 64, output_strides=(256, ((4, 64), (256, 1024)), 1))
    declared = with_input_strides(merged, {0: (256, ((4, 64), (256, 1536)), 1)})
    ours, theirs = build_many([generate_cuda_program(g, None) for g in (declared, graph)])
    assert ours.cuda.split_inputs == (0,)
    inputs = random_inputs(declared, seed=7)
    result = check_on_gpu(declared, ours.with_poison(), inputs=inputs)
    assert result.passed, result.as_dict()
    (got,) = ours.with_poison()(*inputs)
    dense = [t.reshape(g.shape).contiguous() for t, g in zip(inputs, graph.input_types, strict=True)]
    _close(got.reshape(4, 1024, 64), theirs(*dense)[0])
