"""The online-softmax rewrite: same function in float64, finite where the LAX form overflows."""

from __future__ import annotations

import numpy as np
import pytest
from optimizer_graphs import (
    assert_same_function,
    attention_one_kernel,
    exp_into,
    inputs_for,
    interpret,
    run_fp16_range,
    softmax_after_loop,
    split_kv,
)

import mirage as mi
from benchmarks.mugraphs import CASES
from mirage.mugraph.ops import Op
from mirage.optimizer.combine import combine_kernel
from mirage.optimizer.softmax import analyse_block, online_softmax

ATTENTION = ["gqa_b1", "qknorm_b1"]  # the b8 cases differ only in the grid; test_pipeline runs them


def _ops(graph) -> list[Op]:
    return [n.op for b in graph.block_graphs() for n in b.nodes]


@pytest.mark.parametrize("name", ATTENTION)
def test_benchmark_attention_is_rewritten_with_a_stable_combine(name):
    graph = CASES[name].fused()
    stable, result = online_softmax(graph)
    mi.check(stable)
    assert [(s.kernel, s.online, s.combine_kernels) for s in result.rewritten] == [(3, True, (4,))]
    assert not result.skipped
    kernel1, kernel2 = stable.block_graphs()
    # kernel 1 saves the per-block row maxima beside its two partials
    assert len(kernel1.output_nodes) == 3 and stable.nodes[3].outputs[2].shape[-1] == 8
    # kernel 2 walks the 8 splits with a running max and rescaling accumulators
    assert kernel2.forloop_range == 8
    assert {Op.RUNNING_MAX, Op.ACCUM_RESCALE} <= {n.op for n in kernel2.nodes}
    assert Op.ACCUM not in {n.op for n in kernel2.nodes}
    assert_same_function(graph, stable, rtol=1e-9)


@pytest.mark.parametrize("name", ["gqa_b1"])
def test_gqa_stays_finite_in_float32_where_the_lax_form_overflows(name):
    case = CASES[name]
    graph = case.fused()
    stable, _ = online_softmax(graph)
    xs = inputs_for(graph, seed=1, scale={0: 40.0})  # scores up to ~200: exp overflows float32
    (truth,) = interpret(case.reference(), xs)  # float64
    with np.errstate(all="ignore"):
        (lax,) = interpret(graph, xs, _f32())
    (got,) = interpret(stable, xs, _f32())
    assert not np.isfinite(lax).all()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, truth, rtol=1e-3, atol=1e-4 * np.abs(truth).max())


@pytest.mark.parametrize("name", ["qknorm_b1"])
def test_qknorm_stays_in_fp16_range_where_the_lax_form_overflows(name):
    """QK-normalized scores are at most 64/8 = 8, so float32 never overflows; fp16 (65504) does once
    keys line up with queries: 4096 terms of e^8 ≈ 2981.  Simulate fp16's range in float32."""
    case = CASES[name]
    graph = case.fused()
    stable, _ = online_softmax(graph)
    xs = inputs_for(graph, seed=2)
    xs[1] = np.broadcast_to(xs[0][:, :1, :].transpose(0, 2, 1), xs[1].shape).copy()  # K columns = q0
    (truth,) = interpret(case.reference(), xs)
    with np.errstate(all="ignore"):
        (lax,) = run_fp16_range(graph, xs)
    (got,) = run_fp16_range(stable, xs)
    assert not np.isfinite(lax).all()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, truth, rtol=1e-3, atol=1e-4 * np.abs(truth).max())


def _f32():
    from mirage.mugraph.algebra import FloatAlgebra

    return FloatAlgebra(np.float32)


