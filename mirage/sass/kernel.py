"""A kernel as an ordered list of instructions split into basic blocks: the tuner's program state.

:class:`Kernel` values are immutable; :meth:`Kernel.swapped` returns a new one.  Block boundaries are
fixed by the original kernel (leaders: entry, branch and label targets, indirect-branch targets,
the instruction after any control transfer) and never move, because nothing crosses a block edge.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass

from mirage.sass import isa, nvinfo
from mirage.sass.control import ControlBits
from mirage.sass.disasm import Disassembly, disassemble
from mirage.sass.elf import Cubin
from mirage.sass.errors import IllegalMoveError, InstructionAddressError
from mirage.sass.instruction import Instruction

INSTRUCTION_BYTES = 16
INDIRECT_CONTROL = frozenset({"BRX", "BRXU", "JMX", "JMXU", "RET", "CALL", "JMP"})
_COUNTED_WAIT_OPCODES = frozenset({"DEPBAR"})


@dataclass(frozen=True)
class Block:
    index: int
    start: int  # first instruction position
    end: int  # one past the last instruction position
    successors: tuple[int, ...]
    predecessors: tuple[int, ...]
    unknown_predecessor: bool  # reachable from somewhere the model cannot see (indirect control)
    unknown_successor: bool

    def __contains__(self, position: int) -> bool:
        return self.start <= position < self.end


@dataclass(frozen=True)
class Kernel:
    """One kernel's instructions in their current order, with its fixed block structure."""

    name: str
    sm_version: int
    instructions: tuple[Instruction, ...]
    blocks: tuple[Block, ...]
    block_of: tuple[int, ...]  # position -> block index
    counted_scoreboards: frozenset[int]  # scoreboards some DEPBAR.LE waits on by count

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def position_of(self, address: int) -> int:
        """Position of the instruction that currently sits at byte offset ``address``."""
        if address % INSTRUCTION_BYTES or not 0 <= address // INSTRUCTION_BYTES < len(self.instructions):
            raise InstructionAddressError(
                f"{address:#x} is not an instruction address of kernel {self.name} (multiples of 0x10 below "
                f"{len(self.instructions) * INSTRUCTION_BYTES:#x})")
        return address // INSTRUCTION_BYTES

    def block(self, position: int) -> Block:
        return self.blocks[self.block_of[position]]

    def text_bytes(self) -> bytes:
        return b"".join(instruction.word_bytes() for instruction in self.instructions)

    def swapped(self, position: int, stall_raises: tuple[tuple[int, int], ...] = ()) -> Kernel:
        """Swap positions ``position`` and ``position + 1`` (no legality check; see
        :func:`mirage.sass.legality.check_swap`).  Reuse flags of the two instructions and of the one
        before them are cleared, since their successors change; ``stall_raises`` lists
        ``(position, new_stall)`` pairs, positions counted after the swap."""
        instructions = list(self.instructions)
        if not 0 <= position < len(instructions) - 1:
            count = len(instructions)
            raise IllegalMoveError(f"cannot swap position {position} with the next: the kernel has {count} "
                                   f"instructions (positions 0 to {count - 1})", reason="out of range")
        above, below = instructions[position], instructions[position + 1]
        instructions[position], instructions[position + 1] = below, above
        block = self.block(position)
        for neighbour in (position - 1, position, position + 1):
            if neighbour >= block.start and instructions[neighbour].control.reuse:
                instructions[neighbour] = instructions[neighbour].with_control(
                    instructions[neighbour].control.without_reuse())
        for raised_position, stall in stall_raises:
            control = instructions[raised_position].control
            instructions[raised_position] = instructions[raised_position].with_control(
                dataclasses.replace(control, stall=stall))
        return dataclasses.replace(self, instructions=tuple(instructions))

    @functools.cached_property
    def stalls(self) -> tuple[int, ...]:
        return tuple(instruction.control.stall for instruction in self.instructions)

    @functools.cached_property
    def pending_before(self) -> tuple[dict[int, frozenset[str]], ...]:
        """For each position, the registers still owed to each scoreboard just before it issues
        (set by an earlier instruction, not yet waited for).  ``"*"`` stands for any register."""
        from mirage.sass.dataflow import pending_scoreboards

        return pending_scoreboards(self)


