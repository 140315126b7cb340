"""Compilation stages, targets, the cubin cache and compiler errors (mirage.codegen.compile)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from codegen_helpers import needs_nvcc

from mirage.codegen import compile as compile_module
from mirage.codegen import toolchain
from mirage.codegen.compile import (
    CompileError,
    CompileOptions,
    Stage,
    cache_key,
    compile_source,
    compile_sources,
    nvcc_command,
)
from mirage.codegen.toolchain import ToolchainError, read_environment
from mirage.errors import MirageError
from mirage.mugraph.target import TARGETS, Target

SM90A = TARGETS["H100"]
OPTIONS = CompileOptions(target=SM90A)

# Small kernels without CuTe: each builds in about a second.
SCALE_KERNEL = """
extern "C" __global__ void scale(float* out, const float* in, float factor) {
  out[threadIdx.x] = in[threadIdx.x] * factor;
}
"""
ADD_KERNEL = """
extern "C" __global__ void add(float* out, const float* a, const float* b) {
  out[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}
"""
BROKEN_KERNEL = """
extern "C" __global__ void broken(float* out) {
  out[threadIdx.x] = undeclared_name;
}
"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MIRAGE_NO_CACHE", raising=False)
    return tmp_path / "cubins"





# ---- targets ------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize(
    ("target", "gencode"),
    [
        (TARGETS["H100"], "-gencode=arch=compute_90a,code=sm_90a"),
        (TARGETS["H200"], "-gencode=arch=compute_90a,code=sm_90a"),
        (TARGETS["A100"], "-gencode=arch=compute_80,code=sm_80"),
        (TARGETS["L40S"], "-gencode=arch=compute_89,code=sm_89"),
    ],
)
def test_nvcc_builds_for_the_target(target: Target, gencode: str) -> None:
    command = nvcc_command(Path("kernel.cu"), Path("kernel.cubin"), CompileOptions(target=target))
    assert gencode in command
    assert not [flag for flag in command if flag.startswith(("-arch", "--gpu-architecture"))]


def test_targets_below_ampere_are_refused() -> None:
    volta = Target("V100", 70, 96 * 1024, 80)
    with pytest.raises(ToolchainError, match=r"V100 \(sm_70\) is not supported"):
        CompileOptions(target=volta).resolved()
    assert issubclass(ToolchainError, MirageError)


def test_default_target_is_the_current_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_module, "detect_target", lambda: TARGETS["A100"])
    assert CompileOptions().resolved().target == TARGETS["A100"]


def test_default_target_without_a_gpu_is_hopper() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert CompileOptions().resolved().target == TARGETS["H100"]


# ---- environment and command line ---------------------------------------------------------


def test_environment_cache_dir(cache_dir: Path) -> None:
    environment = read_environment()
    assert environment.cache_dir == cache_dir
    assert environment.use_cache


def test_environment_without_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MIRAGE_NO_CACHE", "1")
    environment = read_environment()
    assert not environment.use_cache
    assert tmp_path not in environment.cache_dir.parents


def test_cutlass_include_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wheel_dir = toolchain.cutlass_include_dir()
    assert (wheel_dir / "cute" / "arch" / "mma_sm80.hpp").is_file()
    monkeypatch.setenv("MIRAGE_CUTLASS_INCLUDE", str(wheel_dir))
    assert toolchain.cutlass_include_dir() == wheel_dir
    monkeypatch.setenv("MIRAGE_CUTLASS_INCLUDE", str(tmp_path))
    with pytest.raises(ToolchainError, match="MIRAGE_CUTLASS_INCLUDE"):
        toolchain.cutlass_include_dir()


def test_missing_nvcc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MIRAGE_NVCC", str(tmp_path / "no-nvcc"))
    with pytest.raises(ToolchainError, match="MIRAGE_NVCC=.*does not exist"):
        toolchain.find_nvcc()


