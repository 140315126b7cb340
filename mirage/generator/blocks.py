"""``GenNextBlockOp``: the block-level search under one block header (memoized per key).

The block-level search depends on the header only through the input tiles, the for-loop range and
the inputs' abstract expressions.  :func:`search_bodies` visits every block state reachable in
canonical order and collects, in pre-order, the *bodies* that can be closed: every sink is an
accumulated (``after_accum``) tensor other than an input, and there are at most
``max_block_outputs`` of them.  At each state closing is tried before adding ops, as in Mirage.

**Incremental candidates.**  In canonical order, the ops a child state may add without touching
its newest tensor are exactly the ops its parent could add after the one that made the child, and
their verdicts on shape and on the op-local rules are the same.  So every state passes its sorted
list of accepted candidates down: a child keeps the part after its own op and evaluates only the
candidates that use its newest tensor.  Rules that depend on the state (memory, lookahead, rules
registered by users) are applied per state.

**Visiting order** (``SearchSpace.guided_order``).  The candidates stay sorted in canonical order
(which the inheritance above needs); the children are *visited* in another order: first those that
recompute a value of the reference (``guide.py``), then the rest.  When no input recomputes
anything of the reference, the search deepens iteratively, shallowest bodies first.  Each body
found is handed to ``on_body`` at once (the caller closes it and searches on from it), so a large
block search need not end before its first bodies are used.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from mirage.generator.candidates import first_order, input_tuples, order_head
from mirage.generator.scalars import SCALAR_OPS, block_source, cuts
from mirage.generator.state import BlockState, Body, BodyList
from mirage.mugraph.graph import AccumKind, Level, Node, Ref, TensorType
from mirage.mugraph.ops import COMMUTATIVE, REGISTRY, UNARY, Op

if TYPE_CHECKING:
    from mirage.generator.explore import Explorer

# an accepted candidate: (order, op rank, inputs, output type, its id, term, bytes it adds)
Proposal = tuple


class Truncated(Exception):
    """The state cap was reached inside a block-level search."""


def search_bodies(
    explorer: Explorer,
    tiles: tuple[TensorType, ...],
    forloop_range: int,
    terms: tuple,
    cap: int | None,
    outputs: tuple[int, int] | None = None,
    values: tuple[int | None, ...] | None = None,
    on_body: Callable[[Body], int] | None = None,
) -> tuple[list[Body], int, bool]:
    """The closable bodies (with ``outputs[0]`` to ``outputs[1]`` outputs), the number of block states
    visited, and whether ``cap`` cut the search.

    ``values`` are the reference values of the inputs (``guide.py``; they order the children).
    ``on_body`` is called on each body as soon as it is found and returns the number of (kernel)
    states it visited: they count against ``cap`` as if they followed the body's state."""
    search = _BlockSearch(
        explorer, forloop_range, cap, outputs or (1, explorer.space.max_block_outputs), on_body
    )
    evaluator = explorer.context.evaluator
    root = BlockState(
        (),
        tiles,
        terms,
        (0,) * len(tiles),
        first_order(explorer.space.order == "complete"),
        sum(t.nbytes for t in tiles),
        len(tiles),
        tuple(evaluator.intern(t) for t in tiles),
        len(tiles),
        len(tiles),
        values if values is not None else (None,) * len(tiles),
    )
    try:
        search.run(root, sorted(search.proposals(root, None)))
    except Truncated:
        return search.bodies, search.count, True
    except Exception:  # a budget stop (time, interruption) inside: count the states visited
        explorer.stats.block_states += search.count
        explorer.stats.block_states_searched += search.count
        raise
    return search.bodies, search.count, False


def body_list(bodies: list[Body], states: int) -> BodyList:
    return BodyList(tuple(bodies), states)


def _in_place(choice) -> bool:
    """Mirage's shared-memory estimate counts unary ops and plain accumulators as in place."""
    return choice.op in UNARY or (choice.op is Op.ACCUM and choice.attrs.kind is AccumKind.NONE)


def _concat_matmul_tuples(types: tuple[TensorType, ...], newest_only: bool) -> list[tuple[int, ...]]:
    """Operands (W, X, Y, Z) of ``(W‖X) @ (Y‖Z)`` whose two products W@Y and X@Z fit (the other
    permutations fail the shape rule; listing only these saves trying thousands per state)."""
    pairs = [
        (a, b)
        for a, ta in enumerate(types)
        for b, tb in enumerate(types)
        if a != b and ta.rank == tb.rank >= 2 and ta.shape[-1] == tb.shape[-2]
    ]
    newest = len(types) - 1
    found = [
        (w, x, y, z)
        for w, y in pairs
        for x, z in pairs
        if len({w, x, y, z}) == 4 and (not newest_only or newest in (w, x, y, z))
    ]
    return sorted(found)


