"""Compilation of generated CUDA: named stages, a content-hash cache, parallel builds.

Stages (each can be dumped; a failing tool raises :class:`CompileError` with the command that
reproduces the failure)::

    SOURCE  --nvcc-->  CUBIN  (+ PTX, kept from the same nvcc run on request)
    CUBIN   --cuobjdump -sass-->  SASS (read for every build, kept on request)

Every cubin's SASS is checked for instructions the GPU cannot run (:mod:`mirage.codegen.miscompile`);
a cubin with one is rebuilt once under the check's fallback defines, which the cache entry records.

Typical use::

    result = compile_source(source, CompileOptions(target=TARGETS["H100"]), dumps={Stage.SASS})
    result.cubin_path, result.sass()

Cubins are cached under ``MIRAGE_CACHE_DIR`` (default ``~/.cache/mirage/cubins``) keyed by the
hash of the source, the device library's headers, the CuTe version, the nvcc version and the
full command line. A build happens in a scratch directory that is moved into the cache only
when every requested stage succeeded, so nothing is cached from a failed build.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import filelock

from mirage.codegen import miscompile
from mirage.codegen.toolchain import (
    Environment,
    ToolchainError,
    check_target,
    cutlass_include_dir,
    find_binary_tool,
    find_nvcc,
    library_include_dir,
    read_environment,
    tool_version,
)
from mirage.config import compile_time_limit_s, warn_corrupt
from mirage.errors import MirageError
from mirage.mugraph.target import Target, detect_target

logger = logging.getLogger(__name__)

__all__ = [
    "CompileError",
    "CompileOptions",
    "CompileResult",
    "Stage",
    "Target",
    "ToolchainError",
    "compile_source",
    "compile_sources",
    "cubin_to_sass",
    "nvcc_command",
]

SOURCE_NAME = "kernel.cu"


class CompileError(MirageError):
    """A compiler or binary tool failed; ``cd directory && command`` reproduces the failure."""

    def __init__(self, stage: Stage, command: Sequence[str], output: str, returncode: int, directory: Path):
        self.stage = stage
        self.command = tuple(command)
        self.output = output
        self.returncode = returncode
        self.directory = directory
        status = f" (exit status {returncode})" if returncode else ""
        super().__init__(
            f"{stage.value} stage failed{status}. Reproduce with:\n"
            f"  cd {shlex.quote(str(directory))} && {shlex.join(self.command)}\n{output.strip()}"
        )

    def moved_to(self, directory: Path) -> CompileError:
        """The same error, its command run in ``directory`` (where the sources were kept)."""
        return CompileError(self.stage, self.command, self.output, self.returncode, directory)


class Stage(enum.Enum):
    SOURCE = "source"
    PTX = "ptx"
    CUBIN = "cubin"
    SASS = "sass"


# File name of each stage's output inside a cache entry.
STAGE_FILES: dict[Stage, str] = {
    Stage.SOURCE: SOURCE_NAME,
    Stage.PTX: "kernel.ptx",
    Stage.CUBIN: "kernel.cubin",
    Stage.SASS: "kernel.sass",
}


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """How to build: the target GPU and the nvcc options that change the cubin."""

    target: Target | None = None  # None: the current GPU (detect_target), or the H100 without one
    optimization_level: int = 3
    fast_math: bool = False
    line_info: bool = False
    max_registers: int | None = None
    defines: tuple[tuple[str, str], ...] = ()
    include_dirs: tuple[str, ...] = ()
    extra_flags: tuple[str, ...] = ()

    def resolved(self) -> CompileOptions:
        target = self.target if self.target is not None else detect_target()
        return dataclasses.replace(self, target=check_target(target))


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """A built (or cached) module: its cache entry and the files of the requested stages."""

    key: str
    directory: Path
    command: tuple[str, ...]
    seconds: float  # nvcc wall time when built; 0 when found in the cache
    from_cache: bool

    def path(self, stage: Stage) -> Path:
        path = self.directory / STAGE_FILES[stage]
        if not path.is_file():
            raise FileNotFoundError(f"{stage.value} was not dumped for {self.key}: request it in dumps=")
        return path

    @property
    def cubin_path(self) -> Path:
        return self.path(Stage.CUBIN)

    def cubin(self) -> bytes:
        return self.cubin_path.read_bytes()

    def ptx(self) -> str:
        return self.path(Stage.PTX).read_text()

    def sass(self) -> str:
        return self.path(Stage.SASS).read_text()


# ---- stages -----------------------------------------------------------------------------


def nvcc_command(
    source_path: Path,
    cubin_path: Path,
    options: CompileOptions,
    environment: Environment | None = None,
    keep_dir: Path | None = None,
) -> list[str]:
    """The nvcc command line building ``source_path`` into ``cubin_path`` (PTX kept in ``keep_dir``)."""
    environment = environment or read_environment()
    target = options.resolved().target
    assert target is not None
    command = [
        str(find_nvcc(environment)),
        "-cubin",
        target.gencode,
        "-std=c++17",
        f"-O{options.optimization_level}",
        "--expt-relaxed-constexpr",
        "-I",
        str(library_include_dir()),
        "-I",
        str(cutlass_include_dir(environment)),
    ]
    for directory in options.include_dirs:
        command += ["-I", directory]
    command += [f"-D{name}={value}" for name, value in options.defines]
    if options.fast_math:
        command.append("--use_fast_math")
    if options.line_info:
        command.append("-lineinfo")
    if options.max_registers is not None:
        command.append(f"-maxrregcount={options.max_registers}")
    command += list(options.extra_flags)
    if keep_dir is not None:
        command += ["--keep", "--keep-dir", str(keep_dir)]
    command += ["-o", str(cubin_path), str(source_path)]
    return command


def _run(stage: Stage, command: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    limit = compile_time_limit_s()
    # a session of its own, so that a run past the limit is stopped with the compilers it started
    with subprocess.Popen(list(command), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise CompileError(stage, command, f"stopped after {limit:.0f} s, the compile time limit; raise "
                               "MIRAGE_COMPILE_TIME_LIMIT to wait longer, or build a µGraph of smaller tiles",
                               0, cwd) from None
    completed = subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
    if completed.returncode != 0:
        raise CompileError(stage, command, completed.stderr + completed.stdout, completed.returncode, cwd)
    if completed.stderr.strip():
        logger.debug("%s stage output:\n%s", stage.value, completed.stderr.strip())
    return completed


def source_to_cubin(
    source_path: Path, options: CompileOptions, environment: Environment, keep_ptx: bool
) -> tuple[list[str], float]:
    """SOURCE → CUBIN (and PTX when ``keep_ptx``), next to the source. Returns (command, seconds).

    The command names files relative to the source's directory, where it runs.
    """
    directory = source_path.parent
    keep_dir = Path("keep") if keep_ptx else None
    if keep_dir is not None:
        (directory / keep_dir).mkdir()
    cubin = Path(STAGE_FILES[Stage.CUBIN])
    command = nvcc_command(Path(source_path.name), cubin, options, environment, keep_dir)
    start = time.perf_counter()
    _run(Stage.CUBIN, command, directory)
    seconds = time.perf_counter() - start
    if keep_dir is not None:
        ptx_files = sorted((directory / keep_dir).glob("*.ptx"))
        if not ptx_files:
            raise CompileError(Stage.PTX, command, "nvcc --keep left no .ptx file", 0, directory)
        os.replace(ptx_files[0], directory / STAGE_FILES[Stage.PTX])
        shutil.rmtree(directory / keep_dir)
    return command, seconds


def cubin_to_sass(cubin_path: Path, environment: Environment | None = None) -> str:
    """CUBIN → SASS text (``cuobjdump -sass``)."""
    command = [str(find_binary_tool("cuobjdump", environment)), "-sass", cubin_path.name]
    return _run(Stage.SASS, command, cubin_path.parent).stdout


# ---- cache ------------------------------------------------------------------------------


def _library_fingerprint() -> str:
    digest = hashlib.sha256()
    root = library_include_dir()
    for path in sorted(root.rglob("*.cuh")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _cutlass_fingerprint(environment: Environment) -> str:
    version_header = cutlass_include_dir(environment) / "cutlass" / "version.h"
    return hashlib.sha256(version_header.read_bytes()).hexdigest() if version_header.is_file() else "unknown"


def cache_key(source: str, options: CompileOptions, environment: Environment | None = None) -> str:
    """Content hash of everything that determines the cubin."""
    environment = environment or read_environment()
    options = options.resolved()
    # The command with placeholder paths: scratch directories must not change the key.
    command = nvcc_command(Path(SOURCE_NAME), Path(STAGE_FILES[Stage.CUBIN]), options, environment)
    digest = hashlib.sha256()
    for part in (
        source,
        json.dumps(command[1:]),
        tool_version(find_nvcc(environment)),
        _library_fingerprint(),
        _cutlass_fingerprint(environment),
        miscompile.CHECKS,
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _write_atomically(path: Path, data: str) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    scratch.write_text(data)
    os.replace(scratch, path)


ELF_MAGIC = b"\x7fELF"
ELF_HEADER_BYTES = 64  # an ELF64 header: the least a cubin holds


def _entry_problem(entry: Path) -> tuple[str, dict | None]:
    """What is wrong with the cache entry ``entry`` ('' and its metadata if it is usable)."""
    cubin = entry / STAGE_FILES[Stage.CUBIN]
    try:
        metadata = json.loads((entry / "metadata.json").read_text())
        size = cubin.stat().st_size
        with cubin.open("rb") as stream:
            magic = stream.read(len(ELF_MAGIC))
    except (OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}", None
    if not isinstance(metadata, dict):
        return f"metadata.json holds a JSON {type(metadata).__name__}, not an object", None
    command = metadata.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        return "metadata.json has no build command", None
    if magic != ELF_MAGIC or size < ELF_HEADER_BYTES:
        return f"{cubin.name} is not an ELF file ({size} bytes)", None
    recorded = metadata.get("cubin_bytes")
    if recorded is not None and recorded != size:
        return f"{cubin.name} has {size} bytes, the build wrote {recorded}", None
    return "", metadata


def _complete_entry(entry: Path, dumps: frozenset[Stage], environment: Environment) -> bool:
    """Add cheap missing dumps (SASS) to a cached entry; False if a rebuild is needed (PTX)."""
    if not (entry / STAGE_FILES[Stage.CUBIN]).is_file():
        return False
    if Stage.PTX in dumps and not (entry / STAGE_FILES[Stage.PTX]).is_file():
        return False
    if Stage.SASS in dumps and not (entry / STAGE_FILES[Stage.SASS]).is_file():
        sass = cubin_to_sass(entry / STAGE_FILES[Stage.CUBIN], environment)
        _write_atomically(entry / STAGE_FILES[Stage.SASS], sass)
    return True


def compile_source(
    source: str,
    options: CompileOptions | None = None,
    dumps: Iterable[Stage] = (),
    cache_dir: Path | None = None,
) -> CompileResult:
    """Build CUDA source into a cubin (and the requested dumps), through the cache."""
    environment = read_environment()
    options = (options or CompileOptions()).resolved()
    dumps = frozenset(dumps)
    root = Path(cache_dir) if cache_dir is not None else environment.cache_dir
    key = cache_key(source, options, environment)
    entry = root / key[:2] / key
    cached = _cached(key, entry, dumps, environment)
    if cached is not None:
        return cached
    (root / "locks").mkdir(parents=True, exist_ok=True)
    # One build of a key at a time, across threads and processes (parallel test or search workers
    # asking for the same kernels): the others wait and take the published entry.
    with filelock.FileLock(root / "locks" / f"{key}.lock"):
        cached = _cached(key, entry, dumps, environment)
        return cached if cached is not None else _build(source, options, dumps, environment, root, key)


def _cached(key: str, entry: Path, dumps: frozenset[Stage], environment: Environment) -> CompileResult | None:
    """The cache entry of ``key`` when it is whole and has ``dumps``; a damaged one is removed."""
    if not entry.is_dir():
        return None
    problem, metadata = _entry_problem(entry)
    if problem:  # a truncated or damaged entry is rebuilt, never returned
        warn_corrupt(entry, f"a compiled kernel that cannot be used ({problem})")
        shutil.rmtree(entry, ignore_errors=True)
    elif metadata is not None and _complete_entry(entry, dumps, environment):
        logger.debug("cache hit %s", key)
        return CompileResult(key, entry, tuple(metadata["command"]), 0.0, from_cache=True)
    return None


def _build(source: str, options: CompileOptions, dumps: frozenset[Stage], environment: Environment,
           root: Path, key: str) -> CompileResult:
    entry = root / key[:2] / key
    (root / "scratch").mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=key[:12] + "-", dir=root / "scratch"))
    try:
        source_path = scratch / SOURCE_NAME
        source_path.write_text(source)
        keep_ptx = Stage.PTX in dumps
        command, seconds, sass, fallback = _build_runnable(source_path, options, environment, keep_ptx)
        if Stage.SASS in dumps:
            (scratch / STAGE_FILES[Stage.SASS]).write_text(sass)
        assert options.target is not None
        metadata = {"command": command, "seconds": seconds, "target": options.target.arch,
                    "cubin_bytes": (scratch / STAGE_FILES[Stage.CUBIN]).stat().st_size}
        if fallback:
            metadata["fallback_defines"] = dict(fallback)
        (scratch / "metadata.json").write_text(json.dumps(metadata, indent=2))
        logger.info("compiled %s for %s in %.1f s", key[:12], metadata["target"], seconds)
        _publish(scratch, entry)
    except CompileError as error:
        raise error.moved_to(_keep_failed_source(scratch, root, key)) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return CompileResult(key, entry, tuple(command), seconds, from_cache=False)


def _build_runnable(
    source_path: Path, options: CompileOptions, environment: Environment, keep_ptx: bool
) -> tuple[list[str], float, str, tuple[tuple[str, str], ...]]:
    """SOURCE → CUBIN whose SASS the GPU can run (:mod:`mirage.codegen.miscompile`): a cubin with an
    instruction ptxas should not have emitted is rebuilt once under the fallback defines.

    Returns (command, seconds, SASS, the fallback defines used or ``()``).
    """
    command, seconds = source_to_cubin(source_path, options, environment, keep_ptx)
    cubin = source_path.parent / STAGE_FILES[Stage.CUBIN]
    sass = cubin_to_sass(cubin, environment)
    found = miscompile.faulting_instructions(sass)
    if not found:
        return command, seconds, sass, ()
    names = {name for name, _ in miscompile.FALLBACK_DEFINES}
    defines = tuple(d for d in options.defines if d[0] not in names) + miscompile.FALLBACK_DEFINES
    if set(defines) == set(options.defines):
        raise CompileError(Stage.SASS, command, miscompile.describe(found), 0, source_path.parent)
    logger.info("%s; rebuilding with %s", miscompile.describe(found).split(";")[0], defines[-1])
    cubin.unlink()
    command, more = source_to_cubin(source_path, dataclasses.replace(options, defines=defines), environment,
                                    keep_ptx)
    sass = cubin_to_sass(cubin, environment)
    found = miscompile.faulting_instructions(sass)
    if found:
        raise CompileError(Stage.SASS, command, miscompile.describe(found) + f"\n(also with {defines[-1]}: "
                           "if the source sets that define itself, remove it; else report the nvcc "
                           "version and this source)", 0, source_path.parent)
    return command, seconds + more, sass, miscompile.FALLBACK_DEFINES


def _keep_failed_source(scratch: Path, root: Path, key: str) -> Path:
    """Keep a failed build's source (only) under ``failed/``, outside the cache, to reproduce it."""
    kept = root / "failed" / key
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    shutil.copyfile(scratch / SOURCE_NAME, kept / SOURCE_NAME)
    return kept


