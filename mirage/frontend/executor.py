"""Running a chosen µGraph on torch tensors.

* :class:`Interpreted` runs the graph with the reference interpreter (``mi.interpret``, float64 on
  the CPU) and hands back tensors of the graph's dtypes on the caller's device.  It runs the graph
  after the online-softmax rewrite, as the GPU does (each exp less its row maximum, so that a
  softmax of large or fully masked logits stays finite), exact to the µGraph semantics, and slow.
* :class:`Compiled` runs the kernels that ``mirage.codegen`` generates, on a CUDA device.  Inputs that
  are views (a transposed weight) are made contiguous; copies of parameters and buffers are reused
  while their version counters are unchanged (a write through ``.data`` bypasses the counter).

``make_executor`` picks one: ``"auto"`` compiles on CUDA when mirage.codegen can, else interprets.
With ``sass_tune`` the compiled kernels' SASS schedules are tuned on the GPU (:mod:`mirage.sass`);
a tuned schedule replaces a kernel's own only when the tuner verified it on fresh inputs and its
re-timed gain stands out of the noise floor, and the log says for each kernel which it runs and why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.nn import Parameter

from mirage.codegen.column_major import in_layout
from mirage.frontend import graphs
from mirage.frontend.errors import ExecutorError
from mirage.mugraph.graph import KernelGraph, same_strides
from mirage.mugraph.interpret import interpret

logger = logging.getLogger("mirage.frontend")
Launcher = Callable[[Sequence[torch.Tensor]], Sequence[torch.Tensor]]


class Interpreted:
    kind = "interpret"

    def __init__(self, graph: KernelGraph) -> None:
        from mirage.optimizer.softmax import online_softmax

        self.graph = graph
        # the graph as the GPU runs it: exps less their row maxima (LAX softmaxes overflow otherwise)
        self.stable, _ = online_softmax(graph)
        self.dtypes = [t.dtype.torch() for t in graph.output_types]

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        device = inputs[0].device if inputs else torch.device("cpu")
        outs = interpret(self.stable, list(inputs), dtype=np.float64)
        # np.array copies: an output may be a read-only view (a broadcast) that torch must not wrap
        return [torch.from_numpy(np.array(o, order="C")).to(device=device, dtype=d)
                for o, d in zip(outs, self.dtypes, strict=True)]


def is_parameter(t: torch.Tensor) -> bool:
    """Whether ``t`` is a parameter or a view of one."""
    return isinstance(t if t._base is None else t._base, Parameter)


class KeptCopies:
    """Copies of parameters and buffers (another layout, a broadcast made dense), each kept while the
    tensor it copies keeps its address, shape, strides and version counter."""

    def __init__(self) -> None:
        self._copies: dict[object, tuple[tuple, torch.Tensor]] = {}
        self.reuse_in_graphs = False  # Options.reuse_copies_in_graphs

    def get(self, slot: object, t: torch.Tensor, make: Callable[[], torch.Tensor],
            refresh: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The copy of ``t`` kept in ``slot``: ``make()`` when there is none, ``refresh(kept)`` (in
        place) when ``t`` changed since."""
        key = (t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()))
        cached = self._copies.get(slot)
        if graphs.capturing((t,)):
            reuse = self.reuse_in_graphs or not graphs.recording_constants((t,))
            if reuse and cached is not None and cached[0] == key:
                # a capture standing for calls from Python (graphs.standing_for_calls), or one whose
                # owner chose to read the calls' copies (Options.reuse_copies_in_graphs)
                return cached[1]
            # otherwise the copy is recorded: a replay runs no Python to see a changed parameter
            return make()
        if cached is None:
            cached = self._copies[slot] = (key, make())
        elif cached[0] != key:  # refreshed in place: a CUDA graph that reads the copy reads the new values
            cached = self._copies[slot] = (key, refresh(cached[1]))
        return cached[1]

    def __len__(self) -> int:
        return len(self._copies)

    def __contains__(self, slot: object) -> bool:
        return slot in self._copies

    @property
    def bytes(self) -> int:
        return sum(copy.numel() * copy.element_size() for _, copy in self._copies.values())