# (graph, factor on Q): scores reach a few hundred, past float32's exp limit (88.7), within float64's
SMALL_CASES = {
    "sum accumulator": (lambda: attention_one_kernel("sum"), 40.0),
    "mean accumulator": (lambda: attention_one_kernel("mean"), 40.0),
    "sum_todimx accumulator": (lambda: attention_one_kernel("sum_todimx"), 40.0),
    "element-wise accumulator": (lambda: attention_one_kernel("elementwise"), 40.0),
    "exp after the loop": (softmax_after_loop, 8.0),
    "split-KV, sum combine": (lambda: split_kv("sum"), 40.0),
    "split-KV, mean combine": (lambda: split_kv("mean"), 40.0),
}


@pytest.mark.parametrize("case", SMALL_CASES.values(), ids=SMALL_CASES.keys())
def test_rewrite_keeps_the_function_and_removes_overflow(case):
    build, factor = case
    graph = build()
    stable, result = online_softmax(graph)
    assert result.applied and not result.skipped
    mi.check(stable)
    assert_same_function(graph, stable)
    xs = inputs_for(graph, seed=3, scale={0: factor})
    truth = interpret(graph, xs)  # float64
    assert all(np.isfinite(t).all() for t in truth)
    with np.errstate(all="ignore"):
        lax = interpret(graph, xs, _f32())
    got = interpret(stable, xs, _f32())
    assert not all(np.isfinite(o).all() for o in lax)
    for g, t in zip(got, truth, strict=True):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, t, rtol=2e-3, atol=1e-4 * np.abs(t).max())


def test_online_and_after_loop_sites_use_the_right_maximum():
    online, _ = online_softmax(attention_one_kernel())
    after, result = online_softmax(softmax_after_loop())
    assert Op.RUNNING_MAX in _ops(online) and Op.ACCUM_RESCALE in _ops(online)
    assert Op.RUNNING_MAX not in _ops(after) and Op.REDUCTION_MAX in _ops(after)
    assert [s.online for s in result.rewritten] == [False]


LEFT_ALONE = {
    "exp into silu": (lambda: exp_into("silu"), "silu does not commute"),
    "exp into an rms accumulator": (lambda: exp_into("rms"), "accum does not commute"),
    "exp plus its input": (lambda: exp_into("affine"), "add does not commute"),
    "partial saved as a graph output": (lambda: split_kv(save_partial=True), "is a graph output"),
    "combine that is not a ratio": (lambda: split_kv("product"), "not a ratio"),
    "combine with its own for-loop": (lambda: split_kv(combine_range=2), "forloop_range 2"),
}


@pytest.mark.parametrize("case", LEFT_ALONE.values(), ids=LEFT_ALONE.keys())
def test_unsupported_forms_are_left_unchanged_with_a_reason(case):
    build, reason = case
    graph = build()
    rewritten, result = online_softmax(graph)
    assert rewritten == graph
    assert not result.applied
    assert any(reason in s.reason for s in result.skipped), result.skipped


def test_rewrite_is_idempotent():
    once, _ = online_softmax(CASES["gqa_b1"].fused())
    twice, result = online_softmax(once)
    assert twice == once and not result.applied


def test_analysis_reports_scale_degrees():
    block = CASES["gqa_b1"].fused().block_graphs()[0]
    analysis = analyse_block(block)
    assert analysis.sites == (5,)
    # both accumulators carry the factor once; their savers are partials
    assert analysis.degrees[6] == {5: 1} and analysis.degrees[8] == {5: 1}
    assert analysis.partial_outputs(block) == [9, 10]
    assert analysis.degrees[4] == {}  # the scores themselves are scale-free


def test_combine_rejects_a_reader_that_is_not_a_partial():
    from mirage.optimizer.combine import CombineError
    from mirage.optimizer.softmax import PartialOutput, rewrite_block

    graph = split_kv()
    block = graph.nodes[3].attrs
    rewritten = rewrite_block(block, analyse_block(block))
    only_sums = (PartialOutput(0, 5, 2),)  # pretend only the first output is a partial
    with pytest.raises(CombineError, match="input 1 is not a partial"):
        combine_kernel(graph, 4, 3, rewritten.graph, only_sums)


