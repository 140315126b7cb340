"""Errors raised by the verifier (all subclasses of :class:`mirage.errors.MirageError`)."""

from __future__ import annotations

from mirage.errors import MirageError
from mirage.mugraph.algebra import NotInterpretable


class VerifierError(MirageError):
    """Base class of the verifier's errors."""


class FieldConstantError(VerifierError):
    """A constant has no image in the field pair (its denominator is a multiple of p or q)."""


class ExpNestingError(VerifierError, NotInterpretable):
    """A value that already went through ``exp`` reaches a second ``exp``.

    The fingerprint keeps the q-part of a value only until its first exponentiation (the exponent
    lives in Z_q, the result in Z_p), so the LAX fragment allows one ``exp`` on every input→output
    path.  Graphs with nested exponentials can only be compared with :func:`float_check`.
    """


class OrderedOpError(VerifierError, NotInterpretable):
    """An op needs an order (max, relu's max, clamp bounds): finite fields have none."""


class NotVerifiableError(VerifierError):
    """The graphs cannot be compared by finite-field random testing (use ``float_check``)."""


class GraphMismatchError(VerifierError):
    """The two graphs do not take the same inputs (count, shapes) and cannot be compared."""


class VerifierOptionError(VerifierError, ValueError):
    """An argument of the verifier or the float check has a value it cannot use (δ outside (0, 1), a
    negative seed, no trials, ...)."""


def check_options(**values) -> None:
    """Raise :class:`VerifierOptionError` for the first argument out of its range.  Recognized names:
    ``delta`` (a probability in (0, 1)), ``seed`` (None or an int ≥ 0), ``max_tests``,
    ``heuristic_tests`` and ``trials`` (ints ≥ 1), ``rtol`` and ``atol`` (None or a finite number ≥ 0)."""
    import math
    import numbers

    def integer(value) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    def real(value) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)

    for name, value in values.items():
        if name == "delta" and not (real(value) and 0.0 < value < 1.0):
            raise VerifierOptionError(f"delta must be a probability strictly between 0 and 1 (the error "
                                      f"target, such as 1e-9), got {value!r}")
        if name == "seed" and value is not None and not (integer(value) and value >= 0):
            raise VerifierOptionError(f"seed must be None (fresh randomness) or an integer ≥ 0, got "
                                      f"{value!r}")
        if name in ("max_tests", "heuristic_tests", "trials") and not (integer(value) and value >= 1):
            raise VerifierOptionError(f"{name} must be an integer ≥ 1, got {value!r}")
        if name in ("rtol", "atol") and value is not None \
                and not (real(value) and math.isfinite(value) and value >= 0):
            raise VerifierOptionError(f"{name} must be None (the output dtype's tolerance) or a finite "
                                      f"number ≥ 0, got {value!r}")