def _visit_order(count: int, first: dict[int, int]) -> Iterable[int]:
    """Indices of the children in visiting order: ``first`` (in canonical order), then the rest."""
    if not first:
        return range(count)
    ahead = sorted(first)
    return itertools.chain(ahead, (k for k in range(count) if k not in first))


@functools.cache
def _containing(num_tensors: int, arity: int) -> tuple[tuple[int, ...], ...]:
    newest = num_tensors - 1
    return tuple(t for t in input_tuples(num_tensors, arity) if newest in t)


@functools.cache
def _keyed(num_tensors: int, arity: int, containing: bool, complete: bool
           ) -> tuple[tuple[tuple[int, ...], tuple], ...]:
    """The operand tuples (all, or those that read the newest tensor) with the part of their
    canonical key that does not depend on the op (``candidates.order_head``), computed once."""
    tuples = _containing(num_tensors, arity) if containing else input_tuples(num_tensors, arity)
    return tuple((t, order_head(complete, t)) for t in tuples)


@functools.cache
def _newest_keyed(num_tensors: int, arity: int, commutative: bool
                  ) -> tuple[tuple[tuple[tuple[int, ...], tuple], ...], int]:
    """The complete order's tuples that read the newest tensor, without those a commutative op takes
    in the other order, and how many those are.  Every one sorts after the key of the op that made
    the newest tensor (its head starts with that tensor, which that op did not read), so none is
    cut by the canonical order."""
    keyed = _keyed(num_tensors, arity, True, True)
    kept = tuple((t, h) for t, h in keyed if not (commutative and t[0] > t[1]))
    return kept, len(keyed) - len(kept)


