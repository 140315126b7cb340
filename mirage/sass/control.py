"""Control bits of the Volta–Hopper 128-bit instruction word.

The high 64-bit half of every instruction word carries the scheduling fields that ``ptxas`` sets and
the hardware obeys instead of tracking dependences itself (same layout on sm_70 … sm_90a):

=========  ==============  =================================================================
bits (hi)  field           meaning
=========  ==============  =================================================================
41–44      stall           cycles before the warp may issue its next instruction
45         yield           0 means the scheduler may switch warps (printed ``Y``)
46–48      write barrier   scoreboard 0–5 released when the destination is written; 7 = none
49–51      read barrier    scoreboard 0–5 released when the sources have been read; 7 = none
52–57      wait mask       bit *i*: wait until scoreboard *i* is clear before issuing
58–61      reuse           operand-reuse cache flags for source slots a, b, c, d
=========  ==============  =================================================================

>>> ControlBits.decode(0x000EA8000C1E1900).text()     # LDG.E R8, [R2.64]
'[B------:R-:W2:-:S04]'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SCOREBOARD_COUNT = 6
NO_BARRIER = 7
# Stall and yield share one 5-bit scheduling field whose values are a table: without the yield hint
# only stalls 1..11 decode (12..15 and 0 mean something else); with it, 1..15.  Checked by
# disassembling every combination for each opcode of the test fixtures with nvdisasm (sm_90a).
MAX_STALL_WITHOUT_YIELD = 11
MAX_STALL_WITH_YIELD = 15

_STALL_SHIFT, _YIELD_SHIFT, _WRITE_SHIFT, _READ_SHIFT, _WAIT_SHIFT, _REUSE_SHIFT = 41, 45, 46, 49, 52, 58
_FIELD_MASK = ((1 << 21) - 1) << _STALL_SHIFT


@dataclass(frozen=True)
class ControlBits:
    stall: int
    yield_hint: bool  # True when the yield bit is 0 (``Y`` in the text form)
    write_barrier: int | None
    read_barrier: int | None
    wait_mask: int
    reuse: int

    @classmethod
    def decode(cls, high: int) -> ControlBits:
        write = (high >> _WRITE_SHIFT) & 7
        read = (high >> _READ_SHIFT) & 7
        return cls(
            stall=(high >> _STALL_SHIFT) & 0xF,
            yield_hint=((high >> _YIELD_SHIFT) & 1) == 0,
            write_barrier=None if write == NO_BARRIER else write,
            read_barrier=None if read == NO_BARRIER else read,
            wait_mask=(high >> _WAIT_SHIFT) & 0x3F,
            reuse=(high >> _REUSE_SHIFT) & 0xF,
        )

    def encode(self, high: int) -> int:
        """``high`` with its control fields replaced by these (all other bits kept)."""
        if not 0 <= self.stall <= 15:
            raise ValueError(f"stall {self.stall} outside 0..15")
        field = (
            self.stall << _STALL_SHIFT
            | (0 if self.yield_hint else 1) << _YIELD_SHIFT
            | (NO_BARRIER if self.write_barrier is None else self.write_barrier) << _WRITE_SHIFT
            | (NO_BARRIER if self.read_barrier is None else self.read_barrier) << _READ_SHIFT
            | (self.wait_mask & 0x3F) << _WAIT_SHIFT
            | (self.reuse & 0xF) << _REUSE_SHIFT
        )
        return (high & ~_FIELD_MASK & ((1 << 64) - 1)) | field

    @property
    def waits(self) -> frozenset[int]:
        return frozenset(i for i in range(SCOREBOARD_COUNT) if self.wait_mask >> i & 1)

    @property
    def sets(self) -> frozenset[int]:
        return frozenset(b for b in (self.write_barrier, self.read_barrier) if b is not None)

    @property
    def max_stall(self) -> int:
        """The largest stall this instruction's yield setting can encode."""
        return MAX_STALL_WITH_YIELD if self.yield_hint else MAX_STALL_WITHOUT_YIELD

    def without_reuse(self) -> ControlBits:
        return dataclasses.replace(self, reuse=0) if self.reuse else self

    def text(self) -> str:
        """CuAssembler's notation: ``[B<wait>:R<read>:W<write>:<Y|->:S<stall>]``."""
        wait = "".join(str(i) if self.wait_mask >> i & 1 else "-" for i in range(SCOREBOARD_COUNT))
        read = "-" if self.read_barrier is None else str(self.read_barrier)
        write = "-" if self.write_barrier is None else str(self.write_barrier)
        reuse = "" if not self.reuse else ":U" + "".join(
            "abcd"[i] for i in range(4) if self.reuse >> i & 1)
        return f"[B{wait}:R{read}:W{write}:{'Y' if self.yield_hint else '-'}:S{self.stall:02d}{reuse}]"
