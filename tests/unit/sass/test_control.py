from __future__ import annotations

import dataclasses

import pytest

from mirage.sass.control import ControlBits

# (high word, stall, yield, write barrier, read barrier, wait mask, reuse, text) from real sm_90a code.
CASES = [
    (0x000EA8000C1E1900, 4, False, 2, None, 0, 0, "[B------:R-:W2:-:S04]"),  # LDG.E R8, [R2.64]
    (0x000FE20000000800, 1, False, None, None, 0, 0, "[B------:R-:W-:-:S01]"),  # LDC R1
    (0x001FCC00078E0204, 6, True, None, None, 1, 0, "[B0-----:R-:W-:Y:S06]"),  # IMAD.WIDE waiting SB0
    (0x082FEC0000001838, 6, False, None, None, 2, 2, "[B-1----:R-:W-:-:S06:Ub]"),  # HMMA with reuse b
    (0x0003E8000B921D48, 4, False, None, 1, 0, 0, "[B------:R1:W-:-:S04]"),  # LDGSTS read barrier 1
]


@pytest.mark.parametrize("high, stall, yield_hint, write, read, wait, reuse, text", CASES)
def test_decode_known_words(high, stall, yield_hint, write, read, wait, reuse, text):
    control = ControlBits.decode(high)
    assert (control.stall, control.yield_hint, control.write_barrier, control.read_barrier,
            control.wait_mask, control.reuse) == (stall, yield_hint, write, read, wait, reuse)
    assert control.text() == text
    assert control.encode(high) == high


@pytest.mark.parametrize("high", [case[0] for case in CASES])
def test_encode_changes_only_control_fields(high):
    control = ControlBits.decode(high)
    changed = dataclasses.replace(control, stall=15, reuse=0, wait_mask=0x3F)
    encoded = changed.encode(high)
    assert ControlBits.decode(encoded) == changed
    mask = ((1 << 21) - 1) << 41
    assert encoded & ~mask == high & ~mask


def test_stall_out_of_range_is_refused():
    with pytest.raises(ValueError, match="stall"):
        dataclasses.replace(ControlBits.decode(0), stall=16).encode(0)


def test_waits_and_sets():
    control = ControlBits.decode(0x0003E8000B921D48)
    assert control.sets == {1} and control.waits == frozenset()
    assert ControlBits.decode(0x082FEC0000001838).waits == {1}


@pytest.mark.parametrize("yield_hint, largest", [(False, 11), (True, 15)])
def test_largest_encodable_stall_depends_on_yield(yield_hint, largest):
    control = dataclasses.replace(ControlBits.decode(0x000FE20000000800), yield_hint=yield_hint)
    assert control.max_stall == largest