@needs_nvcc
def test_nvcc_command_line() -> None:
    options = CompileOptions(
        target=SM90A, fast_math=True, line_info=True, max_registers=128, defines=(("TILE", "64"),)
    )
    command = nvcc_command(Path("kernel.cu"), Path("kernel.cubin"), options)
    assert Path(command[0]).name == "nvcc"
    for flag in ("-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-O3", "--use_fast_math"):
        assert flag in command
    for flag in ("-lineinfo", "-maxrregcount=128", "-DTILE=64"):
        assert flag in command
    includes = [command[i + 1] for i, part in enumerate(command) if part == "-I"]
    assert str(toolchain.library_include_dir()) in includes
    assert str(toolchain.cutlass_include_dir()) in includes
    assert command[-3:] == ["-o", "kernel.cubin", "kernel.cu"]


@needs_nvcc
@pytest.mark.parametrize(
    "change",
    [
        {"source": ADD_KERNEL},
        {"options": CompileOptions(target=SM90A, fast_math=True)},
        {"options": CompileOptions(target=TARGETS["A100"])},
        {"options": CompileOptions(target=SM90A, defines=(("X", "1"),))},
    ],
)
def test_cache_key_depends_on_everything_that_changes_the_cubin(change: dict) -> None:
    base = {"source": SCALE_KERNEL, "options": OPTIONS}
    assert cache_key(**base) == cache_key(**base)
    assert cache_key(**{**base, **change}) != cache_key(**base)


# ---- building -----------------------------------------------------------------------------


@needs_nvcc
def test_compile_then_cache_hit(cache_dir: Path) -> None:
    first = compile_source(SCALE_KERNEL, OPTIONS)
    assert not first.from_cache
    assert first.seconds > 0
    assert first.cubin()[:4] == b"\x7fELF"
    assert first.directory.parent.parent == cache_dir
    second = compile_source(SCALE_KERNEL, OPTIONS)
    assert second.from_cache and second.key == first.key
    assert second.cubin() == first.cubin()
    assert second.command == first.command
    with pytest.raises(FileNotFoundError, match="request it in dumps="):
        second.sass()


@needs_nvcc
def test_dumps_are_added_to_a_cached_entry(cache_dir: Path) -> None:
    compile_source(SCALE_KERNEL, OPTIONS)
    with_sass = compile_source(SCALE_KERNEL, OPTIONS, dumps={Stage.SASS})
    assert with_sass.from_cache  # SASS comes from the cached cubin
    assert "Function : scale" in with_sass.sass()
    assert "FMUL" in with_sass.sass()
    with_ptx = compile_source(SCALE_KERNEL, OPTIONS, dumps={Stage.PTX})
    assert not with_ptx.from_cache  # PTX needs the front end again
    assert ".entry scale" in with_ptx.ptx()
    assert ".target sm_90a" in with_ptx.ptx()
    assert with_ptx.path(Stage.SOURCE).read_text() == SCALE_KERNEL


@needs_nvcc
def test_failed_build_reports_a_reproducible_command_and_caches_nothing(cache_dir: Path) -> None:
    with pytest.raises(CompileError) as caught:
        compile_source(BROKEN_KERNEL, OPTIONS)
    error = caught.value
    assert isinstance(error, MirageError)
    assert error.stage is Stage.CUBIN
    assert 'identifier "undeclared_name" is undefined' in str(error)
    assert shlex.join(error.command) in str(error)
    assert "-gencode=arch=compute_90a,code=sm_90a" in error.command
    # Nothing in the cache: no entry, no leftovers; only the failed source, kept apart.
    entries = [p for p in cache_dir.iterdir() if p.name not in ("failed", "scratch", "locks")]
    assert entries == []
    assert list((cache_dir / "scratch").iterdir()) == []
    assert error.directory.parent == cache_dir / "failed"
    # The reported command reproduces the failure.
    rerun = subprocess.run(list(error.command), cwd=error.directory, capture_output=True, text=True)
    assert rerun.returncode != 0
    assert 'identifier "undeclared_name" is undefined' in rerun.stderr + rerun.stdout
    # Fixing the source builds normally.
    assert not compile_source(SCALE_KERNEL, OPTIONS).from_cache


