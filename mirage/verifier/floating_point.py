"""The floating-point check: both graphs through the float interpreter on random inputs.

The check catches what the finite-field test cannot see (numerical instability) and covers graphs
the field cannot interpret (max-based softmax, nested exps).  Both graphs run in float64; two
outputs agree when ``|a - b| ≤ atol · scale + rtol · |b|`` element-wise, with ``scale`` the largest
magnitude of the reference output and the tolerances taken from the output's data type (the
precision the generated kernels will run at).  Later stages pass GPU kernels through ``run``.

>>> import mirage as mi
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(3, 5), dtype=mi.float16)
>>> g.mark_output(g.reduction_max(g.exp(x), 1))
>>> float_check(g.freeze(), g.freeze()).equivalent
True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from mirage.mugraph.builder import as_graph
from mirage.mugraph.dtypes import DType
from mirage.mugraph.interpret import interpret
from mirage.mugraph.ops import Op
from mirage.verifier.classify import ORDER_BASED, Guarantee, classify
from mirage.verifier.errors import check_options
from mirage.verifier.result import (
    VerificationResult,
    check_same_inputs,
    compatible_pairs,
    first_matching,
)

# (rtol, atol as a fraction of the output's scale) per output data type
TOLERANCES: dict[DType, tuple[float, float]] = {
    DType.FLOAT64: (1e-9, 1e-9),
    DType.FLOAT32: (1e-5, 1e-5),
    DType.FLOAT16: (2e-3, 2e-3),
    DType.BFLOAT16: (1.6e-2, 1.6e-2),
}

Runner = Callable[[object, Sequence[np.ndarray]], list[np.ndarray]]

#: Ops whose value turns on the order or the sign of their operands (a max, a ReLU's kink, a clamp's
#: bounds): graphs with them can agree on standard-normal inputs and differ elsewhere (the max of a
#: row of 64 is positive on almost every such input, so ``max`` and ``relu(max)`` agree there).
PIECEWISE = ORDER_BASED | {Op.RELU, Op.CLAMP}


def piecewise(graph) -> bool:
    """Whether ``graph`` (its block graphs included) has an op of :data:`PIECEWISE`."""
    return bool(classify(graph).ops & PIECEWISE)


def edge_inputs(graph, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Two more sets of inputs for graphs with piecewise ops: all negative, and four times as wide."""
    types = as_graph(graph).input_types
    return [[-np.abs(rng.standard_normal(t.shape)) for t in types],
            [4.0 * rng.standard_normal(t.shape) for t in types]]


def scaled_error(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> float:
    """max |got - want| / (atol·scale + rtol·|want|): ≤ 1 means within tolerance (inf if shapes differ)."""
    if got.shape != want.shape:
        return float("inf")
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)):
        return float("inf")
    if not finite.any():
        return 0.0 if np.array_equal(got, want, equal_nan=True) else float("inf")
    scale = float(np.max(np.abs(want[finite]))) or 1.0
    allowed = atol * scale + rtol * np.abs(want[finite])
    return float(np.max(np.abs(got[finite] - want[finite]) / allowed))


class FloatChecker:
    """Compares candidates with one reference in floating point; reference outputs are computed once.

    ``run_reference`` / ``run_candidate`` default to ``mi.interpret`` in float64; a GPU runner for
    generated kernels plugs in here.
    """

    def __init__(self, reference, trials: int = 2, seed: int | None = None, rtol: float | None = None,
                 atol: float | None = None, run_reference: Runner | None = None) -> None:
        check_options(trials=trials, seed=seed, rtol=rtol, atol=atol)
        self.reference = as_graph(reference)
        self.trials = trials
        self.tolerances = [(rtol if rtol is not None else r, atol if atol is not None else a)
                           for r, a in (TOLERANCES[t.dtype] for t in self.reference.output_types)]
        rng = np.random.default_rng(seed)
        self._run = run = run_reference or interpret
        self._inputs = [[rng.standard_normal(t.shape) for t in self.reference.input_types]
                        for _ in range(trials)]
        self._outputs = [[np.asarray(o, dtype=np.float64) for o in run(self.reference, inputs)]
                         for inputs in self._inputs]
        self._rng = rng
        self._piecewise = piecewise(self.reference)
        self._edge: list[tuple[list[np.ndarray], list[np.ndarray]]] | None = None

    def _edge_trials(self) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
        """The trials of :func:`edge_inputs` (drawn once) where the reference's outputs are finite."""
        if self._edge is None:
            self._edge = []
            for inputs in edge_inputs(self.reference, self._rng):
                with np.errstate(all="ignore"):
                    want = [np.asarray(o, dtype=np.float64) for o in self._run(self.reference, inputs)]
                if all(np.isfinite(w).all() for w in want):  # an overflow there tells nothing apart
                    self._edge.append((inputs, want))
        return self._edge

    def check(self, candidate, run_candidate: Runner | None = None) -> VerificationResult:
        """``max_error`` of the result: the worst ratio of difference to allowed difference (≤ 1: equal)."""
        start = time.perf_counter()
        candidate = as_graph(candidate)
        check_same_inputs(self.reference, candidate)
        run_candidate = run_candidate or interpret
        compatible = compatible_pairs(self.reference, candidate)
        alive = [row[:] for row in compatible]
        if len(candidate.outputs) != len(self.reference.outputs) or first_matching(alive) is None:
            return VerificationResult(False, None, 0, None, Guarantee.FLOAT, time.perf_counter() - start,
                                      reason="output shapes differ")
        errors = [[0.0] * len(row) for row in alive]
        trials = list(zip(self._inputs, self._outputs, strict=True))
        if self._piecewise or piecewise(candidate):
            trials += self._edge_trials()
        for trial, (inputs, want) in enumerate(trials):
            got = [np.asarray(o, dtype=np.float64) for o in run_candidate(candidate, inputs)]
            for i, row in enumerate(alive):
                for j, ok in enumerate(row):
                    if ok:
                        errors[i][j] = max(errors[i][j], scaled_error(got[j], want[i], *self.tolerances[i]))
                        row[j] = errors[i][j] <= 1.0
            if first_matching(alive) is None:
                best = [min((e for e, ok in zip(errors[i], compatible[i], strict=True) if ok), default=np.inf)
                        for i in range(len(errors))]
                return VerificationResult(False, None, trial + 1, None, Guarantee.FLOAT,
                                          time.perf_counter() - start, max_error=float(max(best)),
                                          reason=f"outputs differ on trial {trial + 1}")
        matching = first_matching(alive)
        max_error = max((errors[i][j] for i, j in enumerate(matching)), default=0.0) if matching else 0.0
        return VerificationResult(True, matching, len(trials), None, Guarantee.FLOAT,
                                  time.perf_counter() - start, max_error=max_error)


def float_check(reference, candidate, trials: int = 2, seed: int | None = None,
                rtol: float | None = None, atol: float | None = None,
                run_reference: Runner | None = None,
                run_candidate: Runner | None = None) -> VerificationResult:
    """Compare two graphs in floating point on ``trials`` sets of standard-normal inputs, and two more
    (:func:`edge_inputs`) when either graph has a piecewise op (:data:`PIECEWISE`).

    Tolerances default to the reference output's data type (:data:`TOLERANCES`).
    """
    checker = FloatChecker(reference, trials, seed, rtol, atol, run_reference)
    return checker.check(candidate, run_candidate)