class Compiled:
    kind = "cuda"

    def __init__(self, graph: KernelGraph, launch: Launcher) -> None:
        self.graph = graph
        self.launch = launch
        self.kept = KeptCopies()
        # after the first call's checks, a program's launch without them: a subprogram's inputs keep
        # the shapes, dtypes and device of its specialization
        owner = getattr(launch, "__self__", None)
        program_launch = getattr(launch, "__name__", "") == "launch" and hasattr(owner, "run")
        self._next = owner.run if program_launch else launch
        # inputs the kernels read in place where they arrive column-major (a transposed parameter)
        self.transposed = frozenset(getattr(owner, "transposed_inputs", ()) if program_launch else ())
        # and those read in place through the strides they arrive with (a head split's view)
        self.strides: dict[int, tuple[int, ...]] = dict(getattr(owner, "input_strides", {})
                                                       if program_launch else {})
        # and those with split dims, read in place as the view of those dims that they arrive as
        self.views: dict[int, tuple] = dict(getattr(owner, "input_views", {}) if program_launch else {})
        self._checked = False
        # input positions that hold parameters or buffers (set by the subprogram's module); whether
        # a call copied one of them (a strided view): then a caller's CUDA graph copies it in each replay
        self.constants: frozenset[int] = frozenset()
        self.copies_constants = False

    @property
    def reuse_in_graphs(self) -> bool:  # Options.reuse_copies_in_graphs
        return self.kept.reuse_in_graphs

    @reuse_in_graphs.setter
    def reuse_in_graphs(self, value: bool) -> None:
        self.kept.reuse_in_graphs = value

    def _contiguous(self, position: int, t: torch.Tensor) -> torch.Tensor:
        """``t`` made contiguous (or column-major, where the program reads that input in place so and
        ``t`` is not: ``transposed``).  A parameter's or buffer's copy is kept while the tensor's version
        counter is unchanged; any other input is copied at every call: a kernel's output (the
        subprogram before) lands at the same address each call with the same version, new values
        that a key of address and version cannot tell from the old ones.  Parameters are known by
        position (``constants``, from the stitched graph) or as ``nn.Parameter`` (torch.compile
        passes them as inputs)."""
        strides, view = self.strides.get(position), self.views.get(position)
        if view is not None:
            ready = tuple(t.shape) == view[0] and same_strides(view[0], t.stride(), view[1])
        elif strides is not None:
            ready = same_strides(t.shape, t.stride(), strides)
        else:
            ready = t.mT.is_contiguous() if position in self.transposed else t.is_contiguous()
        if ready:
            return t
        if position not in self.constants and not is_parameter(t):
            return in_layout(t, position in self.transposed, strides, view)
        self.copies_constants = True
        return self.kept.get(position, t, lambda: in_layout(t, position in self.transposed, strides, view),
                             lambda kept: kept.copy_(t))

    @property
    def kept_bytes(self) -> int:
        """The memory the kept copies of parameters and buffers take."""
        return self.kept.bytes

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        inputs = [self._contiguous(i, t) for i, t in enumerate(inputs)]
        if self._checked:
            return list(self._next(inputs))
        outputs = list(self.launch(inputs))
        self._checked = True
        return outputs


def codegen_launcher(graph: KernelGraph, build: dict | None = None) -> Callable | None:
    """The compiled form of ``graph`` from mirage.codegen (built as ``build`` says: the pipeline
    depth and launch mode that profiling chose), or None where it cannot build one."""
    try:
        from mirage import codegen
    except ImportError:
        return None
    compile_graph = getattr(codegen, "compile_graph", None)
    if compile_graph is None:
        return None
    return compile_graph(graph, build) if build else compile_graph(graph)


