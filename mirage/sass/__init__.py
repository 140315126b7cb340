"""SASS tuner: legal instruction reordering of compiled kernels, searched on the GPU.

The pieces, in pipeline order: :mod:`~mirage.sass.elf` (cubin container),
:mod:`~mirage.sass.nvinfo` (EIATTR tables), :mod:`~mirage.sass.disasm` (nvdisasm listing →
instruction records), :mod:`~mirage.sass.control` (control bits), :mod:`~mirage.sass.kernel` and
:mod:`~mirage.sass.dataflow` (blocks, scoreboards), :mod:`~mirage.sass.legality` (``check_swap``),
:mod:`~mirage.sass.mutation` (moves and edit checks), the search policies and the sandboxed
evaluation.  Importing this package loads no GPU library.
"""

from __future__ import annotations

from mirage.sass.elf import Cubin
from mirage.sass.kernel import Kernel, load_kernel
from mirage.sass.legality import LatencyRules, Legality, Rule, check_swap
from mirage.sass.mutation import Move, MoveSet, apply_move, legal_moves, verify_edit

__all__ = [
    "Cubin", "Kernel", "LatencyRules", "Legality", "Move", "MoveSet", "Rule", "apply_move", "check_swap",
    "legal_moves", "load_kernel", "verify_edit",
]
