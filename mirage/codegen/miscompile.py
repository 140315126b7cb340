"""Machine code that ptxas can emit for a correct kernel and the GPU cannot run, found by reading the SASS.

One such form is known (nvcc 13.0.88, sm_90a): a ``cp.async`` copy (``LDGSTS``) whose 64-bit memory
descriptor names an odd uniform register, with a shared address that adds a uniform register nothing
writes, as in ``LDGSTS.E.BYPASS.LTC128B.128 [R7+UR0], desc[UR1][R4.64]``. A descriptor takes an aligned
register pair, and the GPU stops at such a copy with an illegal-instruction error. Two checks find it:
a descriptor in an odd uniform register, and an address or descriptor that reads a uniform register no
instruction of its kernel writes (wgmma's ``gdesc`` operands aside: ptxas leaves the half of them that a
register operand replaces unwritten).

ptxas emitted it for 20 of the GPU tests' 100 random µGraphs built with the thread-index assumption
(``MIRAGE_ASSUME_THREAD_INDEX``, which makes index arithmetic cheaper) and for none built without it;
one of ten of those 20 still got it with the index masked to [0, 1024) instead of assumed to lie there.
Over 2,748 SASS dumps (the builds of the tests, benchmarks and explorations, and those 100 µGraphs with
the assumption and without) both checks flag the same 26 kernels, all of this form and built with the
assumption, and nothing else.

:func:`faulting_instructions` finds such instructions; the compiler (:mod:`mirage.codegen.compile`)
checks every cubin it builds and rebuilds a kernel that has one with :data:`FALLBACK_DEFINES`.
"""

from __future__ import annotations

import re

# The checks made, part of every cubin's cache key: a cubin cached before a check existed is rebuilt.
CHECKS = "odd-descriptor, unwritten-uniform-address"

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_PREDICATE = re.compile(r"^@!?U?P\w+\s+")
# A memory descriptor held in an odd uniform register: never a register pair's first half.
_ODD_DESCRIPTOR = re.compile(r"\bdesc\[UR\d*[13579]\]")
# The bracketed operands of an instruction (addresses, descriptors), wgmma's gdesc[...] excepted.
_BRACKETS = re.compile(r"(?<!gdesc)\[([^\]]*)\]")
_UNIFORM = re.compile(r"\bUR(\d+)\b")
_WIDTH = re.compile(r"\.(64|128|WIDE)\b")

# Defines under which ptxas has not emitted the forms above: the thread-index assumption off.
FALLBACK_DEFINES: tuple[tuple[str, str], ...] = (("MIRAGE_ASSUME_THREAD_INDEX", "0"),)


def _written_uniforms(instructions: list[tuple[str, str]]) -> set[int]:
    """Uniform registers that some instruction writes (its first operand, with the width of .64,
    .128 or .WIDE)."""
    written: set[int] = set()
    for _, text in instructions:
        opcode, _, operands = _PREDICATE.sub("", text).partition(" ")
        first = _UNIFORM.fullmatch(operands.split(",")[0].strip())
        if first:
            width = _WIDTH.search(opcode)
            count = {"64": 2, "128": 4, "WIDE": 2}[width.group(1)] if width else 1
            written.update(range(int(first.group(1)), int(first.group(1)) + count))
    return written


def _kernel_faults(sass: str, name: str) -> list[str]:
    instructions = _INSTRUCTION.findall(sass)
    written = _written_uniforms(instructions)
    found = []
    for address, text in instructions:
        operands = _PREDICATE.sub("", text).partition(" ")[2]
        unwritten = {int(n) for bracket in _BRACKETS.findall(operands)
                     for n in _UNIFORM.findall(bracket)} - written
        if _ODD_DESCRIPTOR.search(text) or unwritten:
            found.append(f"{name}+0x{address}: {text}" if name else f"{address}: {text}")
    return found


def faulting_instructions(sass: str) -> list[str]:
    """The instructions of ``sass`` (``cuobjdump -sass`` text, one kernel or several) that the GPU
    cannot run, as ``"<kernel>+0x<address>: <instruction>"`` lines (the form compute-sanitizer
    reports a fault in); empty when there are none."""
    kernels = sass.split("Function : ")
    if len(kernels) == 1:
        return _kernel_faults(sass, "")
    return [line for kernel in kernels[1:] for line in _kernel_faults(kernel, kernel.split()[0])]


def describe(found: list[str]) -> str:
    """A message for a cubin that holds ``found`` (at least one instruction)."""
    shown = "\n".join(f"  {line}" for line in found[:4])
    more = f"\n  ... and {len(found) - 4} more" if len(found) > 4 else ""
    return (
        f"ptxas emitted {len(found)} instruction(s) whose memory descriptor lies in an odd uniform "
        f"register or whose address reads a uniform register nothing writes; the GPU stops at them with "
        f"an illegal-instruction error:\n{shown}{more}"
    )
