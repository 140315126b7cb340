"""Machine code that ptxas can emit for a correct kernel and the GPU cannot run, found by reading the SASS.

One such form is known (nvcc 13.0.88, sm_90a): a ``cp.async`` copy (``LDGSTS``) whose 64-bit memory
descriptor names an odd uniform register, with a shared address that adds a uniform register nothing
writes, as in ``LDGSTS.E.BYPASS.LTC128B.128 [R7+UR0], desc[UR1][R4.64]``. A descriptor takes an aligned
register pair, and the GPU stops at such a copy with an illegal-instruction error. ptxas emitted it for
20 of the GPU tests' 100 random µGraphs built with the thread-index assumption
(``MIRAGE_ASSUME_THREAD_INDEX``, which makes index arithmetic cheaper) and for none built without it;
one of ten of those 20 still got it with the index masked to [0, 1024) instead of assumed to lie there.

:func:`faulting_instructions` finds such instructions; the compiler (:mod:`mirage.codegen.compile`)
checks every cubin it builds and rebuilds a kernel that has one with :data:`FALLBACK_DEFINES`.
"""

from __future__ import annotations

import re

# The checks made, part of every cubin's cache key: a cubin cached before a check existed is rebuilt.
CHECKS = "odd-descriptor"

# A memory descriptor held in an odd uniform register: never a register pair's first half.
_ODD_DESCRIPTOR = re.compile(r"\bdesc\[UR\d*[13579]\]")
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")

# Defines under which ptxas has not emitted the forms above: the thread-index assumption off.
FALLBACK_DEFINES: tuple[tuple[str, str], ...] = (("MIRAGE_ASSUME_THREAD_INDEX", "0"),)


def faulting_instructions(sass: str) -> list[str]:
    """The instructions of ``sass`` (``cuobjdump -sass`` text) that the GPU cannot run, as
    ``"<address>: <instruction>"`` lines; empty when there are none."""
    found = []
    for address, text in _INSTRUCTION.findall(sass):
        if _ODD_DESCRIPTOR.search(text):
            found.append(f"{address}: {text}")
    return found


def describe(found: list[str]) -> str:
    """A message for a cubin that holds ``found`` (at least one instruction)."""
    shown = "\n".join(f"  {line}" for line in found[:4])
    more = f"\n  ... and {len(found) - 4} more" if len(found) > 4 else ""
    return (
        f"ptxas emitted {len(found)} instruction(s) whose memory descriptor lies in an odd uniform "
        f"register; the GPU stops at them with an illegal-instruction error:\n{shown}{more}"
    )
