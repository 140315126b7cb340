"""The result record shared by the finite-field verifier and the floating-point check, and the
matching of candidate outputs to reference outputs under permutations."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from mirage.mugraph.graph import KernelGraph
from mirage.verifier.classify import Guarantee
from mirage.verifier.errors import GraphMismatchError


@dataclass(frozen=True)
class VerificationResult:
    """The outcome of comparing a candidate graph with a reference graph.

    ``output_permutation[i]`` is the candidate output that matched reference output ``i``.
    ``error_bound`` bounds the probability that a non-equivalent candidate is accepted: it is 1.0
    when no bound below 1 is proven (``Guarantee.HEURISTIC``) and None for the float check.
    """

    equivalent: bool
    output_permutation: tuple[int, ...] | None
    tests_run: int
    error_bound: float | None
    guarantee: Guarantee
    seconds: float
    reason: str = ""
    epsilon_per_test: float | None = None  # the per-test bound the number of tests came from
    max_error: float | None = None  # float check: the largest difference, relative to the output scale

    def __bool__(self) -> bool:
        return self.equivalent


def check_same_inputs(reference: KernelGraph, candidate: KernelGraph) -> None:
    ref = [t.shape for t in reference.input_types]
    cand = [t.shape for t in candidate.input_types]
    if ref != cand:
        raise GraphMismatchError(f"the graphs take different inputs: the reference takes {ref}, the "
                                 f"candidate {cand}; both must take the same tensors in the same order")


def compatible_pairs(reference: KernelGraph, candidate: KernelGraph) -> list[list[bool]]:
    """compatible[i][j]: candidate output j has the shape of reference output i."""
    return [[r.shape == c.shape for c in candidate.output_types] for r in reference.output_types]


def matchings(alive: list[list[bool]]) -> Iterator[tuple[int, ...]]:
    """Every assignment of distinct candidate outputs to reference outputs allowed by ``alive``."""

    def extend(i: int, used: frozenset[int], chosen: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if i == len(alive):
            yield chosen
            return
        for j, ok in enumerate(alive[i]):
            if ok and j not in used:
                yield from extend(i + 1, used | {j}, chosen + (j,))

    yield from extend(0, frozenset(), ())


def count_matchings(alive: list[list[bool]], limit: int = 10**6) -> int:
    count = 0
    for _ in matchings(alive):
        count += 1
        if count >= limit:
            break
    return count


def first_matching(alive: list[list[bool]]) -> tuple[int, ...] | None:
    return next(matchings(alive), None)
