"""Checking complete candidates against the reference, with the reference evaluated once.

A kernel-level state is *complete* when it has as many sink tensors (tensors nobody consumes) as the
reference has outputs, of matching types (mirage-notes §4.2).  The search then asks a
:class:`CandidateChecker` whether the sinks, in some order, compute the reference's outputs.

* :class:`VerifierChecker` (the default) uses ``mirage.verifier.Verifier``: finite-field random
  tests with a reported error bound; the reference's fingerprints are computed once per test.
* :class:`FloatChecker` runs the reference interpreter in float64 on fixed random inputs (seeded)
  with a tight tolerance.  It is *not* a proof of equivalence; it serves references the field
  cannot interpret (order-based ops).  The search result says which checker produced it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from mirage.mugraph.graph import KernelGraph, Ref

logger = logging.getLogger(__name__)


class CandidateChecker(Protocol):
    name: str

    def match(self, candidate: KernelGraph, sinks: Sequence[Ref]) -> tuple[Ref, ...] | None:
        """The sinks in reference-output order if the candidate is equivalent, else ``None``."""


def _orders(reference: KernelGraph, candidate: KernelGraph, sinks: Sequence[Ref]):
    """Orders of the sinks whose types match the reference outputs'."""
    want = [(t.shape, t.dtype) for t in reference.output_types]
    for perm in itertools.permutations(range(len(sinks))):
        got = [candidate.type_of(sinks[i]) for i in perm]
        if all((t.shape, t.dtype) == w for t, w in zip(got, want, strict=True)):
            yield perm


class FloatChecker:
    """float64 interpretation on fixed random inputs (``seed``), error below ``tolerance`` times the
    output's scale.  Not a proof: for references the finite-field verifier cannot interpret."""

    name = "float64 interpreter"

    def __init__(self, reference: KernelGraph, seed: int = 0, tolerance: float = 1e-7) -> None:
        from mirage.mugraph.interpret import interpret
        from mirage.verifier.floating_point import edge_inputs, piecewise

        rng = np.random.default_rng(seed)
        self.reference = reference
        self.tolerance = tolerance
        self.inputs = [rng.standard_normal(t.shape) * 0.5 for t in reference.input_types]
        # graphs with a max, a ReLU or a clamp can agree on these inputs and differ elsewhere
        # (``max`` and ``relu(max)`` over rows of 64): they are also run on all-negative and wide inputs
        self.trials = [(self.inputs, interpret(reference, self.inputs))]
        self.edge_inputs = edge_inputs(reference, rng)
        self._edge_trials: list | None = None  # run on the reference when first needed
        self.piecewise = piecewise(reference)
        self.expected = self.trials[0][1]
        self.scales = [float(np.max(np.abs(e))) or 1.0 for e in self.expected]

    @property
    def edge_trials(self) -> list:
        """The edge inputs with the reference's outputs, where those are finite (an overflow there
        tells nothing apart)."""
        from mirage.mugraph.interpret import interpret

        if self._edge_trials is None:
            self._edge_trials = []
            for inputs in self.edge_inputs:
                with np.errstate(all="ignore"):
                    expected = interpret(self.reference, inputs)
                if all(np.isfinite(e).all() for e in expected):
                    self._edge_trials.append((inputs, expected))
        return self._edge_trials

    def match(self, candidate: KernelGraph, sinks: Sequence[Ref]) -> tuple[Ref, ...] | None:
        from mirage.mugraph.interpret import interpret
        from mirage.verifier.floating_point import piecewise

        orders = list(_orders(self.reference, candidate, sinks))
        if not orders:
            return None
        graph = dataclasses.replace(candidate, outputs=tuple(sinks))
        trials = self.trials + (self.edge_trials if self.piecewise or piecewise(graph) else [])
        try:
            with np.errstate(all="ignore"):
                runs = [(interpret(graph, inputs), expected) for inputs, expected in trials]
        except (ValueError, FloatingPointError, ZeroDivisionError) as error:  # a candidate that cannot run
            logger.debug("candidate failed to interpret: %s", error)
            return None
        for perm in orders:
            if all(_close(values[i], e, self.tolerance) for values, expected in runs
                   for i, e in zip(perm, expected, strict=True)):
                return tuple(sinks[i] for i in perm)
        return None


def _close(value: np.ndarray, expected: np.ndarray, tolerance: float) -> bool:
    scale = float(np.max(np.abs(expected))) or 1.0
    return bool(np.isfinite(value).all() and float(np.max(np.abs(value - expected))) <= tolerance * scale)


class VerifierChecker:
    """Finite-field fingerprints through :class:`mirage.verifier.Verifier`: the reference runs once
    per random test, every candidate sees the same tests, and the error target is ``delta``."""

    name = "finite-field fingerprints"

    def __init__(self, reference: KernelGraph, seed: int = 0, delta: float = 1e-9) -> None:
        from mirage.verifier.slicing import SlicedVerifier

        self.name = f"finite-field fingerprints (delta={delta:g})"
        self.reference, self.seed, self.delta = reference, seed, delta
        # where the reference computes each index of its leading dim alone by one function (its
        # slice, mirage.verifier.slicing), a candidate that does too is equivalent exactly when its
        # slice is: verified there, at 1/B of the work, with the same tests and error target
        self.verifier = SlicedVerifier(reference, delta=delta, seed=seed)

    def __getstate__(self) -> dict:
        # the receiving process draws the same tests again (same seed) instead of unpickling them
        return {"reference": self.reference, "seed": self.seed, "delta": self.delta}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["reference"], state["seed"], state["delta"])  # type: ignore[misc]

    def match(self, candidate: KernelGraph, sinks: Sequence[Ref]) -> tuple[Ref, ...] | None:
        from mirage.verifier import NotVerifiableError

        if next(_orders(self.reference, candidate, sinks), None) is None:
            return None
        candidate = dataclasses.replace(candidate, outputs=tuple(sinks))
        try:
            result = self.verifier.verify(candidate)
        except NotVerifiableError as error:
            logger.debug("candidate cannot be fingerprinted: %s", error)
            return None
        if not result.equivalent or result.output_permutation is None:
            return None
        return tuple(sinks[j] for j in result.output_permutation)


def make_checker(
    reference: KernelGraph, seed: int = 0, prefer: str = "auto", delta: float = 1e-9
) -> CandidateChecker:
    """The finite-field verifier (``"verifier"``), the float64 check (``"float"``), or ``"auto"``: the
    verifier unless the reference cannot be fingerprinted (ops outside its reach), then float64."""
    if prefer not in ("auto", "verifier", "float"):
        from mirage.generator.space import SearchSpaceError

        raise SearchSpaceError(f"checker must be 'auto', 'verifier' or 'float', not {prefer!r}")
    if prefer != "float":
        from mirage.verifier import NotVerifiableError

        try:
            return VerifierChecker(reference, seed, delta)
        except NotVerifiableError as error:
            if prefer == "verifier":
                raise
            logger.warning("the reference cannot be fingerprinted (%s); checking in float64", error)
    return FloatChecker(reference, seed)
