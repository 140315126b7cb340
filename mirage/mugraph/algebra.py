"""The algebra protocol: what an interpretation of the IR must provide.

Every op's semantics is written once, in its registry row, as a *formula* over an algebra ``A``
(``mirage.mugraph.ops``).  Each interpretation supplies its own algebra:

* :class:`FloatAlgebra` (here): numpy arrays, the reference semantics (``mi.interpret``);
* ``mirage.verifier.field.FieldAlgebra``: pairs of residues (x mod p, x mod q), the fingerprint;
* the abstract-expression algebra of ``mirage.generator``: terms, for pruning;
* the CUDA algebra of ``mirage.codegen``: C++ expressions, for thread graphs.

Values carry a shape, and every method broadcasts like numpy.  Structural operations (tiling,
transposes, gathers) go through :meth:`Algebra.structural`, which applies one numpy function to
every component of a value, so the tiling code of the interpreter is shared by all algebras.

>>> import numpy as np
>>> A = FloatAlgebra(np.float64)
>>> float(A.div(A.const(1, like=None), A.const(4, like=None)))
0.25
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

Scalar = int | float | Fraction


class Algebra(Protocol):
    """Operations an interpretation must implement (all element-wise ops broadcast like numpy)."""

    # constants and creation
    def const(self, value: Scalar, like: Any) -> Any: ...
    def zeros(self, shape: tuple[int, ...]) -> Any: ...

    # field operations (the LAX fragment)
    def add(self, x: Any, y: Any) -> Any: ...
    def sub(self, x: Any, y: Any) -> Any: ...
    def mul(self, x: Any, y: Any) -> Any: ...
    def div(self, x: Any, y: Any) -> Any: ...
    def exp(self, x: Any) -> Any: ...
    def sqrt(self, x: Any) -> Any: ...
    def matmul(self, x: Any, y: Any) -> Any: ...
    def sum(self, x: Any, axis: int, keepdims: bool = True) -> Any: ...

    # ops outside the fragment: ``name`` identifies the function, ``reference`` is its float meaning
    def opaque(self, name: str, x: Any, reference: Callable[[np.ndarray], np.ndarray]) -> Any: ...

    # order-based helpers (stable softmax); algebras without an order raise NotInterpretable
    def max(self, x: Any, axis: int, keepdims: bool = True) -> Any: ...
    def maximum(self, x: Any, y: Any) -> Any: ...
    def neg_inf(self, shape: tuple[int, ...]) -> Any: ...

    # shape-only work, applied component-wise
    def structural(self, fn: Callable[..., np.ndarray], *xs: Any) -> Any: ...
    def shape(self, x: Any) -> tuple[int, ...]: ...


class NotInterpretable(Exception):
    """An algebra cannot give a meaning to an op (e.g. ``max`` in a finite field)."""


class FloatAlgebra:
    """Reference semantics in numpy floating point (float32 or float64)."""

    concrete = True  # values, not terms: the interpreter checks what two blocks compute twice

    def __init__(self, dtype: type = np.float64) -> None:
        self.dtype = np.dtype(dtype)

    def const(self, value: Scalar, like: Any) -> Any:
        return self.dtype.type(float(value))

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, dtype=self.dtype)

    # IEEE arithmetic as the device's: inf − inf and 0 · inf are NaN there too, and warn of nothing
    def add(self, x, y):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.add(x, y, dtype=self.dtype)

    def sub(self, x, y):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.subtract(x, y, dtype=self.dtype)

    def mul(self, x, y):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.multiply(x, y, dtype=self.dtype)

    def div(self, x, y):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.divide(x, y, dtype=self.dtype)

    def exp(self, x):
        with np.errstate(over="ignore"):
            return np.exp(x, dtype=self.dtype)

    def sqrt(self, x):
        with np.errstate(invalid="ignore"):
            return np.sqrt(x, dtype=self.dtype)

    def matmul(self, x, y):
        return np.matmul(np.asarray(x, self.dtype), np.asarray(y, self.dtype))

    def sum(self, x, axis: int, keepdims: bool = True):
        return np.sum(x, axis=axis, keepdims=keepdims, dtype=self.dtype)

    def opaque(self, name: str, x, reference):
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(reference(np.asarray(x, self.dtype)), self.dtype)

    def max(self, x, axis: int, keepdims: bool = True):
        return np.max(x, axis=axis, keepdims=keepdims)

    def maximum(self, x, y):
        return np.maximum(x, y)

    def neg_inf(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, -np.inf, dtype=self.dtype)

    def structural(self, fn, *xs):
        return fn(*xs)

    def shape(self, x) -> tuple[int, ...]:
        return tuple(np.shape(x))