@needs_nvcc
def test_parallel_builds_keep_order_and_report_failures(cache_dir: Path) -> None:
    sources = [SCALE_KERNEL, BROKEN_KERNEL, ADD_KERNEL]
    outcomes = compile_sources(sources, OPTIONS, dumps={Stage.SASS}, max_workers=2, return_exceptions=True)
    assert isinstance(outcomes[1], CompileError)
    assert "Function : scale" in outcomes[0].sass()
    assert "Function : add" in outcomes[2].sass()
    with pytest.raises(CompileError, match="undeclared_name"):
        compile_sources(sources, OPTIONS, max_workers=2)


@needs_nvcc
def test_no_cache_mode_builds_outside_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MIRAGE_NO_CACHE", "1")
    result = compile_source(SCALE_KERNEL, OPTIONS)
    assert result.cubin()[:4] == b"\x7fELF"
    assert not (tmp_path / "cubins").exists()


@needs_nvcc
@pytest.mark.parametrize(
    ("damage", "content"),
    [
        ("metadata.json", b""),
        ("metadata.json", b"[1]"),
        ("metadata.json", b"null"),
        ("metadata.json", b'{"seconds": 1}'),
        ("kernel.cubin", b"TRUNCATE"),
        ("kernel.cubin", b"\x13\x37" * 300),
        ("kernel.cubin", b""),
    ],
)
def test_a_corrupt_cache_entry_is_warned_about_and_rebuilt(
    cache_dir: Path, caplog: pytest.LogCaptureFixture, damage: str, content: bytes
) -> None:
    first = compile_source(SCALE_KERNEL, OPTIONS)
    target = first.directory / damage
    if content == b"TRUNCATE":
        content = first.cubin()[: len(first.cubin()) // 2]  # still starts with the ELF magic
    target.write_bytes(content)
    with caplog.at_level("WARNING", logger=compile_module.logger.name):
        again = compile_source(SCALE_KERNEL, OPTIONS)
    assert not again.from_cache
    assert again.cubin() == first.cubin()
    assert any("corrupt cache file" in r.getMessage() and "compiled kernel" in r.getMessage()
               for r in caplog.records)
    assert compile_source(SCALE_KERNEL, OPTIONS).from_cache


@needs_nvcc
def test_processes_asking_for_one_kernel_at_once_build_it_once(cache_dir: Path, tmp_path: Path) -> None:
    """Parallel workers (pytest-xdist, search workers) that need the same kernel wait for the first
    build and take its cache entry: nvcc runs once."""
    import os
    import sys

    real = toolchain.find_nvcc(read_environment())
    log = tmp_path / "nvcc_calls"
    wrapper = tmp_path / "nvcc"
    logged = f"{{ echo build >> {shlex.quote(str(log))}; sleep 2; }}"  # the others start meanwhile
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = "--version" ] || {logged}\nexec {shlex.quote(str(real))} "$@"\n')
    wrapper.chmod(0o755)
    script = (f"from mirage.codegen.compile import compile_source, CompileOptions\n"
              f"from mirage.mugraph.target import TARGETS\n"
              f"print(compile_source({SCALE_KERNEL!r}, CompileOptions(target=TARGETS['H100'])).from_cache)\n")
    env = {**os.environ, "MIRAGE_NVCC": str(wrapper)}
    workers = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
               for _ in range(3)]
    outputs = [w.communicate(timeout=300)[0].split() for w in workers]
    assert all(w.returncode == 0 for w in workers)
    assert log.read_text().count("build") == 1
    assert sorted(o[-1] for o in outputs) == ["False", "True", "True"]
