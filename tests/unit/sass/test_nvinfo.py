from __future__ import annotations

import struct

import pytest
from sass_fixtures import fixture_cubin

from mirage.sass import nvinfo


def test_exit_offsets_point_at_exit_instructions(any_kernel):
    cubin_name = {"scaled_add": "elementwise.cubin", "scaled_add_x4": "elementwise.cubin",
                  "cute_gemm_tn": "cute_gemm.cubin"}.get(any_kernel.name)
    if cubin_name is None:
        pytest.skip("only the hand-written fixtures have a known cubin name")
    offsets = nvinfo.instruction_offsets(fixture_cubin(cubin_name), any_kernel.name)
    exits = [offset for offset, names in offsets.items() if "EIATTR_EXIT_INSTR_OFFSETS" in names]
    assert exits
    for offset in exits:
        assert any_kernel.instructions[offset // 16].opcode == "EXIT"
        assert any_kernel.instructions[offset // 16].pinned


@pytest.mark.parametrize("kernel, sizes", [
    ("scaled_add", [8, 8, 8, 4, 4]),
    ("scaled_add_x4", [8, 8, 8, 4, 4]),
])
def test_kernel_parameters_from_kparam_info(kernel, sizes):
    parameters = nvinfo.kernel_parameters(fixture_cubin("elementwise.cubin"), kernel)
    assert [p.size for p in parameters] == sizes
    assert [p.offset for p in parameters] == [0, 8, 16, 24, 28]


def test_cute_gemm_parameters():
    parameters = nvinfo.kernel_parameters(fixture_cubin("cute_gemm.cubin"), "cute_gemm_tn")
    assert [p.size for p in parameters] == [8, 8, 8, 4, 4, 4]


def _record(attribute: int, words: list[int]) -> bytes:
    payload = struct.pack(f"<{len(words)}I", *words)
    return struct.pack("<BBH", 4, attribute, len(payload)) + payload


def test_parse_records_handles_every_format():
    data = struct.pack("<BBH", 1, 0x04, 0) + struct.pack("<BBH", 3, 0x1B, 0xFF) + _record(0x1C, [0x70, 0x150])
    records = nvinfo.parse_records(data)
    assert [r.name for r in records] == ["EIATTR_CTAIDZ_USED", "EIATTR_MAXREG_COUNT",
                                         "EIATTR_EXIT_INSTR_OFFSETS"]
    assert records[1].value == 0xFF
    assert records[2].words() == (0x70, 0x150)
    assert records[2].kind is nvinfo.AttributeKind.OFFSETS


def test_unknown_attribute_is_treated_as_offsets_conservatively():
    (record,) = nvinfo.parse_records(_record(0x7E, [0x20, 0x21]))
    assert record.name == "EIATTR_UNKNOWN_0x7e"
    assert record.kind is nvinfo.AttributeKind.OFFSET_WORDS
