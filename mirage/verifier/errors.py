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
