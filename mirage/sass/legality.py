"""The legality model: may two adjacent instructions trade places?

A swap of positions *i* (instruction A) and *i*+1 (B) is legal when all of these hold:

1. both sit in the same basic block and neither is pinned;
2. no register, predicate, uniform or barrier register is written by one and touched by the other;
3. A does not set a scoreboard that B waits on; if a scoreboard is waited on by count
   (``DEPBAR.LE``), A and B do not both use it; a variable-latency instruction without a scoreboard
   of its own (its completion is implied by a later one's) does not trade places with another
   variable-latency instruction;
4. if A waits on scoreboard *s*, B touches no register still owed to *s* (B would overtake the
   wait that protects it);
5. memory: no two accesses of overlapping spaces trade places when one writes or is ordered;
6. issue distances: B issues ``stall(A)`` cycles earlier and A's successors see A ``stall(B)`` cycles
   later, so every dependence that is *not* protected by a scoreboard wait (fixed-latency results,
   write-after-read on sources) must keep at least ``min(old distance, cap)`` cycles, and a scoreboard
   must be set at least ``scoreboard_setup`` cycles before it is waited on (or as far as before).
   The walk follows the control-flow graph into neighbouring blocks.  With ``repair_stalls`` a
   shortfall is made up by raising the stall count of the instruction before the moved one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from mirage.sass import isa
from mirage.sass.dataflow import ANY_REGISTER
from mirage.sass.instruction import Instruction
from mirage.sass.kernel import Kernel

MAX_STALL = 15


class Rule(enum.Enum):
    """Which rule refused a move (``value`` is the short name used in reports)."""

    NOT_ADJACENT = "not-adjacent"
    CROSSES_BLOCK = "crosses-block"
    PINNED = "pinned"
    REGISTER = "register-dependence"
    SCOREBOARD = "scoreboard"
    GUARD = "scoreboard-guard"
    MEMORY = "memory-order"
    STALL = "stall-distance"


@dataclass(frozen=True)
class LatencyRules:
    """Cycle counts the distance rule works with (sm_90 defaults; see docs/sass.md)."""

    short_cap: int = 12  # a short fixed-latency ALU result is surely available after this many cycles
    long_cap: int = 64  # every other producer, and any predicate dependence
    scoreboard_setup: int = 4  # cycles between setting a scoreboard and waiting on it


DEFAULT_LATENCY = LatencyRules()


@dataclass(frozen=True)
class Legality:
    ok: bool
    reason: str
    rule: Rule | None = None
    stall_raises: tuple[tuple[int, int], ...] = ()  # (position after the swap, new stall)

    def __bool__(self) -> bool:
        return self.ok


def _refuse(rule: Rule, reason: str) -> Legality:
    return Legality(False, reason, rule)


def check_swap(kernel: Kernel, first: int, second: int, *, latency: LatencyRules = DEFAULT_LATENCY,
               repair_stalls: bool = False) -> Legality:
    """May the instructions at positions ``first`` and ``second`` (adjacent) trade places?"""
    i = min(first, second)
    if abs(first - second) != 1 or i < 0 or i + 1 >= len(kernel):
        return _refuse(Rule.NOT_ADJACENT, f"positions {first} and {second} are not adjacent instructions")
    a, b = kernel.instructions[i], kernel.instructions[i + 1]
    if kernel.block_of[i] != kernel.block_of[i + 1]:
        return _refuse(Rule.CROSSES_BLOCK, f"{b.address:#06x} starts a basic block (branch target or label)")
    for instruction in (a, b):
        if instruction.pinned:
            return _refuse(Rule.PINNED, f"{instruction.text} is pinned: {instruction.pinned}")

    shared = (a.defs & b.registers) | (b.defs & a.uses)
    if shared:
        return _refuse(Rule.REGISTER, f"{a.text} and {b.text} both touch {', '.join(sorted(shared))} "
                                      "and one of them writes it")

    a_control, b_control = a.control, b.control
    if a_control.sets & b_control.waits:
        return _refuse(Rule.SCOREBOARD, f"{b.text} waits on scoreboard "
                                        f"{min(a_control.sets & b_control.waits)} that {a.text} sets")
    counted = kernel.counted_scoreboards & (
        (a_control.sets & (b_control.sets | b_control.waits)) | (b_control.sets & a_control.waits))
    if counted:
        return _refuse(Rule.SCOREBOARD, f"scoreboard {min(counted)} is waited on by count (DEPBAR.LE); "
                                        "its operations may not change order")

    pending = kernel.pending_before[i]
    for scoreboard in a_control.waits:
        owed = pending.get(scoreboard, frozenset())
        overlap = owed & b.registers
        if overlap or (ANY_REGISTER in owed and b.registers):
            names = ", ".join(sorted(overlap)) or "a register of an unknown predecessor"
            return _refuse(Rule.GUARD, f"{b.text} would move above {a.text}, which waits on scoreboard "
                                       f"{scoreboard} for {names}")

    for one, other in ((a, b), (b, a)):
        if untracked(one) and other.opcode in isa.VARIABLE_LATENCY_OPCODES:
            return _refuse(Rule.SCOREBOARD,
                           f"{one.text} has no scoreboard of its own; its completion is implied by "
                           f"in-order completion, so {other.text} may not pass it")

    memory = _memory_conflict(a, b)
    if memory:
        return _refuse(Rule.MEMORY, memory)

    return _check_distances(kernel, i, latency, repair_stalls)


def _overlapping(first: isa.MemorySpace, second: isa.MemorySpace) -> bool:
    if isa.MemorySpace.CONSTANT in (first, second):
        return False
    return first == second or isa.MemorySpace.GENERIC in (first, second)


def _memory_conflict(a: Instruction, b: Instruction) -> str | None:
    if a.memory is None or b.memory is None:
        return None
    for one, other in ((a, b), (b, a)):
        assert one.memory is not None and other.memory is not None
        strong = one.memory.spaces if one.memory_ordered else one.memory.writes
        if any(_overlapping(x, y) for x in strong for y in other.memory.spaces):
            return (f"{one.text} writes or orders {'/'.join(sorted(s.value for s in strong))} memory that "
                    f"{other.text} accesses")
    return None


def _cap(producer: Instruction, registers: frozenset[str], latency: LatencyRules) -> int:
    if producer.pinned or producer.opcode not in isa.SHORT_LATENCY_OPCODES:
        return latency.long_cap
    if any(register.startswith(("P", "UP")) for register in registers):
        return latency.long_cap
    return latency.short_cap


def untracked(instruction: Instruction) -> bool:
    """A variable-latency instruction whose result no scoreboard of its own guards."""
    return (instruction.opcode in isa.VARIABLE_LATENCY_OPCODES and bool(instruction.defs)
            and instruction.control.write_barrier is None)


def _requirement(producer: Instruction, consumer: Instruction, waited: frozenset[int],
                 old_distance: int, latency: LatencyRules) -> int:
    """Cycles the consumer must stay behind the producer (0: no constraint)."""
    required = 0
    control = producer.control
    if control.sets & consumer.control.waits:
        required = min(old_distance, latency.scoreboard_setup)
    written = producer.defs & consumer.registers
    read = producer.uses & consumer.defs
    unguarded = (written and control.write_barrier not in waited) or \
                (read and control.read_barrier not in waited)
    if unguarded:
        cap = _cap(producer, written | read, latency)
        required = max(required, min(old_distance, cap))
    return required


def _walk(kernel: Kernel, start: int, backward: bool, limit: int, initial_waits: frozenset[int],
          first_distance: int) -> Iterator[tuple[int | None, int, frozenset[int]]]:
    """Positions reachable from ``start`` (exclusive) in one direction, with the summed stall distance
    and the scoreboards waited on in between.  ``None`` marks an unknown neighbour of the graph."""
    stack = [(start, first_distance, initial_waits)]
    seen: set[tuple[int, int]] = set()
    while stack:
        position, distance, waits = stack.pop()
        block = kernel.block(position)
        step = -1 if backward else 1
        current = position + step
        while block.start <= current < block.end:
            control = kernel.instructions[current].control
            if backward:
                distance += control.stall
                if distance >= limit:
                    break
                yield current, distance, waits
                waits = waits | control.waits
            else:
                waits = waits | control.waits
                yield current, distance, waits
                distance += control.stall
                if distance >= limit:
                    break
            current += step
        else:
            if backward and block.unknown_predecessor or not backward and block.unknown_successor:
                yield None, distance, waits
            neighbours = block.predecessors if backward else block.successors
            for neighbour in neighbours:
                edge = kernel.blocks[neighbour]
                entry = edge.end if backward else edge.start - 1
                key = (neighbour, distance)
                if key not in seen and len(seen) < 4096:
                    seen.add(key)
                    stack.append((entry, distance, waits))


def _check_distances(kernel: Kernel, i: int, latency: LatencyRules, repair: bool) -> Legality:
    a, b = kernel.instructions[i], kernel.instructions[i + 1]
    stall_a, stall_b = a.control.stall, b.control.stall
    limit = latency.long_cap + MAX_STALL
    deficit_before_b = 0  # B moves up by stall(A): producers before it come closer
    for position, distance, waits in _walk(kernel, i, True, limit, b.control.waits, 0):
        if position is None:
            if b.registers or b.control.waits:
                return _refuse(Rule.STALL, f"{b.text} is near the start of a block entered from an "
                                           "unknown place; moving it up may shorten an unknown distance")
            continue
        producer = kernel.instructions[position]
        required = _requirement(producer, b, waits, distance + stall_a, latency)
        if distance < required:
            deficit_before_b = max(deficit_before_b, required - distance)
            culprit = producer
    deficit_after_a = 0  # A moves down by stall(B): its consumers come closer
    for position, distance, waits in _walk(kernel, i + 1, False, limit, frozenset(), stall_a):
        if position is None:
            if a.registers or a.control.sets:
                return _refuse(Rule.STALL, f"{a.text} is near the end of a block that leaves to an unknown "
                                           "place; moving it down may shorten an unknown distance")
            continue
        consumer = kernel.instructions[position]
        required = _requirement(a, consumer, waits, distance + stall_b, latency)
        if distance < required:
            deficit_after_a = max(deficit_after_a, required - distance)
            victim = consumer
    if not deficit_before_b and not deficit_after_a:
        return Legality(True, "legal")
    if not repair:
        if deficit_before_b:
            return _refuse(Rule.STALL, f"{b.text} would issue {deficit_before_b} cycle(s) too soon after "
                                       f"{culprit.text}")
        return _refuse(Rule.STALL, f"{victim.text} would issue {deficit_after_a} cycle(s) too soon after "
                                   f"{a.text}")
    raises: list[tuple[int, int]] = []
    if deficit_before_b:
        block = kernel.block(i)
        if i - 1 < block.start:
            return _refuse(Rule.STALL, f"{b.text} would reach the top of its block too soon after "
                                       "a producer; no stall to raise")
        if kernel.instructions[i - 1].pinned:
            return _refuse(Rule.STALL, f"{b.text} would issue too soon; the stall to raise belongs to a "
                                       "pinned instruction")
        control = kernel.instructions[i - 1].control
        new_stall = control.stall + deficit_before_b
        if new_stall > control.max_stall:
            return _refuse(Rule.STALL, f"repairing the distance needs a stall of {new_stall} > "
                                       f"{control.max_stall}")
        raises.append((i - 1, new_stall))
    if deficit_after_a:
        new_stall = stall_a + deficit_after_a
        if new_stall > a.control.max_stall:
            return _refuse(Rule.STALL, f"repairing the distance needs a stall of {new_stall} > "
                                       f"{a.control.max_stall}")
        raises.append((i + 1, new_stall))
    return Legality(True, "legal after raising stall counts", stall_raises=tuple(raises))
