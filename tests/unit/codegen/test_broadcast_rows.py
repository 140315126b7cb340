"""Inputs whose last dim splits over a broadcast (``KernelInput.split_last``): a group norm's gain and
bias, one value a channel, against rows of (channels of a group · positions), read through their
strides instead of copied to the rows' size. Without a GPU: the builder's declaration, the frontend's,
which tiles read them in place, and the generated code (compiled). The GPU runs are
tests/gpu/test_broadcast_rows_gpu.py."""

from __future__ import annotations

import pytest
import torch
from codegen_helpers import needs_nvcc

import mirage as mi
from benchmarks.mugraphs.broadcast_rows import gain_strides, scaled_rows
from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.errors import GraphError
from mirage.mugraph.serialize import graph_from_dict, graph_to_dict
from mirage.mugraph.target import TARGETS
from mirage.mugraph.text import parse, to_text


def test_the_builder_declares_a_last_dim_split_over_a_broadcast():
    g = mi.new_kernel_graph()
    w = g.new_input(dims=(16, 2048), strides=gain_strides(2, 8, 8, 256), name="w")
    attrs = g.graph.nodes[w.ref.node].attrs
    assert attrs.strides == (8, 0) and attrs.splits() == {0: (8, 0), 1: (256, 1)} and attrs.split_last
    graph = scaled_rows(1)
    assert "split_strides=(0,8,0,1,256,1)" in to_text(graph)
    assert parse(to_text(graph)) == graph and graph_from_dict(graph_to_dict(graph)) == graph


@pytest.mark.parametrize(("strides", "reason"), [
    ((8, ((8, 1), (256, 1))), "cannot split"),  # its inner part stepped: not a broadcast
    ((8, ((8, 2), (256, 0))), "outer stride"),  # the rest not row-major
])
def test_the_builder_refuses_other_last_dim_splits(strides, reason):
    g = mi.new_kernel_graph()
    with pytest.raises(GraphError, match=reason):
        g.new_input(dims=(16, 2048), strides=strides)


def test_an_output_cannot_broadcast_its_last_dim():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(16, 2048))
    with pytest.raises(GraphError):
        g.mark_output(g.exp(x), strides=(2048, ((8, 1), (256, 0))))


@pytest.mark.parametrize(("blocks", "per_group", "in_place"), [
    (1, 8, True),  # a tile of 8 spans of 256 columns
    (16, 8, True),  # a tile of 128 columns, in one span
    (2, 3, False),  # tiles of 384 columns: across a span's end
])
def test_tiles_that_start_spans_or_lie_in_one_read_in_place(blocks, per_group, in_place):
    program = generate_cuda_program(scaled_rows(blocks, per_group), 90)
    assert program.split_inputs == ((1,) if in_place else ())
    view = ((2, 8, per_group, 256), (0, per_group, 1, 0))
    assert program.declared_views[1] == view and (program.input_views.get(1) == view) == in_place
    assert ("{0, 0, 0, 1}, {0, 0, 8, 256}};  // a view read in place" in program.code) == in_place


@needs_nvcc
def test_the_gain_is_read_one_element_a_group_of_columns_and_compiles():
    """In the row loop the gain's 8 columns of a thread's group take one 2-byte load, and its other
    reads do not keep x's loads from 16-byte vectors (each iterator's own check)."""
    program = generate_cuda_program(scaled_rows(1), 90)
    assert "in0.direct_vectors() && in1.direct_vectors()" in program.code
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]))
    assert result.cubin()[:4] == b"\x7fELF"


@pytest.mark.parametrize(("shape", "groups"), [((2, 64, 16, 16), 8), ((1, 320, 8, 8), 32)])
def test_capture_declares_a_group_norms_gain_and_bias_over_its_rows(shape, groups):
    from mirage.frontend import capture, partition

    model = torch.nn.Sequential(torch.nn.GroupNorm(groups, shape[1]), torch.nn.SiLU())
    (sub,) = partition(capture(model, (torch.randn(shape),), {})).subprograms
    per_group, positions = shape[1] // groups, shape[2] * shape[3]
    split = [sub.graph.nodes[n].attrs for n in sub.graph.input_nodes if sub.graph.nodes[n].attrs.split_last]
    batch_split = {0: (groups, 0)} if shape[0] > 1 else {}
    assert len(split) == 2 and all(a.splits() == {**batch_split, 1: (positions, 1)} for a in split)
    assert all(a.strides == (per_group, 0) for a in split)
