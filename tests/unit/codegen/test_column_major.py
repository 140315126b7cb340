"""Inputs read in place where they arrive transposed (mirage.codegen.column_major), without a GPU: how
a graph declares them, which readers qualify, the tile layouts, the generated code (compiled and its
SASS checked: B fragments by ldmatrix without .trans), the layouts calls get, and the frontend's
declaration for ``nn.Linear``'s ``weight.T``.  The GPU runs are tests/gpu/test_column_major_gpu.py."""

from __future__ import annotations

import re

import pytest
import torch
from codegen_helpers import needs_nvcc

import mirage as mi
from mirage.codegen import column_major
from mirage.codegen.compile import CompileOptions, Stage, compile_sources
from mirage.codegen.gpu_check import random_inputs
from mirage.codegen.lower_context import TileLayout
from mirage.codegen.lower_ops import transposed_layout
from mirage.codegen.lower_program import CudaProgram, generate_cuda_program
from mirage.errors import GraphError
from mirage.mugraph.serialize import graph_from_dict, graph_to_dict
from mirage.mugraph.target import TARGETS
from mirage.mugraph.text import parse, to_text


def _linear(n: int = 1024, k: int = 512, grid: int = 16, loop: int = 8, dtype=mi.float16,
            relu_w: bool = False, transposed: bool = True) -> mi.KernelGraph:
    """Y = X · W with W [k, n] given as weight.T (column-major) when ``transposed``."""
    g = mi.new_kernel_graph("linear")
    x = g.new_input(dims=(8, k), dtype=dtype)
    w = g.new_input(dims=(k, n), dtype=dtype, strides=(1, k) if transposed else None)
    tb = mi.new_threadblock_graph(grid_dim=(grid, 1, 1), block_dim=(128, 1, 1), forloop_range=loop)
    xt = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    wt = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(xt, tb.relu(wt) if relu_w else wt)), output_map=(1, -1, -1))
    (y,) = g.customized([x, w], tb)
    g.mark_output(y)
    return g.graph


def test_strides_of_a_transposed_view_declare_a_column_major_input():
    g = mi.new_kernel_graph()
    g.new_input(dims=(4, 8), strides=(1, 4))
    g.new_input(dims=(2, 4, 8), strides=(32, 1, 4))
    g.new_input(dims=(4, 8), strides=(8, 1))
    g.new_input(dims=(4, 8), layout="col")
    assert [g.graph.nodes[i].attrs.layout for i in g.graph.input_nodes] == ["col", "col", "", "col"]
    with pytest.raises(GraphError, match=r"column-major in their last two dims \(strides \(1, 4\)\)"):
        g.new_input(dims=(4, 8), strides=(2, 4))
    with pytest.raises(GraphError, match="'col' needs 2 or more dims"):
        g.new_input(dims=(8,), layout="col")
    with pytest.raises(GraphError, match="is not one of"):
        g.new_input(dims=(4, 8), layout="row")


def test_the_layout_survives_files_and_text_and_is_omitted_at_its_default():
    declared, plain = _linear(), _linear(transposed=False)
    for graph in (declared, plain):
        assert graph_from_dict(graph_to_dict(graph)) == graph
        assert parse(to_text(graph)) == graph
    assert "layout" not in to_text(plain) and "layout" in to_text(declared)
    assert declared.content_hash() != plain.content_hash()
    assert column_major.with_transposed_inputs(plain, [1]) == declared
    with pytest.raises(ValueError, match="not inputs of 2 or more dims"):
        column_major.with_transposed_inputs(plain, [2])


def test_a_matmuls_b_operand_is_read_in_place_and_other_readers_are_not():
    program = generate_cuda_program(_linear(), 90)
    assert program.transposed_inputs == (1,)
    assert "mirage::dev::Transposed<mirage::dev::Layout<1, 1, 64, 64, 72>>" in program.code
    assert CudaProgram.from_dict(program.to_dict()).transposed_inputs == (1,)
    for other in (_linear(relu_w=True), _linear(dtype=mi.float32), _linear(transposed=False)):
        program = generate_cuda_program(other, 90)
        assert program.transposed_inputs == () and "Transposed<" not in program.code


def _attention(warpgroup: bool, tma: bool = False, dim: int = 64):
    import dataclasses

    from benchmarks.mugraphs.attention import one_kernel
    from mirage.optimizer import OptimizerOptions

    graph = column_major.with_transposed_inputs(one_kernel(8, 512, 512, dim, 64, 64), [1])  # K: k.mT
    options = dataclasses.replace(OptimizerOptions(), warpgroup_softmax=warpgroup, tma_copies=tma)
    return generate_cuda_program(graph, 90, options=options)


