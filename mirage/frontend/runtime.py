"""The module ``superoptimize`` returns: each subprogram through its µGraph, the rest through PyTorch.

:class:`MirageModule` captures the program for the shapes of a call, partitions it, chooses a µGraph
per subprogram (search or cache) and stitches a graph module in which every subprogram is one call
of a :class:`SubprogramModule`.  Specializations are cached per input signature (shapes and
non-tensor values); dtypes and devices must stay those of the first capture.

>>> import torch, mirage as mi
>>> fast = mi.superoptimize(lambda x, w: torch.relu(x @ w), (torch.ones(2, 3), torch.ones(3, 4)),
...                         search=False, use_cache=False, progress=False)
>>> fast(torch.ones(2, 3), torch.ones(3, 4))[0].tolist()
[3.0, 3.0, 3.0, 3.0]
"""

from __future__ import annotations

import functools
import heapq
import logging
import operator
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from mirage.frontend import graphs
from mirage.frontend.capture import (
    Signature,
    as_module,
    capture,
    check_call,
    conform_call,
    program_name,
    restore_causal,
    signature_of,
    updates_inputs,
    updates_state,
)
from mirage.frontend.errors import CaptureError, InputError, InputGradError
from mirage.frontend.executor import KeptCopies, is_parameter, make_executor
from mirage.frontend.guard import OURS, Verdict, check
from mirage.frontend.optimize import Choice, choose
from mirage.frontend.options import Options
from mirage.frontend.partition import Partition, Subprogram, partition, product_cuts, size_segments
from mirage.frontend.products import StackedParameters
from mirage.frontend.region import eager_strides
from mirage.frontend.runners import boundary_runner, torch_ops_runner
from mirage.frontend.state import Snapshot
from mirage.mugraph.graph import same_strides

logger = logging.getLogger("mirage.frontend")

_CAPTURING = threading.RLock()  # held while a program is captured, partitioned and its µGraphs chosen


