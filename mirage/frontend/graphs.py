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
import logging
import threading
from collections.abc import Callable, Iterable, Iterator

import torch

logger = logging.getLogger("mirage.frontend")

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


class GraphedCall:
    """One kind of call replayed from a CUDA graph of its own (``Options.cuda_graphs``): what a call
    costs the host is then a copy of each input, one graph launch and a copy of each output, instead
    of the Python and the launches of every kernel.

    The first call captures ``run`` on buffers of the inputs' layout (after a warm-up run on a side
    stream). A later call copies its inputs into those buffers, replays the graph and returns copies of
    the outputs, so that a result is never overwritten by the next replay. Parameters and buffers
    passed as inputs (``torch.compile`` passes them so) are read in place, not copied: a call in
    which one of them is another tensor than at the capture captures again, up to ``MAX_CAPTURES``
    times; after that, or when a capture fails (a program that synchronizes with the host, reads a
    CPU tensor, ...), the calls run as they would without graphs and a warning says why, once; so do
    the calls of a program that writes into its inputs (``unfit`` says so), which must run on the
    caller's tensors.
    """

    MAX_CAPTURES = 4

    def __init__(self, run: Callable[[tuple], object], name: str, unfit: str | None = None) -> None:
        self.run = run  # positional tensors -> the call's outputs (any pytree)
        self.name = name
        self.failed: str | None = None  # why calls no longer replay
        self._unfit = unfit  # why calls of this program cannot replay at all (said at the first call)
        self.captures = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._inputs: list[torch.Tensor] = []  # what the graph reads: a buffer, or the parameter itself
        self._in_place: list[tuple[int, tuple, tuple] | None] = []  # (address, shape, strides) if in place
        self._outputs: list = []
        self._spec = None
        self._lock = threading.Lock()

    def __call__(self, args: tuple):
        with self._lock:
            if self.failed is not None:
                return self.run(args)
            if self._unfit is not None:
                return self._give_up(args, self._unfit)
            if self._graph is None or not self._fits(args):
                if self.captures >= self.MAX_CAPTURES:
                    return self._give_up(args, f"its parameters changed address {self.captures} times")
                try:
                    self._capture(args)
                except Exception as error:  # a program that cannot run under capture
                    self._graph = None
                    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                    return self._give_up(args, f"its capture failed ({type(error).__name__}: {reason})")
            copied = [k for k, kept in enumerate(self._in_place) if kept is None]
            if copied:  # in one call (each torch call costs the host more than a small copy costs the GPU)
                torch._foreach_copy_([self._inputs[k] for k in copied], [args[k] for k in copied])
            self._graph.replay()
            leaves = [t.clone() if isinstance(t, torch.Tensor) else t for t in self._outputs]
            return torch.utils._pytree.tree_unflatten(leaves, self._spec)

    def _fits(self, args: tuple) -> bool:
        return all(kept is None or (a.data_ptr(), tuple(a.shape), a.stride()) == kept
                   for a, kept in zip(args, self._in_place, strict=True))

    def _capture(self, args: tuple) -> None:
        from mirage.codegen.profile import captured

        self.captures += 1
        self._graph = None
        device = args[0].device
        in_place = [_constant(a) for a in args]
        self._in_place = [(a.data_ptr(), tuple(a.shape), a.stride()) if keep else None
                          for a, keep in zip(args, in_place, strict=True)]
        self._inputs = [a if keep else torch.empty_like(a).copy_(a) for a, keep in zip(args, in_place,
                                                                                      strict=True)]
        inputs = tuple(self._inputs)
        with torch.cuda.device(device):  # one warm-up call on a side stream, then the capture
            graph, outputs = captured(lambda: self.run(inputs), capture_error_mode="thread_local")
        self._outputs, self._spec = torch.utils._pytree.tree_flatten(outputs)
        self._graph = graph

    def _give_up(self, args: tuple, why: str):
        self.failed = why
        self._graph, self._inputs, self._outputs = None, [], []
        logger.warning("mirage: %s: calls are not replayed from a CUDA graph, as %s; they launch their "
                       "kernels as without cuda_graphs", self.name, why)
        return self.run(args)


def _constant(t: torch.Tensor) -> bool:
    """Whether ``t`` is a parameter or a view of one (``torch.compile`` passes parameters as inputs)."""
    return isinstance(t if t._base is None else t._base, torch.nn.Parameter)


def graphable(args: tuple) -> bool:
    """Whether a call of ``args`` can replay a graph: CUDA tensors of one device, no capture going on."""
    if not args or not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        return False
    device = args[0].device
    return all(a.device == device for a in args) and not torch.cuda.is_current_stream_capturing()
