"""Mutations of a kernel's schedule and the checks every edit passes.

Two move sets: SIP's (a memory instruction moves up or down by one) and every adjacent swap.  A move
is applied only when :func:`~mirage.sass.legality.check_swap` allows it.  After an edit,
:func:`verify_edit` checks that each basic block holds the same multiset of instruction words
(control bits aside) and, by re-disassembling the edited bytes, the same multiset of instructions.
"""

from __future__ import annotations

import collections
import enum
import functools
import hashlib
from dataclasses import dataclass

from mirage.sass import isa
from mirage.sass.disasm import disassemble_raw
from mirage.sass.errors import EditVerificationError, IllegalMoveError
from mirage.sass.kernel import Kernel
from mirage.sass.legality import DEFAULT_LATENCY, LatencyRules, Legality, check_swap

_CONTROL_MASK = ((1 << 21) - 1) << 41


class MoveSet(enum.Enum):
    SIP = "sip"  # memory instructions up or down by one (SIP, CuAsmRL)
    SWAP = "swap"  # any adjacent pair


@dataclass(frozen=True)
class Move:
    """Move the instruction at ``position`` one slot up (``direction`` -1) or down (+1)."""

    position: int
    direction: int

    @property
    def swap_position(self) -> int:
        """The first position of the adjacent pair this move swaps."""
        return self.position - 1 if self.direction < 0 else self.position

    def describe(self, kernel: Kernel) -> str:
        instruction = kernel.instructions[self.position]
        return f"{instruction.address:#06x} {instruction.text} {'up' if self.direction < 0 else 'down'}"


def candidate_moves(kernel: Kernel, move_set: MoveSet) -> list[Move]:
    match move_set:
        case MoveSet.SIP:
            return [Move(position, direction)
                    for position, instruction in enumerate(kernel.instructions)
                    if instruction.opcode in isa.SIP_MOVABLE for direction in (-1, 1)]
        case MoveSet.SWAP:
            return [Move(position, 1) for position in range(len(kernel) - 1)]
    raise AssertionError(move_set)


def check_move(kernel: Kernel, move: Move, *, latency: LatencyRules = DEFAULT_LATENCY,
               repair_stalls: bool = False) -> Legality:
    first = move.swap_position
    return check_swap(kernel, first, first + 1, latency=latency, repair_stalls=repair_stalls)


def legal_moves(kernel: Kernel, move_set: MoveSet, *, latency: LatencyRules = DEFAULT_LATENCY,
                repair_stalls: bool = False) -> list[tuple[Move, Legality]]:
    found = []
    for move in candidate_moves(kernel, move_set):
        legality = check_move(kernel, move, latency=latency, repair_stalls=repair_stalls)
        if legality.ok:
            found.append((move, legality))
    return found


def apply_move(kernel: Kernel, move: Move, *, latency: LatencyRules = DEFAULT_LATENCY,
               repair_stalls: bool = False) -> Kernel:
    """The kernel after a legal move; :class:`IllegalMoveError` names the rule that refuses it."""
    legality = check_move(kernel, move, latency=latency, repair_stalls=repair_stalls)
    if not legality.ok:
        raise IllegalMoveError(f"cannot move {move.describe(kernel)}: {legality.reason}",
                               reason=legality.reason)
    return kernel.swapped(move.swap_position, legality.stall_raises)


def block_word_multisets(kernel: Kernel) -> list[collections.Counter[tuple[int, int]]]:
    return [collections.Counter((instruction.low, instruction.high & ~_CONTROL_MASK)
                                for instruction in kernel.instructions[block.start: block.end])
            for block in kernel.blocks]


@functools.lru_cache(maxsize=64)
def _raw_texts(text: bytes, sm_version: int) -> tuple[str, ...]:
    return tuple(raw.text.replace(".reuse", "") for raw in disassemble_raw(text, sm_version))


def _text_key(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()[:16]


def verify_edit(original: Kernel, edited: Kernel, *, redisassemble: bool = True) -> None:
    """Raise :class:`EditVerificationError` unless ``edited`` is a per-block permutation of
    ``original`` with every pinned instruction in place."""
    if len(original) != len(edited) or original.blocks != edited.blocks:
        raise EditVerificationError("the edited kernel has a different length or block structure")
    for index, (before, after) in enumerate(zip(block_word_multisets(original), block_word_multisets(edited),
                                                strict=True)):
        if before != after:
            raise EditVerificationError(f"block {index} of {original.name} holds different instruction words "
                                        "after the edit")
    for position, (before, after) in enumerate(zip(original, edited, strict=True)):
        if before.pinned and before.address != after.address:
            raise EditVerificationError(f"pinned instruction {before.text} moved from position {position}")
    if not redisassemble:
        return
    texts_before = _raw_texts(original.text_bytes(), original.sm_version)
    texts_after = _raw_texts(edited.text_bytes(), edited.sm_version)
    for block in original.blocks:
        before = collections.Counter(texts_before[block.start: block.end])
        after = collections.Counter(texts_after[block.start: block.end])
        if before != after:
            missing = sorted((before - after).elements())[:3]
            raise EditVerificationError(
                f"block {block.index} of {original.name} re-disassembles differently "
                f"(text {_text_key(edited.text_bytes())}); missing {missing}")
