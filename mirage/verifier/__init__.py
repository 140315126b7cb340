"""Finite-field equivalence verification of µGraphs, and the floating-point check."""
