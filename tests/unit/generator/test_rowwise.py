"""One-kernel row-wise µGraphs (mirage.generator.rowwise): they compute the reference (float64
interpretation), take the rows' and columns' broadcasts of their inputs and the rows' reductions,
compile for sm_90a without local memory, and reach ``mi.superoptimize`` for AdamW's sixteen ops and a
distillation loss's two log_softmaxes as one kernel each."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import mirage as mi
from mirage.generator import rowwise
from mirage.mugraph.interpret import interpret
from mirage.mugraph.ops import Op


def modulated(rows: int = 64, cols: int = 512):
    """An element-wise chain of three broadcasts: x, a gain a column, a factor a row; two outputs."""
    g = mi.new_kernel_graph("chain")
    x = g.new_input((rows, cols), mi.float16)
    gain, factor = g.new_input((1, cols), mi.float16), g.new_input((rows, 1), mi.float16)
    y = g.add_scalar(g.mul(g.silu(x), g.add_scalar(gain, 1.0)), 0.5)
    g.mark_output(g.div(y, g.add_scalar(g.square(factor), 1.0)))
    g.mark_output(g.tanh(y))
    return g.freeze()


def _inputs(graph, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape) for t in graph.input_types]


@pytest.mark.parametrize("shape", [(64, 512), (256, 1024), (8, 32000), (1, 4096)])
def test_candidates_compute_the_reference_with_its_broadcasts(shape):
    reference = modulated(*shape)
    graphs = rowwise.candidates(reference)
    assert graphs
    inputs = _inputs(reference)
    want = interpret(reference, inputs)
    for graph in graphs:
        assert graph.input_types == reference.input_types and graph.output_types == reference.output_types
        (op,) = [n for n in graph.nodes if n.op is Op.CUSTOMIZED]
        assert len(op.outputs) == 2
        for got, expected in zip(interpret(graph, inputs), want, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


def test_grids_take_rows_and_split_long_or_few_rows():
    grids = lambda shape: [g.block_graphs()[0].grid_dim for g in rowwise.candidates(modulated(*shape))]  # noqa: E731
    assert grids((256, 1024)) == [(256, 1, 1), (128, 1, 1)]
    assert grids((64, 512)) == [(64, 2, 1)]  # 64 blocks of a row: halves of rows, 128 blocks
    assert grids((8, 32000)) == [(8, 32, 1), (4, 32, 1)]  # slices of 1,000 columns: 256 blocks
    assert rowwise.column_splits(1, 4096) == 16  # one row: slices of 256
    assert rowwise.candidates(modulated(4, 10007)) == []  # a prime length: slices of one column, none
    assert grids((8192, 1024)) == [(4096, 1, 1), (2048, 1, 1)]  # grids within 4,096 blocks
    assert grids((65536, 1024)) == []  # none within them: left to the search


def two_log_softmaxes(rows: int = 32, cols: int = 1000):
    """A distillation loss's tempered log_softmaxes of two logits and their difference, as lowered."""
    g = mi.new_kernel_graph("distill")
    s, t = g.new_input((rows, cols), mi.float16), g.new_input((rows, cols), mi.float16)

    def log_softmax(x):
        x = g.mul_scalar(x, 0.5)
        return g.sub(x, g.log(g.reduction(g.exp(x), 1)))

    g.mark_output(g.sub(log_softmax(t), log_softmax(s)))
    return g.freeze()


def test_rows_reduced_whole_give_one_block_rows_and_compute_the_reference():
    reference = two_log_softmaxes()
    found = rowwise.match(reference)
    assert found.whole_rows and (found.rows, found.cols) == (32, 1000)
    graphs = rowwise.candidates(reference)
    assert [g.block_graphs()[0].grid_dim for g in graphs] == [(32, 1, 1)]
    assert graphs[0].block_graphs()[0].block_dim == (128, 1, 1)
    inputs = _inputs(reference)
    np.testing.assert_allclose(interpret(graphs[0], inputs)[0], interpret(reference, inputs)[0],
                               rtol=1e-9, atol=1e-9)
    from mirage.optimizer.softmax import unstable_exps

    assert unstable_exps(graphs[0]) == 0  # the rewrite stabilises both exps in the block


