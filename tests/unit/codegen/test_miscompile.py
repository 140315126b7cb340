"""Cubins are checked for instructions the GPU cannot run and rebuilt without the thread-index
assumption when ptxas emitted one (mirage.codegen.miscompile, mirage.codegen.compile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from codegen_helpers import needs_nvcc

from mirage.codegen import miscompile
from mirage.codegen.compile import CompileError, CompileOptions, Stage, compile_source, cubin_to_sass
from mirage.codegen.lower_program import generate_cuda_program
from mirage.codegen.random_graphs import random_graph
from mirage.mugraph.target import TARGETS

OPTIONS = CompileOptions(target=TARGETS["H100"])
FAULTING = "        /*0c60*/                   LDGSTS.E.BYPASS.LTC128B.128 [R7+UR0], desc[UR1][R4.64] ;"
RUNNABLE = "        /*1b90*/                   LDGSTS.E.BYPASS.LTC128B.128 [R13], desc[UR6][R14.64] ;"
KERNEL = 'extern "C" __global__ void scale(float* out) { out[threadIdx.x] *= 2.0f; }\n'


def test_an_odd_descriptor_register_is_found_and_an_even_one_is_not() -> None:
    sass = "\n".join(["        /*0000*/                   ULDC.64 UR0, c[0x0][0x208] ;",
                      "        /*0010*/                   ULDC.64 UR6, c[0x0][0x208] ;", RUNNABLE, FAULTING])
    assert miscompile.faulting_instructions(sass) == [
        "0c60: LDGSTS.E.BYPASS.LTC128B.128 [R7+UR0], desc[UR1][R4.64]"]
    assert miscompile.faulting_instructions("\n".join(sass.splitlines()[:3])) == []
    assert "1 instruction(s)" in miscompile.describe(miscompile.faulting_instructions(sass))


def _kernel(*instructions: str) -> str:
    lines = [f"        /*{16 * k:04x}*/                   {text} ;" for k, text in enumerate(instructions)]
    return "\t\tFunction : k\n" + "\n".join(lines)


def test_an_address_reading_a_uniform_register_nothing_writes_is_found() -> None:
    assert miscompile.faulting_instructions(_kernel("LDS R2, [R3+UR6]")) == ["k+0x0000: LDS R2, [R3+UR6]"]
    assert miscompile.faulting_instructions(_kernel("S2UR UR6, SR_CgaCtaId", "LDS R2, [R3+UR6]")) == []
    assert miscompile.faulting_instructions(
        _kernel("ULDC.64 UR4, c[0x0][0x208]", "@P0 LDG.E R2, desc[UR4][R2.64]")) == []
    assert miscompile.faulting_instructions(
        _kernel("UIMAD.WIDE.U32 UR8, UR2, 0x4, URZ", "R2UR UR2, R0", "STG.E desc[UR8][R2.64], R5")) == []
    # wgmma leaves the half of gdesc that its register operand replaces unwritten
    wgmma = "HGMMA.64x64x16.F32 R24, R100, gdesc[UR24].tnspB, R24, gsb0"
    assert miscompile.faulting_instructions(_kernel("R2UR UR26, R22", "R2UR UR27, R23", wgmma)) == []


def test_each_kernel_is_checked_on_its_own() -> None:
    writes, reads = _kernel("S2UR UR6, SR_CgaCtaId"), _kernel("LDS R2, [R3+UR6]")
    assert miscompile.faulting_instructions(writes + "\n" + reads) == ["k+0x0000: LDS R2, [R3+UR6]"]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MIRAGE_NO_CACHE", raising=False)
    return tmp_path


@needs_nvcc
def test_a_random_program_ptxas_miscompiles_with_the_assumption_builds_runnable(cache_dir: Path) -> None:
    """Random µGraph 1 is one where ptxas (13.0) emitted the faulting copy with the assumption on:
    whatever the nvcc, the cubin that comes back holds no such instruction."""
    result = compile_source(generate_cuda_program(random_graph(1).graph, None).code, OPTIONS)
    assert miscompile.faulting_instructions(cubin_to_sass(result.cubin_path)) == []
    metadata = json.loads((result.directory / "metadata.json").read_text())
    if "fallback_defines" in metadata:
        assert "-DMIRAGE_ASSUME_THREAD_INDEX=0" in metadata["command"]


@needs_nvcc
def test_a_flagged_build_is_rebuilt_under_the_fallback_defines(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[str] = []

    def first_build_faults(sass: str) -> list[str]:
        checked.append(sass)
        return [FAULTING] if len(checked) == 1 else []

    monkeypatch.setattr(miscompile, "faulting_instructions", first_build_faults)
    result = compile_source(KERNEL, OPTIONS, dumps={Stage.SASS})
    assert len(checked) == 2
    assert "-DMIRAGE_ASSUME_THREAD_INDEX=0" in result.command
    metadata = json.loads((result.directory / "metadata.json").read_text())
    assert metadata["fallback_defines"] == {"MIRAGE_ASSUME_THREAD_INDEX": "0"}
    assert "scale" in result.sass()


@needs_nvcc
def test_a_build_that_faults_under_the_fallback_too_is_a_clear_error(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(miscompile, "faulting_instructions", lambda sass: [FAULTING])
    with pytest.raises(CompileError, match="odd uniform register") as caught:
        compile_source(KERNEL, OPTIONS)
    assert caught.value.stage is Stage.SASS
    assert "exit status" not in str(caught.value)
    assert not list((cache_dir / "cubins").glob("??/*")), "a faulting cubin was cached"
