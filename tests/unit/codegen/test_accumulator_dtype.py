"""OptimizerOptions(accumulator_dtype=...) builds: 16-bit accumulator state in shared memory.

The option (docs/optimizer.md §1) gives the element type of for-loop accumulator state and running
maxima in shared memory; the generated code updates them in fp32 registers and stores them back
converted (gen::add_into, max_into, running_max_into, rescale_into, fill, finalize_mean /
finalize_rms, RescaleFactor). These graphs compile with nvcc for sm_90a, each accumulator kind through
the shared-memory sinks (row_loops and register_row_sums off) and through the default forms.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
from codegen_helpers import needs_nvcc

import mirage as mi
from mirage.codegen.compile import CompileOptions, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.random_graphs import random_graph
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions

pytestmark = needs_nvcc

# the accumulators in shared tiles, updated by the sinks (no row-local loops, no register row sums)
SHARED = OptimizerOptions(row_loops=False, register_row_sums=False)
DEFAULT = OptimizerOptions()


def _accumulate(kind: str):
    """x (12, 96) in fp16, 3 blocks × 3 iterations of (4, 32) tiles; x² accumulated by ``kind``."""
    g = mi.new_kernel_graph()
    x = g.new_input((12, 96), mi.float16)
    tb = mi.new_threadblock_graph((3, 1, 1), forloop_range=3)
    a = tb.new_input(x, (0, -1, -1), 1)
    squared = tb.square(a)
    if kind == "max":
        result = tb.reduction(tb.forloop_accum_max(squared), 1)
    elif kind == "none":
        result = tb.reduction(tb.forloop_accum(squared), 1)
    else:
        result = tb.forloop_accum(squared, acc=kind)
    tb.new_output(result, (0, -1, -1))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g


def _online_softmax():
    """Σ_r exp(x_r − m_r) rescaled by its running maximum m (running_max and rescale sinks)."""
    g = mi.new_kernel_graph()
    x = g.new_input((12, 96), mi.float16)
    tb = mi.new_threadblock_graph((3, 1, 1), forloop_range=3)
    a = tb.new_input(x, (0, -1, -1), 1)
    m = tb.running_max(a)
    acc = tb.forloop_accum_rescale(tb.exp(tb.sub(a, m)), m)
    tb.new_output(tb.reduction(acc, 1), (0, -1, -1))
    (o,) = g.customized([x], tb)
    g.mark_output(o)
    return g


GRAPHS = {f"{kind}": (lambda kind=kind: _accumulate(kind)) for kind in ("sum", "max", "mean", "rms", "none")}
GRAPHS["online_softmax"] = _online_softmax
GRAPHS["random_1"] = lambda: random_graph(1).graph  # a running max rescaling a register accumulator
CASES = [(name, dtype, form) for name in GRAPHS for dtype in ("float16", "bfloat16")
         for form in ("shared", "default") if dtype == "float16" or name in ("sum", "max", "online_softmax")]


def _options(dtype: str, form: str) -> OptimizerOptions:
    base = SHARED if form == "shared" else DEFAULT
    return dataclasses.replace(base, accumulator_dtype=getattr(mi, dtype))


@cache
def _built():
    programs = {case: generate_cuda_program(GRAPHS[case[0]](), 90, options=_options(*case[1:]))
                for case in CASES}
    results = compile_sources([p.code for p in programs.values()], CompileOptions(target=TARGETS["H100"]),
                              return_exceptions=True)
    return {case: (programs[case], result) for case, result in zip(programs, results, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_16_bit_accumulators_compile_for_sm90a(case):
    program, result = _built()[case]
    assert not isinstance(result, Exception), str(result)
    assert result.cubin()[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", ["sum", "max", "mean", "online_softmax"])
def test_shared_accumulators_have_the_option_element_type(name):
    """The shared-memory form keeps accumulator state in 16-bit tiles and updates it by the sinks."""
    code = generate_cuda_program(GRAPHS[name](), 90, options=_options("float16", "shared")).code
    sinks = {"sum": "add_into", "mean": "add_into", "max": "max_into", "online_softmax": "rescale_into"}
    assert f"mirage::gen::{sinks[name]}(" in code
    default = generate_cuda_program(GRAPHS[name](), 90, options=SHARED).code
    assert "SharedTile<float," in default and "SharedTile<float," not in code


def test_float32_accumulators_are_the_default():
    """The default option and an explicit float32 give the same code."""
    graph = _accumulate("sum")
    explicit = OptimizerOptions(accumulator_dtype=mi.float32)
    assert generate_cuda_program(graph, 90).code == generate_cuda_program(graph, 90, options=explicit).code
