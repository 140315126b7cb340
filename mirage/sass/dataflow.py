"""Scoreboard dataflow: which registers each scoreboard still guards before each instruction.

An instruction with a write barrier *s* owes its destinations to *s* until some later instruction
waits on *s*; one with a read barrier owes its sources (they may not be overwritten yet).  The
analysis runs forward over the control-flow graph, joining by union, so a register is "pending on
*s*" before an instruction if it is on any path.  Counted waits (``DEPBAR.LE SBx, n``) clear
nothing, since they let *n* operations stay in flight.  A variable-latency instruction with no write
barrier of its own (the compiler relies on in-order completion behind a later instruction's
scoreboard) owes its destinations to every scoreboard.  An unconditional write of a register ends
what was owed on it; an instruction whose operand layout is unknown (its registers count as both
written and read) ends nothing, since it may only read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirage.sass import isa
from mirage.sass.control import SCOREBOARD_COUNT
from mirage.sass.isa import VARIABLE_LATENCY_OPCODES

if TYPE_CHECKING:
    from mirage.sass.instruction import Instruction
    from mirage.sass.kernel import Kernel

ANY_REGISTER = "*"
State = dict[int, frozenset[str]]
_TOP: State = {s: frozenset({ANY_REGISTER}) for s in range(SCOREBOARD_COUNT)}


def surely_written(instruction: Instruction) -> frozenset[str]:
    """The registers ``instruction`` certainly writes: its destinations, unless their layout is
    unknown (an opcode outside the tables, a memory instruction without a memory operand), whose
    registers count as written *and* read and so may only be read."""
    if isa.destination_rule(instruction.opcode) is isa.DestinationRule.ALL:
        return frozenset()
    if instruction.memory is not None and not any("[" in operand for operand in instruction.operands):
        return frozenset()
    return instruction.defs


def _join(states: list[State]) -> State:
    joined: dict[int, set[str]] = {}
    for state in states:
        for scoreboard, registers in state.items():
            joined.setdefault(scoreboard, set()).update(registers)
    return {scoreboard: frozenset(registers) for scoreboard, registers in joined.items() if registers}


def _transfer(kernel: Kernel, start: int, end: int, state: State,
              record: list[State] | None) -> State:
    current = dict(state)
    for position in range(start, end):
        instruction = kernel.instructions[position]
        control = instruction.control
        if record is not None:
            record[position] = current
        untracked = (instruction.opcode in VARIABLE_LATENCY_OPCODES and instruction.defs
                     and control.write_barrier is None)
        if control.wait_mask or control.write_barrier is not None or control.read_barrier is not None \
                or untracked or (instruction.defs and instruction.predicate is None):
            current = dict(current)
            for scoreboard in control.waits:
                current.pop(scoreboard, None)
            written = surely_written(instruction) if instruction.predicate is None else frozenset()
            if written:
                # an unconditional write ends whatever was owed on its destinations
                current = {s: r - written for s, r in current.items() if r - written}
            if untracked:
                for scoreboard in range(SCOREBOARD_COUNT):
                    current[scoreboard] = current.get(scoreboard, frozenset()) | instruction.defs
            if control.write_barrier is not None:
                current[control.write_barrier] = current.get(control.write_barrier, frozenset()) | \
                    instruction.defs
            if control.read_barrier is not None:
                current[control.read_barrier] = current.get(control.read_barrier, frozenset()) | \
                    instruction.uses
    return current


def pending_scoreboards(kernel: Kernel) -> tuple[State, ...]:
    out_states: list[State | None] = [None] * len(kernel.blocks)
    changed = True
    while changed:
        changed = False
        for block in kernel.blocks:
            incoming = [out_states[p] for p in block.predecessors if out_states[p] is not None]
            if block.unknown_predecessor:
                incoming.append(_TOP)
            state_in = _join(incoming)  # type: ignore[arg-type]
            state_out = _transfer(kernel, block.start, block.end, state_in, None)
            if state_out != out_states[block.index]:
                out_states[block.index] = state_out
                changed = True
    record: list[State] = [{} for _ in kernel.instructions]
    for block in kernel.blocks:
        incoming = [out_states[p] for p in block.predecessors if out_states[p] is not None]
        if block.unknown_predecessor:
            incoming.append(_TOP)
        _transfer(kernel, block.start, block.end, _join(incoming), record)  # type: ignore[arg-type]
    return tuple(record)
