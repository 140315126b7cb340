"""The legality model on the committed fixtures: known-illegal moves are refused by the rule that
should refuse them, known-legal ones are accepted."""

from __future__ import annotations

import pytest

from mirage.sass import isa
from mirage.sass.kernel import Kernel
from mirage.sass.legality import DEFAULT_LATENCY, LatencyRules, Rule, check_swap


def _distance(kernel: Kernel, producer: int, consumer: int) -> int:
    return sum(kernel.instructions[p].control.stall for p in range(producer, consumer))


def _load_address_cases(kernel: Kernel):
    """(swap position, producer position) where moving a global load up by one brings it closer to
    the fixed-latency instruction that computes its address, below what the compiler left."""
    cases = []
    for position, load in enumerate(kernel.instructions):
        if load.opcode != "LDG":
            continue
        block = kernel.block(position)
        for producer in range(position - 2, block.start - 1, -1):
            candidate = kernel.instructions[producer]
            if candidate.defs & load.uses and candidate.control.write_barrier is None:
                above = kernel.instructions[position - 1]
                old = _distance(kernel, producer, position)
                if not (above.defs & load.registers) and old - above.control.stall < min(
                        old, DEFAULT_LATENCY.short_cap):
                    cases.append((position - 1, producer))
                break
    return cases


def test_load_moved_next_to_its_address_computation_is_refused(elementwise_x4, cute_gemm):
    cases = [(kernel, swap, producer) for kernel in (elementwise_x4, cute_gemm)
             for swap, producer in _load_address_cases(kernel)]
    assert len(cases) >= 2
    for kernel, swap, _ in cases:
        assert not check_swap(kernel, swap, swap + 1)
    stall_refusals = [(k, s, p) for k, s, p in cases if check_swap(k, s, s + 1).rule is Rule.STALL]
    assert stall_refusals, "at least one of them must be refused by the distance rule itself"
    kernel, swap, producer = stall_refusals[0]
    assert "too soon" in check_swap(kernel, swap, swap + 1).reason


def test_stall_repair_restores_the_distance_the_compiler_left(elementwise_x4, cute_gemm):
    repaired = 0
    for kernel in (elementwise_x4, cute_gemm):
        for swap, producer in _load_address_cases(kernel):
            legality = check_swap(kernel, swap, swap + 1)
            if legality.rule is not Rule.STALL:
                continue
            fixed = check_swap(kernel, swap, swap + 1, repair_stalls=True)
            if not fixed:
                continue
            edited = kernel.swapped(swap, fixed.stall_raises)
            old = _distance(kernel, producer, swap + 1)
            assert _distance(edited, producer, swap) >= min(old, DEFAULT_LATENCY.short_cap)
            repaired += 1
    assert repaired >= 1


def test_arithmetic_moved_below_the_store_that_reads_it_is_refused(elementwise_x4, cute_gemm):
    cases = 0
    for kernel in (elementwise_x4, cute_gemm):
        for position, store in enumerate(kernel.instructions):
            if store.opcode != "STG" or position == 0:
                continue
            producer = kernel.instructions[position - 1]
            if producer.defs & store.uses and producer.opcode in isa.ALU_OPCODES:
                legality = check_swap(kernel, position - 1, position)
                assert legality.rule is Rule.REGISTER, legality.reason
                cases += 1
    assert cases >= 1


def test_move_across_a_branch_target_is_refused(cute_gemm):
    cases = 0
    for block in cute_gemm.blocks[1:]:
        above, below = cute_gemm.instructions[block.start - 1], cute_gemm.instructions[block.start]
        if above.pinned or below.pinned:
            continue
        legality = check_swap(cute_gemm, block.start - 1, block.start)
        assert legality.rule is Rule.CROSSES_BLOCK
        cases += 1
    assert cases >= 1


def test_move_across_a_barrier_is_refused(cute_gemm):
    barriers = [p for p, ins in enumerate(cute_gemm.instructions) if ins.opcode == "BAR"]
    assert barriers
    for position in barriers:
        for neighbour in (position - 1, position + 1):
            legality = check_swap(cute_gemm, min(position, neighbour), max(position, neighbour))
            assert not legality and legality.rule in (Rule.PINNED, Rule.CROSSES_BLOCK)


def test_loads_do_not_pass_a_wait_that_guards_their_operands(cute_gemm):
    refusals = [p for p in range(len(cute_gemm) - 1) if check_swap(cute_gemm, p, p + 1).rule is Rule.GUARD]
    assert refusals
    for position in refusals:
        assert cute_gemm.instructions[position].control.waits


def test_shared_memory_writes_keep_their_order(cute_gemm):
    opcodes = [instruction.opcode for instruction in cute_gemm.instructions]
    pairs = [p for p in range(len(opcodes) - 1) if opcodes[p] == opcodes[p + 1] == "LDGSTS"]
    assert pairs
    for position in pairs:
        assert check_swap(cute_gemm, position, position + 1).rule is Rule.MEMORY


def test_not_adjacent_is_refused(elementwise_x4):
    assert check_swap(elementwise_x4, 3, 5).rule is Rule.NOT_ADJACENT
    assert check_swap(elementwise_x4, 0, len(elementwise_x4)).rule is Rule.NOT_ADJACENT


def test_legal_moves_exist_and_are_symmetric(any_kernel):
    legal = [p for p in range(len(any_kernel) - 1) if check_swap(any_kernel, p, p + 1)]
    assert legal
    for position in legal:
        assert check_swap(any_kernel, position + 1, position).ok


def test_independent_load_hoist_is_accepted(elementwise_x4):
    """SIP's typical move: a global load trades places with an instruction it does not depend on."""
    accepted = []
    for position, instruction in enumerate(elementwise_x4.instructions):
        if instruction.opcode == "LDG" and position + 1 < len(elementwise_x4):
            legality = check_swap(elementwise_x4, position, position + 1)
            if legality:
                accepted.append(position)
    assert accepted


def test_a_legal_swap_undone_is_legal_again(elementwise_x4):
    position = next(p for p in range(len(elementwise_x4) - 1) if check_swap(elementwise_x4, p, p + 1))
    swapped = elementwise_x4.swapped(position)
    assert check_swap(swapped, position, position + 1)
    assert swapped.swapped(position).text_bytes() == elementwise_x4.text_bytes() or any(
        ins.control.reuse for ins in elementwise_x4.instructions[position - 1: position + 2])


@pytest.mark.parametrize("short_cap, minimum", [(4, 1), (64, 0)])
def test_tighter_caps_allow_more_moves(elementwise_x4, short_cap, minimum):
    rules = LatencyRules(short_cap=short_cap, long_cap=max(short_cap, DEFAULT_LATENCY.long_cap))
    positions = range(len(elementwise_x4) - 1)
    count = sum(bool(check_swap(elementwise_x4, p, p + 1, latency=rules)) for p in positions)
    default = sum(bool(check_swap(elementwise_x4, p, p + 1)) for p in positions)
    assert (count >= default) if short_cap < DEFAULT_LATENCY.short_cap else (count <= default)
    assert count >= minimum
