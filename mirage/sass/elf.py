"""A small reader and in-place patcher for cubins (ELF64, little endian, ``EM_CUDA``).

Only what the tuner needs: section headers and names, symbols, relocations against a kernel's
``.text.<kernel>`` section, and replacing the bytes of a section *without moving anything*.  An edit
that keeps a section's length rewrites only the bytes that changed, so an unmodified cubin
round-trips byte for byte and an edited one differs from the original only inside ``.text``
(and ``.nv.info`` where offsets are remapped).

>>> cubin = Cubin.read("kernel.cubin")                           # doctest: +SKIP
>>> cubin.kernel_names()                                         # doctest: +SKIP
('scaled_add',)
>>> same = cubin.with_section_bytes(".text.scaled_add", cubin.text("scaled_add"))  # doctest: +SKIP
>>> same.data == cubin.data                                      # doctest: +SKIP
True
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from pathlib import Path

from mirage.sass.errors import CubinFormatError, KernelNotFoundError

ELF_MAGIC = b"\x7fELF"
ELF_CLASS_64 = 2
ELF_DATA_LITTLE = 1
EM_CUDA = 190

SHT_NOBITS = 8
SHT_RELA = 4
SHT_REL = 9
SHT_SYMTAB = 2

TEXT_PREFIX = ".text."

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_REL = struct.Struct("<QQ")
_RELA = struct.Struct("<QQq")


@dataclass(frozen=True)
class Section:
    """One section header, as stored in the file."""

    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    addralign: int
    entsize: int

    @property
    def file_size(self) -> int:
        """Bytes the section occupies in the file (``NOBITS`` sections occupy none)."""
        return 0 if self.type == SHT_NOBITS else self.size


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    info: int
    other: int
    section_index: int


@dataclass(frozen=True)
class Relocation:
    """A relocation whose ``offset`` is a byte offset into the section it applies to."""

    section: str
    offset: int
    type: int
    symbol_index: int
    addend: int | None


@dataclass(frozen=True)
class Cubin:
    """An immutable cubin image.  Edits return new :class:`Cubin` values."""

    data: bytes
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    flags: int

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def read(cls, path: str | Path) -> Cubin:
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise CubinFormatError(f"cannot read the cubin {path}: {error.strerror or error}") from None
        return cls.from_bytes(data)

    @classmethod
    def from_bytes(cls, data: bytes) -> Cubin:
        data = bytes(data)
        if data[:4] != ELF_MAGIC:
            raise CubinFormatError(
                "not an ELF file (no \\x7fELF magic); pass a .cubin produced by nvcc -cubin")
        if len(data) < _HEADER.size:
            raise CubinFormatError(f"a truncated ELF file ({len(data)} bytes, shorter than its "
                                   f"{_HEADER.size}-byte header); pass the whole .cubin")
        if data[4] != ELF_CLASS_64 or data[5] != ELF_DATA_LITTLE:
            raise CubinFormatError("only 64-bit little-endian ELF cubins are supported")
        header = _HEADER.unpack_from(data, 0)
        machine, flags = header[2], header[7]
        section_offset, section_entry_size, section_count, names_index = (
            header[6], header[11], header[12], header[13])
        if machine != EM_CUDA:
            raise CubinFormatError(f"ELF machine is {machine}, not EM_CUDA ({EM_CUDA}); this is no cubin")
        if section_entry_size != _SECTION_HEADER.size:
            raise CubinFormatError(f"unexpected section header size {section_entry_size}")
        end = section_offset + section_count * section_entry_size
        if end > len(data):
            raise CubinFormatError(f"section headers end at {end}, past the file's {len(data)} bytes")
        raw = [_SECTION_HEADER.unpack_from(data, section_offset + i * section_entry_size)
               for i in range(section_count)]
        names = raw[names_index] if names_index < len(raw) else None
        if names is None:
            raise CubinFormatError("section-name string table index out of range")
        names_bytes = data[names[4]: names[4] + names[5]]
        sections = tuple(
            Section(index=i, name=_c_string(names_bytes, h[0]), type=h[1], flags=h[2], offset=h[4],
                    size=h[5], link=h[6], info=h[7], addralign=h[8], entsize=h[9])
            for i, h in enumerate(raw))
        for section in sections:
            if section.offset + section.file_size > len(data):
                raise CubinFormatError(f"section {section.name!r} runs past the end of the file")
        return cls(data=data, sections=sections, symbols=_read_symbols(data, sections), flags=flags)

    # -- queries ----------------------------------------------------------------------------------

    @property
    def sm_version(self) -> int:
        """The SM number (``90`` for sm_90/sm_90a), read from ``e_flags``."""
        version = (self.flags >> 16) & 0xFF
        return version if version else (self.flags >> 8) & 0xFF

    def section(self, name: str) -> Section:
        for section in self.sections:
            if section.name == name:
                return section
        raise KeyError(name)

    def has_section(self, name: str) -> bool:
        return any(section.name == name for section in self.sections)

    def section_bytes(self, name: str) -> bytes:
        section = self.section(name)
        return self.data[section.offset: section.offset + section.file_size]

    def kernel_names(self) -> tuple[str, ...]:
        return tuple(s.name[len(TEXT_PREFIX):] for s in self.sections if s.name.startswith(TEXT_PREFIX))

    def text_section(self, kernel: str) -> Section:
        name = TEXT_PREFIX + kernel
        if not self.has_section(name):
            known = ", ".join(self.kernel_names()) or "none"
            raise KernelNotFoundError(f"no section {name!r} in the cubin; kernels present: {known}")
        return self.section(name)

    def text(self, kernel: str) -> bytes:
        section = self.text_section(kernel)
        return self.data[section.offset: section.offset + section.size]

    def relocations(self, kernel: str) -> tuple[Relocation, ...]:
        """Relocations (``.rel``/``.rela``) that patch bytes of ``.text.<kernel>``."""
        target = self.text_section(kernel)
        found: list[Relocation] = []
        for section in self.sections:
            if section.type not in (SHT_REL, SHT_RELA) or section.info != target.index:
                continue
            layout = _RELA if section.type == SHT_RELA else _REL
            body = self.data[section.offset: section.offset + section.size]
            for start in range(0, len(body) - layout.size + 1, layout.size):
                fields = layout.unpack_from(body, start)
                found.append(Relocation(section=target.name, offset=fields[0], type=fields[1] & 0xFFFFFFFF,
                                        symbol_index=fields[1] >> 32,
                                        addend=fields[2] if section.type == SHT_RELA else None))
        return tuple(found)

    # -- edits ------------------------------------------------------------------------------------

    def with_section_bytes(self, name: str, new_bytes: bytes) -> Cubin:
        """Replace a section's contents; the length must stay the same, nothing else moves."""
        section = self.section(name)
        if len(new_bytes) != section.file_size:
            raise CubinFormatError(
                f"section {name!r} is {section.file_size} bytes; the replacement has {len(new_bytes)} "
                "(the tuner only permutes instructions, so lengths never change)")
        old = self.data[section.offset: section.offset + section.file_size]
        if old == new_bytes:
            return self
        patched = bytearray(self.data)
        for position, (before, after) in enumerate(zip(old, new_bytes, strict=True)):
            if before != after:
                patched[section.offset + position] = after
        return dataclasses.replace(self, data=bytes(patched))

    def with_text(self, kernel: str, new_text: bytes) -> Cubin:
        return self.with_section_bytes(self.text_section(kernel).name, new_text)

    def write(self, path: str | Path) -> None:
        Path(path).write_bytes(self.data)