def _kernel_level_softmax(save_exp: bool = False):
    """softmax(x + mask) over the last dim as pre-defined ops (the reference graph of a softmax)."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    mask = g.new_input(dims=(4, 8), dtype=mi.float32)
    e = g.exp(g.add(x, mask))
    g.mark_output(g.div(e, g.reduction(e, 1)))
    if save_exp:
        g.mark_output(e)
    from mirage.mugraph.builder import as_graph

    return as_graph(g)


def test_a_kernel_level_softmax_subtracts_its_row_maximum():
    """Logits past float32's exp range and a row masked far below zero: the LAX form gives inf / inf
    and 0 / 0, the rewritten one PyTorch's softmax (and a second pass changes nothing)."""
    import torch

    graph = _kernel_level_softmax()
    stable, result = online_softmax(graph)
    assert [(s.kernel, s.exp) for s in result.rewritten] == [(-1, 3)]
    assert [n.op for n in stable.nodes[3:6]] == [Op.REDUCTION_MAX, Op.SUB, Op.EXP]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) * 200
    mask = np.zeros((4, 8), np.float32)
    mask[3] = -1e4
    truth = torch.softmax(torch.from_numpy(x).double() + torch.from_numpy(mask).double(), -1).numpy()
    with np.errstate(all="ignore"):
        (lax,) = interpret(graph, [x, mask], _f32())
    (got,) = interpret(stable, [x, mask], _f32())
    assert np.isnan(lax).any()
    np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-6)
    again, second = online_softmax(stable)
    assert again == stable and not second.applied


def test_a_kernel_level_exp_that_is_saved_is_left_alone():
    graph = _kernel_level_softmax(save_exp=True)
    stable, result = online_softmax(graph)
    assert stable == graph and not result.applied
    assert [(s.kernel, s.exp) for s in result.skipped] == [(-1, 3)]
    assert "graph output" in result.skipped[0].reason


def test_a_program_of_pre_defined_ops_runs_the_stable_softmax():
    """A graph with no graph-defined op runs its kernel-level ops as torch calls (on any device): the
    prepared graph's, so the same logits give PyTorch's softmax there too."""
    import torch

    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.runtime import Program

    program = Program(generate_cuda_program(_kernel_level_softmax(), 90), None)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 200
    mask = torch.zeros(4, 8)
    mask[3] = -1e4
    (got,) = program.launch([x, mask])
    torch.testing.assert_close(got, torch.softmax(x + mask, -1))


@pytest.mark.parametrize("form", ["whole", "split"])
@pytest.mark.parametrize("hidden", ["later_keys", "earlier_keys"])
def test_masked_attention_stays_finite_where_a_mask_hides_whole_tiles(form, hidden):
    """softmax(Q·K/8 + M)·V with M of 0 and −inf, as causal attention's mask is (and its mirror
    image): some rows see no key of a whole tile, a whole split, or the loop's first iterations. The
    running maxima start from a finite floor (ops.RUNNING_MAX_FLOOR), so exp(s − m) is 0 and the
    rescale 1 there, and the rewritten µGraph gives the float64 reference's numbers, without NaN."""
    import torch

    from tests.unit.verifier.verifier_graphs import causal_mask, masked_attention

    graph = masked_attention(form=form)
    stable, result = online_softmax(graph)
    assert result.rewritten and not result.skipped
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 64, 32), (4, 32, 64), (4, 64, 32)))
    mask = causal_mask(64, 64)
    if hidden == "earlier_keys":
        mask = np.ascontiguousarray(mask[:, ::-1, ::-1])  # query i sees keys i..63
    (got,) = interpret(stable, [q, k, v, mask], _f32())
    scores = torch.from_numpy(q).double() @ torch.from_numpy(k).double() / 8 + torch.from_numpy(mask).double()
    truth = (torch.softmax(scores, -1) @ torch.from_numpy(v).double()).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, truth, rtol=1e-4, atol=1e-5)
