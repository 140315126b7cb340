from __future__ import annotations

import struct

import pytest
from sass_fixtures import FIXTURES, fixture_cubin

from mirage.sass.elf import Cubin, changed_ranges
from mirage.sass.errors import CubinFormatError, KernelNotFoundError

CUBINS = ["elementwise.cubin", "cute_gemm.cubin"]


@pytest.mark.parametrize("name", CUBINS)
def test_unmodified_cubin_round_trips_byte_for_byte(name, tmp_path):
    original = (FIXTURES / name).read_bytes()
    cubin = Cubin.from_bytes(original)
    for kernel in cubin.kernel_names():
        cubin = cubin.with_text(kernel, cubin.text(kernel))
    cubin.write(tmp_path / "copy.cubin")
    assert (tmp_path / "copy.cubin").read_bytes() == original


@pytest.mark.parametrize("name, kernels", [
    ("elementwise.cubin", {"scaled_add", "scaled_add_x4"}),
    ("cute_gemm.cubin", {"cute_gemm_tn"}),
])
def test_kernel_names_and_text_sections(name, kernels):
    cubin = fixture_cubin(name)
    assert set(cubin.kernel_names()) == kernels
    assert cubin.sm_version == 90
    for kernel in kernels:
        text = cubin.text(kernel)
        assert len(text) % 128 == 0 and len(text) > 0
        assert cubin.text_section(kernel).size == len(text)


def test_editing_text_changes_only_that_section():
    cubin = fixture_cubin("elementwise.cubin")
    section = cubin.text_section("scaled_add")
    text = bytearray(cubin.text("scaled_add"))
    text[0x20:0x30], text[0x30:0x40] = text[0x30:0x40], text[0x20:0x30]
    edited = cubin.with_text("scaled_add", bytes(text))
    ranges = changed_ranges(cubin.data, edited.data)
    assert ranges
    assert all(section.offset + 0x20 <= start and end <= section.offset + 0x40 for start, end in ranges)
    assert edited.text("scaled_add") == bytes(text)
    assert Cubin.from_bytes(edited.data).text("scaled_add_x4") == cubin.text("scaled_add_x4")


def test_length_changing_edit_is_refused():
    cubin = fixture_cubin("elementwise.cubin")
    with pytest.raises(CubinFormatError, match="only permutes"):
        cubin.with_text("scaled_add", cubin.text("scaled_add")[:-16])


@pytest.mark.parametrize("data, message", [
    (b"not an elf file at all" * 4, "no \\\\x7fELF"),
    (b"\x7fELF\x01\x01" + bytes(58), "64-bit"),
    (b"\x7fELF\x02\x01" + bytes(10), "truncated ELF file \\(16 bytes"),
])
def test_bad_input_raises_specific_errors(data, message):
    with pytest.raises(CubinFormatError, match=message):
        Cubin.from_bytes(data)


def test_wrong_machine_is_refused():
    data = bytearray((FIXTURES / "elementwise.cubin").read_bytes())
    struct.pack_into("<H", data, 18, 62)  # EM_X86_64
    with pytest.raises(CubinFormatError, match="EM_CUDA"):
        Cubin.from_bytes(bytes(data))


def test_unknown_kernel_names_the_kernels_present():
    with pytest.raises(KernelNotFoundError, match="scaled_add"):
        fixture_cubin("elementwise.cubin").text("missing_kernel")


def test_relocations_of_fixtures_are_empty_and_symbols_are_read():
    cubin = fixture_cubin("cute_gemm.cubin")
    assert cubin.relocations("cute_gemm_tn") == ()
    assert any(symbol.name == "cute_gemm_tn" for symbol in cubin.symbols)


def test_a_missing_cubin_is_a_format_error(tmp_path):
    with pytest.raises(CubinFormatError, match="cannot read the cubin"):
        Cubin.read(tmp_path / "missing.cubin")
