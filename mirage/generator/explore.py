"""Depth-first enumeration of µGraphs (the paper's Algorithm 1) over one subtree of the search.

:class:`Explorer` runs ``GenNextKernelOp``: at every kernel-level state it first checks whether the
state is a complete, verified µGraph (then records it and does not extend it), then tries the
pre-defined kernel ops, then graph-defined ops: an input set, a block header (grid, block dims,
input maps, for-loop dims and range), and the block-level search (``blocks.py``), whose closable
bodies are closed with each output map into a graph-defined op.

Every op is added in canonical order and passes the pruning rules first (``checks.py``).

The block-level search under a header is memoized on (tiles, for-loop range, input terms), so the
thousands of headers that share tiles search their block ops once.  State counts stay *logical*:
a memoized search counts the states it visited, so the numbers (and state budgets) do not depend
on what a worker process had cached.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mirage.errors import GraphError
from mirage.generator import abstract_expr as ae
from mirage.generator import scalars
from mirage.generator.blocks import body_list, search_bodies
from mirage.generator.budget import StopReason
from mirage.generator.candidates import (
    block_headers,
    first_order,
    input_sets,
    input_tuples,
    mirage_order,
    ops_after,
    order_key,
    output_maps,
)
from mirage.generator.checks import SearchRules
from mirage.generator.evaluate import KERNEL, OpEvaluator
from mirage.generator.guide import ReferenceGuide
from mirage.generator.pruning import Candidate
from mirage.generator.space import OpChoice, SearchSpace
from mirage.generator.state import BlockHeader, Body, KernelState
from mirage.generator.tiling import DimClasses
from mirage.generator.verification import CandidateChecker
from mirage.mugraph import build
from mirage.mugraph.graph import BlockGraph, InputIterator, KernelGraph, Level, Node, Ref, TensorType
from mirage.mugraph.ops import COMMUTATIVE, REGISTRY, Op

logger = logging.getLogger(__name__)

_CHECK_EVERY = 256  # states between clock checks


class StopSearch(Exception):
    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass
class SearchContext:
    """What every worker needs, built once per search (picklable; caches stay in their process)."""

    reference: KernelGraph
    space: SearchSpace
    rules: SearchRules
    checker: CandidateChecker
    started_at: float  # time.time() at the start of the search
    stop_when: Callable[[KernelGraph], bool] | None = None  # picklable for worker processes
    keep_when: Callable[[KernelGraph], bool] | None = None  # likewise: which candidates to verify
    max_results: int | None = None  # the search's result budget: a unit that found as many stops
    memo: dict = field(default_factory=dict, repr=False)
    memo_limit: int = 20_000
    _evaluator: OpEvaluator | None = field(default=None, repr=False)
    _guide: ReferenceGuide | None = field(default=None, repr=False)
    _tiling: DimClasses | None = field(default=None, repr=False)

    def __getstate__(self):
        return {**self.__dict__, "memo": {}, "_evaluator": None, "_guide": None, "_tiling": None}

    @property
    def guide(self) -> ReferenceGuide:
        if self._guide is None:
            self._guide = ReferenceGuide.of(self.reference)
        return self._guide

    @property
    def tiling(self) -> DimClasses:
        if self._tiling is None:
            self._tiling = DimClasses.of(self.reference)
        return self._tiling

    @property
    def evaluator(self) -> OpEvaluator:
        if self._evaluator is None:
            self._evaluator = OpEvaluator(self.rules, self.space.reduction_dimx)
        return self._evaluator


@dataclass(frozen=True)
class Found:
    graph: KernelGraph
    position: int  # logical state index within its work unit
    elapsed_s: float  # seconds since the search started


@dataclass
class UnitStats:
    kernel_states: int = 0
    block_states: int = 0  # logical (memoized searches counted as if repeated)
    block_states_searched: int = 0  # actually visited by this process
    states_per_depth: Counter = field(default_factory=Counter)  # "kernel:1", "block:3", ...
    pruned: Counter = field(default_factory=Counter)
    verify_calls: int = 0
    verify_s: float = 0.0
    seconds: float = 0.0


def root_state(reference: KernelGraph, complete_order: bool = True) -> KernelState:
    """The kernel graph of the reference's inputs only."""
    nodes = tuple(reference.nodes[i] for i in reference.input_nodes)
    count = len(nodes)
    return KernelState(
        KernelGraph(nodes, (), reference.name),
        tuple(Ref(i, 0) for i in range(count)),
        tuple(ae.variable(i) for i in range(count)),
        (0,) * count,
        first_order(complete_order),
        0,
        sum(n.outputs[0].nbytes for n in nodes),
        values=tuple(reference.input_nodes),
    )