def test_an_attention_chain_reads_k_in_place_in_the_warp_and_the_warpgroup_forms():
    warp, warpgroup, tma = _attention(False), _attention(True), _attention(True, tma=True)
    assert warp.transposed_inputs == warpgroup.transposed_inputs == tma.transposed_inputs == (1,)
    assert "mirage::dev::Transposed<mirage::dev::Layout<1, 1, 64, 64, 72>>, mirage::dev::Layout" in warp.code
    # the warpgroup form: K stored as Q is (keys x D, 128-byte swizzled), wgmma's K-major B
    assert "mirage::dev::Transposed<mirage::dev::Swizzled128Layout<1, 1, 64, 64>>" in warpgroup.code
    (launch,) = tma.kernels
    assert [(m.input, m.box, m.transposed) for m in launch.tensor_maps] == [(1, (1, 1, 64, 64), True),
                                                                              (2, (1, 1, 64, 64), False)]


@needs_nvcc
def test_the_warpgroup_form_reading_k_in_place_issues_k_major_wgmmas():
    """sm_90a's HGMMA takes B K-major from the stored tile: no transposing load of K anywhere (D of
    one and of two 64-element swizzle rows)."""
    programs = [_attention(True, dim=dim) for dim in (64, 128)]
    assert all(p.transposed_inputs == (1,) for p in programs)
    results = compile_sources([p.code for p in programs], CompileOptions(target=TARGETS["H100"]),
                              dumps={Stage.SASS})
    for result in results:
        sass = result.sass()
        assert "HGMMA.64x64x16.F32" in sass and "MT88" not in sass


@pytest.mark.parametrize(("shape", "capacity", "expected"), [
    ((64, 64), 64 * 72 * 2, TileLayout((1, 1, 64, 64), 72, transposed=True)),  # rows padded by 16 bytes
    ((64, 128), 64 * 136 * 2, TileLayout((1, 1, 64, 128), 64, swizzled=True, transposed=True)),
    ((32, 128), 32 * 136 * 2, TileLayout((1, 1, 32, 128), 32, transposed=True)),  # dense
])
def test_a_transposed_tile_is_padded_where_it_fits_else_swizzled_else_dense(shape, capacity, expected):
    layout = transposed_layout(shape, "__half", capacity)
    assert layout == expected
    assert layout.stored.dims == (1, 1, shape[1], shape[0]) and not layout.stored.transposed
    assert layout.storage * 2 <= capacity


@needs_nvcc
def test_generated_kernels_read_b_by_ldmatrix_without_trans():
    graphs = {"padded": _linear(), "swizzled": _linear(n=2048, grid=16, loop=8),
              "dense": _linear(n=2048, loop=16), "row_major": _linear(transposed=False)}
    programs = {name: generate_cuda_program(g, 90) for name, g in graphs.items()}
    programs["attention"] = _attention(False)  # K by .x4 without .trans, V (row-major) with it
    assert "Swizzled128Layout<1, 1, 128, 64>>" in programs["swizzled"].code
    results = compile_sources([p.code for p in programs.values()], CompileOptions(target=TARGETS["H100"]),
                              dumps={Stage.SASS})
    for name, result in zip(programs, results, strict=True):
        found = set(re.findall(r"LDSM\.16\.M?T?88\.\d", result.sass()))
        assert "LDSM.16.M88.4" in found, (name, found)
        assert any("MT88" in f for f in found) == (name in ("row_major", "attention")), (name, found)


def test_calls_get_the_layout_the_program_reads():
    w = torch.randn(6, 4)
    assert column_major.in_layout(w.T, True).data_ptr() == w.data_ptr()
    assert column_major.in_layout(w.T, False).is_contiguous()
    made = column_major.in_layout(w.T.contiguous(), True)
    assert made.mT.is_contiguous() and torch.equal(made, w.T)
    (x, weight) = random_inputs(_linear(), device="cpu")
    assert x.is_contiguous() and weight.mT.is_contiguous() and not weight.is_contiguous()


class _Launch:
    """A compiled program's stand-in: records what its kernels were given."""

    def __init__(self, transposed):
        self.transposed_inputs = transposed
        self.given = []

    def launch(self, inputs):
        self.given.append(list(inputs))
        return [inputs[0]]

    run = launch


def test_the_executor_passes_a_transposed_parameter_as_it_is():
    from mirage.frontend.executor import Compiled

    weight = torch.nn.Parameter(torch.randn(6, 4))
    for transposed, copied in (((0,), False), ((), True)):
        program = _Launch(transposed)
        executor = Compiled(_linear(), program.launch)
        for _ in range(2):
            executor([weight.T, torch.randn(3, 6)])
        given = [call[0] for call in program.given]
        assert all(torch.equal(g, weight.T) for g in given)
        assert all((g.data_ptr() != weight.data_ptr()) == copied for g in given)
        assert (executor.kept_bytes > 0) == copied and executor.copies_constants == copied


