"""Shared by the device-library tests: declarations that must not compile, and the messages the
library's static_asserts give for them."""

from __future__ import annotations

import pytest

from mirage.codegen.compile import CompileError, CompileOptions, compile_source


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
