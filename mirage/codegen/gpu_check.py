"""The GPU check: run a µGraph's generated kernels and compare with the float64 reference.

``check_on_gpu(graph)`` compiles the graph (or takes a compiled :class:`~mirage.codegen.runtime.Program`),
draws inputs from N(0, scale²) in the graph's dtypes, runs the program with every kernel output
poisoned (NaN) beforehand, so that an element no block writes shows, and compares each output with
``mi.interpret`` of the graph in float64 on the CPU (fed the same, rounded, inputs).

The error of an output is normwise: ``max|gpu − reference| / max|reference|``; it must stay below
the tolerance of the output's dtype (:data:`TOLERANCES`), and every element must be finite where the
reference is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mirage.mugraph.dtypes import DType
from mirage.mugraph.graph import KernelGraph

log = logging.getLogger(__name__)

# normwise relative error allowed per output dtype (fp32 matmuls run on TF32 tensor cores)
TOLERANCES: dict[DType, float] = {
    DType.FLOAT16: 1e-2,
    DType.BFLOAT16: 3e-2,
    DType.FLOAT32: 5e-3,
    DType.FLOAT64: 1e-9,
}


@dataclass(frozen=True)
class OutputCheck:
    index: int
    shape: tuple[int, ...]
    dtype: str
    relative_error: float  # max|gpu − ref| / max|ref|
    max_abs_error: float
    reference_max: float
    unwritten: int  # NaN or inf elements of the GPU result where the reference is finite
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.relative_error < self.tolerance

    def as_dict(self) -> dict:
        return {"index": self.index, "shape": list(self.shape), "dtype": self.dtype,
                "relative_error": self.relative_error, "max_abs_error": self.max_abs_error,
                "reference_max": self.reference_max, "unwritten": self.unwritten,
                "tolerance": self.tolerance, "passed": self.passed}


@dataclass(frozen=True)
class CheckResult:
    name: str
    outputs: tuple[OutputCheck, ...]
    kernels: int
    run_seconds: float  # first run, loading included
    reference_seconds: float

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def worst_error(self) -> float:
        return max((o.relative_error for o in self.outputs), default=0.0)

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "worst_error": self.worst_error,
                "kernels": self.kernels, "run_seconds": self.run_seconds,
                "reference_seconds": self.reference_seconds, "outputs": [o.as_dict() for o in self.outputs]}


def random_inputs(graph: KernelGraph, seed: int = 0, scale: float = 1.0, device: str = "cuda") -> list:
    """Inputs of ``graph`` drawn from N(0, scale²), rounded to each input's dtype."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(t.shape, generator=generator, dtype=torch.float64) * scale).to(t.dtype.torch()).to(device)
            for t in graph.input_types]


def compare(gpu_outputs: Sequence, reference_outputs: Sequence[np.ndarray], graph: KernelGraph,
            tolerances: dict[DType, float] | None = None) -> tuple[OutputCheck, ...]:
    tolerances = tolerances or TOLERANCES
    checks = []
    for k, (got, ref, t) in enumerate(zip(gpu_outputs, reference_outputs, graph.output_types, strict=True)):
        got = got.detach().double().cpu().numpy()
        ref = np.asarray(ref, dtype=np.float64)
        finite = np.isfinite(ref)
        bad = int(np.count_nonzero(~np.isfinite(got) & finite))
        diff = np.where(finite & np.isfinite(got), np.abs(got - ref), 0.0)
        reference_max = float(np.max(np.abs(ref[finite]), initial=0.0))
        max_abs = float(np.max(diff, initial=0.0))
        relative = max_abs / max(reference_max, 1e-30) if max_abs else 0.0
        checks.append(OutputCheck(k, t.shape, t.dtype.value, relative, max_abs, reference_max, bad,
                                  tolerances[t.dtype]))
    return tuple(checks)


def check_on_gpu(graph, program=None, *, inputs: Sequence | None = None, seed: int = 0, scale: float = 1.0,
                 target=None, tolerances: dict[DType, float] | None = None, name: str = "") -> CheckResult:
    """Run ``graph``'s kernels on the GPU and compare with the float64 reference (module docstring).

    ``program``: an already compiled :class:`~mirage.codegen.runtime.Program` of ``graph`` (else it is
    compiled for ``target``, default the current GPU).
    """
    import torch

    from mirage.codegen.runtime import compile_program
    from mirage.mugraph.builder import as_graph
    from mirage.mugraph.interpret import interpret

    graph = as_graph(graph)
    if program is None:
        program = compile_program(graph, target)
    if inputs is None:
        inputs = random_inputs(graph, seed, scale)
    start = time.perf_counter()
    outputs = program.with_poison().launch(list(inputs))
    torch.cuda.synchronize()
    run_seconds = time.perf_counter() - start
    start = time.perf_counter()
    reference = interpret(graph, [x.detach().cpu() for x in inputs], dtype=np.float64)
    reference_seconds = time.perf_counter() - start
    result = CheckResult(name or graph.name or "graph", compare(outputs, reference, graph, tolerances),
                         len(program.cuda.kernels), run_seconds, reference_seconds)
    log.info("%s: %s (worst relative error %.2e)", result.name, "pass" if result.passed else "FAIL",
             result.worst_error)
    return result