def _publish(scratch: Path, entry: Path) -> None:
    """Move a finished build into the cache; merge files into an entry another build published."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(scratch, entry)
        return
    except OSError:
        if not entry.is_dir():
            raise
    for path in scratch.iterdir():
        if not (entry / path.name).exists():
            os.replace(path, entry / path.name)


def compile_sources(
    sources: Sequence[str],
    options: CompileOptions | None = None,
    dumps: Iterable[Stage] = (),
    cache_dir: Path | None = None,
    max_workers: int | None = None,
    return_exceptions: bool = False,
) -> list[CompileResult | CompileError]:
    """Build several sources in parallel (one nvcc process per worker), results in input order.

    With ``return_exceptions`` a failed build yields its :class:`CompileError` in place of a
    result; otherwise the first failure (in input order) is raised after all builds finish.
    """
    options = (options or CompileOptions()).resolved()
    dumps = frozenset(dumps)
    workers = max_workers or os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(compile_source, source, options, dumps, cache_dir) for source in sources]
        outcomes: list[CompileResult | CompileError] = []
        for future in futures:
            try:
                outcomes.append(future.result())
            except CompileError as error:
                outcomes.append(error)
    if not return_exceptions:
        for outcome in outcomes:
            if isinstance(outcome, CompileError):
                raise outcome
    return outcomes
