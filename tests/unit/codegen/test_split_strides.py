"""Inputs whose dim takes two strides (the (batch · heads) dim of a head split at batch > 1,
``KernelInput.split_strides``), without a GPU: how the builder and the frontend declare them, their
text and file forms, which kernels read them in place, the generated code (compiled), and the layouts
calls get. The GPU runs are tests/gpu/test_split_strides_gpu.py."""

from __future__ import annotations

import pytest
import torch
from codegen_helpers import needs_nvcc

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel, with_head_splits, with_input_strides
from mirage.codegen import column_major
from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.gpu_check import random_inputs
from mirage.codegen.lower_program import CudaProgram, generate_cuda_program
from mirage.codegen.runtime import laid_out
from mirage.errors import GraphError
from mirage.mugraph.graph import KernelInput, merged_strides, output_view, split_view
from mirage.mugraph.serialize import graph_from_dict, graph_to_dict
from mirage.mugraph.target import TARGETS
from mirage.mugraph.text import parse, to_text

QKV = 2 * 128 * 3 * 768  # a batch row of the stacked projection's output, in elements


@pytest.mark.parametrize(("shape", "view_shape", "view_strides", "expected"), [
    ((24, 128, 64), (2, 12, 128, 64), (128 * 2304, 64, 2304, 1), (((2, 294912), (12, 64)), 2304, 1)),
    ((24, 128, 64), (2, 12, 128, 64), (12 * 8192, 8192, 64, 1), (8192, 64, 1)),  # dense: one stride
    ((24, 128, 64), (1, 24, 128, 64), (0, 64, 2304, 1), (64, 2304, 1)),  # a batch of one drops out
    ((8, 3, 64), (2, 6, 2, 64), (1536, 256, 128, 1), None),  # 6 does not split into 4 × 1.5
    ((6, 8, 64), (2, 12, 2, 64), (1536, 128, 64, 1), (512, 64, 1)),  # 12 split as 3 × 4: a view
    ((96, 64), (2, 4, 12, 64), (8192, 1024, 64, 1), None),  # three strides
])
def test_merged_strides(shape, view_shape, view_strides, expected):
    if expected is None:
        with pytest.raises(ValueError):
            merged_strides(shape, view_shape, view_strides)
    else:
        assert merged_strides(shape, view_shape, view_strides) == expected


def test_the_builder_declares_a_split_dim_and_its_view():
    g = mi.new_kernel_graph()
    q = g.new_input(dims=(24, 128, 64), strides=(((2, 294912), (12, 64)), 2304, 1), name="q")
    k = g.new_input(dims=(24, 64, 128), strides=(((2, 294912), (12, 64)), 1, 2304), name="k")
    assert g.graph.nodes[q.ref.node].attrs == KernelInput("q", "", "", (64, 2304, 1), (0, 12, 294912))
    attrs = g.graph.nodes[k.ref.node].attrs
    assert attrs.layout == "col" and attrs.splits() == {0: (12, 294912)}
    view = ((2, 12, 64, 128), (294912, 64, 1, 2304))
    assert split_view((24, 64, 128), attrs.strides, attrs.splits()) == view


@pytest.mark.parametrize(("strides", "reason"), [
    ((((3, 294912), (12, 64)), 2304, 1), "cannot split as 3 × 12"),
    ((128 * 64, 64, ((2, 32), (32, 1))), "cannot split"),  # the last dim
    ((((2, 64), (12, 64)), 2304, 1), "repeat elements"),
    ((("2", 294912), 2304, 1), "neither an int nor"),
])
def test_the_builder_refuses_splits_it_cannot_read(strides, reason):
    g = mi.new_kernel_graph()
    with pytest.raises(GraphError, match=reason):
        g.new_input(dims=(24, 128, 64), strides=strides)


def test_a_split_survives_text_and_files_and_changes_the_hash():
    plain = one_kernel(24, 128, 128, 64, 64, 64)
    split = with_head_splits(plain, 2, 12, 128, 64)
    one_batch = with_head_splits(one_kernel(12, 128, 128, 64, 64, 64), 1, 12, 128, 64)
    assert "split_strides=(0,12,294912)" in to_text(split)
    assert "split_strides" not in to_text(one_batch)
    for graph in (split, one_batch):
        assert parse(to_text(graph)) == graph and graph_from_dict(graph_to_dict(graph)) == graph
    assert len({plain.content_hash(), split.content_hash()}) == 2


