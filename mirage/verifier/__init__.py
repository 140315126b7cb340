"""Finite-field equivalence verification of µGraphs, and the floating-point check.

``verify(reference, candidate, delta=1e-9)`` runs finite-field random tests (as many as ``delta``
needs) and reports the error bound it proved; ``float_check`` compares the graphs in floating
point; ``classify`` says whether a graph is in the LAX fragment and which guarantee applies.
"""

from mirage.verifier.classify import Guarantee, LaxInfo, classify
from mirage.verifier.errors import (
    ExpNestingError,
    FieldConstantError,
    GraphMismatchError,
    NotVerifiableError,
    OrderedOpError,
    VerifierError,
)
from mirage.verifier.field import DEFAULT_FIELDS, FieldAlgebra, FieldArray, FieldPair
from mirage.verifier.floating_point import FloatChecker, float_check
from mirage.verifier.result import VerificationResult
from mirage.verifier.verify import Verifier, verify

__all__ = [
    "DEFAULT_FIELDS", "ExpNestingError", "FieldAlgebra", "FieldArray", "FieldConstantError", "FieldPair",
    "FloatChecker",
    "GraphMismatchError", "Guarantee", "LaxInfo", "NotVerifiableError", "OrderedOpError",
    "VerificationResult", "Verifier", "VerifierError", "classify", "float_check", "verify",
]
