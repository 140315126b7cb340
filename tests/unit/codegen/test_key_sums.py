"""QKNorm with each key's sum of squares computed by a kernel of its own (``variants.attention_fused(
key_sums=True)``): the attention kernel reads one value per key as an input tile, which the
online-softmax chain maps to the key's factor on read (``gen::FactorTile``, no step and no barrier of
its own), copied by TMA beside K and V in the warpgroup form; its normalized Q is swizzled for the
warpgroup MMAs; and the pipeline's first stages are fetched before Q's rms (``early_prologue``).
The GPU checks are in tests/gpu/test_key_sums_gpu.py."""

from __future__ import annotations

import dataclasses
import re

import pytest
from codegen_helpers import needs_nvcc

from benchmarks.variants import attention_fused
from mirage.codegen import tensor_maps
from mirage.codegen.compile import CompileOptions, Stage, compile_sources
from mirage.codegen.lower_program import generate_cuda_program
from mirage.mugraph.target import TARGETS
from mirage.optimizer import OptimizerOptions, prepare
from mirage.optimizer.memory import BufferKind
from mirage.optimizer.softmax_chain import match

SPLITS = dict(kv_splits=8, q_splits=2, iters=8, threads=256, row_sums=True, combine_rows=8)
RELEASE = OptimizerOptions(warpgroup_softmax=True, tma_copies=True)


def _graph(b: int = 1):
    return attention_fused(b, True, key_sums=True, norm_blocks=64, **SPLITS)


def _attention(program) -> str:
    """The source of the attention kernel (the second of three)."""
    start = program.code.index("graph-defined op", program.code.index("__global__"))
    return program.code[start:program.code.index("graph-defined op", start + 1)]


def test_the_chain_takes_loaded_per_key_values():
    prepared = prepare(_graph(), TARGETS["H100"], OptimizerOptions())
    attention = prepared.kernels[1]
    chain = attention.softmax_chain
    assert chain is not None and chain.column_loaded
    assert attention.block_graph.nodes[chain.column].op.value == "input"
    assert chain.anchor == chain.qk  # nothing to wait for: the values land with K and V
    # the same match without the warpgroup form's planning
    again = match(attention.block_graph, attention.schedule)
    assert again is not None and again.column == chain.column and again.column_loaded


def test_warp_form_reads_the_values_through_a_factor_tile():
    program = generate_cuda_program(_graph(), 90, options=OptimizerOptions())
    code = _attention(program)
    assert len(program.kernels) == 3  # the key sums, the attention, the combine
    assert ("mirage::gen::FactorTile<mirage::dev::SharedTile<__half, mirage::dev::Layout<1, 1, 1, 64, 64>>, "
            "mirage::gen::ColumnFactor<") in code
    assert re.search(r"softmax\d+::step\([^;]*, t\d+\);", code)  # the values' tile is the chain's 5th operand


def test_warpgroup_form_copies_the_values_by_tma_with_k_and_v():
    program = generate_cuda_program(_graph(), 90, options=RELEASE)
    attention = program.kernels[1]
    assert tensor_maps.TensorMapSpec(3, (1, 1, 1, 64)) in attention.tensor_maps  # one row of 64 values
    assert len(attention.tensor_maps) == 3
    code = _attention(program)
    loop = code[code.index("---- the for-loop"):code.index("---- after the for-loop")]
    assert "__syncthreads" not in loop  # every pipelined input released: no block barrier
    assert "FactorTile<mirage::dev::SharedTile<__half, mirage::dev::Swizzled128Layout<1, 1, 1, 64>>" in code
    # the rms-normalized Q is written swizzled and read by the warpgroup MMAs, behind a proxy fence
    assert "OnlineSoftmax<kThreads, __half, mirage::dev::Swizzled128Layout<1, 1, 128, 64>" in code
    before = code[code.index("---- before the for-loop"):code.index("---- the for-loop")]
    assert before.index("fence_view_async_shared") < before.index("pre-loop results ready")


def _before_loop(options) -> tuple[str, object]:
    program = generate_cuda_program(_graph(), 90, options=options)
    code = _attention(program)
    return code[code.index("---- before the for-loop"):code.index("---- the for-loop")], program


@pytest.mark.parametrize("form", [OptimizerOptions(), RELEASE])
def test_early_prologue_fetches_the_first_stages_before_the_pre_loop_steps(form):
    early, _ = _before_loop(dataclasses.replace(form, early_prologue=True))
    late, _ = _before_loop(dataclasses.replace(form, early_prologue=False))
    assert early.index("for (int stage = 0;") < early.index("rms_norm_apply")
    assert late.index("for (int stage = 0;") > late.index("rms_norm_apply")
    # Q's copy group is older than the prologue's groups: its wait leaves those in flight
    assert "mirage::dev::Pipeline<1>::commit();" in early
    assert re.search(r"Pipeline<[2-9](, true)?>::wait\(\);  // depth 0 → 1", early)
    assert re.search(r"Pipeline<1(, true)?>::wait\(\);  // depth 0 → 1", late)


def test_early_prologue_starts_the_stages_lifetimes_at_the_first_level():
    """The stages are alive from the first pre-loop level, so no pre-loop tile (raw Q, normalized Q)
    may share their bytes; without early_prologue the raw Q's tile, dead before the prologue, may."""
    for early in (True, False):
        prepared = prepare(_graph(), TARGETS["H100"], OptimizerOptions(stages=3, early_prologue=early))
        memory = prepared.kernels[1].memory
        assert memory.early_prologue is early
        stages = [b for b in memory.buffers if b.kind is BufferKind.INPUT_STAGES]
        assert len(stages) == 3  # K, V and the key sums
        if early:
            assert {b.start for b in stages} == {0}
        else:
            assert min(b.start for b in stages) > 0
        for b in stages:  # buffers alive at once never share bytes
            for c in memory.buffers:
                if c is not b and b.overlaps_in_time(c):
                    assert b.offset + b.size <= c.offset or c.offset + c.size <= b.offset, (b, c)


@needs_nvcc
def test_warpgroup_key_sums_build_compiles():
    program = generate_cuda_program(_graph(8), 90, options=dataclasses.replace(RELEASE, stages=3))
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    attention = next(f for f in result.sass().split("Function : ")[1:] if "HGMMA" in f)
    assert "UTMALDG" in attention  # the TMA copies, the values' among them
    assert "LDL" not in attention and "STL" not in attention
