"""Operator scheduling by depth, with barriers only between depths (mirage-notes §5.2).

Every node of a block graph runs in one *phase*:

* ``PRE_LOOP``: input iterators without a for-loop dim (loaded once) and ops that depend only on
  them (loop-invariant work is hoisted out of the loop);
* ``LOOP``: input iterators with a for-loop dim, the ops that depend on them, accumulators and
  running maxima (updated every iteration);
* ``POST_LOOP``: ops after the accumulators, accumulator finalization (register write-back, mean and
  rms scaling) and output savers.

Within a phase a node's *depth* is the longest path to it from the phase's sources (values of an
earlier phase count as ready); a node applied as the *epilogue* of its producer (it reads the
producer's result in registers, :mod:`mirage.optimizer.registers`) takes the producer's depth.
The schedule lists the steps by (phase, depth, epilogue chain) and puts one ``__syncthreads()``
between consecutive depths, one after the pre-loop phase and one at the end of every iteration —
the fewest barriers that keep every shared-memory read after the write it depends on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mirage.mugraph.graph import AccumKind, BlockGraph
from mirage.mugraph.ops import FORLOOP_STATEFUL, Op

if TYPE_CHECKING:
    from mirage.optimizer.registers import RegisterPlan


class Phase(enum.IntEnum):
    PRE_LOOP = 0
    LOOP = 1
    POST_LOOP = 2


class Action(enum.Enum):
    LOAD = "load"  # input iterator: device → shared memory
    COMPUTE = "compute"  # a block op
    ACCUMULATE = "accumulate"  # accumulator or running max update (every iteration)
    FINALIZE = "finalize"  # accumulator after the loop: register write-back, mean/rms scaling
    STORE = "store"  # output saver: shared → device memory


@dataclass(frozen=True)
class Step:
    node: int
    phase: Phase
    depth: int
    action: Action
    epilogue_of: int | None = None  # runs inside this producer's step, on its registers
    prologue_of: int | None = None  # runs inside this reduction's step, on each element it reads


@dataclass(frozen=True)
class Barrier:
    phase: Phase
    reason: str


@dataclass(frozen=True)
class Schedule:
    """Steps and barriers in execution order; the LOOP part repeats ``forloop_range`` times."""

    items: tuple[Step | Barrier, ...]
    forloop_range: int = 1
    depths: tuple[tuple[int, Phase, int], ...] = field(default=())  # (node, phase, depth) of every node

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(i for i in self.items if isinstance(i, Step))

    @property
    def barrier_positions(self) -> tuple[int, ...]:
        """Indices in ``items`` of the barriers."""
        return tuple(k for k, i in enumerate(self.items) if isinstance(i, Barrier))

    def phase_items(self, phase: Phase) -> tuple[Step | Barrier, ...]:
        return tuple(i for i in self.items if i.phase is phase)

    def levels(self, phase: Phase) -> tuple[tuple[int, ...], ...]:
        """Node indices per depth of ``phase`` (steps between two barriers)."""
        out: list[list[int]] = [[]]
        for item in self.phase_items(phase):
            if isinstance(item, Barrier):
                out.append([])
            else:
                out[-1].append(item.node)
        return tuple(tuple(level) for level in out if level)

    def barriers_executed(self) -> int:
        """``__syncthreads()`` calls one block makes."""
        count = {p: sum(isinstance(i, Barrier) for i in self.phase_items(p)) for p in Phase}
        return count[Phase.PRE_LOOP] + self.forloop_range * count[Phase.LOOP] + count[Phase.POST_LOOP]


def phases(graph: BlockGraph, hoist_invariants: bool = True) -> list[Phase]:
    """The phase of every node (see the module docstring).

    A for-loop of one iteration has nothing to hoist out of: its ops stay in the loop phase, where
    they can run as the epilogues of each other and of the accumulators (the pre-loop phase would
    separate them by a phase boundary, a barrier and a round trip through shared memory).
    """
    hoist_invariants = hoist_invariants and graph.forloop_range > 1
    out: list[Phase] = []
    for node in graph.nodes:
        if node.op is Op.INPUT:
            phase = Phase.LOOP if node.attrs.forloop_dim >= 0 else Phase.PRE_LOOP
        elif node.op is Op.OUTPUT or (node.outputs[0].after_accum and node.op not in FORLOOP_STATEFUL):
            phase = Phase.POST_LOOP
        elif node.op in FORLOOP_STATEFUL or not hoist_invariants:
            phase = Phase.LOOP
        else:
            phase = max((out[r.node] for r in node.inputs), default=Phase.PRE_LOOP)
        out.append(phase)
    return out


def needs_finalize(graph: BlockGraph, node: int, register_accumulators: frozenset[int]) -> bool:
    """True when an accumulator has work after the loop (write-back from registers, mean/rms)."""
    n = graph.nodes[node]
    return n.op in (Op.ACCUM, Op.ACCUM_RESCALE) and (
        node in register_accumulators or n.attrs.kind in (AccumKind.MEAN, AccumKind.RMS))


def depth_of(graph: BlockGraph, i: int, phase: list[Phase], depth: list[int], epilogue_of: dict[int, int],
             register_accumulators: frozenset[int] = frozenset(),
             prologues: frozenset[int] = frozenset()) -> int:
    """The depth of node ``i`` given the depths of the nodes before it.

    An epilogue takes its producer's depth; a prologue the depth of its operand, so that the
    reduction it runs in comes one level after that operand.  For POST_LOOP consumers an
    accumulator counts as depth 0 when it is finalized after the loop (the finalize step runs at
    depth 0) and as ready otherwise.
    """
    if i in epilogue_of:
        return depth[epilogue_of[i]]
    ready = -1
    for r in graph.nodes[i].inputs:
        producer = graph.nodes[r.node]
        if phase[r.node] == phase[i]:
            ready = max(ready, depth[r.node])
        elif phase[i] is Phase.POST_LOOP and producer.op in (Op.ACCUM, Op.ACCUM_RESCALE):
            ready = max(ready, 0 if needs_finalize(graph, r.node, register_accumulators) else -1)
    return ready if i in prologues else ready + 1


def node_depths(graph: BlockGraph, phase: list[Phase], epilogue_of: dict[int, int],
                register_accumulators: frozenset[int] = frozenset(),
                prologues: frozenset[int] = frozenset()) -> list[int]:
    """The depth of every node within its phase (:func:`depth_of`)."""
    depth: list[int] = []
    for i in range(len(graph.nodes)):
        depth.append(depth_of(graph, i, phase, depth, epilogue_of, register_accumulators, prologues))
    return depth


def build_schedule(graph: BlockGraph, registers: RegisterPlan | None = None,
                   hoist_invariants: bool = True) -> Schedule:
    """The schedule of ``graph`` given the epilogue and register decisions of ``registers``."""
    epilogue_of = dict(registers.epilogues) if registers else {}
    prologue_of = dict(registers.prologues) if registers else {}
    in_registers = frozenset(registers.accumulators) if registers else frozenset()
    phase = phases(graph, hoist_invariants)
    depth = node_depths(graph, phase, epilogue_of, in_registers, frozenset(prologue_of))

    def chain(i: int) -> tuple[int, int]:
        length = 0
        while i in epilogue_of:
            i, length = epilogue_of[i], length + 1
        return i, length

    steps: list[Step] = []
    for i, node in enumerate(graph.nodes):
        match node.op:
            case Op.INPUT:
                action = Action.LOAD
            case Op.OUTPUT:
                action = Action.STORE
            case op if op in FORLOOP_STATEFUL:
                action = Action.ACCUMULATE
            case _:
                action = Action.COMPUTE
        if i in prologue_of:  # listed beside its reduction (same depth: no barrier between)
            steps.append(Step(i, phase[i], depth[prologue_of[i]], action, prologue_of=prologue_of[i]))
            continue
        steps.append(Step(i, phase[i], depth[i], action, epilogue_of.get(i)))
        if needs_finalize(graph, i, in_registers):
            steps.append(Step(i, Phase.POST_LOOP, 0, Action.FINALIZE))
    steps.sort(key=lambda s: (s.phase, s.depth, *chain(s.node), s.action is Action.FINALIZE))
    items: list[Step | Barrier] = []
    for phase_value in Phase:
        mine = [s for s in steps if s.phase is phase_value]
        for k, s in enumerate(mine):
            if k and s.depth != mine[k - 1].depth:
                items.append(Barrier(phase_value, f"depth {mine[k - 1].depth} → {s.depth}"))
            items.append(s)
        if mine and phase_value is Phase.PRE_LOOP:
            items.append(Barrier(phase_value, "pre-loop results ready for the loop"))
        if mine and phase_value is Phase.LOOP:
            items.append(Barrier(phase_value, "end of iteration"))
    return Schedule(tuple(items), graph.forloop_range,
                    tuple((i, phase[i], depth[i]) for i in range(len(graph.nodes))))


def naive_barriers(graph: BlockGraph) -> int:
    """Barriers of the schedule that syncs after every op (for comparison in reports and tests)."""
    phase = phases(graph, hoist_invariants=False)
    count = {p: phase.count(p) for p in Phase}
    return count[Phase.PRE_LOOP] + graph.forloop_range * count[Phase.LOOP] + count[Phase.POST_LOOP]
