"""Code generation: lowering to a kernel program, Jinja templates, the CUDA device library,
compilation and its cache, loading and launching, GPU checks and profiling.

* :func:`generate_cuda_program` — a µGraph's CUDA source and launch description;
* :func:`compile_program` — the same, compiled, as a :class:`Program` callable on torch tensors;
* :func:`check_on_gpu` — run a µGraph's kernels and compare with the float64 reference.

Names are imported on first use, so ``import mirage.codegen`` loads neither jinja2 nor CuPy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CudaProgram": "mirage.codegen.lower_program",
    "KernelLaunch": "mirage.codegen.lower_program",
    "generate_cuda_program": "mirage.codegen.lower_program",
    "LoweringError": "mirage.codegen.lower_ops",
    "Program": "mirage.codegen.runtime",
    "LaunchError": "mirage.codegen.runtime",
    "build": "mirage.codegen.runtime",
    "build_many": "mirage.codegen.runtime",
    "compile_program": "mirage.codegen.runtime",
    "compile_graph": "mirage.codegen.runtime",
    "compile_chosen": "mirage.codegen.runtime",
    "BuildChoice": "mirage.codegen.runtime",
    "CompileError": "mirage.codegen.compile",
    "CompileOptions": "mirage.codegen.compile",
    "check_on_gpu": "mirage.codegen.gpu_check",
    "CheckResult": "mirage.codegen.gpu_check",
    "random_graph": "mirage.codegen.random_graphs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mirage.codegen' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