def _program(graph) -> CudaProgram:
    return generate_cuda_program(graph, 90)


@needs_nvcc
def test_an_attention_reads_its_split_heads_in_place():
    """Q, K and V of 24 (batch · heads) rows, each block one row: every iterator addresses its view through
    the inner strides plus the split (outer stride 294912 per 12 heads), K as stored; the kernel compiles;
    the program names the views its calls pass."""
    graph = with_head_splits(one_kernel(24, 128, 128, 64, 64, 64), 2, 12, 128, 64)
    program = _program(graph)
    assert program.split_inputs == (0, 1, 2) and sorted(program.input_strides) == [0, 1, 2]
    assert program.input_views[0] == ((2, 12, 128, 64), (294912, 64, 2304, 1))
    assert program.input_views[1] == ((2, 12, 64, 128), (294912, 64, 1, 2304))
    assert program.code.count("{0, 294912, 0, 0}, {0, 12, 0, 0}};  // a view read in place") == 3
    assert CudaProgram.from_dict(program.to_dict()).split_inputs == (0, 1, 2)
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]))
    assert result.cubin()[:4] == b"\x7fELF"


def _rows(tile: int, loop_over_rows: bool = False) -> mi.KernelGraph:
    """exp of a split (2 · 12, 64, 64) input, blocks of ``tile`` rows (or one block looping over them)."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(24, 64, 64), strides=(((2, 64 * 2304), (12, 64)), 2304, 1))
    grid = (1, 1, 1) if loop_over_rows else (24 // tile, 1, 1)
    tb = mi.new_threadblock_graph(grid_dim=grid, block_dim=(128, 1, 1),
                                  forloop_range=24 // tile if loop_over_rows else 1)
    t = tb.new_input(x, input_map=(-1, -1, -1) if loop_over_rows else (0, -1, -1),
                     forloop_dim=0 if loop_over_rows else -1)
    tb.new_output(tb.forloop_accum(tb.exp(t), acc="sum") if loop_over_rows else tb.forloop_accum(tb.exp(t)),
                  output_map=(-1, -1, -1) if loop_over_rows else (0, -1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(y)
    return g.freeze()


@pytest.mark.parametrize(("tile", "loop", "in_place"), [(1, False, True), (4, False, True), (3, False, True),
                                                         (8, False, False), (1, True, False)])
def test_only_tiles_within_the_split_and_no_loop_over_it_read_in_place(tile, loop, in_place):
    """A tile of 8 rows would straddle the 12 heads of a batch row, a loop would step across it: those
    programs read the input dense (the runtime copies it), the others through the split."""
    program = _program(_rows(tile, loop))
    assert program.split_inputs == ((0,) if in_place else ())
    assert (0 in program.input_strides) == in_place and (0 in program.input_views) == in_place
    assert ("{0, 147456, 0, 0}, {0, 12, 0, 0}}" in program.code) == in_place


def test_calls_pass_the_view_or_the_graph_shape_and_get_the_declared_layout():
    graph = with_head_splits(one_kernel(24, 128, 128, 64, 64, 64), 2, 12, 128, 64)
    view = _program(graph).input_views[0]
    (q, *_) = random_inputs(graph, seed=1, device="cpu")
    assert tuple(q.shape) == view[0] and q.stride() == view[1]
    assert column_major.in_layout(q, False, None, view) is q  # read as it arrives
    dense = q.reshape(24, 128, 64).contiguous()
    laid = column_major.in_layout(dense, False, None, view)  # the graph's shape, copied into the view
    assert laid.shape == view[0] and laid.stride() == view[1]
    assert torch.equal(laid.reshape(24, 128, 64), dense)


MERGE = (((2, 128 * 768), (12, 64)), 768, 1)  # (b·h, s, d) written as (b, s, h, d): a head merge at batch 2


def _attention_with_split_output() -> mi.KernelGraph:
    return one_kernel(24, 128, 128, 64, 64, 64, output_strides=MERGE)


def test_an_output_declares_a_split_dim_and_survives_text_and_files():
    graph = _attention_with_split_output()
    assert graph.output_strides == ((64, 768, 1, 0, 12, 98304),)
    assert output_view((24, 128, 64), graph.output_strides[0]) == ((2, 12, 128, 64), (98304, 64, 768, 1))
    assert parse(to_text(graph)) == graph and graph_from_dict(graph_to_dict(graph)) == graph
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(24, 128, 64))
    with pytest.raises(GraphError, match="row-major"):
        g.mark_output(x, strides=(((2, 128 * 768), (12, 128 * 64)), 64, 1))
    with pytest.raises(GraphError, match="densely"):
        g.mark_output(x, strides=(((2, 128 * 768), (12, 32)), 768, 1))


@needs_nvcc
def test_the_saver_writes_through_the_split_and_the_kernel_compiles():
    program = _program(_attention_with_split_output())
    assert program.graph.strided_writes()  # the saver's tile (one row of b·h) never straddles the split
    assert "{0, 98304, 0, 0}, {0, 12, 0, 0}};  // laid out as the program views it" in program.code
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]))
    assert result.cubin()[:4] == b"\x7fELF"


def test_a_saver_tile_across_the_split_writes_row_major_and_is_laid_out_after():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(24, 16, 64))
    tb = mi.new_threadblock_graph(grid_dim=(3, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    t = tb.new_input(x, input_map=(0, -1, -1), forloop_dim=-1)  # 8 rows a block: across 12 heads' rows
    tb.new_output(tb.forloop_accum(tb.exp(t)), output_map=(0, -1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(y, strides=(((2, 16 * 768), (12, 64)), 768, 1))
    graph = g.freeze()
    assert graph.strided_writes() == {}
    assert "laid out as the program views it" not in _program(graph).code
    value = torch.randn(24, 16, 64)
    laid = laid_out(value, graph.output_strides[0], (24, 16, 64))
    assert laid.shape == (2, 12, 16, 64) and laid.stride() == (12288, 64, 768, 1)
    assert torch.equal(laid.reshape(24, 16, 64), value)
    assert laid_out(laid, graph.output_strides[0], (24, 16, 64)) is laid


def test_capture_declares_the_head_merge_of_a_batch_of_two():
    from benchmarks.unseen import BertSelfAttention
    from mirage.frontend import capture, partition

    subs = partition(capture(BertSelfAttention(), (torch.randn(2, 64, 768),), {})).subprograms
    attention = next(s for s in subs if sum(n.op.value == "matmul" for n in s.graph.nodes) == 2)
    assert attention.graph.output_strides == ((64, 768, 1, 0, 12, 64 * 768),)


@needs_nvcc
def test_a_grouped_query_fold_splits_the_rows_and_compiles():
    """q of 16 heads folded into 4 key heads' groups, (4, 4 · 256, 64): a row of the tile is group g and
    token t at g · 64 + t · 1536; tiles of 64 rows stay within one group (256 tokens) and are read in
    place, the head merge of the result written so too."""
    g = mi.new_kernel_graph("grouped")
    q = g.new_input(dims=(4, 1024, 64), strides=(256, ((4, 64), (256, 1536)), 1), name="q")
    attrs = g.graph.nodes[q.ref.node].attrs
    assert attrs.strides == (256, 1536, 1) and attrs.splits() == {1: (256, 64)}
    merged = one_kernel(4, 1024, 256, 64, 64, 64, output_strides=(256, ((4, 64), (256, 1024)), 1))
    graph = with_input_strides(merged, {0: (256, ((4, 64), (256, 1536)), 1)})
    assert graph.nodes[graph.input_nodes[0]].attrs.splits() == attrs.splits()
    program = _program(graph)
    assert program.split_inputs == (0,) and program.input_views[0] == ((4, 4, 256, 64), (256, 64, 1536, 1))
    assert "{0, 0, 64, 0}, {0, 0, 256, 0}};  // a view read in place" in program.code
    assert "{0, 0, 64, 0}, {0, 0, 256, 0}};  // laid out as the program views it" in program.code
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]))
    assert result.cubin()[:4] == b"\x7fELF"


def test_a_column_major_view_cannot_split_its_stored_rows():
    g = mi.new_kernel_graph()
    with pytest.raises(GraphError, match="column-major view"):
        g.new_input(dims=(4, 1024, 64), strides=(65536, ((4, 16384), (256, 1)), 256))
