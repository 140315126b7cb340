"""prepare(): the whole pipeline on every benchmark µGraph, its options, and its record."""

from __future__ import annotations

import dataclasses
import doctest
import functools
import importlib

import pytest
from optimizer_graphs import assert_same_function, matmul_chain

import mirage as mi
from benchmarks.mugraphs import CASES
from mirage.errors import GraphError, SharedMemoryError
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.ops import Op
from mirage.mugraph.target import DEFAULT_TARGET
from mirage.optimizer import PIPELINE, OptimizerOptions, prepare

# one size per program runs by default; the other sizes (same programs, larger shapes) are marked slow
LARGE = {n for n in CASES if n.endswith(("_b8", "_m8"))}
ALL = [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in CASES]


@functools.cache
def _prepared(name: str):
    return prepare(CASES[name].fused())


@pytest.mark.parametrize("name", ALL)
def test_prepared_graph_computes_the_same_function(name):
    program = _prepared(name)
    assert_same_function(program.source, program.graph, rtol=1e-9)


@pytest.mark.parametrize("name", list(CASES))
def test_every_graph_defined_op_gets_a_complete_record(name):
    program = _prepared(name)
    assert [r.name for r in program.records] == [p.name for p in PIPELINE]
    customized = [i for i, n in enumerate(program.graph.nodes) if n.op is Op.CUSTOMIZED]
    assert [k.node for k in program.kernels] == customized
    for k in program.kernels:
        node = program.graph.nodes[k.node]
        assert k.block_graph is node.attrs
        direct = k.row_loop is not None and set(k.row_loop.direct) == set(k.block_graph.input_nodes)
        assert 0 < k.smem_bytes <= program.target.smem_per_block or direct and k.smem_bytes == 0
        assert len(k.layouts) == len(k.block_graph.nodes)
        assert [i for i, t in enumerate(k.layouts) if t is None] == k.block_graph.output_nodes
        assert [t.shape for t in k.input_layouts] == [program.graph.type_of(r).shape for r in node.inputs]
        assert [t.shape for t in k.output_layouts] == [t.shape for t in node.outputs]
        assert {s.node for s in k.schedule.steps} == set(range(len(k.block_graph.nodes)))
        assert k.registers.registers_per_thread <= k.registers.budget
        assert program.kernel(k.node) is k
    assert (program.softmax.applied) == (program.source.name in ("gqa", "qknorm"))


def test_options_switch_passes_off():
    graph = CASES["gqa_b1"].fused()
    plain = prepare(graph, options=OptimizerOptions(online_softmax=False, fusion=False))
    ops = {n.op for b in plain.graph.block_graphs() for n in b.nodes}
    assert Op.RUNNING_MAX not in ops and Op.FUSED not in ops and Op.EXP in ops
    assert not plain.softmax.applied and plain.fusion.groups == 0
    full = prepare(graph)
    ops = {n.op for b in full.graph.block_graphs() for n in b.nodes}
    assert {Op.RUNNING_MAX, Op.ACCUM_RESCALE, Op.FUSED} <= ops and Op.EXP not in ops  # exp is inside FUSED


def test_pipeline_stages_grow_shared_memory():
    graph = matmul_chain(k=256)
    options = [OptimizerOptions(stages=s, prefetch_small_bytes=0) for s in (1, 2, 3)]
    sizes = [prepare(graph, options=o).kernels[0].smem_bytes for o in options]
    assert sizes[0] < sizes[1] < sizes[2]


@pytest.mark.parametrize(
    ("stages", "small_bytes", "expected"), [(2, 1 << 20, 4), (3, 1 << 20, 4), (2, 0, 2), (1, 1 << 20, 1)]
)
def test_loops_of_small_tiles_prefetch_every_iteration(stages, small_bytes, expected):
    """matmul_chain's tiles total a few KB per iteration: with a pipeline asked for, all 4 of its
    iterations are in flight at once (never more stages than iterations; stages=1 stays unpipelined)."""
    graph = matmul_chain(k=256)
    options = OptimizerOptions(stages=stages, prefetch_small_bytes=small_bytes)
    (kernel,) = prepare(graph, options=options).kernels
    slots = {b.slots for b in kernel.memory.buffers if b.kind.value == "input_stages"}
    assert slots == {expected}


def test_prepare_rejects_invalid_graphs_and_oversized_plans():
    with pytest.raises(GraphError, match="no outputs"):
        prepare(KernelGraph((), ()))
    small = dataclasses.replace(DEFAULT_TARGET, smem_per_block=64 * 1024)
    fits = prepare(CASES["gqa_b1"].fused(), small, OptimizerOptions(stages=1))
    assert max(k.smem_bytes for k in fits.kernels) <= 64 * 1024
    with pytest.raises(SharedMemoryError, match="more than the 65536"):
        prepare(CASES["gqa_b1"].fused(), small, OptimizerOptions(stages=3))


def test_prepare_accepts_a_builder():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 64), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=2)
    tb.new_output(tb.forloop_accum(tb.exp(tb.new_input(x, forloop_dim=1)), acc="sum"))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    program = prepare(g)
    assert program.source == g.freeze() and len(program.kernels) == 1


@pytest.mark.parametrize("name", ["gqa_b1", "lora_m16"])
def test_graphs_without_graph_defined_ops_get_device_layouts_only(name):
    program = prepare(CASES[name].reference())
    assert program.kernels == ()
    if name == "gqa_b1":  # its kernel-level softmax runs less its row maxima; nothing else changes
        sites = program.softmax.rewritten
        assert [(s.kernel, program.source.nodes[s.exp].op) for s in sites] == [(-1, Op.EXP)]
        assert len(program.graph.nodes) == len(program.source.nodes) + 2
    else:
        assert program.graph == program.source
    for ref in program.graph.refs():
        layout = program.layouts.of_device(ref)
        assert layout.strides[layout.innermost_dim] == 1
    if name == "lora_m16":  # nothing to gain: every tensor stays row-major (the tie-breaking cost)
        assert program.layouts.cost == 0


@pytest.mark.parametrize("module", ["mirage.optimizer.fusion", "mirage.optimizer.pipeline"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