def test_capture_declares_a_linear_weight_column_major():
    from mirage.frontend.capture import capture
    from mirage.frontend.partition import partition

    model = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.ReLU())
    x = torch.randn(4, 64)
    (sub,) = partition(capture(model, (x,), {})).subprograms
    layouts = {sub.graph.nodes[i].attrs.name: sub.graph.nodes[i].attrs.layout for i in sub.graph.input_nodes}
    assert sorted(layouts.values()) == ["", "col"]
    assert [name for name, layout in layouts.items() if layout == "col"][0].endswith("weight")


@pytest.mark.parametrize("name", ["gemv_b8", "rmsnorm_b8", "gatedmlp_m8", "lora_m16", "attention_h8_512"])
def test_the_suites_weight_streaming_mugraphs_read_their_weights_in_place(name):
    from benchmarks.column_major import PROGRAMS

    make, weights = PROGRAMS[name]
    program = generate_cuda_program(column_major.with_transposed_inputs(make(), weights), 90)
    assert program.transposed_inputs == weights


class _Scores(torch.nn.Module):
    """GPT-2's form: the keys transposed by their own op before the product."""

    def forward(self, q, k):
        return torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / 8.0, dim=-1)


def test_capture_declares_transposed_keys_column_major():
    from mirage.frontend.capture import capture
    from mirage.frontend.partition import partition

    q, k = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    (sub,) = partition(capture(_Scores(), (q, k), {})).subprograms
    layouts = [sub.graph.nodes[i].attrs.layout for i in sub.graph.input_nodes]
    assert sorted(layouts) == ["", "col"], layouts


def test_the_warp_forms_k_in_place_gets_a_slot_for_its_padded_rows():
    """128 keys of a 64-wide head: the row-major slot (64 x 136) is smaller than the transposed tile
    with padded rows (128 x 72); the memory plan sizes the slot for the latter, so K is not stored
    dense (whose ldmatrix reads conflict on banks)."""
    from benchmarks.mugraphs.attention import one_kernel

    graph = column_major.with_transposed_inputs(one_kernel(12, 512, 512, 64, 64, 128), [1])
    program = generate_cuda_program(graph, 90)
    (kernel,) = program.prepared.kernels
    k_tile = kernel.block_graph.input_nodes[1]
    assert kernel.memory.buffer_of(k_tile).slot_bytes == 128 * 72 * 2
    assert "mirage::dev::Transposed<mirage::dev::Layout<1, 1, 128, 64, 72>>" in program.code


def test_head_split_views_are_read_through_their_declared_strides():
    """Q and V [h, s, d] with strides (d, h·d, 1), K [h, d, s] with (d, 1, h·d) (Hugging Face's head
    splits at batch 1): every iterator addresses its view through them, K's as stored (keys x d);
    the program names the strides its calls must pass (others are copied into them)."""
    import dataclasses

    from benchmarks.mugraphs.attention import one_kernel
    from mirage.mugraph.graph import KernelInput

    g = mi.new_kernel_graph("heads")
    q = g.new_input(dims=(12, 128, 64), strides=(64, 768, 1), name="q")
    k = g.new_input(dims=(12, 64, 128), strides=(64, 1, 768), name="k")
    assert g.graph.nodes[k.ref.node].attrs == KernelInput("k", "", "col", (64, 1, 768))
    assert g.graph.nodes[q.ref.node].attrs == KernelInput("q", "", "", (64, 768, 1))
    graph = one_kernel(12, 128, 128, 64, 64, 64)
    nodes = list(graph.nodes)
    for p, (layout, strides) in enumerate((("", (64, 768, 1)), ("col", (64, 1, 768)), ("", (64, 768, 1)))):
        i = graph.input_nodes[p]
        nodes[i] = dataclasses.replace(nodes[i], attrs=KernelInput(f"x{p}", "", layout, strides))
    program = generate_cuda_program(dataclasses.replace(graph, nodes=tuple(nodes)), 90)
    assert program.input_strides == {0: (64, 768, 1), 1: (64, 1, 768), 2: (64, 768, 1)}
    assert program.code.count("_strides{{768, 64, 768, 1}};  // a view read in place") == 3
    plain = generate_cuda_program(graph, 90)
    assert plain.input_strides == {} and "a view read in place" not in plain.code


@needs_nvcc
def test_a_broadcast_view_is_copied_through_its_zero_stride():
    """Every block reads the same table (stride 0 over the blocks' dim): the iterator's strides say so,
    and the kernel compiles."""
    g = mi.new_kernel_graph("table")
    x = g.new_input(dims=(32, 256, 64), strides=(0, 64, 1), name="table")
    tb = mi.new_threadblock_graph(grid_dim=(32, 4, 1), block_dim=(128, 1, 1), forloop_range=1)
    t = tb.new_input(x, input_map=(0, 1, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.exp(t)), output_map=(0, 1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(y)
    program = generate_cuda_program(g.freeze(), 90)
    assert program.input_strides == {0: (0, 64, 1)}
    assert "_strides{{0, 0, 64, 1}};  // a view read in place" in program.code
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]))
    assert result.cubin()[:4] == b"\x7fELF"
