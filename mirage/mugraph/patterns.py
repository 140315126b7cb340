"""Inputs whose values the program fixes: a kernel input may name a *pattern* (``KernelInput.pattern``),
a promise that every call passes the values the pattern defines.  The µGraph's meaning does not
change (the search and the verifier treat the input as any other), but the generated code may compute
the values from their indices instead of reading them.

One pattern so far:

``causal:L``
    The additive mask of causal attention, PyTorch's alignment: 0 where key ``j`` ≤ query ``i`` and −∞
    where ``j > i``, over the last dim (keys); the other dims flattened give the row, whose query is
    that row modulo ``L`` (grouped-query heads folded into the rows repeat the ``L`` queries).

The frontend names the pattern on the masks it builds itself (``capture``); the values are checked
where it does (:func:`matches`), and random inputs for checks on the GPU take them
(:func:`values`), so that a kernel that computes them is compared on the inputs it assumes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mirage.errors import GraphError

CAUSAL = "causal"


def causal(queries: int) -> str:
    """The causal-mask pattern of ``queries`` queries a period (see the module docstring)."""
    return f"{CAUSAL}:{int(queries)}"


def parse(pattern: str) -> tuple[str, int]:
    """(kind, period) of ``pattern``; raises GraphError naming what is wrong."""
    kind, _, period = pattern.partition(":")
    if kind != CAUSAL or not period.isdigit() or int(period) < 1:
        raise GraphError(f"unknown input pattern {pattern!r}: the one pattern is 'causal:L' (L ≥ 1 queries)")
    return kind, int(period)


def check_shape(pattern: str, shape: Sequence[int]) -> None:
    """Raise GraphError unless a tensor of ``shape`` can hold ``pattern`` (rows of keys)."""
    _, period = parse(pattern)
    if len(shape) < 2:
        raise GraphError(f"input pattern {pattern!r} needs rows of keys (2 or more dims), got shape "
                         f"{list(shape)}")
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    if rows % period:
        raise GraphError(f"input pattern {pattern!r}: {rows} rows are not whole periods of {period} queries")


def values(pattern: str, shape: Sequence[int], dtype: Any, device: Any = "cpu"):
    """The tensor ``pattern`` defines at ``shape`` (a torch tensor of ``dtype`` on ``device``)."""
    import torch

    check_shape(pattern, shape)
    _, period = parse(pattern)
    keys = int(shape[-1])
    rows = torch.arange(int(torch.tensor(shape[:-1]).prod()), device=device) % period
    hidden = torch.arange(keys, device=device)[None, :] > rows[:, None]
    mask = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill(hidden, float("-inf"))
    return mask.reshape(tuple(int(d) for d in shape))


def matches(pattern: str, tensor) -> bool:
    """Whether ``tensor`` holds exactly the values ``pattern`` defines at its shape."""
    import torch

    expected = values(pattern, tuple(tensor.shape), tensor.dtype, tensor.device)
    return bool(torch.equal(tensor, expected))
