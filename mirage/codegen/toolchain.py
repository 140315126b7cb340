"""The CUDA toolchain: where nvcc, cuobjdump and the headers are.

GPU targets are :class:`mirage.mugraph.target.Target` rows (``TARGETS``, ``detect_target``);
:func:`check_target` refuses the ones the device library cannot be built for.

The code generator's settings are gathered in one place, :func:`read_environment`. The cache
location comes from :mod:`mirage.config` (``MIRAGE_CACHE_DIR``, default ``~/.cache/mirage``;
cubins go to its ``cubins/`` folder; ``MIRAGE_NO_CACHE=1`` builds into a temporary folder that
is removed at exit). The toolchain variables:

``MIRAGE_CUTLASS_INCLUDE``
    a CUTLASS/CuTe ``include`` directory, used instead of the one in the ``nvidia-cutlass`` wheel.
``MIRAGE_NVCC``
    the nvcc executable (default: ``$CUDA_HOME/bin/nvcc``, then ``nvcc`` on ``PATH``).
``CUDA_HOME`` / ``CUDA_PATH``
    the CUDA installation, searched for nvcc and cuobjdump.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib.util
import logging
import os
import shutil
import subprocess
from pathlib import Path

from mirage import config
from mirage.errors import MirageError
from mirage.mugraph.target import Target

logger = logging.getLogger(__name__)


class ToolchainError(MirageError):
    """A CUDA tool or header directory is missing, or the target GPU is not supported."""


# The device library uses cp.async and bf16 mma.sync: Ampere (compute capability 8.0) or newer.
MINIMUM_COMPUTE_CAPABILITY = 80


def check_target(target: Target) -> Target:
    """``target`` if the device library can be built for it, else a ToolchainError."""
    if target.compute_capability < MINIMUM_COMPUTE_CAPABILITY:
        raise ToolchainError(
            f"{target.name} ({target.arch}) is not supported: the device library needs cp.async and bf16 "
            "tensor cores (compute capability 8.0 or newer)"
        )
    return target


@dataclasses.dataclass(frozen=True)
class Environment:
    """Settings taken from environment variables (see the module docstring)."""

    cache_dir: Path  # cubin cache root
    use_cache: bool
    cutlass_include: Path | None
    nvcc: Path | None
    cuda_home: Path | None


@functools.lru_cache(maxsize=1)
def _uncached_root() -> Path:
    """A private build folder for MIRAGE_NO_CACHE runs, removed when the process exits."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="mirage-cubins-"))
    atexit.register(shutil.rmtree, root, True)
    return root


def read_environment() -> Environment:
    """Read every setting the code generator uses (cache settings through :mod:`mirage.config`)."""

    def path_of(name: str) -> Path | None:
        value = os.environ.get(name, "").strip()
        return Path(value).expanduser() if value else None

    settings = config.settings()
    return Environment(
        cache_dir=settings.cache_dir / "cubins" if settings.use_cache else _uncached_root(),
        use_cache=settings.use_cache,
        cutlass_include=path_of("MIRAGE_CUTLASS_INCLUDE"),
        nvcc=path_of("MIRAGE_NVCC"),
        cuda_home=path_of("CUDA_HOME") or path_of("CUDA_PATH"),
    )


def library_include_dir() -> Path:
    """The directory holding ``mirage/*.cuh``, the hand-written device library."""
    return Path(__file__).resolve().parent / "include"


def cutlass_include_dir(environment: Environment | None = None) -> Path:
    """The CUTLASS/CuTe include directory: ``MIRAGE_CUTLASS_INCLUDE`` or the nvidia-cutlass wheel's."""
    environment = environment or read_environment()
    candidates: list[Path] = []
    if environment.cutlass_include is not None:
        candidates.append(environment.cutlass_include)
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is not None and spec.origin is not None:
            candidates.append(Path(spec.origin).parent / "source" / "include")
    for candidate in candidates:
        if (candidate / "cute" / "arch" / "mma_sm80.hpp").is_file():
            return candidate
    where = ", ".join(str(c) for c in candidates) or "no candidate"
    raise ToolchainError(
        f"CuTe headers not found ({where}): install the nvidia-cutlass wheel "
        "(pip install nvidia-cutlass==4.2.0.0) or point MIRAGE_CUTLASS_INCLUDE at a CUTLASS include "
        "directory"
    )


def _find_executable(name: str, directories: list[Path]) -> Path | None:
    for directory in directories:
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def _wheel_bin_dirs() -> list[Path]:
    """bin/ directories of the NVIDIA pip wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    dirs = []
    for root in spec.submodule_search_locations:
        dirs.extend(sorted(Path(root).glob("*/bin")))
    return dirs


def find_nvcc(environment: Environment | None = None) -> Path:
    environment = environment or read_environment()
    if environment.nvcc is not None:
        if not environment.nvcc.is_file():
            raise ToolchainError(
                f"MIRAGE_NVCC={environment.nvcc} does not exist: point it at an nvcc executable"
            )
        return environment.nvcc
    directories = [environment.cuda_home / "bin"] if environment.cuda_home else []
    found = _find_executable("nvcc", directories)
    if found is None:
        raise ToolchainError("nvcc not found: install the CUDA toolkit, or set CUDA_HOME or MIRAGE_NVCC")
    return found


def find_binary_tool(name: str, environment: Environment | None = None) -> Path:
    """``cuobjdump`` or ``nvdisasm``: from the CUDA installation, PATH, or the NVIDIA pip wheels."""
    environment = environment or read_environment()
    directories = [environment.cuda_home / "bin"] if environment.cuda_home else []
    found = _find_executable(name, directories) or _find_executable(name, _wheel_bin_dirs())
    if found is None:
        raise ToolchainError(f"{name} not found: install nvidia-cuda-{name} (pip) or the CUDA toolkit")
    return found


@functools.lru_cache(maxsize=8)
def tool_version(executable: Path) -> str:
    """The tool's ``--version`` text (part of every cache key)."""
    completed = subprocess.run([str(executable), "--version"], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise ToolchainError(f"{executable} --version failed: {completed.stderr.strip()}")
    return completed.stdout.strip()