def load_kernel(cubin: Cubin, name: str, disassembly: Disassembly | None = None) -> Kernel:
    """Disassemble a kernel of a cubin and build its blocks, pinning every instruction an
    ``.nv.info`` offset table or a relocation names."""
    disassembly = disassembly or disassemble(cubin, name)
    offsets = nvinfo.instruction_offsets(cubin, name)
    relocated = {relocation.offset - relocation.offset % INSTRUCTION_BYTES
                 for relocation in cubin.relocations(name)}
    instructions = []
    for instruction in disassembly.instructions:
        reason = instruction.pinned
        if reason is None and instruction.address in offsets:
            reason = "named in .nv.info: " + ", ".join(offsets[instruction.address])
        if reason is None and instruction.address in relocated:
            reason = "patched by a relocation"
        instructions.append(dataclasses.replace(instruction, pinned=reason) if reason else instruction)
    leaders = {0}
    targets = dict(disassembly.branch_targets)
    leaders.update(address for address in targets.values())
    leaders.update(disassembly.label_addresses)
    indirect_targets = nvinfo.branch_target_offsets(cubin, name)
    leaders.update(indirect_targets)
    for instruction in instructions:
        if instruction.opcode in isa.BLOCK_TERMINATORS:
            leaders.add(instruction.address + INSTRUCTION_BYTES)
    return build_kernel(name, cubin.sm_version, tuple(instructions), leaders, targets, indirect_targets)


def build_kernel(name: str, sm_version: int, instructions: tuple[Instruction, ...], leaders: set[int],
                 targets: dict[int, int], indirect_targets: frozenset[int] = frozenset()) -> Kernel:
    size = len(instructions) * INSTRUCTION_BYTES
    starts = sorted(leader // INSTRUCTION_BYTES for leader in leaders if 0 <= leader < size)
    bounds = list(zip(starts, [*starts[1:], len(instructions)], strict=True))
    block_at = {start: index for index, (start, _) in enumerate(bounds)}
    indirect = any(instruction.opcode in INDIRECT_CONTROL for instruction in instructions)
    successors: list[list[int]] = []
    unknown_successor: list[bool] = []
    for index, (_, end) in enumerate(bounds):
        last = instructions[end - 1]
        following = [index + 1] if index + 1 < len(bounds) else []
        unknown = indirect
        if last.opcode == "BRA":
            target = targets.get(last.address)
            branch = [block_at[target // INSTRUCTION_BYTES]] if target is not None and \
                target // INSTRUCTION_BYTES in block_at else []
            unknown |= target is None
            successors.append(branch + (following if last.predicate else []))
        elif last.opcode == "EXIT" and last.predicate is None:
            successors.append([])
        else:
            successors.append(following)
        unknown_successor.append(unknown)
    predecessors: list[list[int]] = [[] for _ in bounds]
    for index, targets_of_block in enumerate(successors):
        for successor in targets_of_block:
            predecessors[successor].append(index)
    blocks = tuple(
        Block(index=index, start=start, end=end, successors=tuple(dict.fromkeys(successors[index])),
              predecessors=tuple(dict.fromkeys(predecessors[index])),
              unknown_predecessor=indirect or start * INSTRUCTION_BYTES in indirect_targets,
              unknown_successor=unknown_successor[index])
        for index, (start, end) in enumerate(bounds))
    block_of = tuple(index for index, (start, end) in enumerate(bounds) for _ in range(start, end))
    counted = frozenset(
        int(operand[2:]) for instruction in instructions if instruction.opcode in _COUNTED_WAIT_OPCODES
        for operand in instruction.operands if operand.startswith("SB") and operand[2:].isdigit())
    return Kernel(name=name, sm_version=sm_version, instructions=instructions, blocks=blocks,
                  block_of=block_of, counted_scoreboards=counted)


def control_of(kernel: Kernel, position: int) -> ControlBits:
    return kernel.instructions[position].control
