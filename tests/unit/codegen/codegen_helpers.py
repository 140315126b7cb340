"""Shared by the codegen tests: the skip for machines without nvcc, host programs built on the device
library, the check that declarations the device library must reject fail to compile with the
library's messages, and the SASS of a build split by kernel."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from mirage.codegen import toolchain
from mirage.codegen.compile import CompileError, CompileOptions, compile_source
from mirage.codegen.toolchain import ToolchainError, find_nvcc


def _have_nvcc() -> bool:
    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


needs_nvcc = pytest.mark.skipif(not _have_nvcc(), reason="nvcc is not installed")


def build_host_program(directory: Path, source: str, name: str = "program") -> Path:
    """``source`` (host code using the device library's host-side parts) built by nvcc into
    ``directory / name``; the path of the executable."""
    (directory / f"{name}.cu").write_text(source)
    command = [str(find_nvcc()), "-std=c++17", "--expt-relaxed-constexpr",
               "-I", str(toolchain.library_include_dir()), "-I", str(toolchain.cutlass_include_dir()),
               "-o", name, f"{name}.cu"]
    subprocess.run(command, cwd=directory, check=True, capture_output=True)
    return directory / name


def assert_each_is_rejected(checks: list[tuple[str, str]], options: CompileOptions) -> None:
    """Compile every (declaration, message) pair as one kernel each; nvcc must fail with every message."""
    bodies = "\n".join(
        f'extern "C" __global__ void bad_{i}(float* f, __half* h) {{ {code} }}'
        for i, (code, _) in enumerate(checks)
    )
    source = f"#include <mirage/mirage.cuh>\nusing namespace mirage::dev;\n{bodies}\n"
    with pytest.raises(CompileError) as caught:
        compile_source(source, options)
    for _, message in checks:
        assert message in caught.value.output, message


def sass_by_function(sass: str) -> dict[str, str]:
    """Split ``cuobjdump -sass`` output into one text per kernel."""
    parts = re.split(r"^\s+Function : (\S+)\s*$", sass, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def compile_collection(builders: dict, options=None) -> dict:
    """The µGraphs of ``builders`` (name → function building one) generated for sm_90a (with the
    optimizer's ``options``) and compiled together; name → compile result, every build checked to have
    succeeded."""
    from mirage.codegen.compile import Stage, compile_sources
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.mugraph.target import TARGETS

    programs = {name: generate_cuda_program(build(), 90, options=options) for name, build in builders.items()}
    results = compile_sources([p.code for p in programs.values()], CompileOptions(target=TARGETS["H100"]),
                              dumps={Stage.SASS}, return_exceptions=True)
    for name, result in zip(programs, results, strict=True):
        assert not isinstance(result, Exception), f"{name}: {result}"
    return dict(zip(programs, results, strict=True))
