"""The committed sm_90a cubins in ``tests/fixtures/sass`` and loaders for them (shared by the tests)."""

from __future__ import annotations

from pathlib import Path

from mirage.sass.elf import Cubin
from mirage.sass.kernel import Kernel, load_kernel

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sass"

# (cubin file, kernel) rows every structural test runs on.  The generated µGraph kernel joins the
# table once the code generator writes one into fixtures/sass/mugraph/ (see the README there).
FIXTURE_KERNELS = [
    ("elementwise.cubin", "scaled_add"),
    ("elementwise.cubin", "scaled_add_x4"),
    ("cute_gemm.cubin", "cute_gemm_tn"),
] + [(f"mugraph/{path.name}", None) for path in sorted((FIXTURES / "mugraph").glob("*.cubin"))]

_kernels: dict[tuple[str, str], Kernel] = {}


def fixture_cubin(name: str) -> Cubin:
    return Cubin.read(FIXTURES / name)


def fixture_kernel(file_name: str, kernel: str | None) -> Kernel:
    cubin = fixture_cubin(file_name)
    name = kernel or cubin.kernel_names()[0]
    if (file_name, name) not in _kernels:
        _kernels[(file_name, name)] = load_kernel(cubin, name)
    return _kernels[(file_name, name)]