class SubprogramModule(nn.Module):
    """Runs one subprogram: views the torch inputs as the graph's inputs, runs the chosen µGraph,
    views the graph's outputs as the torch values."""

    def __init__(self, subprogram: Subprogram, choice: Choice, options: Options) -> None:
        super().__init__()
        self.subprogram = subprogram
        self.choice = choice
        self.executor_mode = options.executor
        self.sass_tune = options.sass_tune
        self.reuse_in_graphs = options.reuse_copies_in_graphs
        self.sources = list(dict.fromkeys(b.source for b in subprogram.inputs))
        self._position = {name: i for i, name in enumerate(self.sources)}
        self._executors: dict[torch.device, Any] = {}
        self.constant_sources: frozenset[str] = frozenset()  # the sources that are parameters or buffers
        # a parameter or buffer that a binding broadcasts and reshapes into a copy (a rotary table
        # over the heads) is kept while it is unchanged, as the executor keeps its layout copies
        self.kept = KeptCopies()
        self._bound_views: set[int] = set()  # the bindings that view such a tensor: nothing to keep

    @property
    def copies_constants(self) -> bool:
        """Whether a call copied a parameter or buffer it reads as a strided view (see executor)."""
        return len(self.kept) > 0 or any(getattr(e, "copies_constants", False)
                                         for e in self._executors.values())

    @property
    def kept_copies(self) -> tuple[int, int]:
        """How many copies of parameters and buffers the calls keep, and their bytes."""
        kept = [self.kept] + [e.kept for e in self._executors.values() if hasattr(e, "kept")]
        return sum(len(k) for k in kept), sum(k.bytes for k in kept)

    def _bound(self, k: int, binding, t: torch.Tensor) -> torch.Tensor:
        """Input ``k``: ``t`` through its binding, a kept copy where that copies a constant."""
        if k in self._bound_views or not (binding.source in self.constant_sources or is_parameter(t)):
            return binding.apply(t)

        def refresh(kept: torch.Tensor) -> torch.Tensor:
            return kept.copy_(binding.apply(t))

        self.kept.reuse_in_graphs = self.reuse_in_graphs
        slot = (k, t.device)
        if slot in self.kept:
            return self.kept.get(slot, t, lambda: binding.apply(t).contiguous(), refresh)
        bound = binding.apply(t)
        if bound.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            self._bound_views.add(k)  # a view: the executor keeps a layout copy where it needs one
            return bound
        return self.kept.get(slot, t, bound.contiguous, refresh)  # the first call's copy is the one kept

    @property
    def read_in_place(self) -> list[str]:
        """The inputs its compiled kernels read as they arrive, transposed (``weight.T``) or as other
        views (a head split), with no copy (:mod:`mirage.codegen.column_major`), by name; empty before
        the first call on a GPU."""
        graph = self.choice.graph
        positions = sorted({p for e in self._executors.values()
                            for p in (*getattr(e, "transposed", ()), *getattr(e, "strides", {}))})
        return [graph.nodes[graph.input_nodes[p]].attrs.name or f"input {p}" for p in positions]

    def executor(self, device: torch.device):
        if device not in self._executors:
            self._executors[device] = make_executor(self.choice.graph, device, self.executor_mode,
                                                    self.subprogram.graph, sass_tune=self.sass_tune,
                                                    build=self.choice.build)
            if hasattr(self._executors[device], "constants"):
                self._executors[device].constants = frozenset(
                    i for i, b in enumerate(self.subprogram.inputs) if b.source in self.constant_sources)
                self._executors[device].reuse_in_graphs = self.reuse_in_graphs
        return self._executors[device]

    def forward(self, *sources: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bindings = self.subprogram.inputs
        executor = self.executor(sources[self._position[bindings[0].source]].device)
        views = getattr(executor, "views", {})  # inputs its kernels read as the view of split dims
        inputs = [b.viewed(sources[self._position[b.source]]) if k in views
                  else self._bound(k, b, sources[self._position[b.source]]) for k, b in enumerate(bindings)]
        results = executor(inputs)
        return tuple(o.apply(results[o.index]) for o in self.subprogram.outputs)

    def extra_repr(self) -> str:
        return f"{self.subprogram.name}: {self.subprogram.num_ops} ops, µGraph from {self.choice.source}"


def stitch(gm: fx.GraphModule, part: Partition, modules: Mapping[str, SubprogramModule]) -> fx.GraphModule:
    """Replace each subprogram's nodes in ``gm`` by one call of its module (in place)."""
    nodes = list(gm.graph.nodes)
    by_name = {n.name: n for n in nodes}
    index = {n: i for i, n in enumerate(nodes)}
    unit_of: dict[fx.Node, Any] = {n: n for n in nodes}
    for s in part.subprograms:
        for name in s.nodes:
            unit_of[by_name[name]] = s.name
    subprograms = {s.name: s for s in part.subprograms}

    def dependencies(unit) -> set:
        if isinstance(unit, str):
            return {unit_of[by_name[b.source]] for b in subprograms[unit].inputs}
        return {unit_of[p] for p in unit.all_input_nodes}

    def first_index(unit) -> int:
        return index[by_name[subprograms[unit].nodes[0]]] if isinstance(unit, str) else index[unit]

    units = list(dict.fromkeys(unit_of[n] for n in nodes))
    waiting = {u: dependencies(u) - {u} for u in units}
    users: dict[Any, list] = {u: [] for u in units}
    for u, deps in waiting.items():
        for d in deps:
            users[d].append(u)
    ready = [(first_index(u), k, u) for k, u in enumerate(units) if not waiting[u]]
    heapq.heapify(ready)
    order_key = {u: k for k, u in enumerate(units)}
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen
    env: dict[fx.Node, fx.Node] = {}
    emitted = 0
    while ready:
        _, _, unit = heapq.heappop(ready)
        emitted += 1
        if isinstance(unit, str):
            module = modules[unit]
            module.constant_sources = frozenset(n for n in module.sources if by_name[n].op == "get_attr")
            call = graph.call_module(unit, tuple(env[by_name[name]] for name in module.sources))
            for k, binding in enumerate(subprograms[unit].outputs):
                value = graph.call_function(operator.getitem, (call, k))
                stride = eager_strides(by_name[binding.node]) if binding.expand is None else None
                if stride is not None:  # the PyTorch ops after it may rely on eager's layout (a view)
                    value = graph.call_function(restrided, (value, stride))
                env[by_name[binding.node]] = value
        else:
            env[unit] = graph.node_copy(unit, lambda n: env[n])
        for user in users[unit]:
            waiting[user].discard(unit)
            if not waiting[user]:
                heapq.heappush(ready, (first_index(user), order_key[user], user))
    if emitted != len(units):  # the partitioner rules cycles out; this is a bug if reached
        raise AssertionError("the partition has a cycle through PyTorch ops")
    for name in part.upcasts:  # read through by subprograms: dead unless PyTorch ops use it too
        if not env[by_name[name]].users:
            graph.erase_node(env[by_name[name]])
    restore_causal(graph)
    for name, module in modules.items():
        gm.add_submodule(name, module)
    gm.graph = graph
    gm.recompile()
    return gm


def restrided(tensor: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """``tensor``'s values laid out with ``stride`` (a copy unless it already is): what eager PyTorch
    gives the op a subprogram replaces, so that the PyTorch ops after it (a ``view``) work as written."""
    if same_strides(tensor.shape, tensor.stride(), stride):
        return tensor
    laid_out = torch.empty_strided(tensor.shape, tuple(stride), dtype=tensor.dtype, device=tensor.device)
    return laid_out.copy_(tensor)


@dataclass
class Specialization:
    signature: Signature
    module: fx.GraphModule  # the stitched module that runs
    captured: fx.Graph  # the graph as captured, before stitching
    partition: Partition
    choices: dict[str, Choice]
    seconds: dict[str, float]
    split: tuple[str, ...] = ()  # what the searches of the subprograms split afterwards gave
    verdict: Verdict | None = None  # the whole-program check's (frontend.guard); None where it did not run
    # what a caller's CUDA graph captures where it is not ``module`` (the program as given, where the
    # check found the stitched module slower in a graph, whose replays copy strided parameters)
    graph_module: Any = None
    _flat: Any = None  # flat_runner's result, made on first use
    graphed: Any = None  # graphs.GraphedCall: its calls replayed from a CUDA graph (Options.cuda_graphs)

    def run_positional(self, args: tuple):
        """A checked call of positional tensors: the stitched graph run flat, or, inside a caller's CUDA
        graph capture, ``graph_module`` where the whole-program check chose it for graphs."""
        if self.graph_module is not None and graphs.recording_constants(args):
            return self.graph_module(*args)
        return self.run_flat(args)

    def run_flat(self, args: tuple):
        """``module(*args)`` for positional tensors already checked against this specialization: the
        stitched graph without the exported module's pytree flattening, input hooks and guards (what
        a repeated call of a small program spends most of its host time on)."""
        if self._flat is None:
            gm = self.module if isinstance(self.module, fx.GraphModule) else None
            self._flat = (flat_runner(gm) if gm is not None else None) or self.module
        return self._flat(*args)

    def partition_dot(self) -> str:
        from mirage.frontend.draw import partition_dot

        return partition_dot(self.captured, self.partition)

    def report(self) -> str:
        lines = [f"inputs: {self.signature.describe()}", self.partition.summary()]
        stitched = ({n.target for n in self.module.graph.nodes if n.op == "call_module"}
                    if isinstance(self.module, fx.GraphModule) else set())
        for s in self.partition.subprograms:
            c = self.choices[s.name]
            if self.verdict is not None and self.verdict.pytorch:
                what = "its reference graph" if c.source == "reference" else f"µGraph from {c.source}"
                runs = f"{what}, not run: the whole program is faster in PyTorch ({c.detail})"
            elif s.name in stitched:
                runs = f"µGraph from {c.source} ({c.detail})"
            else:
                runs = f"runs in PyTorch, as nothing beat its reference graph ({c.detail})"
            lines.append(f"  {s.name}: {len(s.nodes)} torch ops, {s.num_ops} kernel-graph ops; {runs}")
        lines += [f"  {n}" for n in self.partition.notices()]
        lines += [f"  before a split: {n}" for n in self.split]
        lines += [f"  {self.verdict.note}"] if self.verdict is not None else []
        if self.verdict is None and not any(s.name in stitched for s in self.partition.subprograms):
            lines.append("  no µGraph runs: the program runs as given")
        kept = [m.kept_copies for m in self.module.modules() if isinstance(m, SubprogramModule)] \
            if isinstance(self.module, nn.Module) else []
        count, size = (sum(k[0] for k in kept), sum(k[1] for k in kept)) if kept else (0, 0)
        if count:
            lines.append(f"  kept copies: {count} parameter(s) or buffer(s) read as strided views (a "
                         f"transposed weight) or broadcast into a frame (a rotary table over the heads), "
                         f"{size / 1024:,.0f} KiB, made again when one changes")
        # a stack is None once a parameter was given a tensor of its own (`.data = ...`)
        stacks = [m.names for m in self.module.modules() if isinstance(m, StackedParameters)
                  and m._stack is not None and m._stack.dim() == 2] \
            if isinstance(self.module, nn.Module) else []
        for names in stacks:
            lines.append(f"  one product of {len(names)} stacked weights ({', '.join(names)}): sibling "
                         "products only reshaped, the parameters now rows of one tensor")
        in_place = [name for m in self.module.modules() if isinstance(m, SubprogramModule)
                    for name in m.read_in_place] if isinstance(self.module, nn.Module) else []
        if in_place:
            lines.append(f"  read in place: {len(in_place)} input(s) arriving transposed or as views, "
                         f"no copy ({', '.join(in_place)})")
        lines.append("  time: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items()))
        return "\n".join(lines)


def runs_in_pytorch(choice: Choice, options: Options) -> bool:
    """Whether a subprogram keeps its torch ops: a search ran (or was asked for) and found nothing
    better than the reference graph.  With ``search=False`` the reference graph runs as generated code."""
    return options.search and choice.source == "reference"


def choose_all(gm: fx.GraphModule, subprograms: Sequence[Subprogram], options: Options,
               profile_on: str | None = None) -> dict[str, Choice]:
    """Choose a µGraph for each subprogram, with a progress bar (profiled on GPU ``profile_on``, where
    a build is kept only if it beats the subprogram's own torch ops)."""
    from tqdm.auto import tqdm

    choices = {}
    bar = tqdm(subprograms, desc="mirage: choosing µGraphs", unit="subprogram",
               disable=not options.progress or len(subprograms) == 0, leave=False)
    for s in bar:
        bar.set_postfix_str(s.name)
        choices[s.name] = choose(s.graph, options.search_settings, search=options.search,
                                 cache_dir=options.search_cache_dir, progress=options.progress,
                                 profile_on=profile_on, candidates=options.candidates,
                                 pytorch_runner=lambda s=s: torch_ops_runner(gm, s),
                                 # called with the inputs a kept build reads in place
                                 boundary_runner=functools.partial(boundary_runner, gm, s, "cuda"))
        c = choices[s.name]
        logger.info("mirage: %s (%d ops): µGraph from %s: %s", s.name, s.num_ops, c.source, c.detail)
    return choices


def profile_device(args: tuple, kwargs: dict, options: Options) -> str | None:
    """The GPU to profile candidates on: that of the first CUDA input, when kernels will run there."""
    if options.executor == "interpret" or not (options.search or options.candidates):
        return None
    for x in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor) and x.is_cuda:
            return torch.cuda.get_device_name(x.device)
    return None


def flat_runner(gm: fx.GraphModule):
    """A function of ``gm``'s flattened inputs that returns what ``gm`` returns, with no input
    flattening, hooks or guard checks, or None when ``gm`` does not flatten its inputs (no pytree
    codegen). Only for calls whose inputs are the flattened leaves already, checked by the caller."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None or info.out_spec is None:
        return None
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            graph.erase_node(node)
        elif node.op == "call_module" and isinstance(gm.get_submodule(node.target), SubprogramModule):
            with graph.inserting_before(node):  # its forward itself: no module call, no hooks
                direct = graph.call_function(gm.get_submodule(node.target).forward, node.args, node.kwargs)
            node.replace_all_uses_with(direct)
            graph.erase_node(node)
    forward = fx.GraphModule(gm, graph).forward
    out_spec = info.out_spec

    def run(*args):
        return torch.utils._pytree.tree_unflatten(list(forward(*args)), out_spec)

    return run


class MirageModule(nn.Module):
    """A superoptimized PyTorch program (inference only: outputs carry no gradients)."""

    def __init__(self, program: Any, options: Options) -> None:
        super().__init__()
        self.program = as_module(program)
        self.name = program_name(program)
        self.options = options
        # by (signature, autocast state): a capture under torch.autocast records its casts
        self._specializations: dict[tuple[Signature, tuple], Specialization] = {}
        self._first: Signature | None = None
        self._style: tuple[int, tuple[str, ...]] | None = None  # the first call's positions and keywords
        self._noticed: set[str] = set()
        # calls of positional tensors only, by (shape, dtype, device) of each: the specialization a call
        # of the same kind ran, so that a repeated call skips the pytree signature and its checks
        self._fast: dict[tuple, Specialization] = {}
        self._snapshot: Snapshot | None = None  # parameters, buffers, submodules, attributes as captured

    @property
    def specializations(self) -> list[Specialization]:
        return list(self._specializations.values())

    @property
    def partition(self) -> Partition:
        if not self._specializations:
            raise InputError(f"{self.name} has not been captured yet: call it once, or pass example_inputs")
        return self.specializations[-1].partition

    def report(self) -> str:
        return "\n\n".join(s.report() for s in self.specializations) or "not captured yet"

    def draw_partition(self, path: str, format: str | None = None) -> str:
        """Draw the partition of the latest specialization (.dot always; .png/.svg with Graphviz)."""
        from mirage.frontend.draw import render

        if not self._specializations:
            raise InputError(f"{self.name} has not been captured yet: call it once, or pass example_inputs")
        return render(self.specializations[-1].partition_dot(), path, format)

    def specialize(self, args: tuple, kwargs: dict) -> Specialization:
        """The specialization for a call of ``args`` and ``kwargs``: captured, partitioned and chosen
        now unless an earlier call made it. One capture runs at a time, in any thread: torch.export
        swaps fake tensors into the module it traces, which a second trace running beside it would
        read (a first call from several threads at once)."""
        with _CAPTURING:
            return self._specialize(args, kwargs)

    def _specialize(self, args: tuple, kwargs: dict) -> Specialization:
        if self._style is not None:
            args, kwargs = conform_call(self.program, self._style, args, kwargs)
        signature = signature_of(args, kwargs)
        if self._first is not None:
            check_call(self._first, signature, self.name)
        key = (signature, _autocast_state())
        if key in self._specializations:
            return self._specializations[key]
        seconds = {}
        start = time.perf_counter()
        gm = capture(self.program, args, kwargs, self.options.merge_products)
        self._snapshot = self._snapshot or Snapshot.of(self.program)
        seconds["capture"] = time.perf_counter() - start
        start = time.perf_counter()
        stateful = updates_state(gm)  # before stitching, which rewrites gm
        part = partition(gm, self.options.budget)
        seconds["partition"] = time.perf_counter() - start
        for notice in part.notices():
            if notice not in self._noticed:
                self._noticed.add(notice)
                logger.warning(notice)
        start = time.perf_counter()
        device = profile_device(args, kwargs, self.options)
        choices = choose_all(gm, part.subprograms, self.options, device)
        part, choices, split = self._split_fruitless(gm, part, choices, device)
        seconds["choose"] = time.perf_counter() - start
        # a subprogram whose search found nothing better than its reference graph keeps its torch ops:
        # the reference graph, op by op, is slower than PyTorch's own kernels
        replaced = tuple(s for s in part.subprograms if not runs_in_pytorch(choices[s.name], self.options))
        modules = {s.name: SubprogramModule(s, choices[s.name], self.options) for s in replaced}
        captured = gm.graph
        stitched = stitch(gm, replace(part, subprograms=replaced), modules)
        spec = Specialization(signature, stitched, captured, part, choices, seconds, split)
        if not replaced:  # no µGraph runs: PyTorch's own kernels, not the captured graph's decompositions
            spec.module = self.program
        if device is not None and replaced and self.options.whole_program_check:
            start = time.perf_counter()
            # a caller's graph copies in every replay, unless it reads the calls' copies
            copies = lambda: not self.options.reuse_copies_in_graphs and any(  # noqa: E731
                m.copies_constants for m in modules.values())
            spec.verdict = check(stitched, self.program, args, kwargs, copies) if not stateful else Verdict(
                OURS, {}, "whole program not timed: it updates its own buffers or parameters, which "
                          "timing would update thousands of times")
            spec.module = self.program if spec.verdict.pytorch else stitched
            spec.graph_module = self.program if spec.verdict.pytorch_in_graphs and not spec.verdict.pytorch \
                else None
            seconds["check"] = time.perf_counter() - start
        self._first = self._first or signature
        self._style = self._style or (len(args), tuple(kwargs))
        self._specializations[key] = spec
        logger.info("mirage: specialized %s for %s: %s", self.name, signature.describe(), part.summary())
        return spec

    def _split_fruitless(self, gm: fx.GraphModule, part: Partition, choices: dict[str, Choice],
                         device: str | None) -> tuple[Partition, dict[str, Choice], tuple[str, ...]]:
        """Split each subprogram whose search found nothing where ``partition.product_cuts`` says
        (before the products that start its next layer, else after its products; one of no product
        by size, ``partition.size_segments``), and search the parts; subprograms left as they were
        keep their choices.  With ``Options.split_rounds`` above 1, parts that are fruitless in turn
        split again (a projection, then its residual and norm), each round searching only its new
        parts; 0 splits nothing.  A split is kept only where it changes the partition; then also what
        the split subprograms' searches gave, one line each, for the report."""
        cuts: frozenset[str] = frozenset()
        segments: dict[str, tuple[str, int]] = {}
        notes: tuple[str, ...] = ()
        for _ in range(self.options.split_rounds):
            fruitless = [s for s in part.subprograms if runs_in_pytorch(choices[s.name], self.options)]
            wider = cuts.union(*(product_cuts(gm, s) for s in fruitless))
            sized = {**segments, **{n: k for s in fruitless for n, k in size_segments(gm, s).items()}}
            if wider == cuts and sized == segments:
                break
            split = partition(gm, self.options.budget, wider, sized)
            before = {s.nodes: choices[s.name] for s in part.subprograms}
            if {s.nodes for s in split.subprograms} == set(before):
                break
            logger.info("mirage: %s: splitting subprograms that no µGraph beat before %s", self.name,
                        ", ".join(sorted(wider - cuts)))
            cuts, segments = wider, sized
            kept = {s.nodes for s in split.subprograms}
            notes += tuple(f"{len(s.nodes)} torch ops ({', '.join(s.ops)}): {choices[s.name].detail}"
                           for s in fruitless if s.nodes not in kept)
            new = [s for s in split.subprograms if s.nodes not in before]
            fresh = choose_all(gm, new, self.options, device)
            part, choices = split, {s.name: before[s.nodes] if s.nodes in before else fresh[s.name]
                                    for s in split.subprograms}
        return part, choices, notes

    def forward(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # traced (torch.compile, torch.export): see _untraced
            return _untraced(self, args, kwargs)
        return self._forward(args, kwargs)

    def _forward(self, args: tuple, kwargs: dict):
        if self._snapshot is not None:
            self._check_state()
        key = None if kwargs else _tensor_key(args)
        spec = self._fast.get((key, _autocast_state())) if key is not None else None
        if spec is None:
            return self._call(args, kwargs, key)
        grad = torch.is_grad_enabled()
        if grad and any(x.requires_grad for x in args):
            self._refuse_grad()
        torch._C._set_grad_enabled(False)  # torch.no_grad() without the context object
        try:
            if self.options.cuda_graphs and graphs.graphable(args):
                if spec.graphed is None:
                    unfit = "it writes into its inputs" if updates_inputs(spec.captured) else None
                    spec.graphed = graphs.GraphedCall(spec.run_positional, self.name, unfit)
                return spec.graphed(args)
            return spec.run_positional(args)
        finally:
            torch._C._set_grad_enabled(grad)

    def _call(self, args: tuple, kwargs: dict, key: tuple | None):
        if self._style is not None:
            args, kwargs = conform_call(self.program, self._style, args, kwargs)
        signature = signature_of(args, kwargs)
        if self._first is not None:
            check_call(self._first, signature, self.name)
        if torch.is_grad_enabled():
            leaves = torch.utils._pytree.tree_leaves((args, kwargs))
            if any(isinstance(x, torch.Tensor) and x.requires_grad for x in leaves):
                self._refuse_grad()
        spec = self._specializations.get((signature, _autocast_state())) or self.specialize(args, kwargs)
        if key is not None and self._style == (len(args), ()):  # positional, as the first capture
            self._fast[(key, _autocast_state())] = spec
        module = spec.module
        if spec.graph_module is not None and graphs.recording_constants(torch.utils._pytree.tree_leaves(
                (args, kwargs))):
            module = spec.graph_module
        with torch.no_grad():
            return module(*args, **kwargs)

    def _check_state(self) -> None:
        """Forget every specialization when a parameter, buffer or submodule of the program was
        replaced or converted, or a plain attribute changed, since capture (``frontend.state``): the
        next call captures again."""
        why = self._snapshot.changed()
        if why is None:
            return
        logger.warning("mirage: %s: %s since it was captured; capturing it again", self.name, why)
        self._specializations.clear()
        self._fast.clear()
        self._first = self._style = self._snapshot = None

    def __getstate__(self) -> dict:
        """What pickling keeps (``torch.save(module)``, ``copy.deepcopy``): the program and the options.
        The specializations hold stitched graph modules that do not pickle; the module captures again
        at its first call, its µGraphs answered from the search cache."""
        state = dict(self.__dict__)
        state.update(_specializations={}, _fast={}, _first=None, _style=None, _snapshot=None)
        return state

    def _refuse_grad(self):
        raise InputGradError(
            f"an input of {self.name} requires grad, but mirage modules compute forward passes "
            "only: call it under torch.no_grad() or torch.inference_mode(), or pass x.detach()")


@torch.compiler.disable
def _untraced(module: MirageModule, args: tuple, kwargs: dict):
    """``module(*args, **kwargs)`` run as it is, outside the trace: torch.compile of a model that holds
    a superoptimized module breaks its graph there (the µGraphs run outside PyTorch's ops). torch.export
    cannot trace them at all: its fake tensors have no values to compute with."""
    traced = (torch._subclasses.FakeTensor, fx.Proxy)  # (torch.export's flag alone is global to threads)
    if any(isinstance(x, traced) for x in torch.utils._pytree.tree_leaves((args, kwargs))):
        raise CaptureError(
            f"{module.name} is a superoptimized module, which torch.export and other tracers cannot trace "
            "(its µGraphs run outside PyTorch's ops); trace the program it was made from "
            "(module.program) instead")
    return module._forward(args, kwargs)


def _autocast_state() -> tuple:
    """Whether torch.autocast is on, and in which dtype, for CUDA and the CPU: a program captured
    under it holds its casts, one captured outside it holds none, so each state has its own capture."""
    return tuple((torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                 if torch.is_autocast_enabled(device) else False for device in ("cuda", "cpu"))


def _tensor_key(args: tuple) -> tuple | None:
    """(shape, dtype, device) of each input when all are tensors (what a signature holds of them)."""
    if not all(isinstance(x, torch.Tensor) for x in args):
        return None
    return tuple((x.shape, x.dtype, x.device) for x in args)
