"""Split-row norms (mirage.generator.split_norms): a group norm's, an instance norm's and a long
``rms_norm``'s two-kernel µGraphs compute the reference (float64 interpretation, the finite-field
verifier), and reach ``mi.superoptimize`` through PyTorch's ``F.group_norm``."""

from __future__ import annotations

import numpy as np
import pytest

import mirage as mi
from mirage.generator import split_norms
from mirage.mugraph.interpret import interpret
from mirage.mugraph.ops import Op
from mirage.verifier.slicing import SlicedVerifier


def group_norm_reference(rows: int, cols: int, per: str = "value", centered: bool = True):
    """What the frontend lowers ``silu(GroupNorm(x))`` to: a mean, the centred values' rms_norm, a gain
    and a bias (``per``: one a value, the groups' frame copy; one a row, an instance norm's)."""
    g = mi.new_kernel_graph("norm")
    x = g.new_input((rows, cols), mi.float16)
    if centered:
        y = g.rms_norm(g.sub(x, g.mul_scalar(g.reduction(x, 1), 1 / cols)), eps=1e-5)
    else:
        y = g.rms_norm(x, eps=1e-6)
    shape = {"value": (rows, cols), "row": (rows, 1), "column": (1, cols)}[per]
    gain, bias = g.new_input(shape, mi.float16), g.new_input(shape, mi.float16)
    g.mark_output(g.silu(g.add(g.mul(y, gain), bias)))
    return g.freeze()


def _inputs(reference, seed: int, offset: float = 0.0):
    rng = np.random.default_rng(seed)
    shapes = [t.shape for t in reference.input_types]
    return [rng.standard_normal(shapes[0]) * 3 + offset] + [rng.standard_normal(s) for s in shapes[1:]]


@pytest.mark.parametrize("per", ["value", "row", "column"])
def test_a_long_row_norm_gets_two_kernel_candidates_computing_the_reference(per):
    reference = group_norm_reference(64, 40960, per)
    found = split_norms.match(reference)
    assert found.centered and found.eps == 1e-5 and len(found.tail) == 3
    graphs = split_norms.candidates(reference)
    assert [[b.grid_dim for b in g.block_graphs()] for g in graphs[::2]] == [
        [(64, 20, 1), (64, 20, 1)], [(64, 10, 1), (64, 10, 1)]]
    inputs = _inputs(reference, 0, offset=100.0)  # a mean far from 0: Chan's combine keeps the variance
    want = interpret(reference, inputs)[0]
    verifier = SlicedVerifier(reference, seed=0)
    for graph in graphs[::3]:
        assert graph.input_types == reference.input_types and graph.output_types == reference.output_types
        np.testing.assert_allclose(interpret(graph, inputs)[0], want, rtol=1e-9, atol=1e-9)
        assert verifier.verify(graph).equivalent


def test_an_uncentred_rms_norm_saves_one_partial_a_slice():
    reference = group_norm_reference(8, 16384, "column", centered=False)
    assert not split_norms.match(reference).centered
    (graph, *_) = split_norms.candidates(reference)
    first, second = (n for n in graph.nodes if n.op is Op.CUSTOMIZED)
    assert len(first.outputs) == 1 and first.attrs.grid_dim == (8, 8, 1)
    inputs = _inputs(reference, 1)
    np.testing.assert_allclose(interpret(graph, inputs)[0], interpret(reference, inputs)[0], rtol=1e-9)
    assert SlicedVerifier(reference, seed=0).verify(graph).equivalent


def test_a_norm_with_nothing_after_it_and_a_residual_read_of_x():
    """A group norm without gain or bias ends at the norm; ``x + norm(x)`` reads x's tile again."""
    g = mi.new_kernel_graph("bare")
    x = g.new_input((4, 8192), mi.float32)
    g.mark_output(g.rms_norm(g.sub(x, g.mul_scalar(g.reduction(x, 1), 1 / 8192)), eps=1e-5))
    bare = g.freeze()
    g = mi.new_kernel_graph("residual")
    x = g.new_input((4, 8192), mi.float32)
    g.mark_output(g.add(x, g.rms_norm(x, eps=1e-6)))
    residual = g.freeze()
    for reference in (bare, residual):
        graphs = split_norms.candidates(reference)
        assert len(graphs) == 4
        inputs = _inputs(reference, 2, offset=-7.0)
        want = interpret(reference, inputs)[0]
        np.testing.assert_allclose(interpret(graphs[0], inputs)[0], want, rtol=1e-9)


