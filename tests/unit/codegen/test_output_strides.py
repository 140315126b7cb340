"""Outputs written with declared strides (``KernelGraph.output_strides``), without a GPU: how a graph
declares them, the forms that keep them, the generated code (its savers address the output through
them; compiled) and what the runtime hands back.  The frontend's declarations are tested in
tests/unit/frontend/test_output_layouts.py, the GPU runs in tests/gpu/test_output_strides_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from codegen_helpers import needs_nvcc

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel, rows_fused
from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.errors import GraphError
from mirage.mugraph.graph import output_strides
from mirage.mugraph.serialize import graph_from_dict, graph_to_dict
from mirage.mugraph.target import TARGETS
from mirage.mugraph.text import parse, to_text
from mirage.optimizer import OptimizerOptions

MERGED = (64, 768, 1)  # [12, 128, 64] laid out as [128, 12, 64]: heads merged back by a view


def _heads(graph):
    return dataclasses.replace(graph, output_strides=(MERGED,))


@pytest.mark.parametrize(("shape", "strides", "expected"), [
    ((12, 128, 64), (8192, 64, 1), ()),  # row-major
    ((12, 128, 64), (64, 768, 1), (64, 768, 1)),
    ((1, 12, 128, 64), (5, 64, 768, 1), (1, 64, 768, 1)),  # a dim of one element is never stepped
])
def test_dense_permutations_are_declared(shape, strides, expected):
    assert output_strides(shape, strides) == expected


@pytest.mark.parametrize(("strides", "reason"), [
    ((64, 1, 768), "densely"),  # a gap between rows
    ((8192, 1, 128), "last dim"),  # dense, but the last dim not stepped by one element
    ((64, 768), "rank"),
])
def test_other_strides_are_refused_by_the_builder(strides, reason):
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(12, 128, 64))
    with pytest.raises(GraphError, match=reason if reason != "rank" else "2 strides"):
        g.mark_output(g.exp(x), strides=strides)


def test_declared_output_strides_survive_text_and_json_and_change_the_hash():
    g = mi.new_kernel_graph("t")
    x = g.new_input(dims=(12, 128, 64))
    y = g.exp(x)
    g.mark_output(y, strides=MERGED)
    g.mark_output(g.exp(y))
    graph = g.freeze()
    assert graph.output_strides == (MERGED, ()) and graph.output_stride(1) == ()
    assert "output_strides (64,768,1); ()" in to_text(graph)
    assert parse(to_text(graph)) == graph and graph_from_dict(graph_to_dict(graph)) == graph
    plain = dataclasses.replace(graph, output_strides=())
    assert "output_strides" not in graph_to_dict(plain) and "output_strides" not in to_text(plain)
    assert plain.content_hash() != graph.content_hash()


@pytest.mark.parametrize("form", ["warp", "warpgroup", "split"])
def test_the_saver_addresses_a_declared_output_through_its_strides(form):
    graph = (rows_fused(12, 128, 64, 128, 2, 2, 1, 128, 4) if form == "split"
             else one_kernel(12, 128, 128, 64, 64, 64))
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=form == "warpgroup")
    ours = generate_cuda_program(_heads(graph), 90, options=options)
    # one saver only, the program's output's: the split's partial sums and numerators stay row-major
    assert ours.code.count("laid out as the program views it") == 1
    assert ours.code.count("strides{{768, 64, 768, 1}};  // laid out as the program views it") == 1
    theirs = generate_cuda_program(graph, 90, options=options)
    assert "laid out as the program views it" not in theirs.code


@needs_nvcc
def test_kernels_writing_declared_outputs_compile():
    programs = [generate_cuda_program(_heads(g), 90, options=dataclasses.replace(OptimizerOptions(),
                                                                                  warpgroup_softmax=wg))
                for g, wg in ((one_kernel(12, 128, 128, 64, 64, 64), True),
                              (rows_fused(12, 128, 64, 128, 2, 2, 1, 128, 4), False))]
    for result in compile_sources([p.code for p in programs], CompileOptions(target=TARGETS["H100"])):
        assert result.cubin()[:4] == b"\x7fELF"


def test_the_runtime_lays_out_an_output_computed_through_torch():
    """An output that an op run through torch computes row-major is handed back with the declared
    strides (a copy), with its values."""
    from mirage.codegen.runtime import laid_out

    value = torch.randn(12, 128, 64)
    laid = laid_out(value, MERGED)
    assert laid.stride() == MERGED and torch.equal(laid, value)
    assert laid_out(laid, MERGED) is laid and laid_out(value, ()) is value


def test_an_output_another_op_reads_is_written_row_major_and_laid_out_after():
    """The reader takes its input row-major: the producing kernel writes it so, and the runtime lays
    the output out with its declared strides afterwards."""
    g = mi.new_kernel_graph("t")
    x = g.new_input(dims=(12, 128, 64), dtype=mi.float32)
    y = g.exp(x)
    g.mark_output(y, strides=MERGED)
    g.mark_output(g.exp(y))
    graph = g.freeze()
    assert graph.strided_writes() == {}
    alone = mi.new_kernel_graph("u")
    alone.mark_output(alone.exp(alone.new_input(dims=(12, 128, 64))), strides=MERGED)
    frozen = alone.freeze()
    assert frozen.strided_writes() == {frozen.outputs[0]: MERGED}