class Explorer:
    """Runs the depth-first search below one state; collects verified µGraphs and statistics."""

    def __init__(
        self,
        context: SearchContext,
        deadline: float | None = None,
        state_cap: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.context = context
        self.space: SearchSpace = context.space
        self.rules = context.rules
        self.deadline = deadline
        # when set (the root's listing of work units): past it, _headers yields what it has listed
        # and stops, and listing_truncated says so
        self.listing_deadline: float | None = None
        self.listing_truncated = False
        self.state_cap = state_cap
        self.progress = progress
        self.position = 0
        self.stats = UnitStats()
        self.found: list[Found] = []
        self._ticks = 0
        self._outputs = len(context.reference.outputs)
        self._output_types = sorted((t.shape, t.dtype.value) for t in context.reference.output_types)
        self._kernel_arity = max((REGISTRY[c.op].arity or 1 for c in self.space.kernel_ops), default=1)
        self._customized_rank = len(self.space.kernel_ops)
        self._order = self.rules.enabled("canonical_order")
        self._memory = self.rules.enabled("memory")
        self._kernel_lookahead = self.rules.enabled("kernel_lookahead")
        self._complete = self.space.order == "complete"
        self._commutative = self.rules.enabled("commutative_operands")
        self.chained_scalars = scalars.chained_scalars(context.reference) if self.rules.enabled(
            "scalar_chain") else scalars.SCALAR_OPS
        guide = context.guide
        self.block_guide = guide.for_ops(self.space.block_ops) if self.space.guided_order else None

    # ---- bookkeeping ------------------------------------------------------------------------------

    def visit(self, level: str, depth: int) -> None:
        if self.state_cap is not None and self.position >= self.state_cap:
            raise StopSearch(StopReason.STATES)
        self.position += 1
        self.stats.states_per_depth[f"{level}:{depth}"] += 1
        self.tick()

    def tick(self) -> None:
        self._ticks += 1
        if self._ticks % _CHECK_EVERY == 0:
            if self.progress is not None:
                self.progress(_CHECK_EVERY)
            self.check_deadline()

    def check_deadline(self) -> None:
        if self.deadline is not None and time.time() > self.deadline:
            raise StopSearch(StopReason.TIME)

    def extra_verdict(
        self,
        choice: OpChoice,
        rank: int,
        inputs: tuple[int, ...],
        types: tuple[TensorType, ...],
        term,
        last: tuple,
        memory: int,
        forloop_range: int,
    ) -> str | None:
        """The table's other rules (registered by users), on a full candidate."""
        level = Level.KERNEL if forloop_range == KERNEL else Level.BLOCK
        candidate = Candidate(
            level,
            choice.op,
            choice.attrs,
            inputs,
            tuple(types[i] for i in inputs),
            term,
            rank,
            mirage_order(self._complete, last),
            memory,
            max(forloop_range, 1),
            self.space.reduction_dimx,
        )
        return self.rules.extra_verdict(candidate)

    # ---- kernel level -----------------------------------------------------------------------------

    def run_kernel(self, state: KernelState, depth: int = 0) -> None:
        """Visit ``state`` and its whole subtree."""
        self.visit("kernel", depth)
        self.stats.kernel_states += 1
        if self.verify(state):
            return
        for kind, child in self.children(state):
            if kind == "kernel":
                self.run_kernel(child, depth + 1)  # type: ignore[arg-type]
            else:
                self.run_header(state, child, depth + 1)  # type: ignore[arg-type]

    def children(self, state: KernelState) -> Iterator[tuple[str, KernelState | BlockHeader]]:
        """Pre-defined-op children, then graph-defined-op headers, in search order."""
        if len(state.graph.nodes) >= self.space.max_kernel_ops:
            return
        if not state.type_ids:
            evaluator = self.context.evaluator
            state = dataclasses.replace(state, type_ids=tuple(evaluator.intern(t) for t in state.types))
        headers = state.graph_defined < self.space.max_graph_defined
        if headers and self.space.graph_defined_first:
            yield from (("header", h) for h in self._headers(state))
        for child in self._kernel_op_children(state):
            yield "kernel", child
        if headers and not self.space.graph_defined_first:
            yield from (("header", h) for h in self._headers(state))

    def _typed_like_outputs(self, state: KernelState, sinks: list[int]) -> bool:
        types = [state.graph.type_of(state.tensors[i]) for i in sinks]
        return sorted((t.shape, t.dtype.value) for t in types) == self._output_types

    def verify(self, state: KernelState) -> bool:
        sinks = state.sinks()
        if len(sinks) != self._outputs or not self._typed_like_outputs(state, sinks):
            return False
        if not self.rules.outputs_match_target([state.terms[i] for i in sinks]):
            self.stats.pruned["output_expression"] += 1
            return False
        keep = self.context.keep_when
        if keep is not None:
            outputs = tuple(state.tensors[i] for i in sinks)
            if not keep(dataclasses.replace(state.graph, outputs=outputs)):
                self.stats.pruned["keep_when"] += 1
                return False
        if self.deadline is not None and time.time() > self.deadline:
            raise StopSearch(StopReason.TIME)  # a verification can take seconds: none starts late
        start = time.perf_counter()
        matched = self.context.checker.match(state.graph, [state.tensors[i] for i in sinks])
        self.stats.verify_s += time.perf_counter() - start
        self.stats.verify_calls += 1
        if matched is None:
            return False
        graph = dataclasses.replace(state.graph, outputs=matched)
        self.found.append(Found(graph, self.position, time.time() - self.context.started_at))
        logger.debug("verified µGraph at state %d:\n%s", self.position, graph)
        if self.context.stop_when is not None and self.context.stop_when(graph):
            raise StopSearch(StopReason.TARGET)
        if self.context.max_results is not None and len(self.found) >= self.context.max_results:
            # units are committed in order, so these fill the budget whatever earlier units find: the
            # rest of this unit could not be committed
            raise StopSearch(StopReason.RESULTS)
        return True

    def _lookahead_ok(self, sinks: int, ops_left: int, graph_defined_left: int) -> bool:
        """Can the graph still end with exactly as many sinks as the reference has outputs?"""
        if not self._kernel_lookahead or graph_defined_left > 0:
            return True
        return sinks - ops_left * (self._kernel_arity - 1) <= self._outputs <= sinks + ops_left

    def _kernel_op_children(self, state: KernelState) -> Iterator[KernelState]:
        pruned = self.stats.pruned
        evaluator = self.context.evaluator
        type_ids, terms = state.type_ids, state.terms
        values = state.values or (None,) * len(terms)
        ops_left = self.space.max_kernel_ops - len(state.graph.nodes) - 1
        graph_defined_left = self.space.max_graph_defined - state.graph_defined
        for rank, choice in enumerate(self.space.kernel_ops):
            every = input_tuples(len(type_ids), REGISTRY[choice.op].arity or 1)
            tuples = ops_after(self._complete, every, state.last, rank) if self._order else every
            pruned["canonical_order"] += len(every) - len(tuples)
            if self._complete and choice.op in COMMUTATIVE and self._commutative:
                before = len(tuples)
                tuples = tuple(t for t in tuples if t[0] <= t[1])
                pruned["commutative_operands"] += before - len(tuples)
            for inputs in tuples:
                failed, out, out_id, term, nbytes, _ = evaluator.evaluate(
                    KERNEL, rank, choice, [type_ids[i] for i in inputs], [terms[i] for i in inputs]
                )
                if failed is not None:
                    pruned[failed] += 1
                    continue
                memory = state.memory_bytes + nbytes
                if self._memory and memory > self.space.device_memory_bytes:
                    pruned["memory"] += 1
                    continue
                if choice.op in scalars.SCALAR_OPS and scalars.cuts(
                        choice.op, scalars.kernel_source(state.graph, state.tensors[inputs[0]], choice.op),
                        self.chained_scalars):
                    pruned["scalar_chain"] += 1
                    continue
                if self.rules.extra_at[Level.KERNEL]:
                    failed = self.extra_verdict(
                        choice, rank, inputs, state.types, term, state.last, state.memory_bytes, KERNEL
                    )
                    if failed is not None:
                        pruned[failed] += 1
                        continue
                uses = list(state.uses)
                for i in inputs:
                    uses[i] += 1
                uses.append(0)
                if not self._lookahead_ok(uses.count(0), ops_left, graph_defined_left):
                    pruned["kernel_lookahead"] += 1
                    continue
                graph, index = build.append(
                    state.graph, choice.op, tuple(state.tensors[i] for i in inputs), choice.attrs, (out,)
                )
                value = self.context.guide.value(choice, [values[i] for i in inputs])
                yield KernelState(
                    graph,
                    state.tensors + (Ref(index, 0),),
                    terms + (term,),
                    tuple(uses),
                    order_key(self._complete, inputs, rank),
                    state.graph_defined,
                    memory,
                    type_ids + (out_id,),
                    values + (None if value in values else value,),
                )

    def _headers(self, state: KernelState) -> Iterator[BlockHeader]:
        """Every header of every input set; with the guided order, those whose tiling fits the
        reference's dim classes first (``tiling.py``), each group in canonical order."""
        guided = self.space.guided_order
        later: list[BlockHeader] = []
        for count, header in enumerate(self._all_headers(state)):
            if count % _CHECK_EVERY == 0:  # many inputs make many headers: the listing keeps the budget too
                self.check_deadline()
                if self.listing_deadline is not None and time.time() > self.listing_deadline:
                    self.listing_truncated = True
                    break
            if not guided or self._fits(state, header):
                yield header
            else:
                later.append(header)
        yield from later

    def _all_headers(self, state: KernelState) -> Iterator[BlockHeader]:
        pruned = self.stats.pruned
        types = state.types
        ops_left = self.space.max_kernel_ops - len(state.graph.nodes) - 1
        graph_defined_left = self.space.max_graph_defined - state.graph_defined - 1
        sinks = set(state.sinks())
        sets = input_sets(len(types))
        if self.space.guided_order:  # sets of unconsumed tensors first: a µGraph must consume them
            sets = tuple(sorted(sets, key=lambda inputs: sum(i not in sinks for i in inputs)))
        for inputs in sets:
            if self._order and order_key(self._complete, inputs, self._customized_rank) <= state.last:
                pruned["canonical_order"] += 1
                continue
            # after the op, the consumed sinks are gone and it adds 1 to max_block_outputs sinks
            remaining = len(sinks - set(inputs))
            counts = [
                k
                for k in range(1, self.space.max_block_outputs + 1)
                if self._lookahead_ok(remaining + k, ops_left, graph_defined_left)
            ]
            if not counts:
                pruned["kernel_lookahead"] += 1
                continue
            final = ops_left == 0 and graph_defined_left == 0
            rejected = [0, 0]
            values = state.values or (None,) * len(state.terms)
            known = [values[i] for i in inputs]
            yield from block_headers(
                inputs, [types[i] for i in inputs], self.space, rejected, (min(counts), max(counts)), final,
                lambda imaps, spans, known=known: self._uneven_fits(known, imaps, spans),
            )
            pruned["input_maps"] += rejected[0]
            if rejected[1]:
                pruned["uneven_grids"] += rejected[1]

    # ---- graph-defined ops ------------------------------------------------------------------------

    def run_header(self, state: KernelState, header: BlockHeader, depth: int) -> None:
        """The block-level search under one header, and the kernel subtrees of its closed graphs.

        Each closable body is closed as soon as the block search finds it (its kernel subtree is
        searched before the block search goes on), except, under ``complete_first``, a body whose
        closed states need more kernels where the header fits the reference's tiling or an output
        has a reference output's type (:meth:`_needs_more`): bodies that complete the µGraph come
        first, and the waiting subtrees follow the block search's end, in the order found.  A
        finished block search is memoized, and a memoized one replays its bodies.  Either way the states are
        numbered alike: a body's kernel subtree follows the body's block state, or the block
        search's last state and the waiting subtrees before it."""
        values = state.values or (None,) * len(state.terms)
        inputs_values = tuple(values[i] for i in header.inputs)
        key = (
            header.tiles,
            header.forloop_range,
            tuple(state.terms[i] for i in header.inputs),
            header.outputs,
            inputs_values if self.block_guide is not None else None,
        )
        base = self.position
        cap = None if self.state_cap is None else self.state_cap - base
        final_check = header.final and self.rules.enabled("output_expression")
        extra = 0
        deferred: list[list[KernelState]] = []  # closed bodies that wait for the block search's end
        wait = not header.final and self.space.complete_first
        fits = wait and self._fits(state, header)

        def run(children: list[KernelState]) -> int:
            nonlocal extra
            before = self.position
            for child in children:
                self.run_kernel(child, depth + 1)
            extra += self.position - before
            return self.position - before

        def close(body: Body) -> int:
            """Search the kernel subtrees of ``body`` (now, or once the block search has ended); the
            number of states they visited now."""
            if final_check and not self.rules.outputs_match_target(body.terms):
                self.stats.pruned["output_expression"] += 1  # the outputs of the µGraph: must match
                return 0
            children = list(self._close(state, header, body))
            if wait and self._needs_more(children, len(state.tensors), fits):
                deferred.append(children)
                return 0
            self.position = base + body.position + 1 + extra
            return run(children)

        memo = self.context.memo
        cached = memo.get(key)
        if cached is not None:
            states, truncated = cached.states, False
            bodies = cached.bodies
            if cap is not None and cached.states > cap:
                bodies, states, truncated = tuple(b for b in bodies if b.position < cap), cap, True
            for body in bodies:
                close(body)
        else:
            tiles, forloop_range, terms = key[:3]
            found, states, truncated = search_bodies(
                self, tiles, forloop_range, terms, cap, header.outputs, inputs_values, close
            )
            self.stats.block_states_searched += states
            if not truncated:
                if len(memo) >= self.context.memo_limit:
                    memo.clear()
                memo[key] = body_list(found, states)
        self.stats.block_states += states
        self.position = base + states + extra
        if truncated:
            raise StopSearch(StopReason.STATES)
        for children in deferred:
            self.position = base + states + extra
            run(children)
        self.position = base + states + extra

    def _fits(self, state: KernelState, header: BlockHeader) -> bool:
        """Whether ``header`` tiles the reference as one kernel can (``tiling.py``)."""
        values = state.values or (None,) * len(state.terms)
        return not self.context.tiling.misfits([values[i] for i in header.inputs], header.input_maps,
                                               header.forloop_dims, header.grid_dim, header.forloop_range)

    def _uneven_fits(self, values: list, input_maps: tuple, spans: tuple) -> bool:
        """Whether each uneven grid axis (``spans``) of input maps over inputs of these reference values
        splits a dim that indexes the reference's outputs and that it never reduces (``tiling.py``):
        only there do the blocks' overlapping tiles agree."""
        tiling = self.context.tiling
        return all(tiling.axis_fits(values, input_maps, axis) for axis in range(3) if spans[axis])

    def _needs_more(self, children: list[KernelState], first_new: int, fits: bool) -> bool:
        """Whether a closed body's states need more kernels although a body of the same header may
        complete the µGraph in one kernel fewer: the header tiles the reference as one kernel can
        (``fits``), or one of the body's outputs has the type of a reference output.  The search
        visits the complete bodies first (``SearchSpace.complete_first``)."""
        for child in children:
            sinks = child.sinks()
            if (len(sinks) == self._outputs and self._typed_like_outputs(child, sinks)
                    and self.rules.outputs_match_target([child.terms[i] for i in sinks])):
                return False
        if fits:
            return True
        wanted = {shape for shape, _ in self._output_types}
        return any(t.shape in wanted for child in children for t in child.types[first_new:])

    def _close(self, state: KernelState, header: BlockHeader, body: Body) -> Iterator[KernelState]:
        """The kernel states made by closing ``body`` under ``header`` with each output map."""
        types = state.types
        inputs = tuple(
            Node(Op.INPUT, (), InputIterator(types[k], imap, fmap), (tile,))
            for k, imap, fmap, tile in zip(
                header.inputs, header.input_maps, header.forloop_dims, header.tiles, strict=True
            )
        )
        block = BlockGraph(
            inputs + body.nodes,
            header.grid_dim,
            header.block_dim,
            header.forloop_range,
            self.space.reduction_dimx,
            header.spans,
        )
        evaluator = self.context.evaluator
        for omap in output_maps(header.grid_dim, self.space):
            graph = block
            try:
                for sink in body.sinks:
                    graph, _ = build.add_output_saver(graph, Ref(sink, 0), omap)
                operands = tuple(state.tensors[k] for k in header.inputs)
                kernel, index = build.add_customized(state.graph, operands, graph)
            except GraphError:
                self.stats.pruned["output_maps"] += 1
                continue
            outputs = kernel.nodes[index].outputs
            memory = state.memory_bytes + sum(t.nbytes for t in outputs)
            if self._memory and memory > self.space.device_memory_bytes:
                self.stats.pruned["memory"] += 1
                continue
            uses = list(state.uses)
            for k in header.inputs:
                uses[k] += 1
            uses += [0] * len(outputs)
            type_ids = tuple(evaluator.intern(t) for t in types + outputs)
            yield KernelState(
                kernel,
                state.tensors + tuple(Ref(index, j) for j in range(len(outputs))),
                state.terms + body.terms,
                tuple(uses),
                order_key(self._complete, header.inputs, self._customized_rank),
                state.graph_defined + 1,
                memory,
                type_ids,
                (state.values or (None,) * len(state.terms)) + (None,) * len(outputs),
            )
