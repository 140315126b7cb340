"""The ``.nv.info`` attribute tables (EIATTR records) of a cubin.

A record is ``format:u8 attribute:u8 value:u16``; for the ``SVAL`` format the ``u16`` is the length of
a payload that follows.  Several attributes list byte offsets of instructions inside
``.text.<kernel>`` (exit instructions, ``S2R SR_CTAID`` reads the driver may patch, mbarrier
operations, ...).  The tuner pins every instruction such a table names, so the tables stay true
without being rewritten.  Attributes whose layout is not known are treated the same way for every
aligned in-range word of their payload, which can only pin more.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from mirage.sass.elf import Cubin

NV_INFO = ".nv.info"
INSTRUCTION_BYTES = 16


class RecordFormat(enum.IntEnum):
    NVAL = 1  # no value
    BVAL = 2  # one byte
    HVAL = 3  # two bytes
    SVAL = 4  # sized payload


class AttributeKind(enum.Enum):
    VALUE = "value"  # no instruction offsets inside
    OFFSETS = "offsets"  # a list of u32 instruction offsets
    OFFSET_WORDS = "offset-words"  # offsets mixed with other words: pin every aligned word in range
    BRANCH_TARGETS = "branch-targets"  # indirect-branch table: pinned and block leaders


@dataclass(frozen=True)
class AttributeRow:
    id: int
    name: str
    kind: AttributeKind


_V, _O, _W, _B = (AttributeKind.VALUE, AttributeKind.OFFSETS, AttributeKind.OFFSET_WORDS,
                  AttributeKind.BRANCH_TARGETS)

# Attribute ids and names as printed by ``cuobjdump -elf``; the kind says what the tuner must respect.
ATTRIBUTES: tuple[AttributeRow, ...] = tuple(AttributeRow(i, "EIATTR_" + n, k) for i, n, k in (
    (0x01, "PAD", _V), (0x02, "IMAGE_SLOT", _V), (0x03, "JUMPTABLE_RELOCS", _W), (0x04, "CTAIDZ_USED", _V),
    (0x05, "MAX_THREADS", _V), (0x06, "IMAGE_OFFSET", _V), (0x07, "IMAGE_SIZE", _V),
    (0x08, "TEXTURE_NORMALIZED", _V), (0x09, "SAMPLER_INIT", _V), (0x0A, "PARAM_CBANK", _V),
    (0x0B, "SMEM_PARAM_OFFSETS", _V), (0x0C, "CBANK_PARAM_OFFSETS", _V), (0x0D, "SYNC_STACK", _V),
    (0x0E, "TEXID_SAMPID_MAP", _V), (0x0F, "EXTERNS", _V), (0x10, "REQNTID", _V),
    (0x11, "FRAME_SIZE", _V), (0x12, "MIN_STACK_SIZE", _V), (0x13, "SAMPLER_FORCE_UNNORMALIZED", _V),
    (0x14, "BINDLESS_IMAGE_OFFSETS", _W), (0x15, "BINDLESS_TEXTURE_BANK", _V),
    (0x16, "BINDLESS_SURFACE_BANK", _V), (0x17, "KPARAM_INFO", _V), (0x18, "SMEM_PARAM_SIZE", _V),
    (0x19, "CBANK_PARAM_SIZE", _V), (0x1A, "QUERY_NUMATTRIB", _V), (0x1B, "MAXREG_COUNT", _V),
    (0x1C, "EXIT_INSTR_OFFSETS", _O), (0x1D, "S2RCTAID_INSTR_OFFSETS", _O),
    (0x1E, "CRS_STACK_SIZE", _V), (0x1F, "NEED_CNP_WRAPPER", _V), (0x20, "NEED_CNP_PATCH", _V),
    (0x21, "EXPLICIT_CACHING", _V), (0x22, "ISTYPEP_USED", _V), (0x23, "MAX_STACK_SIZE", _V),
    (0x24, "SUQ_USED", _V), (0x25, "LD_CACHEMOD_INSTR_OFFSETS", _O), (0x26, "LOAD_CACHE_REQUEST", _V),
    (0x27, "ATOM_SYS_INSTR_OFFSETS", _O), (0x28, "COOP_GROUP_INSTR_OFFSETS", _O),
    (0x29, "COOP_GROUP_MASK_REGIDS", _V), (0x2A, "SW1850030_WAR", _W), (0x2B, "WMMA_USED", _V),
    (0x2C, "HAS_PRE_V10_OBJECT", _V), (0x2D, "ATOMF16_EMUL_INSTR_OFFSETS", _O),
    (0x2E, "ATOM16_EMUL_INSTR_REG_MAP", _W), (0x2F, "REGCOUNT", _V), (0x30, "SW2393858_WAR", _W),
    (0x31, "INT_WARP_WIDE_INSTR_OFFSETS", _O), (0x32, "SHARED_SCRATCH", _V), (0x33, "STATISTICS", _V),
    (0x34, "INDIRECT_BRANCH_TARGETS", _B), (0x35, "SW2861232_WAR", _W), (0x36, "SW_WAR", _W),
    (0x37, "CUDA_API_VERSION", _V), (0x38, "NUM_MBARRIERS", _V), (0x39, "MBARRIER_INSTR_OFFSETS", _O),
    (0x3A, "COROUTINE_RESUME_ID_OFFSETS", _O), (0x3B, "SAM_REGION_STACK_SIZE", _V),
    (0x3C, "PER_REG_TARGET_PERF_STATS", _V), (0x3D, "CTA_PER_CLUSTER", _V), (0x3E, "EXPLICIT_CLUSTER", _V),
    (0x3F, "MAX_CLUSTER_RANK", _V), (0x40, "INSTR_REG_MAP", _W), (0x41, "RESERVED_SMEM_USED", _V),
    (0x42, "RESERVED_SMEM_0_SIZE", _V), (0x43, "UCODE_SECTION_DATA", _W),
    (0x44, "UNUSED_LOAD_BYTE_OFFSET", _W), (0x45, "KPARAM_INFO_V2", _V), (0x46, "SYSCALL_OFFSETS", _O),
    (0x47, "SW_WAR_MEMBAR_SYS_INSTR_OFFSETS", _O), (0x48, "GRAPHICS_GLOBAL_CBANK", _V),
    (0x49, "SHADER_TYPE", _V), (0x4A, "VRC_CTA_INIT_COUNT", _V), (0x4B, "TOOLS_PATCH_FUNC", _W),
    (0x4C, "NUM_BARRIERS", _V), (0x4D, "TEXMODE_INDEPENDENT", _V), (0x4E, "PERF_STATISTICS", _V),
    (0x4F, "AT_ENTRY_FRAGMENTS", _W), (0x50, "SPARSE_MMA_MASK", _V), (0x51, "TCGEN05_1CTA_USED", _V),
    (0x52, "TCGEN05_2CTA_USED", _V), (0x53, "GEN_ERRBAR_AT_EXIT", _V), (0x54, "REG_RECONFIG", _V),
    (0x55, "ANNOTATIONS", _V), (0x56, "SANITIZE", _V), (0x57, "STACK_CANARY_TRAP_OFFSETS", _O),
    (0x58, "STUB_FUNCTION_KIND", _V), (0x59, "LOCAL_CTA_ASYNC_STORE_OFFSETS", _O),
    (0x5A, "MERCURY_FINALIZER_OPTIONS", _V),
))
ATTRIBUTES_BY_ID: dict[int, AttributeRow] = {row.id: row for row in ATTRIBUTES}


@dataclass(frozen=True)
class NvInfoRecord:
    format: RecordFormat
    attribute: int
    value: int  # the u16 of non-SVAL records, the payload length of SVAL records
    payload: bytes
    position: int  # byte offset of the record in its section

    @property
    def name(self) -> str:
        row = ATTRIBUTES_BY_ID.get(self.attribute)
        return row.name if row else f"EIATTR_UNKNOWN_{self.attribute:#04x}"

    @property
    def kind(self) -> AttributeKind:
        row = ATTRIBUTES_BY_ID.get(self.attribute)
        # An attribute this table does not know may list offsets: treat its words conservatively.
        return row.kind if row else AttributeKind.OFFSET_WORDS

    def words(self) -> tuple[int, ...]:
        count = len(self.payload) // 4
        return struct.unpack_from(f"<{count}I", self.payload) if count else ()


@dataclass(frozen=True)
class KernelParameter:
    """One kernel parameter from ``EIATTR_KPARAM_INFO``: its ordinal, offset and size in bytes."""

    ordinal: int
    offset: int
    size: int


def parse_records(data: bytes) -> tuple[NvInfoRecord, ...]:
    records = []
    position = 0
    while position + 4 <= len(data):
        raw_format, attribute, value = struct.unpack_from("<BBH", data, position)
        try:
            record_format = RecordFormat(raw_format)
        except ValueError:
            break  # trailing padding or an unknown layout: stop rather than misread
        payload = b""
        size = 4
        if record_format is RecordFormat.SVAL:
            payload = data[position + 4: position + 4 + value]
            size += value
        records.append(NvInfoRecord(record_format, attribute, value, payload, position))
        position += size
    return tuple(records)


def kernel_records(cubin: Cubin, kernel: str) -> tuple[NvInfoRecord, ...]:
    name = f"{NV_INFO}.{kernel}"
    return parse_records(cubin.section_bytes(name)) if cubin.has_section(name) else ()


def instruction_offsets(cubin: Cubin, kernel: str) -> dict[int, tuple[str, ...]]:
    """Byte offsets in ``.text.<kernel>`` named by an attribute table, with the attribute names."""
    text_size = cubin.text_section(kernel).size
    found: dict[int, list[str]] = {}
    for record in kernel_records(cubin, kernel):
        if record.kind is AttributeKind.VALUE or record.format is not RecordFormat.SVAL:
            continue
        words = record.words()
        if record.kind is AttributeKind.OFFSETS:
            candidates = words
        else:
            candidates = tuple(w for w in words if w % INSTRUCTION_BYTES == 0)
        for offset in candidates:
            if 0 <= offset < text_size:
                found.setdefault(offset, []).append(record.name)
    return {offset: tuple(names) for offset, names in sorted(found.items())}


def branch_target_offsets(cubin: Cubin, kernel: str) -> frozenset[int]:
    """Offsets that an indirect branch table may jump to (every aligned in-range word, to be safe)."""
    text_size = cubin.text_section(kernel).size
    targets = set()
    for record in kernel_records(cubin, kernel):
        if record.kind is AttributeKind.BRANCH_TARGETS:
            targets.update(w for w in record.words() if w % INSTRUCTION_BYTES == 0 and w < text_size)
    return frozenset(targets)


def kernel_parameters(cubin: Cubin, kernel: str) -> tuple[KernelParameter, ...]:
    """The parameters of a kernel in ordinal order, from its ``EIATTR_KPARAM_INFO`` records."""
    parameters = []
    for record in kernel_records(cubin, kernel):
        if record.attribute == 0x17 and len(record.payload) >= 12:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", record.payload)
            parameters.append(KernelParameter(ordinal=ordinal, offset=offset, size=(flags >> 18) & 0x3FFF))
    return tuple(sorted(parameters, key=lambda p: p.ordinal))
