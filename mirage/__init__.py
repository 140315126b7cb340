"""mirage: a multi-level superoptimizer for tensor programs on NVIDIA GPUs.

Importing mirage has no side effects and loads no native library; GPU pieces load on first use.
"""

from mirage.errors import MirageError
from mirage.mugraph import (
    DType,
    KernelGraph,
    as_graph,
    bfloat16,
    check,
    float16,
    float32,
    float64,
    interpret,
    load,
    new_kernel_graph,
    new_threadblock_graph,
    parse,
)

__version__ = "0.1.0"


def superoptimize(graph, example_inputs=None, **options):
    """Search, verify and compile the fastest equivalent of ``graph`` (see the user guide)."""
    from mirage.api import superoptimize as _superoptimize

    return _superoptimize(graph, example_inputs, **options)


def generate_cuda_program(graph, target_cc: int | None = 90, **options):
    """The CUDA source of ``graph`` and how to launch each kernel (see mirage.codegen)."""
    from mirage.codegen import generate_cuda_program as _generate

    return _generate(graph, target_cc, **options)


def compile_program(graph, target=None, **options):
    """``graph`` optimized, generated and compiled: a program callable on CUDA torch tensors."""
    from mirage.codegen import compile_program as _compile

    return _compile(graph, target, **options)


def verify(reference, candidate, **options):
    """Prove ``candidate`` computes the same function as ``reference`` (finite-field random tests)."""
    from mirage.verifier import verify as _verify

    return _verify(as_graph(reference), as_graph(candidate), **options)


__all__ = [
    "DType", "KernelGraph", "MirageError", "as_graph", "bfloat16", "check", "compile_program", "float16",
    "float32", "generate_cuda_program",
    "float64", "interpret", "load", "new_kernel_graph", "new_threadblock_graph", "parse",
    "superoptimize", "verify",
]
