"""The benchmark programs of BENCHMARKS.md as µGraphs: the reference (unfused) kernel graph and a
hand-built fused µGraph of the kind Mirage found, each a function of the batch size.

``CASES`` maps a case name (``gqa_b1``, ``rmsnorm_b8``, ...) to a :class:`Case`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.mugraphs import attention, mlp, ntrans


@dataclass(frozen=True)
class Case:
    name: str
    program: str  # gqa, qknorm, rmsnorm, ntrans, lora, gatedmlp
    size: int  # b, or m for gatedmlp / lora
    reference: Callable
    fused: Callable
    config: str | None  # the search config of the program

    def shapes(self) -> list[tuple[int, ...]]:
        return [t.shape for t in self.reference().input_types]


def _cases() -> dict[str, Case]:
    rows = []
    for b in (1, 8):
        rows += [
            Case(f"gqa_b{b}", "gqa", b, lambda b=b: attention.reference(b),
                 lambda b=b: attention.fused(b), "attention"),
            Case(f"qknorm_b{b}", "qknorm", b, lambda b=b: attention.reference(b, qknorm=True),
                 lambda b=b: attention.fused(b, qknorm=True), "attention"),
            Case(f"rmsnorm_b{b}", "rmsnorm", b, lambda b=b: mlp.rmsnorm_reference(b),
                 lambda b=b: mlp.rmsnorm_fused(b), "mlp"),
            Case(f"ntrans_b{b}", "ntrans", b, lambda b=b: ntrans.reference(b),
                 lambda b=b: ntrans.fused(b), None),
        ]
    rows.append(Case("lora_m16", "lora", 16, lambda: mlp.lora_reference(16), lambda: mlp.lora_fused(16),
                     "lora"))
    for m in (1, 8):
        rows.append(Case(f"gatedmlp_m{m}", "gatedmlp", m, lambda m=m: mlp.gatedmlp_reference(m),
                         lambda m=m: mlp.gatedmlp_fused(m), "mlp"))
    return {c.name: c for c in rows}


CASES = _cases()
