"""Errors of the optimizer.  Graph-shape problems reuse :mod:`mirage.errors` (for instance
:class:`~mirage.errors.SharedMemoryError` when a memory plan does not fit the target)."""

from __future__ import annotations

from mirage.errors import MirageError


class OptimizerError(MirageError):
    """The optimizer cannot prepare a graph for code generation."""


class LayoutError(OptimizerError):
    """The layout model has no solution (contradictory constraints) or the solver gave up."""


class RegisterBudgetError(OptimizerError):
    """A register-resident tensor was requested that does not fit the per-thread register budget."""
