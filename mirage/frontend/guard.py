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

The stitched module is timed as calls from Python run it (``graphs.standing_for_calls``: a weight
read transposed is copied once per version of the weight). Where a call copies such a parameter, it
is timed again as a caller's CUDA graph runs it, copying in every replay; where PyTorch is faster
there, a graph captured around the module runs the program as given (``Verdict.runs_in_graphs``).

>>> faster({"µGraphs": 30.0, "PyTorch": 24.0})
'PyTorch'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from mirage.frontend import graphs

logger = logging.getLogger("mirage.frontend")

OURS, THEIRS = "µGraphs", "PyTorch"
OURS_IN_GRAPHS = "µGraphs in a CUDA graph"


@dataclass(frozen=True)
class Verdict:
    """Which module runs, and the times behind the choice (µs a call; empty when not timed)."""

    runs: str  # OURS or THEIRS
    times: Mapping[str, float]
    note: str
    runs_in_graphs: str | None = None  # the same in a caller's CUDA graph; None: as ``runs``

    @property
    def pytorch(self) -> bool:
        return self.runs == THEIRS

    @property
    def pytorch_in_graphs(self) -> bool:
        return (self.runs_in_graphs or self.runs) == THEIRS


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
          copies_constants: Callable[[], bool] = lambda: False,
          timer: Callable[[Callable, tuple, dict], float] = time_call) -> Verdict:
    """Time ``ours`` (the stitched module) and ``program`` (as given) on copies of a call's inputs
    and name the faster; ``copies_constants()``, asked once ours ran: whether its calls copy strided
    parameters, so that it is timed in a caller's CUDA graph as well. Where either cannot be timed
    (a program that syncs with the host cannot be captured in a CUDA graph), ours runs and the note
    says why."""
    args, kwargs = _copies(args, kwargs)
    try:
        with graphs.standing_for_calls():
            times = {OURS: timer(ours, args, kwargs)}
        if copies_constants():
            times[OURS_IN_GRAPHS] = timer(ours, args, kwargs)
        times[THEIRS] = timer(program, args, kwargs)
    except Exception as error:  # noqa: BLE001 - a check that cannot run leaves the verified pick
        logger.warning("mirage: the whole-program check could not time the program (%s: %s); "
                       "running the chosen µGraphs", type(error).__name__, error)
        return Verdict(OURS, {}, f"whole program not timed ({type(error).__name__}: "
                                 f"{str(error).splitlines()[0] if str(error) else ''})")
    runs = faster(times)
    graphed = times.get(OURS_IN_GRAPHS)
    in_graphs = "" if graphed is None else \
        f" ({graphed:.2f} µs in a CUDA graph, which copies strided parameters in every replay)"
    summary = (f"{times[OURS]:.2f} µs a call with the chosen µGraphs{in_graphs}, "
               f"{times[THEIRS]:.2f} µs in PyTorch")
    if runs == THEIRS:
        logger.warning("mirage: the program as given is faster than with its chosen µGraphs (%s); it runs "
                       "in PyTorch", summary)
        return Verdict(THEIRS, times, f"whole program: {summary}; PyTorch runs it, faster")
    if graphed is not None and faster({OURS: graphed, THEIRS: times[THEIRS]}) == THEIRS:
        logger.info("mirage: calls run the chosen µGraphs; a CUDA graph captured around the module runs "
                    "the program as given, faster there (%s)", summary)
        return Verdict(OURS, times, f"whole program: {summary}; calls run the µGraphs, a CUDA graph "
                                    "captured around the module runs PyTorch, faster there", THEIRS)
    return Verdict(OURS, times, f"whole program: {summary}")
