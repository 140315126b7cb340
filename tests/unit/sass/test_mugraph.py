"""The generated µGraph kernel fixture (LoRA, ``tests/fixtures/sass/mugraph``) through the SASS
tuner's static pieces: the cubin round-trips, the legality model refuses and accepts moves on it as on
the hand-written fixtures, random legal walks keep every block's instructions, and the launch
descriptions built from the program match the committed ones and the kernel's parameter table."""

from __future__ import annotations

import doctest
import json
import random
from collections.abc import Callable

import pytest
from sass_fixtures import FIXTURES, fixture_cubin, fixture_kernel

import mirage.sass.mugraph
from mirage.codegen.lower_program import CudaProgram
from mirage.codegen.runtime import Program
from mirage.sass import isa
from mirage.sass.elf import Cubin
from mirage.sass.kernel import Kernel
from mirage.sass.launch import BufferArgument, LaunchSpec, check_against_cubin
from mirage.sass.legality import DEFAULT_LATENCY, Rule, check_swap
from mirage.sass.mugraph import launch_specs
from mirage.sass.mutation import MoveSet, apply_move, legal_moves, verify_edit
from mirage.sass.nvinfo import kernel_parameters
from mirage.sass.search import SearchOptions, random_legal_move

CUBIN = "mugraph/lora_m16.cubin"
KERNEL = "lora_k4"
LAUNCH = json.loads((FIXTURES / "mugraph" / "launch.json").read_text())


@pytest.fixture(scope="module")
def lora() -> Kernel:
    return fixture_kernel(CUBIN, KERNEL)


@pytest.fixture(scope="module")
def fixture_program() -> Program:
    cuda = CudaProgram.from_dict(json.loads((FIXTURES / "mugraph" / LAUNCH["program"]).read_text()))
    return Program(cuda, FIXTURES / CUBIN)


def test_cubin_round_trips_byte_for_byte(tmp_path):
    original = (FIXTURES / CUBIN).read_bytes()
    cubin = Cubin.from_bytes(original)
    assert cubin.kernel_names() == (KERNEL,) and cubin.sm_version == 90
    rebuilt = cubin.with_text(KERNEL, cubin.text(KERNEL))
    rebuilt.write(tmp_path / "copy.cubin")
    assert (tmp_path / "copy.cubin").read_bytes() == original


def test_kernel_has_the_generated_code_shape(lora):
    opcodes = {instruction.opcode for instruction in lora.instructions}
    # tensor-core products over cp.async-loaded, ldmatrix-read tiles, behind barriers
    assert {"HMMA", "LDGSTS", "LDSM", "BAR", "LDGDEPBAR", "STG"} <= opcodes
    assert len(lora) > 1000 and len(lora.blocks) > 20


# ---- legality -----------------------------------------------------------------------------------


def _distance(kernel: Kernel, producer: int, consumer: int) -> int:
    return sum(kernel.instructions[p].control.stall for p in range(producer, consumer))


def load_next_to_address(kernel: Kernel) -> list[int]:
    """Swaps that move a global load up by one, closer to the fixed-latency instruction computing its
    address than the compiler left it."""
    swaps = []
    for position, load in enumerate(kernel.instructions):
        if load.opcode not in ("LDG", "LDGSTS"):
            continue
        block = kernel.block(position)
        for producer in range(position - 2, block.start - 1, -1):
            candidate = kernel.instructions[producer]
            if candidate.defs & load.uses and candidate.control.write_barrier is None:
                above = kernel.instructions[position - 1]
                old = _distance(kernel, producer, position)
                if not above.pinned and above.memory is None and not (above.defs & load.registers) and (
                        old - above.control.stall < min(old, DEFAULT_LATENCY.short_cap)):
                    swaps.append(position - 1)
                break
    return swaps


def arithmetic_below_its_store(kernel: Kernel) -> list[int]:
    return [position - 1 for position, store in enumerate(kernel.instructions)
            if store.opcode == "STG" and kernel.instructions[position - 1].defs & store.uses
            and kernel.instructions[position - 1].opcode in isa.ALU_OPCODES]


def across_a_block_edge(kernel: Kernel) -> list[int]:
    instructions = kernel.instructions
    return [block.start - 1 for block in kernel.blocks[1:]
            if not instructions[block.start - 1].pinned and not instructions[block.start].pinned]


def next_to_a_barrier(kernel: Kernel) -> list[int]:
    barriers = [p for p, instruction in enumerate(kernel.instructions) if instruction.opcode == "BAR"]
    return [swap for p in barriers for swap in (p - 1, p)]


def shared_memory_write_pairs(kernel: Kernel) -> list[int]:
    opcodes = [instruction.opcode for instruction in kernel.instructions]
    return [p for p in range(len(opcodes) - 1) if opcodes[p] == opcodes[p + 1] == "LDGSTS"]


