"""``mirage.superoptimize``: the public entry point.

>>> import torch, mirage as mi
>>> def mlp(x, w1, w2):
...     return torch.nn.functional.silu(x @ w1) * (x @ w2)
>>> args = (torch.randn(4, 16), torch.randn(16, 8), torch.randn(16, 8))
>>> fast = mi.superoptimize(mlp, args, search=False, use_cache=False, progress=False)
>>> torch.allclose(fast(*args), mlp(*args), atol=1e-5)
True
>>> print(fast.partition.summary())
1 subprogram(s) covering 4 torch op(s); 0 compute op(s) left in PyTorch
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from mirage.frontend.errors import (
    ExampleInputsError,
    InputCountError,
    InputDeviceError,
    InputDTypeError,
    InputShapeError,
    InputTypeError,
    UnsupportedProgramError,
)
from mirage.frontend.executor import make_executor
from mirage.frontend.optimize import Choice, choose
from mirage.frontend.options import Options
from mirage.frontend.runtime import MirageModule
from mirage.mugraph.builder import KNGraph
from mirage.mugraph.graph import KernelGraph
from mirage.mugraph.text import type_text

logger = logging.getLogger("mirage")


def superoptimize(program: Any, example_inputs: Any = None, **options: Any) -> nn.Module:
    """Return a module that computes what ``program`` computes, with each LAX subprogram run through
    the best µGraph found for it (generated kernels on a GPU, the reference interpreter elsewhere).

    ``program``: a ``torch.nn.Module``, a function of tensors, a ``torch.fx.GraphModule``, or a kernel
    graph (``mi.new_kernel_graph()`` builder or frozen :class:`~mirage.KernelGraph`).
    ``example_inputs``: a tensor, a tuple/list of positional inputs, or a dict of keyword inputs.
    With them the program is captured and searched now; without, at its first call.  A call with new
    shapes captures again (cached per shape); dtypes and devices must stay the same.

    Options (all keywords; see :class:`mirage.frontend.Options`): ``search`` (default True),
    ``config`` (search space name; default: chosen per subprogram), ``time_limit_s`` (search budget
    per subprogram, default 30), ``max_results``, ``search_overrides`` (dict for the generator),
    ``max_subprogram_ops`` (default 16), ``executor`` ("auto", "interpret", "cuda"), ``use_cache``,
    ``cache_dir``, ``progress``, ``sass_tune`` (default False: on a GPU, reorder each generated
    kernel's SASS with :mod:`mirage.sass` and keep a schedule only when it is verified and faster
    beyond the timing noise; a few minutes per kernel), ``candidates`` (µGraphs of your own, e.g.
    from an earlier search or written by hand: each is verified against every subprogram of its
    signature and, when equivalent, ranked and profiled with the search's results),
    ``upcasts``, ``whole_program_check`` (default True: on a GPU, the program as given runs instead
    where it was timed faster than with the chosen µGraphs; :mod:`mirage.frontend.guard`),
    ``merge_products`` (default True: sibling projections that are only split into heads run as one
    product, their parameters becoming rows of one tensor; :mod:`mirage.frontend.products`).
    """
    opts = Options.parse(**options)
    if _called_by_a_worker_importing_the_script():
        logger.warning(
            "mirage.superoptimize: called while a search worker process imports your script (the "
            "search starts workers that import the main script, which runs its top-level code again); "
            "returning the program unchanged here. Put the script's top-level work under "
            "`if __name__ == \"__main__\":` so that workers skip it")
        return program
    if isinstance(program, (KNGraph, KernelGraph)):
        graph = program.freeze() if isinstance(program, KNGraph) else program
        if example_inputs is not None:
            logger.info("mirage: example_inputs are not needed for kernel graphs; ignoring them")
        return KernelGraphModule(graph, opts)
    if isinstance(program, type) or not (isinstance(program, nn.Module) or callable(program)):
        raise UnsupportedProgramError(
            f"cannot superoptimize {program!r} ({type(program).__name__}): pass a torch.nn.Module "
            "instance, a function of tensors, a torch.fx.GraphModule, or a kernel graph built with "
            "mirage.new_kernel_graph()")
    if isinstance(program, MirageModule):  # superoptimized before: again, from the program it was made of
        logger.info("mirage.superoptimize: %s is superoptimized already; superoptimizing the program it was "
                    "made from with these options", program.name)
        program = program.program
    module = MirageModule(program, opts)
    if example_inputs is not None:
        args, kwargs = _split_inputs(example_inputs)
        module.specialize(args, kwargs)
    return module


def _called_by_a_worker_importing_the_script() -> bool:
    """Whether this call comes from a script's top-level code run again by a worker process that
    multiprocessing started (spawn or forkserver), which imports the main script as ``__mp_main__``."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        names = [k for k in example_inputs if not isinstance(k, str)]
        if names:
            raise ExampleInputsError(
                f"example_inputs given as a dict name the program's parameters, so its keys must be "
                f"strings; got the key {names[0]!r}. Pass positional inputs as a tuple or list")
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise ExampleInputsError(
        f"example_inputs must be a tensor, a tuple or list of inputs, or a dict of keyword inputs; got "
        f"{type(example_inputs).__name__}")


class KernelGraphModule(nn.Module):
    """A superoptimized kernel graph: ``module(x, w)`` or ``module(inputs=[x, w])`` returns the list of
    outputs (as Mirage's ``KNGraph.__call__``).  Shapes and dtypes are the graph's own."""

    def __init__(self, reference: KernelGraph, options: Options) -> None:
        super().__init__()
        from mirage.mugraph.check import check

        check(reference)
        self.reference = reference
        self.options = options
        self.choice: Choice = choose(reference, options.search_settings, search=options.search,
                                     cache_dir=options.search_cache_dir, progress=options.progress)
        logger.info("mirage: %s: µGraph from %s (%s)", reference.name or "graph", self.choice.source,
                    self.choice.detail)
        self._executors: dict[torch.device, Any] = {}

    @property
    def graph(self) -> KernelGraph:
        """The chosen µGraph."""
        return self.choice.graph

    def check_inputs(self, inputs: Sequence[Any]) -> None:
        types = self.reference.input_types
        if len(inputs) != len(types):
            raise InputCountError(f"the kernel graph takes {len(types)} inputs "
                                  f"({', '.join(type_text(t) for t in types)}), got {len(inputs)}")
        devices = set()
        for i, (x, t) in enumerate(zip(inputs, types, strict=True)):
            if not isinstance(x, torch.Tensor):
                raise InputTypeError(f"input {i} must be a torch.Tensor of {type_text(t)}, got "
                                     f"{type(x).__name__}; convert it with torch.as_tensor")
            if tuple(x.shape) != t.shape:
                raise InputShapeError(f"input {i} has shape {list(x.shape)}, the kernel graph takes "
                                      f"{list(t.shape)}; kernel graphs have fixed shapes: build one for "
                                      "this shape (or superoptimize a torch program, which re-specializes)")
            if x.dtype != t.dtype.torch():
                raise InputDTypeError(f"input {i} has dtype {x.dtype}, the kernel graph takes "
                                      f"{t.dtype.torch()}; convert it with .to({t.dtype.torch()})")
            devices.add(x.device)
        if len(devices) > 1:
            raise InputDeviceError(f"inputs are on several devices ({', '.join(map(str, devices))}); move "
                                   "them to one device")

    def forward(self, *args: torch.Tensor, inputs: Sequence[torch.Tensor] | None = None,
                stream: Any = None) -> list[torch.Tensor]:
        if inputs is not None and args:
            raise InputCountError("pass the inputs either positionally or as inputs=[...], not both")
        tensors = list(inputs) if inputs is not None else list(args)
        self.check_inputs(tensors)
        device = tensors[0].device if tensors else torch.device("cpu")
        if device not in self._executors:
            self._executors[device] = make_executor(self.graph, device, self.options.executor,
                                                    sass_tune=self.options.sass_tune)
        with torch.no_grad():
            return self._executors[device](tensors)
