"""Probabilistic equivalence verification by finite-field random tests (mirage-notes §3).

Each test draws fresh uniform inputs in Z_p × Z_q, a fresh ω of order q and a fresh key for the
uninterpreted functions, runs both graphs through :class:`~mirage.verifier.field.FieldAlgebra`, and
compares every output element.  Equivalent graphs always pass.  The number of tests comes from the
target δ: the per-test bound ε of :mod:`mirage.verifier.bounds` (Theorem 2 of the notes) gives
``t = ⌈ln(δ / m) / ln ε⌉``, with m the number of output matchings tried.

>>> import mirage as mi
>>> def graph(doubled):
...     g = mi.new_kernel_graph()
...     x = g.new_input(dims=(4, 8), dtype=mi.float16)
...     w = g.new_input(dims=(8, 2), dtype=mi.float16)
...     y = g.matmul(x, w)
...     g.mark_output(g.mul_scalar(y, 2.0) if doubled else g.add(y, y))
...     return g.freeze()
>>> result = verify(graph(False), graph(True))
>>> result.equivalent, result.guarantee.value, result.error_bound <= 1e-9
(True, 'theorem', True)
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np

from mirage.errors import OverlapError
from mirage.mugraph.algebra import NotInterpretable
from mirage.mugraph.builder import as_graph
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.interpret import Interpreter
from mirage.verifier.bounds import (
    Application,
    Division,
    Summary,
    SummaryAlgebra,
    TestBound,
    per_test_bound,
    tests_needed,
)
from mirage.verifier.classify import Guarantee, classify
from mirage.verifier.errors import NotVerifiableError, VerifierOptionError, check_options
from mirage.verifier.field import DEFAULT_FIELDS, FieldAlgebra, FieldArray, FieldPair
from mirage.verifier.result import (
    VerificationResult,
    check_same_inputs,
    compatible_pairs,
    count_matchings,
    first_matching,
)

logger = logging.getLogger(__name__)

INPUT_CACHE_BYTES = 256 * 2**20  # keep a test's random inputs in memory below this size


@dataclass(frozen=True, eq=False)
class _Test:
    """One random test: its seed (inputs, ω, hash key) and the reference's fingerprints."""

    input_seed: np.random.SeedSequence
    omega_exponent: int
    hash_key: int
    inputs: list[FieldArray] | None  # None: regenerate from the seed (too large to keep)
    reference_outputs: list[FieldArray]


@dataclass(frozen=True, eq=False)
class _ReferenceSummary:
    outputs: list[Summary]
    applications: list[Application]
    divisions: list[Division]
    next_id: int


