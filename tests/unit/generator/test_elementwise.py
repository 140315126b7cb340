"""One-kernel element-wise µGraphs (mirage.generator.elementwise): they compute the reference (float64
interpretation), take the rows' and columns' broadcasts of their inputs, compile for sm_90a without
local memory, and reach ``mi.superoptimize`` for AdamW's sixteen ops as one kernel."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import mirage as mi
from mirage.generator import elementwise
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
    graphs = elementwise.candidates(reference)
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
    grids = lambda shape: [g.block_graphs()[0].grid_dim for g in elementwise.candidates(modulated(*shape))]  # noqa: E731
    assert grids((256, 1024)) == [(256, 1, 1), (128, 1, 1)]
    assert grids((64, 512)) == [(64, 2, 1)]  # 64 blocks of a row: halves of rows, 128 blocks
    assert grids((8, 32000)) == [(8, 32, 1), (4, 32, 1)]  # slices of 1,000 columns: 256 blocks
    assert elementwise.column_splits(1, 4096) == 16  # one row: slices of 256


def test_what_is_not_element_wise_gets_none():
    g = mi.new_kernel_graph()
    x = g.new_input((8, 64), mi.float16)
    g.mark_output(g.exp(g.reduction(x, 1)))  # a reduction
    assert elementwise.candidates(g.freeze()) == []
    g = mi.new_kernel_graph()
    g.mark_output(g.exp(g.new_input((8, 64), mi.float16)))  # one op: the search's
    assert elementwise.candidates(g.freeze()) == []
    g = mi.new_kernel_graph()
    g.mark_output(g.exp(g.silu(g.new_input((2, 8, 64), mi.float16))))  # 3-D
    assert elementwise.candidates(g.freeze()) == []


def test_the_generated_kernel_compiles_for_sm90a_without_local_memory():
    from mirage.codegen.compile import CompileOptions, Stage, compile_sources
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.toolchain import ToolchainError, find_nvcc
    from mirage.mugraph.target import TARGETS

    try:
        find_nvcc()
    except ToolchainError:
        pytest.skip("nvcc is not installed")
    graphs = elementwise.candidates(adamw_reference())[:1] + elementwise.candidates(modulated(8, 32000))[:1]
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
    assert choice.source == "element-wise" and "one-kernel element-wise µGraph(s) verified" in fast.report()
    assert sum(n.op is Op.CUSTOMIZED for n in choice.graph.nodes) == 1
    want = copy.deepcopy(model).double()(*(x.double() for x in inputs))
    for got, expected in zip(fast(*inputs), want, strict=True):
        assert float((got.double() - expected).abs().max() / expected.abs().max()) < 2e-3