def changed_ranges(before: bytes, after: bytes) -> tuple[tuple[int, int], ...]:
    """Half-open byte ranges where two equally long images differ (for reports and tests)."""
    if len(before) != len(after):
        raise ValueError("images differ in length")
    ranges: list[tuple[int, int]] = []
    start = None
    for position, (a, b) in enumerate(zip(before, after, strict=True)):
        if a != b and start is None:
            start = position
        elif a == b and start is not None:
            ranges.append((start, position))
            start = None
    if start is not None:
        ranges.append((start, len(before)))
    return tuple(ranges)


def _c_string(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset: end if end >= 0 else len(table)].decode("utf-8", errors="replace")


def _read_symbols(data: bytes, sections: tuple[Section, ...]) -> tuple[Symbol, ...]:
    for section in sections:
        if section.type != SHT_SYMTAB:
            continue
        if section.link >= len(sections):
            raise CubinFormatError(f"symbol table {section.name!r} names string table section "
                                   f"{section.link}, but the cubin has {len(sections)} sections; the file "
                                   "is damaged, pass the .cubin nvcc wrote")
        strings = sections[section.link]
        string_bytes = data[strings.offset: strings.offset + strings.size]
        body = data[section.offset: section.offset + section.size]
        symbols = []
        for start in range(0, len(body) - _SYMBOL.size + 1, _SYMBOL.size):
            name, info, other, shndx, value, size = _SYMBOL.unpack_from(body, start)
            symbols.append(Symbol(name=_c_string(string_bytes, name), value=value, size=size, info=info,
                                  other=other, section_index=shndx))
        return tuple(symbols)
    return ()