def sass_tuned(program, name: str, options=None):
    """``program`` with the SASS schedules the tuner found and verified (see
    :func:`mirage.sass.mugraph.tune_program`), or ``program`` itself; a tuning failure is logged and
    leaves the compiled kernels as they are."""
    if program.cubin is None or not program.cuda.kernels:
        return program
    try:
        import torch

        from mirage.sass.mugraph import decide, default_options, record_tuning, recorded_tuning, tune_program

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        earlier = recorded_tuning(program, device) if device else None
        if earlier is not None:  # tuned on this GPU before: the same decisions, without tuning
            logger.info("mirage: %s: SASS schedules as tuned before on this GPU (%s)", name,
                        "tuned cubin" if earlier is not program else "compiled schedules kept")
            return earlier
        tuned, results = tune_program(program, options or default_options())
        if device:
            record_tuning(program, tuned, results, device)
    except Exception as error:  # no CuPy or nvdisasm, a sandbox that cannot start, ...: keep the kernels
        logger.warning("mirage: %s: SASS tuning failed (%s: %s); running the compiled kernels as they are",
                       name, type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return program
    for result in results:
        decision = decide(result)
        if decision.accepted:
            logger.info("mirage: %s: kernel %s runs a tuned SASS schedule: %s", name, decision.kernel,
                        decision.reason)
        else:
            logger.info("mirage: %s: kernel %s keeps its compiled schedule: %s", name, decision.kernel,
                        decision.reason)
    return tuned


def tuned_codegen_launcher(graph: KernelGraph, build: dict | None = None) -> Callable | None:
    """Like :func:`codegen_launcher`, with the kernels' SASS schedules tuned on this GPU."""
    try:
        from mirage import codegen
    except ImportError:
        return None
    compile_chosen = getattr(codegen, "compile_chosen", None)
    if compile_chosen is None:
        return None
    return sass_tuned(compile_chosen(graph, build), graph.name or "the subprogram").launch


def make_executor(graph: KernelGraph, device: torch.device, mode: str = "auto",
                  reference: KernelGraph | None = None, *, sass_tune: bool = False,
                  build: dict | None = None):
    """How to run ``graph`` on ``device``.  On CUDA, when ``graph`` does not compile, ``reference``
    (the subprogram's unfused graph, whose kernel-level ops run as torch calls) is tried next.
    ``sass_tune``: tune the compiled kernels' SASS schedules (see :func:`sass_tuned`).  ``build``:
    how to build ``graph`` (``codegen.runtime.BuildChoice.as_dict``, from profiling)."""
    if mode == "interpret":
        return Interpreted(graph)
    if device.type != "cuda":
        if mode == "cuda":
            raise ExecutorError(f"executor='cuda' needs CUDA tensors, got tensors on {device}; move the "
                                "model and inputs to a GPU or use executor='interpret'")
        return Interpreted(graph)
    name = graph.name or "the subprogram"
    for candidate in dict.fromkeys(g for g in (graph, reference) if g is not None):
        try:
            chosen = build if candidate is graph else None
            launcher = (tuned_codegen_launcher if sass_tune else codegen_launcher)(candidate, chosen)
        except Exception as error:  # compilation failures: nvcc errors, ops without a lowering, ...
            if mode == "cuda":
                raise
            logger.warning("mirage: %s did not compile for the GPU (%s: %s)", name, type(error).__name__,
                           str(error).splitlines()[0] if str(error) else "")
            continue
        if launcher is None:
            break
        if candidate is not graph:
            logger.warning("mirage: %s runs its unfused reference graph instead", name)
        return Compiled(candidate, launcher)
    if mode == "cuda":
        raise ExecutorError("executor='cuda' needs mirage.codegen.compile_graph, which this "
                            "installation lacks; use executor='auto' or 'interpret'")
    logger.warning("mirage: %s runs in the reference interpreter on the CPU (correct, not fast)", name)
    return Interpreted(graph)
