"""Early loads of program inputs (mirage.codegen.early_loads), as generated code."""

from __future__ import annotations

import dataclasses
import re

import pytest
from codegen_helpers import needs_nvcc

from benchmarks.mugraphs import CASES, mlp
from mirage.codegen.lower_program import generate_cuda_program
from mirage.optimizer import OptimizerOptions


def _program(graph, **options):
    return generate_cuda_program(graph, 90, options=dataclasses.replace(OptimizerOptions(), **options))


def _body(code: str, name: str) -> str:
    start = code.index(f" {name}(")
    end = code.find("extern \"C\"", start)
    return code[start:end if end >= 0 else len(code)]


@pytest.mark.parametrize("stages", [2, 3])
def test_the_gemv_copies_its_weight_stages_before_the_wait(stages):
    program = _program(mlp.rmsnorm_two_kernels(8, grid=128, iters=8, threads=256), stages=stages)
    norm, gemv = program.contexts
    assert [it.parameter for it in gemv.early_loads] == ["input1"]  # W; Y is the first kernel's
    assert norm.signal_after_wait and not gemv.signal_after_wait
    body = _body(program.code, gemv.name)
    weight = gemv.early_loads[0].name
    early = body.index(f"for (int stage = 0; stage < {stages - 1}; ++stage) {weight}.load(stage)")
    wait = body.index("wait_for_prerequisite_grids()")
    assert early < wait
    prologue = body[wait:]
    assert f"{weight}.load(stage);" not in prologue  # copied once, not twice
    assert prologue.count(f"Pipeline<{stages}>::commit();") >= 1  # still one group per stage
    # the first kernel signals after its wait, not before
    first = _body(program.code, norm.name)
    assert first.index("wait_for_prerequisite_grids()") < first.index("launch_dependent_grids()")


def test_off_and_single_kernels_and_intermediates_read_late():
    graph = mlp.rmsnorm_two_kernels(8, grid=128, iters=8, threads=256)
    off = _program(graph, early_input_loads=False)
    assert not any(k.early_loads or k.signal_after_wait for k in off.contexts)
    body = _body(off.code, off.contexts[0].name)
    assert body.index("launch_dependent_grids()") < body.index("wait_for_prerequisite_grids()")
    single = _program(mlp.rmsnorm_fused(8, grid=128, iters=8, threads=256))
    assert not any(k.early_loads or k.signal_after_wait for k in single.contexts)
    # GQA's combine kernel reads only the attention kernel's partials
    gqa = _program(CASES["gqa_b1"].fused())
    assert len(gqa.contexts) == 2 and not any(k.early_loads or k.signal_after_wait for k in gqa.contexts)


@needs_nvcc
def test_early_loads_compile_for_sm90a():
    from mirage.codegen.compile import CompileOptions, Stage, compile_sources
    from mirage.mugraph.target import TARGETS

    program = _program(mlp.rmsnorm_two_kernels(8, grid=128, iters=8, threads=256), multicast_cluster=2)
    (result,) = compile_sources([program.code], CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    sass = result.sass()
    gemv = sass[sass.index(f"Function : {program.kernels[1].name}"):]
    assert re.search(r"LDGSTS", gemv)
    # a copy of the weight is issued before the dependency wait (ACQBULK / griddepcontrol.wait)
    assert gemv.index("LDGSTS") < gemv.index("ACQBULK")


def _normalize_k_member():
    from benchmarks.variants import family

    return next(g for row, g in family("qknorm_b1") if "normalize_k=True" in row.label)


def test_the_attention_kernel_after_the_key_norms_reads_v_early_where_its_stages_live_from_the_start():
    program = _program(_normalize_k_member())
    attention = program.contexts[1]
    assert attention.pre_loop and {it.parameter for it in attention.early_loads} <= {"input0", "input2"}
    assert attention.early_loads and program.contexts[0].signal_after_wait
    # without the early prologue, the memory plan may place Q's pre-loop tiles over the stages: no early loads
    late = _program(_normalize_k_member(), early_prologue=False)
    assert not any(k.early_loads or k.signal_after_wait for k in late.contexts)
