"""The whole-program check: a superoptimized program is never slower than the program it replaces.

Each subprogram's pick already beat that subprogram's own torch ops (``optimize.choose``), but what
lies between the subprograms can still lose: a cast that capture made explicit so that a subprogram
could compute in float32 (``softmax(x, dtype=torch.float32)`` becomes a cast and a softmax, two
kernels where PyTorch ran one), a layout copy at a boundary, a launch more than PyTorch's fused op.
So once the subprograms are chosen, the stitched module and the program as given are timed on the
GPU, on copies of the call's inputs, in the same way as the builds (CUDA-graph replays, median per
call), and the faster one runs. The report says which, with both times. A program that writes into
its own buffers or parameters (a KV cache, a counter) is not timed: timing would run those writes
thousands of times.

>>> faster({"µGraphs": 30.0, "PyTorch": 24.0})
'PyTorch'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger("mirage.frontend")

OURS, THEIRS = "µGraphs", "PyTorch"


@dataclass(frozen=True)
class Verdict:
    """Which module runs, and the times behind the choice (µs a call; empty when not timed)."""

    runs: str  # OURS or THEIRS
    times: Mapping[str, float]
    note: str

    @property
    def pytorch(self) -> bool:
        return self.runs == THEIRS


def faster(times: Mapping[str, float]) -> str:
    """The name of the faster of ``OURS`` and ``THEIRS``; ours on a tie."""
    return THEIRS if times[THEIRS] < times[OURS] else OURS


def _copies(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call's inputs, each tensor copied: a program that writes into its inputs may run
    many times while it is timed, and the caller's tensors must not change."""
    return torch.utils._pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x,
                                        (args, kwargs))


def time_call(module: Callable, args: tuple, kwargs: dict) -> float:
    """Median µs of one call of ``module(*args, **kwargs)`` (CUDA-graph replays, as builds are timed)."""
    from mirage.codegen.profile import time_graph

    def call() -> Any:
        with torch.no_grad():
            return module(*args, **kwargs)

    return time_graph(call, replays=100).median_us


def check(ours: Callable, program: Callable, args: tuple, kwargs: dict,
          timer: Callable[[Callable, tuple, dict], float] = time_call) -> Verdict:
    """Time ``ours`` (the stitched module) and ``program`` (as given) on copies of a call's inputs
    and name the faster. Where either cannot be timed (a program that syncs with the host cannot be
    captured in a CUDA graph), ours runs and the note says why."""
    args, kwargs = _copies(args, kwargs)
    try:
        times = {OURS: timer(ours, args, kwargs), THEIRS: timer(program, args, kwargs)}
    except Exception as error:  # noqa: BLE001 - a check that cannot run leaves the verified pick
        logger.warning("mirage: the whole-program check could not time the program (%s: %s); "
                       "running the chosen µGraphs", type(error).__name__, error)
        return Verdict(OURS, {}, f"whole program not timed ({type(error).__name__}: "
                                 f"{str(error).splitlines()[0] if str(error) else ''})")
    runs = faster(times)
    summary = f"{times[OURS]:.2f} µs a call with the chosen µGraphs, {times[THEIRS]:.2f} µs in PyTorch"
    if runs == THEIRS:
        logger.warning("mirage: the program as given is faster than with its chosen µGraphs (%s); it runs "
                       "in PyTorch", summary)
        return Verdict(THEIRS, times, f"whole program: {summary}; PyTorch runs it, faster")
    return Verdict(OURS, times, f"whole program: {summary}")
