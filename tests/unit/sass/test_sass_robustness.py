"""The SASS tools on inputs the fixtures do not cover: instruction forms of other element types, and
corrupt or truncated cubins."""

from __future__ import annotations

import struct

import pytest
from sass_fixtures import fixture_cubin

import mirage as mi
from mirage.codegen.lower_program import generate_cuda_program
from mirage.sass.control import ControlBits
from mirage.sass.elf import SHT_SYMTAB, Cubin
from mirage.sass.errors import CubinFormatError
from mirage.sass.instruction import parse_instruction
from mirage.sass.kernel import build_kernel
from mirage.sass.legality import Rule, check_swap
from mirage.sass.mugraph import launch_specs


def test_tf32_matrix_operands_span_four_and_two_registers():
    """mma.m16n8k8 with TF32 operands reads four A registers and two B registers (one per element)."""
    hmma = parse_instruction(0x10, "HMMA.1688.F32.TF32 R4, R8, R12, RZ", 0, 0)
    assert hmma.uses == {"R8", "R9", "R10", "R11", "R12", "R13"}
    assert hmma.defs == {"R4", "R5", "R6", "R7"}
    k4 = parse_instruction(0x10, "HMMA.1684.F32.TF32 R4, R8, R12, R4", 0, 0)
    assert k4.uses == {"R8", "R9", "R12", "R4", "R5", "R6", "R7"}


def test_swap_of_a_tf32_matmul_with_the_producer_of_its_upper_b_register_is_refused():
    """Seen in a generated fp32 matmul: the write of R13 right before ``HMMA.1688.F32.TF32 …, R12, …``
    was called legal to swap (stall repair on), which would feed the matmul a stale B fragment."""
    instructions = (parse_instruction(0x00, "IMAD.MOV.U32 R13, RZ, RZ, R3", 0, 0),
                    parse_instruction(0x10, "HMMA.1688.F32.TF32 R8, R8, R12, RZ", 0, 0),
                    parse_instruction(0x20, "IMAD.MOV.U32 R11, RZ, RZ, R2", 0, 0),
                    parse_instruction(0x30, "HMMA.1688.F32.TF32 R4, R8, R6, RZ", 0, 0))
    kernel = build_kernel("tf32", 90, instructions, {0}, {})
    for position in (0, 2):
        for repair in (False, True):
            legality = check_swap(kernel, position, position + 1, repair_stalls=repair)
            assert not legality.ok and legality.rule is Rule.REGISTER, legality.reason


def _word(text: str, address: int, *, stall: int = 1, read_barrier: int | None = None, waits: int = 0):
    control = ControlBits(stall=stall, yield_hint=True, write_barrier=None, read_barrier=read_barrier,
                          wait_mask=waits, reuse=0)
    return parse_instruction(address, text, 0, control.encode(0))


def test_fchk_reads_both_registers_and_writes_only_its_predicate():
    fchk = parse_instruction(0, "FCHK P0, R0, R11", 0, 0)
    assert fchk.defs == {"P0"}
    assert fchk.uses == {"R0", "R11"}


def test_store_source_read_by_fchk_stays_guarded_by_its_read_scoreboard():
    """A store owes its source R0 to read scoreboard 1 until an instruction waits on it; an FCHK that
    only reads R0 in between must not end that debt, or the write of R0 that relies on the wait could
    move above it and overwrite the value before the store has read it."""
    fillers = [_word(f"FADD R{20 + k}, R30, R31", 0x20 + 0x10 * k, stall=15) for k in range(5)]
    instructions = (_word("STG.E desc[UR4][R2.64], R0", 0x00, read_barrier=1),
                    _word("FCHK P0, R0, R11", 0x10, stall=15), *fillers,  # past every distance cap
                    _word("FADD R5, R6, R7", 0x70, waits=1 << 1),
                    _word("MOV R0, 0x1", 0x80))
    kernel = build_kernel("fchk", 90, instructions, {0}, {})
    assert "R0" in kernel.pending_before[7][1]
    for repair in (False, True):
        legality = check_swap(kernel, 7, 8, repair_stalls=repair)
        assert not legality.ok and legality.rule is Rule.GUARD, legality.reason


def test_symbol_table_naming_a_missing_string_table_is_a_cubin_format_error():
    """A damaged section header (the symbol table's link past the section count) is refused as a damaged
    cubin, not with an IndexError from the symbol reader."""
    cubin = fixture_cubin("elementwise.cubin")
    symtab = next(s for s in cubin.sections if s.type == SHT_SYMTAB)
    data = bytearray(cubin.data)
    section_headers = struct.unpack_from("<Q", data, 0x28)[0]
    struct.pack_into("<I", data, section_headers + symtab.index * 64 + 40, len(cubin.sections) + 7)
    with pytest.raises(CubinFormatError, match="string table"):
        Cubin.from_bytes(bytes(data))


def _slice_graph(strides):
    """exp of a [128, 64] input declared with ``strides`` (a column slice of a wider tensor when the
    row stride exceeds 64), read in place by the kernel."""
    g = mi.new_kernel_graph("slice")
    x = g.new_input(dims=(128, 64), dtype=mi.float16, strides=strides)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=1)
    tb.new_output(tb.forloop_accum(tb.exp(tb.new_input(x, (0, -1, -1)))), (0, -1, -1))
    (y,) = g.customized([x], tb)
    g.mark_output(y)
    return g


def test_launch_spec_of_an_input_read_through_wide_strides_covers_every_element_read():
    """A [128, 64] slice with row stride 1536 is read in place up to element 127·1536 + 63; the tuner's
    sandbox must allocate that much, not the slice's 8192 elements, or the kernel reads past its buffer."""
    program = generate_cuda_program(_slice_graph((1536, 1)), target_cc=90)
    assert program.input_strides == {0: (1536, 1)}
    (spec,) = launch_specs(program)
    output, source = spec.arguments
    assert output.output and output.shape == (128, 64)
    assert not source.output and source.elements == 127 * 1536 + 64


def test_launch_spec_of_dense_and_broadcast_inputs_keeps_the_graph_shape():
    for strides in (None, (0, 1)):
        (spec,) = launch_specs(generate_cuda_program(_slice_graph(strides), target_cc=90))
        assert [a.shape for a in spec.arguments] == [(128, 64), (128, 64)]


def test_debt_of_a_register_survives_an_instruction_of_unknown_operand_layout():
    """An mbarrier wait reading R0 (``SYNCS``: outside the tables, so its registers count as written and
    read) does not end a store's read-scoreboard debt on R0; the write of R0 that relies on the wait
    for that scoreboard must stay below it."""
    fillers = [_word(f"FADD R{20 + k}, R30, R31", 0x20 + 0x10 * k, stall=15) for k in range(5)]
    instructions = (_word("STS [R0], R5", 0x00, read_barrier=2),
                    _word("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R0+URZ], R3", 0x10, stall=15), *fillers,
                    _word("FADD R6, R7, R8", 0x70, waits=1 << 2),
                    _word("IADD3 R0, R9, 0x10, RZ", 0x80))
    kernel = build_kernel("syncs", 90, instructions, {0}, {})
    assert "R0" in kernel.pending_before[7][2]
    legality = check_swap(kernel, 7, 8)
    assert not legality.ok and legality.rule is Rule.GUARD, legality.reason
