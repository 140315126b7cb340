"""Calls under CUDA-graph capture: what a replay must record, and what it may reuse.

A call from Python copies a parameter it reads as a strided view (``nn.Linear``'s weight, read
transposed) once and reuses the copy while the parameter's version counter is unchanged: every call
checks it. A replay of a CUDA graph runs no Python, so a graph captured around the module records
those copies, and each replay makes them again: a weight updated in place between replays is seen.

Timing a module with CUDA-graph replays (which leave the host's overhead out) would then charge a
Python call for copies it does not make. Within :func:`standing_for_calls` a capture stands for calls
from Python instead: copies of parameters and buffers made before the capture are read, not recorded.
The whole-program check and the benchmarks time calls that way, and time a caller's graph too.

>>> recording_constants([]), standing_for_calls().__class__.__name__
(False, '_GeneratorContextManager')
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

import torch

_state = threading.local()


def capturing(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether a CUDA graph is being captured on the current stream (for CUDA ``tensors``)."""
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors)
    return cuda and torch.cuda.is_current_stream_capturing()


def recording_constants(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether a capture is going on that must record the copies of parameters and buffers: one
    that a caller made (not one standing for calls from Python)."""
    return not getattr(_state, "calls", False) and capturing(tensors)


@contextlib.contextmanager
def standing_for_calls() -> Iterator[None]:
    """Within: CUDA-graph captures stand for calls from Python (see the module docstring)."""
    before = getattr(_state, "calls", False)
    _state.calls = True
    try:
        yield
    finally:
        _state.calls = before