def test_short_rows_many_rows_and_other_programs_get_none():
    assert split_norms.candidates(group_norm_reference(64, 4096)) == []  # a row fits a block
    assert split_norms.candidates(group_norm_reference(512, 16384)) == []  # rows fill the SMs
    g = mi.new_kernel_graph("norm_then_sum")  # a reduction after the norm: not element-wise
    x = g.new_input((8, 16384), mi.float16)
    g.mark_output(g.reduction(g.rms_norm(x, eps=1e-6), 1))
    assert split_norms.match(g.freeze()) is None
    g = mi.new_kernel_graph("mean_of_another")  # the mean of one input taken from another
    x, y = g.new_input((8, 16384), mi.float16), g.new_input((8, 16384), mi.float16)
    g.mark_output(g.rms_norm(g.sub(x, g.mul_scalar(g.reduction(y, 1), 1 / 16384)), eps=1e-5))
    assert split_norms.match(g.freeze()) is None


def test_group_norm_through_superoptimize_runs_the_split_norm():
    """``silu(F.group_norm(x, 4))`` over groups of 16,384 values: the search finds no µGraph that holds
    a group, so the split-row norm runs; the result is PyTorch's in float64."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    weight, bias = torch.randn(64), torch.randn(64)

    def norm_silu(v):
        return F.silu(F.group_norm(v, 4, weight, bias, eps=1e-5))

    x = torch.randn(1, 64, 32, 32) * 2 + 5
    fast = mi.superoptimize(norm_silu, (x,), time_limit_s=2, progress=False, use_cache=False)
    assert "split-row µGraph(s) float-checked" in fast.report()
    assert [c.source for s in fast.specializations for c in s.choices.values()] == ["split rows"]
    want = F.silu(F.group_norm(x.double(), 4, weight.double(), bias.double(), eps=1e-5))
    torch.testing.assert_close(fast(x).double(), want, rtol=1e-5, atol=1e-5)


def test_a_layer_norm_over_one_long_row_gets_the_split_norm():
    """``nn.LayerNorm(16384)`` lowers to the same mean, ``rms_norm``, gain and bias: split candidates."""
    torch = pytest.importorskip("torch")

    norm = torch.nn.LayerNorm(16384).eval()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2), norm.bias.normal_()
    x = torch.randn(4, 16384) * 3 - 2
    (sub,) = mi.superoptimize(norm, (x,), search=False).partition.subprograms
    assert len(split_norms.candidates(sub.graph)) == 4
    fast = mi.superoptimize(norm, (x,), time_limit_s=2, progress=False, use_cache=False)
    assert "split-row µGraph(s) float-checked" in fast.report()
    assert [c.source for s in fast.specializations for c in s.choices.values()] == ["split rows"]
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), norm.double()(x.double()), rtol=1e-5, atol=1e-5)


def test_rows_too_long_for_the_searchs_one_block_form_get_the_split_norm():
    """A spectrogram's ``nn.LayerNorm((100, 80))`` normalizes rows of 8,000: under ``MIN_COLS``, but its
    one-block form (x, the gain, the bias and four row tiles of ops) takes 112 KB of shared memory by the
    search's estimate, over the space's 96, so the search finds nothing; the split norm is offered, and
    its result is PyTorch's in float64. A LayerNorm over rows of 4,096 gets none."""
    torch = pytest.importorskip("torch")

    for cols, wanted in ((4096, 0), (8000, 4)):
        norm = torch.nn.LayerNorm(cols).half()
        (sub,) = mi.superoptimize(norm, (torch.randn(4, cols).half(),), search=False).partition.subprograms
        assert len(split_norms.candidates(sub.graph)) == wanted, cols
    norm = torch.nn.LayerNorm((100, 80)).eval()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2), norm.bias.normal_()
    x = torch.randn(4, 100, 80) * 3 - 2
    fast = mi.superoptimize(norm, (x,), time_limit_s=2, progress=False, use_cache=False)
    assert "split-row µGraph(s) float-checked" in fast.report()
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), norm.double()(x.double()), rtol=1e-5, atol=1e-5)