class _BlockSearch:
    def __init__(
        self,
        explorer: Explorer,
        forloop_range: int,
        cap: int | None,
        outputs: tuple[int, int],
        on_body: Callable[[Body], int] | None = None,
    ) -> None:
        self.least_outputs, self.most_outputs = outputs
        self.explorer = explorer
        self.space = explorer.space
        self.forloop_range = forloop_range
        self.cap = cap
        self.count = 0
        self.extra = 0  # states visited by ``on_body`` (they follow their body's state)
        self.on_body = on_body
        self.bodies: list[Body] = []
        self.guide = explorer.block_guide  # None: children in canonical order
        self.limit = self.space.max_block_ops  # tensors (inputs included) of the deepest states
        self.shallowest = 0  # report the bodies of states with at least this many tensors
        self.deeper = False  # a state at ``limit`` has children
        rules = explorer.rules
        self.order = rules.enabled("canonical_order")
        self.memory = rules.enabled("memory")
        self.lookahead = rules.enabled("block_lookahead")
        self.extra_rules = bool(rules.extra_at[Level.BLOCK])
        self.complete = self.space.order == "complete"
        # with the complete order, a commutative op may take its operands in one order only
        commutative = self.complete and rules.enabled("commutative_operands")
        self.choices = [
            (
                rank,
                choice,
                REGISTRY[choice.op].arity or 1,
                _in_place(choice),
                commutative and choice.op in COMMUTATIVE,
            )
            for rank, choice in enumerate(self.space.block_ops)
        ]
        self.arity = max((c[2] for c in self.choices), default=1)

    def run(self, root: BlockState, proposals: list[Proposal]) -> None:
        """Depth first; with the guide on and nothing of the reference among the inputs (the
        guide cannot order anything), shallowest bodies first: iterative deepening on the number
        of ops, each pass reporting the bodies one op deeper than the last."""
        if self.guide is None or any(v is not None for v in root.values):
            self.visit(root, proposals, 0)
            return
        for limit in range(len(root.types), self.space.max_block_ops + 1):
            self.limit, self.shallowest, self.deeper = limit, limit, False
            self.visit(root, proposals, 0)
            if not self.deeper:
                return

    def visit(self, state: BlockState, proposals: list[Proposal], depth: int) -> None:
        if self.cap is not None and self.count + self.extra >= self.cap:
            raise Truncated
        position = self.count
        self.count += 1
        explorer = self.explorer
        explorer.stats.states_per_depth[f"block:{depth}"] += 1
        explorer.tick()
        sinks = self._closable(state) if len(state.types) >= self.shallowest else None
        if sinks is not None:
            body = Body(state.nodes, sinks, tuple(state.terms[i] for i in sinks), position)
            self.bodies.append(body)
            if self.on_body is not None:
                self.extra += self.on_body(body)
        if len(state.types) >= self.limit:
            self.deeper = self.deeper or (bool(proposals) and self.limit < self.space.max_block_ops)
            return
        pruned = explorer.stats.pruned
        if self.memory:
            limit, before = self.space.shared_memory_bytes, len(proposals)
            proposals = [p for p in proposals if state.memory_bytes + p[6] <= limit]
            pruned["memory"] += before - len(proposals)
        first = {} if self.guide is None else self.guide.first(state.values, proposals, self.complete)
        chained = explorer.chained_scalars
        for k in _visit_order(len(proposals), first):
            order, rank, inputs, out, out_id, term, nbytes = proposals[k]
            op = self.space.block_ops[rank].op
            if op in SCALAR_OPS and cuts(op, block_source(state.nodes, inputs[0], op, state.num_inputs),
                                         chained):
                pruned["scalar_chain"] += 1
                continue
            if self.extra_rules:
                failed = explorer.extra_verdict(
                    self.space.block_ops[rank],
                    rank,
                    inputs,
                    state.types,
                    term,
                    state.last,
                    state.memory_bytes,
                    self.forloop_range,
                )
                if failed is not None:
                    pruned[failed] += 1
                    continue
            uses = list(state.uses)
            sink_count, open_sinks = state.sink_count + 1, state.open_count + (not out.after_accum)
            for i in set(inputs):
                if not uses[i]:
                    sink_count -= 1
                    open_sinks -= i < state.num_inputs or not state.types[i].after_accum
            for i in inputs:
                uses[i] += 1
            uses.append(0)
            types = state.types + (out,)
            if self.lookahead and not self._can_close(len(types), sink_count, open_sinks):
                pruned["block_lookahead"] += 1
                continue
            choice = self.space.block_ops[rank]
            node = Node(choice.op, tuple(Ref(i, 0) for i in inputs), choice.attrs, (out,))
            child = BlockState(
                state.nodes + (node,),
                types,
                state.terms + (term,),
                tuple(uses),
                order,
                state.memory_bytes + nbytes,
                state.num_inputs,
                state.type_ids + (out_id,),
                sink_count,
                open_sinks,
                state.values + (first.get(k),),
            )
            inherited = proposals[k + 1 :] if self.order else proposals
            self.visit(child, sorted(inherited + self.proposals(child, order)), depth + 1)

    def proposals(self, state: BlockState, made_by) -> list[Proposal]:
        """Accepted candidates of ``state`` that use its newest tensor (all of them at the root)."""
        explorer = self.explorer
        pruned = explorer.stats.pruned
        evaluator = explorer.context.evaluator
        cache_get, evaluate = evaluator.cache_get, evaluator.evaluate
        type_ids, terms, last, loop = state.type_ids, state.terms, state.last, self.forloop_range
        term_ids = [id(t) for t in terms]
        count = len(type_ids)
        found = []
        skipped = swapped = 0
        complete = self.complete
        ordered = self.order
        for rank, choice, arity, in_place, commutative in self.choices:
            keyed: Sequence[tuple[tuple[int, ...], tuple]]
            checked = True  # whether the order and operand-order checks can cut a tuple
            if choice.op is Op.CONCAT_MATMUL:
                keyed = [(t, order_head(complete, t))
                         for t in _concat_matmul_tuples(state.types, made_by is not None)]
            elif complete and made_by is not None:
                keyed, cut = _newest_keyed(count, arity, commutative)
                swapped += cut
                checked = False
            else:
                keyed = _keyed(count, arity, made_by is not None, complete)
            for inputs, head in keyed:
                # candidates.key_from_head, inlined: this loop runs millions of times a search
                order = (head, rank, inputs) if complete else (head, rank)
                if checked:
                    if ordered and order <= last:
                        skipped += 1
                        continue
                    if commutative and inputs[0] > inputs[1]:
                        swapped += 1
                        continue
                if arity == 1:
                    (a,) = inputs
                    hit = cache_get((loop, rank, type_ids[a], term_ids[a]))
                elif arity == 2:
                    a, b = inputs
                    hit = cache_get((loop, rank, type_ids[a], type_ids[b], term_ids[a], term_ids[b]))
                else:
                    hit = None
                if hit is None:
                    hit = evaluate(
                        loop, rank, choice, [type_ids[i] for i in inputs], [terms[i] for i in inputs]
                    )
                failed = hit[0]
                if failed is not None:
                    pruned[failed] += 1
                    continue
                found.append((order, rank, inputs, hit[1], hit[2], hit[3], 0 if in_place else hit[4]))
        pruned["canonical_order"] += skipped
        pruned["commutative_operands"] += swapped
        return found

    def _closable(self, state: BlockState) -> tuple[int, ...] | None:
        """The sinks, if every one is an accumulated non-input and there are not too many."""
        if state.open_count or not self.least_outputs <= state.sink_count <= self.most_outputs:
            return None
        return tuple(state.sinks())

    def _can_close(self, tensors: int, sinks: int, open_sinks: int) -> bool:
        """Can every sink still become an accumulated output within the op budget?  Each op
        consumes at most ``arity`` open sinks and removes at most ``arity - 1`` sinks."""
        left = self.space.max_block_ops - tensors
        if open_sinks > left * self.arity:
            return False
        return sinks - left * (self.arity - 1) <= self.most_outputs
