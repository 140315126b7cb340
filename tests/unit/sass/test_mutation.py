from __future__ import annotations

import dataclasses
import random

import pytest

from mirage.sass.errors import EditVerificationError, IllegalMoveError
from mirage.sass.mutation import (
    Move,
    MoveSet,
    apply_move,
    candidate_moves,
    legal_moves,
    verify_edit,
)


@pytest.mark.parametrize("move_set", list(MoveSet))
def test_random_legal_walk_re_disassembles_to_the_same_instructions(any_kernel, move_set):
    generator = random.Random(7)
    kernel = any_kernel
    applied = 0
    for _ in range(12):
        moves = legal_moves(kernel, move_set, repair_stalls=True)
        if not moves:
            break
        move, _ = generator.choice(moves)
        kernel = apply_move(kernel, move, repair_stalls=True)
        applied += 1
    assert applied > 0
    assert kernel.text_bytes() != any_kernel.text_bytes()
    verify_edit(any_kernel, kernel, redisassemble=True)


def test_sip_moves_are_memory_instructions(cute_gemm):
    moves = candidate_moves(cute_gemm, MoveSet.SIP)
    assert moves
    assert {cute_gemm.instructions[m.position].opcode for m in moves} <= {"LDG", "STG", "LDS", "STS", "LDSM",
                                                                         "STSM", "LDGSTS", "LDL", "STL"}


def test_illegal_move_raises_with_the_reason(cute_gemm):
    barrier = next(p for p, ins in enumerate(cute_gemm.instructions) if ins.opcode == "BAR")
    with pytest.raises(IllegalMoveError) as raised:
        apply_move(cute_gemm, Move(barrier, 1))
    assert "pinned" in raised.value.reason


def test_verification_catches_a_foreign_instruction(elementwise_x4):
    position = next(p for p in range(len(elementwise_x4) - 1)
                    if elementwise_x4.instructions[p].text != elementwise_x4.instructions[p + 1].text
                    and elementwise_x4.block_of[p] == elementwise_x4.block_of[p + 1]
                    and not elementwise_x4.instructions[p].pinned)
    instructions = list(elementwise_x4.instructions)
    instructions[position] = instructions[position + 1]  # duplicate one, lose the other
    broken = dataclasses.replace(elementwise_x4, instructions=tuple(instructions))
    with pytest.raises(EditVerificationError, match="different instruction words"):
        verify_edit(elementwise_x4, broken, redisassemble=False)


def test_reuse_flags_are_cleared_around_a_swap(cute_gemm):
    for move, legality in legal_moves(cute_gemm, MoveSet.SWAP, repair_stalls=True):
        edited = cute_gemm.swapped(move.swap_position, legality.stall_raises)
        block = cute_gemm.block(move.swap_position)
        for position in range(max(block.start, move.swap_position - 1), move.swap_position + 2):
            assert edited.instructions[position].control.reuse == 0


@pytest.mark.parametrize("position", [-1, "last"])
def test_a_swap_past_either_end_is_refused(cute_gemm, position):
    position = len(cute_gemm.instructions) - 1 if position == "last" else position
    with pytest.raises(IllegalMoveError, match="cannot swap position"):
        cute_gemm.swapped(position)