def test_a_norm_with_an_output_a_row_takes_whole_rows():
    g = mi.new_kernel_graph()
    x, gain = g.new_input((64, 4096), mi.float16), g.new_input((1, 4096), mi.float16)
    g.mark_output(g.silu(g.mul(g.rms_norm(x, eps=1e-6), gain)))
    g.mark_output(g.reduction(g.square(x), 1))  # (64, 1)
    (graph,) = rowwise.candidates(g.freeze())
    assert graph.block_graphs()[0].grid_dim == (64, 1, 1) and graph.block_graphs()[0].block_dim == (512, 1, 1)
    inputs = _inputs(g.freeze())
    for got, want in zip(interpret(graph, inputs), interpret(g.freeze(), inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_what_is_not_row_wise_gets_none():
    def none_for(build) -> bool:
        g = mi.new_kernel_graph()
        g.mark_output(build(g, g.new_input((8, 64), mi.float16)))
        return rowwise.candidates(g.freeze()) == []

    assert none_for(lambda g, x: g.exp(g.reduction(x, 0)))  # a column's sum
    assert none_for(lambda g, x: g.exp(x))  # one op: the search's
    assert none_for(lambda g, x: g.exp(g.matmul(x, g.new_input((64, 8), mi.float16))))  # a product
    g = mi.new_kernel_graph()
    g.mark_output(g.exp(g.silu(g.new_input((2, 8, 64), mi.float16))))  # 3-D
    assert rowwise.candidates(g.freeze()) == []
    g = mi.new_kernel_graph()
    g.mark_output(g.silu(g.exp(g.reduction(g.new_input((8, 9000), mi.float16), 1))))  # rows too long
    assert rowwise.candidates(g.freeze()) == []


def test_the_generated_kernel_compiles_for_sm90a_without_local_memory():
    from mirage.codegen.compile import CompileOptions, Stage, compile_sources
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.toolchain import ToolchainError, find_nvcc
    from mirage.mugraph.target import TARGETS

    try:
        find_nvcc()
    except ToolchainError:
        pytest.skip("nvcc is not installed")
    graphs = rowwise.candidates(adamw_reference())[:1] + rowwise.candidates(modulated(8, 32000))[:1]
    programs = [generate_cuda_program(g, 90) for g in graphs]
    results = compile_sources([p.code for p in programs], CompileOptions(target=TARGETS["H100"]),
                              dumps={Stage.SASS})
    for program, result in zip(programs, results, strict=True):
        assert len(program.kernels) == 1
        sass = result.sass()
        assert "LDL" not in sass and "STL" not in sass
        assert "LDG.E.128" in sass  # 16-byte loads of the full inputs


def adamw_reference():
    """AdamW's step as the frontend lowers it (the subprogram of ``benchmarks.unseen_models``)."""
    from benchmarks.unseen_models import AdamWStep
    from mirage.frontend import capture, partition

    model = AdamWStep().half()
    inputs = tuple(torch.randn(256, 1024).half() for _ in range(3))
    (sub,) = partition(capture(model, inputs, {})).subprograms
    return sub.graph


def test_adamw_runs_as_one_element_wise_kernel_through_superoptimize():
    from benchmarks.unseen_models import AdamWStep

    torch.manual_seed(0)
    model = AdamWStep().half()
    inputs = tuple(torch.randn(256, 1024).half() for _ in range(3))
    fast = mi.superoptimize(model, inputs, time_limit_s=1, progress=False, use_cache=False)
    (spec,) = fast.specializations
    (choice,) = spec.choices.values()
    assert choice.source == "row-wise" and "one-kernel row-wise µGraph(s) verified" in fast.report()
    assert "search skipped: the one-kernel form takes 23 block ops, past the search space's 13" in (
        choice.detail)
    assert sum(n.op is Op.CUSTOMIZED for n in choice.graph.nodes) == 1
    want = copy.deepcopy(model).double()(*(x.double() for x in inputs))
    for got, expected in zip(fast(*inputs), want, strict=True):
        assert float((got.double() - expected).abs().max() / expected.abs().max()) < 2e-3


def test_the_search_runs_where_its_budget_holds_the_one_kernel_form():
    """The search is skipped only where the one-kernel form is past the space's block-op budget: a
    caller's larger budget (``search_overrides``) searches again, a short chain is searched."""
    from mirage.frontend.optimize import SearchSettings, _beyond_the_space, with_block_budget

    def beyond(reference, settings=None) -> str:  # the settings widened as choose() widens them
        settings = settings or SearchSettings(config="mlp")
        return _beyond_the_space(reference, with_block_budget(reference, settings))

    reference = adamw_reference()
    assert "23 block ops, past the search space's 13" in beyond(reference)
    assert beyond(reference, SearchSettings(config="mlp", overrides=(("max_block_ops", "24"),))) == ""
    assert beyond(modulated()) == ""  # 13 block ops: the budget is raised to them
