"""Per-opcode facts for sm_90 SASS, as data: which opcodes are pinned, how they touch memory, and
which operands they write.

Everything here errs on the safe side.  An opcode in no table is pinned (never moved).  Where the
destination layout of an operand is uncertain, it is counted as written *and* read, which can only
add dependences.  Register widths err wide for the same reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# -- opcode property sets ---------------------------------------------------------------------------

# Control transfer and convergence: pinned; the first group also ends a basic block.
BLOCK_TERMINATORS = frozenset({
    "BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU", "CALL", "RET", "EXIT", "KILL", "BREAK", "BPT", "RTT",
})
CONTROL_FLOW = BLOCK_TERMINATORS | frozenset({
    "BSSY", "BSYNC", "WARPSYNC", "BMOV", "NANOSLEEP", "YIELD", "LEPC", "PRET", "JCAL", "ACQBULK",
})
# Barriers, fences, scoreboard counters and cache control: pinned.
SYNCHRONIZATION = frozenset({
    "BAR", "B2R", "R2B", "MEMBAR", "FENCE", "ERRBAR", "CGAERRBAR", "CCTL", "CCTLL", "CCTLT", "DEPBAR",
    "LDGDEPBAR", "ARRIVES", "CGABAR", "UCGABAR_ARV", "UCGABAR_WAIT", "PMTRIG", "SETCTAID", "SETLMEMBASE",
})
# Hopper asynchronous and warpgroup operations (tensor memory access, bulk copies, mbarriers,
# warpgroup MMA, register reconfiguration): pinned.
HOPPER_ASYNC = frozenset({
    "HGMMA", "IGMMA", "QGMMA", "BGMMA", "WARPGROUP", "SYNCS", "UTMALDG", "UTMASTG", "UTMAPF", "UTMACCTL",
    "UTMACMDFLUSH", "UTMAREDG", "UBLKCP", "UBLKRED", "UBLKPF", "ELECT", "USETMAXREG", "ENDCOLLECTIVE",
})
# Placeholders the compiler keeps for alignment or hardware workarounds: pinned.
PLACEHOLDERS = frozenset({"NOP"})
# Special registers whose reads must not move (timers, performance counters).
PINNED_SPECIAL_REGISTERS = ("SR_CLOCK", "SR_GLOBALTIMER", "SR_PM")


class MemorySpace(enum.Enum):
    GLOBAL = "global"
    SHARED = "shared"
    LOCAL = "local"
    GENERIC = "generic"  # may alias any of the three above
    CONSTANT = "constant"  # read-only while a kernel runs


@dataclass(frozen=True)
class MemoryAccess:
    """How an opcode touches memory: spaces read and written."""

    reads: frozenset[MemorySpace]
    writes: frozenset[MemorySpace]

    @property
    def spaces(self) -> frozenset[MemorySpace]:
        return self.reads | self.writes


def _access(reads: tuple[MemorySpace, ...] = (), writes: tuple[MemorySpace, ...] = ()) -> MemoryAccess:
    return MemoryAccess(frozenset(reads), frozenset(writes))


_G, _S, _L, _X, _C = (MemorySpace.GLOBAL, MemorySpace.SHARED, MemorySpace.LOCAL, MemorySpace.GENERIC,
                      MemorySpace.CONSTANT)

# The movable memory opcodes.  Operands before the first memory operand are destinations.
MEMORY_OPCODES: dict[str, MemoryAccess] = {
    "LDG": _access(reads=(_G,)),
    "STG": _access(writes=(_G,)),
    "LDS": _access(reads=(_S,)),
    "STS": _access(writes=(_S,)),
    "LDSM": _access(reads=(_S,)),
    "STSM": _access(writes=(_S,)),
    "LDL": _access(reads=(_L,)),
    "STL": _access(writes=(_L,)),
    "LD": _access(reads=(_X,)),
    "ST": _access(writes=(_X,)),
    "LDGSTS": _access(reads=(_G,), writes=(_S,)),  # cp.async: global -> shared
    "ATOM": _access(reads=(_X,), writes=(_X,)),
    "ATOMG": _access(reads=(_G,), writes=(_G,)),
    "ATOMS": _access(reads=(_S,), writes=(_S,)),
    "RED": _access(reads=(_X,), writes=(_X,)),
    "REDG": _access(reads=(_G,), writes=(_G,)),
    "LDC": _access(reads=(_C,)),
    "ULDC": _access(reads=(_C,)),
}
# SIP's move set: the memory instructions a mutation moves up or down by one.
SIP_MOVABLE = frozenset({"LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LDGSTS", "LDL", "STL", "LD", "ST"})
# Memory-ordering modifiers that make even a load ordered with every other access of its space.
ORDERING_MODIFIERS = frozenset({"STRONG", "SYS", "MMIO", "VOLATILE", "ACQUIRE", "RELEASE", "ACQ_REL", "SC"})

# Movable compute opcodes whose first operand is the destination (plus directly following predicate
# operands: carry-outs of IADD3/LEA/IMAD, the second predicate of a SETP, ...).
ALU_OPCODES = frozenset({
    # fp32 / fp16 / bf16
    "FADD", "FMUL", "FFMA", "FMNMX", "FMNMX3", "FSEL", "FSET", "FSETP", "FCHK", "FSWZADD", "FRND", "FADD32I",
    "FMUL32I", "FFMA32I", "HADD2", "HMUL2", "HFMA2", "HMNMX2", "HSET2", "HSETP2", "HADD2_32I", "HMUL2_32I",
    "HFMA2_32I", "MUFU", "F2F", "F2I", "I2F", "I2I", "I2FP", "F2IP", "F2FP", "I2IP", "FMUL2", "FADD2",
    "FFMA2",
    # fp64
    "DADD", "DMUL", "DFMA", "DSETP", "DSET", "DMNMX",
    # integer and logic
    "IADD3", "IADD", "IADD32I", "IMAD", "IMUL", "IMUL32I", "IABS", "IMNMX", "VIMNMX", "VIMNMX3", "VIADD",
    "VIADDMNMX", "ISETP", "ISCADD", "ISCADD32I", "LEA", "LOP", "LOP3", "LOP32I", "SHF", "SHL", "SHR",
    "SEL", "MOV", "MOV32I", "PRMT", "POPC", "FLO", "BREV", "BMSK", "SGXT", "IDP", "IDP4A", "VABSDIFF",
    "VABSDIFF4", "PLOP3", "PSETP", "P2R", "R2P", "CS2R", "S2R", "S2UR", "R2UR",
    # matrix (register operands only; warpgroup MMA is pinned)
    "HMMA", "IMMA", "DMMA", "BMMA",
    # warp-level data exchange (same block, same active threads, so free to move with its operands)
    "SHFL", "VOTE", "VOTEU", "MATCH", "REDUX",
    # uniform datapath
    "UMOV", "UIADD3", "UIMAD", "ULEA", "ULOP", "ULOP3", "ULOP32I", "USHF", "USHL", "USHR", "UISETP",
    "USEL", "UPLOP3", "UPRMT", "USGXT", "UFLO", "UPOPC", "UBREV", "UBMSK", "UP2UR", "UR2UP", "UVIADD",
    "UIABS", "UIMNMX", "UPSETP", "UF2FP", "USETP",
})
# Opcodes with two leading destinations (predicate pair, or predicate + register).
TWO_DESTINATION_OPCODES = frozenset({
    "ISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "UISETP", "UPSETP", "PLOP3", "UPLOP3", "SHFL", "VOTE",
    "VOTEU",
})
# Opcodes that write only their first operand, a predicate, and read every register after it
# (``FCHK P0, R0, R11``: the division range check reads both R0 and R11).
SINGLE_DESTINATION_OPCODES = frozenset({"FCHK"})
FP64_OPCODES = frozenset({"DADD", "DMUL", "DFMA", "DSETP", "DSET", "DMNMX"})
# Opcodes whose latency may vary (memory, special registers, transcendental, conversions, warp
# exchange, fp64).  One of these *without* a write barrier still delivers its result late: the
# compiler relies on in-order completion behind a later instruction's scoreboard, or on distance.
VARIABLE_LATENCY_OPCODES = frozenset(MEMORY_OPCODES) | FP64_OPCODES | frozenset({
    "S2R", "S2UR", "R2UR", "MUFU", "F2F", "F2I", "I2F", "I2I", "FRND", "I2FP", "F2IP", "I2IP",
    "SHFL", "MATCH", "REDUX", "VOTE", "VOTEU", "POPC", "FLO", "BREV",
})
# Short fixed-latency arithmetic (about 4-6 cycles on sm_80/sm_90): their results are surely
# available after ``LatencyRules.short_cap`` cycles.  Everything else uses ``long_cap``.
SHORT_LATENCY_OPCODES = frozenset(
    op for op in ALU_OPCODES if not op.startswith("U") and op not in VARIABLE_LATENCY_OPCODES
    and op not in {"HMMA", "IMMA", "DMMA", "BMMA", "R2P", "P2R", "CS2R"})
SIXTY_FOUR_BIT_MODIFIERS = frozenset({"64", "U64", "S64", "F64", "WIDE"})
MATRIX_OPCODES = frozenset({"HMMA", "IMMA", "DMMA", "BMMA"})
MATRIX_FALLBACK_WIDTH = 8

# Register widths of (destination, a, b, c) for known matrix shapes: (opcode, shape, accumulator), for
# 16-bit (or 8-bit integer) operands.  TF32 operands take a register per element, twice the registers of
# 16-bit ones at the same shape (PTX ISA: mma.m16n8k8 .tf32 has four A and two B registers), so they
# have their own table.
MATRIX_WIDTHS: dict[tuple[str, str, str], tuple[int, int, int, int]] = {
    ("HMMA", "16816", "F32"): (4, 4, 2, 4),
    ("HMMA", "16816", "F16"): (2, 4, 2, 2),
    ("HMMA", "1688", "F32"): (4, 2, 1, 4),
    ("HMMA", "1688", "F16"): (2, 2, 1, 2),
    ("IMMA", "16832", "S32"): (4, 4, 2, 4),
    ("IMMA", "8816", "S32"): (2, 1, 1, 2),
}
TF32_MATRIX_WIDTHS: dict[tuple[str, str, str], tuple[int, int, int, int]] = {
    ("HMMA", "1688", "F32"): (4, 4, 2, 4),
    ("HMMA", "1684", "F32"): (4, 2, 1, 4),
}


class DestinationRule(enum.Enum):
    FIRST = "first"  # operand 0 and the predicates right after it
    ONLY_FIRST = "only-first"  # operand 0 alone
    FIRST_TWO = "first-two"  # operands 0 and 1
    BEFORE_MEMORY = "before-memory"  # every operand before the first memory operand
    ALL = "all"  # unknown layout: every register operand is written and read


def destination_rule(opcode: str) -> DestinationRule:
    if opcode in MEMORY_OPCODES:
        return DestinationRule.BEFORE_MEMORY
    if opcode in TWO_DESTINATION_OPCODES:
        return DestinationRule.FIRST_TWO
    if opcode in SINGLE_DESTINATION_OPCODES:
        return DestinationRule.ONLY_FIRST
    if opcode in ALU_OPCODES:
        return DestinationRule.FIRST
    return DestinationRule.ALL


def pinned_reason(opcode: str, modifiers: tuple[str, ...], predicate: str | None,
                  operands: tuple[str, ...]) -> str | None:
    """Why an instruction must never move, or ``None`` when only its dependences constrain it."""
    if opcode in CONTROL_FLOW:
        return f"control flow ({opcode})"
    if opcode in SYNCHRONIZATION:
        return f"barrier or fence ({opcode})"
    if opcode in HOPPER_ASYNC:
        return f"Hopper async or warpgroup operation ({opcode})"
    if opcode in PLACEHOLDERS:
        return f"placeholder ({opcode})"
    if predicate == "!PT":
        return "never-executed placeholder (@!PT)"
    if any(special in operand for operand in operands for special in PINNED_SPECIAL_REGISTERS):
        return "reads a timer or performance counter"
    if opcode not in MEMORY_OPCODES and opcode not in ALU_OPCODES:
        return f"opcode {opcode} is not in the legality model's tables"
    return None


def memory_access(opcode: str, modifiers: tuple[str, ...]) -> tuple[MemoryAccess | None, bool]:
    """The memory access of an opcode and whether it is ordered (strong/volatile/acquire/...)."""
    access = MEMORY_OPCODES.get(opcode)
    if access is None:
        return None, False
    return access, any(modifier in ORDERING_MODIFIERS for modifier in modifiers)


def memory_data_width(opcode: str, modifiers: tuple[str, ...]) -> int:
    """Registers per data operand of a memory instruction (``.64``: 2, ``.128``: 4, LDSM ``.4``: 4)."""
    if opcode in ("LDSM", "STSM"):
        for marker in ("4", "2"):
            if marker in modifiers[1:]:
                return int(marker)
        return 1
    if "128" in modifiers:
        return 4
    if "64" in modifiers or "U64" in modifiers or "S64" in modifiers or "F64" in modifiers:
        return 2
    return 1


def operand_widths(opcode: str, modifiers: tuple[str, ...], operand_count: int) -> tuple[int, ...] | None:
    """Widths (in registers) of the register operands of a compute instruction by position among its
    non-predicate operands, or ``None`` for one register each (the common case)."""
    if opcode in MATRIX_OPCODES:
        shape = next((m for m in modifiers if m.isdigit()), "")
        accumulator = next((m for m in modifiers if m in ("F32", "F16", "S32")), "")
        table = TF32_MATRIX_WIDTHS if "TF32" in modifiers else MATRIX_WIDTHS
        widths = table.get((opcode, shape, accumulator))
        if widths is None or "SP" in modifiers:
            return (MATRIX_FALLBACK_WIDTH,) * operand_count
        return widths + (1,) * max(0, operand_count - 4)
    if opcode in ("IMAD", "UIMAD") and "WIDE" in modifiers:
        return (2, 1, 1, 2) + (1,) * max(0, operand_count - 4)
    if opcode in ("SHF", "USHF", "LEA", "ULEA", "MUFU"):
        return None  # 64-bit variants name both halves explicitly
    if opcode in FP64_OPCODES or opcode == "CS2R" and "32" not in modifiers:
        return (2,) * operand_count
    if SIXTY_FOUR_BIT_MODIFIERS & set(modifiers):
        return (2,) * operand_count  # conversions and other 64-bit forms: err wide
    return None