# (name, finder of swap positions, rules that must refuse each one)
REFUSED = [
    ("load moved next to its address computation", load_next_to_address, {Rule.STALL, Rule.GUARD}),
    ("arithmetic moved below the store that reads it", arithmetic_below_its_store, {Rule.REGISTER}),
    ("move across a branch target", across_a_block_edge, {Rule.CROSSES_BLOCK}),
    ("move across a barrier", next_to_a_barrier, {Rule.PINNED, Rule.CROSSES_BLOCK}),
    ("asynchronous copies trading places", shared_memory_write_pairs, {Rule.MEMORY}),
]


@pytest.mark.parametrize("name, finder, rules", REFUSED, ids=[row[0] for row in REFUSED])
def test_known_illegal_moves_are_refused(lora, name, finder: Callable[[Kernel], list[int]], rules):
    swaps = finder(lora)
    assert swaps, f"the fixture has no case of: {name}"
    for swap in swaps:
        legality = check_swap(lora, swap, swap + 1)
        assert not legality and legality.rule in rules, (lora.instructions[swap].text, legality.reason)


def test_the_distance_rule_itself_refuses_a_load_hoist(lora):
    refusals = [s for s in load_next_to_address(lora) if check_swap(lora, s, s + 1).rule is Rule.STALL]
    assert refusals
    assert "too soon" in check_swap(lora, refusals[0], refusals[0] + 1).reason


def test_legal_moves_exist_are_symmetric_and_include_memory_moves(lora):
    legal = [p for p in range(len(lora) - 1) if check_swap(lora, p, p + 1)]
    assert len(legal) >= 10
    for position in legal:
        assert check_swap(lora, position + 1, position).ok
    assert legal_moves(lora, MoveSet.SIP), "SIP's move set has a legal memory move on the generated kernel"


def test_stall_repair_opens_moves_the_distance_rule_refused(lora):
    plain = legal_moves(lora, MoveSet.SWAP)
    repaired = legal_moves(lora, MoveSet.SWAP, repair_stalls=True)
    assert len(repaired) > 2 * len(plain)
    raised = [(move, legality) for move, legality in repaired if legality.stall_raises]
    assert raised and all(not check_swap(lora, move.swap_position, move.swap_position + 1)
                          for move, _ in raised[:20])


@pytest.mark.parametrize("move_set, seed", [(MoveSet.SIP, 3), (MoveSet.SWAP, 5), (MoveSet.SWAP, 8)])
def test_random_legal_walk_re_disassembles_to_the_same_multiset_per_block(lora, move_set, seed):
    """The moves the search would draw (uniform among legal ones), with stall repair."""
    generator = random.Random(seed)
    options = SearchOptions(move_set=move_set, repair_stalls=True)
    kernel = lora
    for _ in range(12):
        drawn = random_legal_move(kernel, options, generator)
        assert drawn is not None
        kernel = apply_move(kernel, drawn[0], repair_stalls=True)
    assert kernel.text_bytes() != lora.text_bytes()
    verify_edit(lora, kernel, redisassemble=True)


# ---- launch descriptions ------------------------------------------------------------------------


def test_launch_specs_match_the_program_and_the_committed_launch(fixture_program):
    specs = launch_specs(fixture_program)
    assert [json.loads(spec.to_json()) for spec in specs] == LAUNCH["kernels"]
    assert [LaunchSpec.from_json(json.dumps(row)) for row in LAUNCH["kernels"]] == specs
    (spec,) = specs
    (launch,) = fixture_program.cuda.kernels
    graph = fixture_program.graph
    assert (spec.kernel, spec.grid, spec.block, spec.shared_memory_bytes) == (
        launch.name, launch.grid, launch.block, launch.smem_bytes)
    assert spec.exact and spec.atol == 0.0
    expected = [(graph.type_of(ref).shape, graph.type_of(ref).dtype.value, ref in launch.outputs)
                for ref in launch.arguments]
    assert [(a.shape, a.dtype, a.output) for a in spec.arguments] == expected
    assert [a.name for a in spec.arguments] == ["%4.0", "X%0", "W%1", "LA%2", "LB%3"]


def test_launch_specs_fit_the_kernel_parameter_table(fixture_program):
    cubin = fixture_cubin(CUBIN)
    for spec in launch_specs(fixture_program):
        check_against_cubin(spec, cubin)
        assert len(kernel_parameters(cubin, spec.kernel)) == len(spec.arguments)
        assert all(isinstance(argument, BufferArgument) for argument in spec.arguments)


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_inputs_are_drawn_as_the_tuner_draws_them(fixture_program, scale):
    (spec,) = launch_specs(fixture_program, scale=scale)
    inputs = [a for a in spec.arguments if not a.output]
    assert inputs and all(a.init == "normal" and a.scale == scale for a in inputs)
    assert [a.name for a in spec.outputs] == ["%4.0"]


def test_docstring_examples():
    result = doctest.testmod(mirage.sass.mugraph)
    assert result.attempted > 0 and result.failed == 0
