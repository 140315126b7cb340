from __future__ import annotations

import pytest

from mirage.sass.instruction import parse_instruction, registers_in, split_operands

# (text, defs, uses): the operand layouts the legality model depends on.
CASES = [
    ("LDG.E.CONSTANT R4, desc[UR4][R4.64]", {"R4"}, {"R4", "R5", "UR4", "UR5"}),
    ("LDG.E.128 R8, desc[UR6][R2.64+0x10]", {"R8", "R9", "R10", "R11"}, {"R2", "R3", "UR6", "UR7"}),
    ("STG.E desc[UR4][R6.64], R11", set(), {"R6", "R7", "R11", "UR4", "UR5"}),
    ("STS.64 [R2+0x10], R4", set(), {"R2", "R4", "R5"}),
    ("LDSM.16.M88.4 R20, [R40+0x800]", {"R20", "R21", "R22", "R23"}, {"R40"}),
    ("LDGSTS.E.LTC128B.128 [R11+0x800], desc[UR8][R8.64]", set(), {"R11", "R8", "R9", "UR8", "UR9"}),
    ("ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R3, desc[UR4][R2.64], R5", {"R3"}, {"R2", "R3", "R5", "UR4",
                                                                              "UR5"}),
    ("IMAD.WIDE R4, R9, 0x4, R4", {"R4", "R5"}, {"R9", "R4", "R5"}),
    ("IMAD.WIDE.U32 R2, R0, 0x4, R2", {"R2", "R3"}, {"R0", "R2", "R3"}),
    ("ISETP.GE.AND P0, PT, R9, UR4, PT", {"P0"}, {"R9", "UR4"}),
    ("ISETP.GE.U32.AND.EX P0, PT, R3, UR5, PT, P1", {"P0"}, {"R3", "UR5", "P1"}),
    ("LEA R4, P1, R0, R5.reuse, 0x6", {"R4", "P1"}, {"R0", "R5"}),
    ("LEA.HI.X R65, R5, UR11, R0, 0x1, P0", {"R65"}, {"R5", "UR11", "R0", "P0"}),
    ("LOP3.LUT P1, R7, R3, 0x4, RZ, 0xc0, !PT", {"P1", "R7"}, {"R3"}),
    ("HMMA.16816.F32 R56, R20, R24.reuse, R56", {"R56", "R57", "R58", "R59"},
     {"R20", "R21", "R22", "R23", "R24", "R25", "R56", "R57", "R58", "R59"}),
    ("HMMA.16816.F16 R4, R8, R12, R4", {"R4", "R5"}, {"R8", "R9", "R10", "R11", "R12", "R13", "R4", "R5"}),
    ("CS2R R14, SRZ", {"R14", "R15"}, set()),
    ("DFMA R2, R4, R6, R2", {"R2", "R3"}, {"R4", "R5", "R6", "R7", "R2", "R3"}),
    ("@!P0 FFMA R11, -R2, |R6|, R11", {"R11"}, {"P0", "R2", "R6", "R11"}),
    ("@P0 EXIT", set(), {"P0"}),
    ("ULDC.64 UR4, c[0x0][0x208]", {"UR4", "UR5"}, set()),
    ("UISETP.NE.AND UP0, UPT, UR4, URZ, UPT", {"UP0"}, {"UR4"}),
    ("P2R R2, PR, RZ, 0x7f", {"R2"}, {f"P{i}" for i in range(7)}),
    ("SHFL.BFLY PT, R3, R2, 0x1, 0x1f", {"R3"}, {"R2"}),
    ("SOMENEWOP.X R2, R3", {"R2", "R3"}, {"R2", "R3"}),  # unknown opcode: both, and pinned
]


@pytest.mark.parametrize("text, defs, uses", CASES)
def test_def_use_sets(text, defs, uses):
    instruction = parse_instruction(0, text, 0, 0)
    assert instruction.defs == defs
    assert instruction.uses == uses


@pytest.mark.parametrize("text, reason", [
    ("BRA `(.L_x_3)", "control flow"),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", "barrier"),
    ("DEPBAR.LE SB0, 0x1", "barrier"),
    ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0", "Hopper"),
    ("WARPGROUP.ARRIVE", "Hopper"),
    ("SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4], RZ", "Hopper"),
    ("@!PT LDS RZ, [RZ]", "never-executed"),
    ("S2UR UR4, SR_CLOCKLO", "timer"),
    ("SOMENEWOP.X R2, R3", "not in the legality model"),
])
def test_pinned_instructions(text, reason):
    assert reason in (parse_instruction(0, text, 0, 0).pinned or "")


@pytest.mark.parametrize("text", ["FFMA R11, R2, UR6, R11", "LDG.E R4, desc[UR4][R4.64]", "S2R R0, SR_TID.X"])
def test_ordinary_instructions_are_not_pinned(text):
    assert parse_instruction(0, text, 0, 0).pinned is None


def test_split_operands_respects_brackets_and_braces():
    assert split_operands("desc[UR4][R6.64+0x10], R11") == ["desc[UR4][R6.64+0x10]", "R11"]
    assert split_operands("SB0, 0x1, {5,4,3}") == ["SB0", "0x1", "{5,4,3}"]


def test_registers_in_expands_and_skips_zero_registers():
    assert registers_in("R2.64") == {"R2", "R3"}
    assert registers_in("R4", 4) == {"R4", "R5", "R6", "R7"}
    assert registers_in("gdesc[UR4]") == {"UR4", "UR5", "UR6", "UR7"}
    assert registers_in("RZ") == set() and registers_in("!PT") == set()


def test_memory_ordering_modifiers_are_recognized():
    assert parse_instruction(0, "LDG.E.STRONG.SYS R2, desc[UR4][R2.64]", 0, 0).memory_ordered
    assert not parse_instruction(0, "LDG.E R2, desc[UR4][R2.64]", 0, 0).memory_ordered