class Verifier:
    """Compares candidates with one reference graph; the reference's work per test is done once.

    Every candidate sees the same random tests (drawn when first needed), which the candidates
    cannot depend on, so the error bound holds for each candidate.  Use :func:`verify` for a
    one-off comparison with fresh randomness.
    """

    def __init__(self, reference, delta: float = 1e-9, seed: int | None = None,
                 fields: FieldPair = DEFAULT_FIELDS, max_tests: int = 64, heuristic_tests: int = 4,
                 input_cache_bytes: int = INPUT_CACHE_BYTES) -> None:
        check_options(delta=delta, seed=seed, max_tests=max_tests, heuristic_tests=heuristic_tests)
        if not isinstance(fields, FieldPair):
            raise VerifierOptionError(f"fields must be a mirage.verifier.FieldPair (such as DEFAULT_FIELDS), "
                                      f"got {fields!r}")
        self.reference = as_graph(reference)
        self.delta, self.fields = delta, fields
        self.max_tests, self.heuristic_tests = max_tests, heuristic_tests
        self.input_cache_bytes = input_cache_bytes
        self.info = _require_fingerprintable(self.reference, "reference")
        self._seeds = np.random.SeedSequence(seed)
        self._tests: list[_Test] = []
        self._summary = self._summarize_reference()

    # ---- public ----------------------------------------------------------------------------------

    def verify(self, candidate) -> VerificationResult:
        start = time.perf_counter()
        candidate = as_graph(candidate)
        check_same_inputs(self.reference, candidate)
        candidate_info = _require_fingerprintable(candidate, "candidate")
        guarantee = _weaker(self.info.guarantee, candidate_info.guarantee)
        compatible = compatible_pairs(self.reference, candidate)
        if len(candidate.outputs) != len(self.reference.outputs) or first_matching(compatible) is None:
            return VerificationResult(False, None, 0, 0.0, guarantee, time.perf_counter() - start,
                                      reason=_shape_reason(self.reference, candidate))
        alive = [row[:] for row in compatible]
        try:
            # the first test runs before the bound is computed: most wrong candidates stop here
            if not self._run_test(candidate, 0, alive):
                return self._rejected(0, guarantee, None, start)
            bound = self.bound(candidate)
            count = count_matchings(compatible)
            tests = tests_needed(bound.epsilon, self.delta, count)
            if tests is None or tests > self.max_tests:
                guarantee, tests = Guarantee.HEURISTIC, self.heuristic_tests
            for index in range(1, tests):
                if not self._run_test(candidate, index, alive):
                    return self._rejected(index, guarantee, bound.epsilon, start)
        except OverlapError as error:  # not a function of each entry of an uneven axis alone
            return VerificationResult(False, None, 0, 0.0, guarantee, time.perf_counter() - start,
                                      reason=str(error))
        error_bound = 1.0 if guarantee is Guarantee.HEURISTIC else min(1.0, count * bound.epsilon**tests)
        elapsed = time.perf_counter() - start
        logger.debug("verified %s in %d tests (%.3f s, bound %.2g)", candidate.name, tests, elapsed,
                     error_bound)
        return VerificationResult(True, first_matching(alive), tests, error_bound, guarantee, elapsed,
                                  epsilon_per_test=bound.epsilon)

    def _run_test(self, candidate: KernelGraph, index: int, alive: list[list[bool]]) -> bool:
        """Run test ``index``; keep in ``alive`` the output pairs that still agree; any matching left?"""
        outputs = self.fingerprints(candidate, index)
        reference_outputs = self._test(index).reference_outputs
        for i, row in enumerate(alive):
            for j, ok in enumerate(row):
                if ok:
                    row[j] = reference_outputs[i].equals(outputs[j])
        return first_matching(alive) is not None

    @staticmethod
    def _rejected(index: int, guarantee: Guarantee, epsilon: float | None,
                  start: float) -> VerificationResult:
        return VerificationResult(False, None, index + 1, 0.0, guarantee, time.perf_counter() - start,
                                  reason=f"outputs differ on random test {index + 1}",
                                  epsilon_per_test=epsilon)

    # ---- the tests -------------------------------------------------------------------------------

    def _test(self, index: int) -> _Test:
        while len(self._tests) <= index:
            parameter_seed, input_seed = self._seeds.spawn(2)
            rng = np.random.default_rng(parameter_seed)
            omega_exponent, key = int(rng.integers(1, self.fields.q)), int(rng.integers(0, 2**63))
            inputs = self._inputs(input_seed)
            algebra = FieldAlgebra(self.fields, omega_exponent, key)
            outputs = _run(algebra, self.reference, inputs)
            size = sum(x.p.nbytes * 4 for x in inputs)
            kept = inputs if size <= self.input_cache_bytes else None
            self._tests.append(_Test(input_seed, omega_exponent, key, kept, outputs))
        return self._tests[index]

    def _inputs(self, seed: np.random.SeedSequence) -> list[FieldArray]:
        rng = np.random.default_rng(seed)  # the same stream every time: a Generator copies the state
        return [self.fields.random(t.shape, rng) for t in self.reference.input_types]

    def reference_fingerprints(self, index: int) -> list[FieldArray]:
        """The reference's outputs in random test ``index`` (drawn and computed on first use)."""
        return self._test(index).reference_outputs

    def fingerprints(self, candidate: KernelGraph, index: int) -> list[FieldArray]:
        """A graph's outputs in random test ``index`` (same inputs, ω and hash key as the reference)."""
        test = self._test(index)
        inputs = test.inputs if test.inputs is not None else self._inputs(test.input_seed)
        return _run(FieldAlgebra(self.fields, test.omega_exponent, test.hash_key), candidate, inputs)

    # ---- the bound -------------------------------------------------------------------------------

    def _summarize_reference(self) -> _ReferenceSummary:
        algebra = SummaryAlgebra()
        outputs = _run(algebra, self.reference, [algebra.input(t.shape) for t in self.reference.input_types])
        return _ReferenceSummary(outputs, algebra.applications, algebra.divisions, next(algebra.counter))

    def bound(self, candidate) -> TestBound:
        """The per-test bound ε for ``candidate`` (with its d and k), from the summary analysis."""
        candidate = as_graph(candidate)
        compatible = compatible_pairs(self.reference, candidate)
        reference = self._summary
        algebra = SummaryAlgebra(counter=itertools.count(reference.next_id))
        outputs = _run(algebra, candidate, [algebra.input(t.shape) for t in candidate.input_types])
        pairs = [(reference.outputs[i], outputs[j]) for i, row in enumerate(compatible)
                 for j, ok in enumerate(row) if ok]
        return per_test_bound(pairs, reference.applications + algebra.applications,
                              reference.divisions + algebra.divisions, self.fields)


def verify(reference, candidate, delta: float = 1e-9, seed: int | None = None,
           fields: FieldPair = DEFAULT_FIELDS, max_tests: int = 64,
           heuristic_tests: int = 4) -> VerificationResult:
    """Decide whether ``candidate`` computes the same function as ``reference``.

    Runs as many finite-field random tests as the error target ``delta`` needs (each with fresh
    inputs, ω and hash key) and reports the bound it reached.  Raises ``NotVerifiableError`` for
    graphs the fingerprint cannot interpret (order-based ops, two exps on a path): compare those
    with :func:`mirage.verifier.float_check`.
    """
    return Verifier(reference, delta, seed, fields, max_tests, heuristic_tests).verify(candidate)


def _run(algebra, graph: KernelGraph, inputs) -> list:
    try:
        return Interpreter(algebra).run(graph, inputs)
    except NotInterpretable as error:
        name = graph.name or "(unnamed)"
        raise NotVerifiableError(f"graph {name} cannot be fingerprinted: {error}") from error


def _require_fingerprintable(graph: KernelGraph, role: str):
    info = classify(graph)
    if not info.fingerprintable:
        raise NotVerifiableError(f"the {role} graph {graph.name or '(unnamed)'} is outside what finite-field "
                                 f"testing covers ({info.reason}); compare it with float_check")
    return info


_STRENGTH = [Guarantee.THEOREM, Guarantee.UNINTERPRETED, Guarantee.HEURISTIC, Guarantee.FLOAT, Guarantee.NONE]


def _weaker(a: Guarantee, b: Guarantee) -> Guarantee:
    return max(a, b, key=_STRENGTH.index)


def _shape_reason(reference: KernelGraph, candidate: KernelGraph) -> str:
    ref = [t.shape for t in reference.output_types]
    cand = [t.shape for t in candidate.output_types]
    return f"output shapes differ: reference {ref}, candidate {cand}"
