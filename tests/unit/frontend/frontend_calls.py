"""Helpers of the frontend tests that call a superoptimized program again and again."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


def float64_calls(fast: Callable, program: Callable, make_inputs: Callable[[], tuple],
                  calls: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``calls`` calls of ``fast`` on fresh inputs, each with what ``program`` gives on the same
    inputs in float64: (got, expected), both float64, one pair an output of a program of several."""
    for _ in range(calls):
        inputs = make_inputs()
        with torch.no_grad():
            got, want = fast(*inputs), program(*(x.double() for x in inputs))
        if isinstance(want, tuple):
            yield from ((g.double(), w) for g, w in zip(got, want, strict=True))
        else:
            yield got.double(), want


def recording_launch(seen: list, position: int | None = None) -> Callable:
    """A launcher of ``x @ w`` that records the addresses it is given (all, or the one at ``position``)."""
    def launch(inputs):
        seen.append([t.data_ptr() for t in inputs] if position is None else inputs[position].data_ptr())
        return [inputs[0] @ inputs[1]]

    return launch
