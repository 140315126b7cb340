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
    sass = "\n".join([RUNNABLE, FAULTING, "        /*1ba0*/      LDG.E desc[UR11][R2.64] ;"])
    found = miscompile.faulting_instructions(sass)
    assert found == ["0c60: LDGSTS.E.BYPASS.LTC128B.128 [R7+UR0], desc[UR1][R4.64]",
                     "1ba0: LDG.E desc[UR11][R2.64]"]
    assert miscompile.faulting_instructions(RUNNABLE) == []
    assert "2 instruction(s)" in miscompile.describe(found)


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
