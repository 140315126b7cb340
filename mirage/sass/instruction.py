"""Instruction records: one disassembled SASS instruction with its register def/use sets.

>>> ins = parse_instruction(0x0E0, "LDG.E.CONSTANT R4, desc[UR4][R4.64]", 0x0000000404047981,
...                         0x000EE2000C1E9900)
>>> sorted(ins.defs), sorted(ins.uses)
(['R4'], ['R4', 'R5', 'UR4', 'UR5'])
>>> ins.control.text()
'[B------:R-:W3:-:S01]'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mirage.sass import isa
from mirage.sass.control import ControlBits

_REGISTER = re.compile(r"(?<![A-Za-z0-9_])(UR\d+|URZ|R\d+|RZ|UP\d+|UPT|P\d+|PT|B\d+|UPR|PR)(\.64)?"
                       r"(?![A-Za-z0-9_])")
_DESCRIPTOR = re.compile(r"(g?)desc\[(UR\d+)\]")
_LABEL = re.compile(r"`\(([^)]*)\)")
_PREDICATE = re.compile(r"^!?(UP\d+|UPT|P\d+|PT)$")
_ZERO_REGISTERS = frozenset({"RZ", "URZ", "PT", "UPT"})
_PREDICATE_FILE = 7  # P0..P6 (PT is constant)
MAX_REGISTER = 254


@dataclass(frozen=True)
class Instruction:
    """One instruction of a kernel.  ``address`` is where it sat in the original kernel."""

    address: int
    text: str
    predicate: str | None
    opcode: str
    modifiers: tuple[str, ...]
    operands: tuple[str, ...]
    low: int
    high: int
    defs: frozenset[str]
    uses: frozenset[str]
    memory: isa.MemoryAccess | None
    memory_ordered: bool
    pinned: str | None
    branch_label: str | None
    control: ControlBits = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "control", ControlBits.decode(self.high))

    @property
    def full_opcode(self) -> str:
        return ".".join((self.opcode, *self.modifiers))

    @property
    def normalized_text(self) -> str:
        """The text without ``.reuse`` flags (which edits may clear)."""
        return self.text.replace(".reuse", "")

    @property
    def registers(self) -> frozenset[str]:
        return self.defs | self.uses

    def word_bytes(self) -> bytes:
        return self.low.to_bytes(8, "little") + self.high.to_bytes(8, "little")

    def with_control(self, control: ControlBits) -> Instruction:
        from dataclasses import replace

        return replace(self, high=control.encode(self.high))


def split_operands(text: str) -> list[str]:
    """Split an operand list on the commas that are not inside brackets, braces or backticks."""
    operands, depth, current, quoted = [], 0, [], False
    for char in text:
        if char == "`":
            quoted = not quoted
        elif not quoted and char in "[({":
            depth += 1
        elif not quoted and char in "])}":
            depth -= 1
        if char == "," and depth == 0 and not quoted:
            operands.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        operands.append("".join(current).strip())
    return operands


def is_predicate_operand(operand: str) -> bool:
    return bool(_PREDICATE.match(operand.strip()))


def is_memory_operand(operand: str) -> bool:
    return "[" in operand


def registers_in(operand: str, width: int = 1, wide_uniform: bool = False) -> set[str]:
    """Registers an operand names, pairs and quads expanded; RZ/URZ/PT/UPT left out."""
    found: set[str] = set()
    descriptors = {m.group(2): (4 if m.group(1) else 2) for m in _DESCRIPTOR.finditer(operand)}
    text = _LABEL.sub("", operand)
    for match in _REGISTER.finditer(text):
        name, suffix = match.group(1), match.group(2)
        if name in _ZERO_REGISTERS:
            continue
        if name in ("PR", "UPR"):
            prefix = "UP" if name == "UPR" else "P"
            found.update(f"{prefix}{i}" for i in range(_PREDICATE_FILE))
            continue
        count = descriptors.get(name, 2 if suffix else width)
        if wide_uniform and name.startswith("UR") and "[" in operand:
            count = max(count, 2)
        found.update(_expand(name, count))
    return found


def _expand(name: str, count: int) -> list[str]:
    prefix = name.rstrip("0123456789")
    if prefix not in ("R", "UR") or count <= 1:
        return [name]
    first = int(name[len(prefix):])
    return [f"{prefix}{i}" for i in range(first, min(first + count, MAX_REGISTER + 1))]


def _destination_indices(rule: isa.DestinationRule, operands: list[str]) -> set[int]:
    match rule:
        case isa.DestinationRule.ALL:
            return set(range(len(operands)))
        case isa.DestinationRule.ONLY_FIRST:
            return {0} if operands else set()
        case isa.DestinationRule.FIRST_TWO:
            return set(range(min(2, len(operands))))
        case isa.DestinationRule.BEFORE_MEMORY:
            first_memory = next((i for i, op in enumerate(operands) if is_memory_operand(op)), None)
            return set(range(len(operands) if first_memory is None else first_memory))
        case isa.DestinationRule.FIRST:
            if not operands:
                return set()
            indices = {0}
            position = 1
            while position < len(operands) and is_predicate_operand(operands[position]):
                indices.add(position)
                position += 1
            if is_predicate_operand(operands[0]) and position < len(operands):
                indices.add(position)  # predicate-output forms such as LOP3.LUT P0, R5, ...
            return indices
    raise AssertionError(rule)


def parse_instruction(address: int, text: str, low: int, high: int) -> Instruction:
    """Build an :class:`Instruction` from nvdisasm's text of it and its two 64-bit words."""
    body = text.strip().rstrip(";").strip()
    predicate = None
    if body.startswith("@"):
        predicate, _, body = body[1:].partition(" ")
        body = body.strip()
    mnemonic, _, operand_text = body.partition(" ")
    opcode, *modifier_list = mnemonic.split(".")
    modifiers = tuple(modifier_list)
    operands = split_operands(operand_text)
    label_match = next((_LABEL.search(op) for op in operands if _LABEL.search(op)), None)

    rule = isa.destination_rule(opcode)
    destinations = _destination_indices(rule, operands)
    memory, ordered = isa.memory_access(opcode, modifiers)
    wide_uniform = memory is not None and bool(
        memory.spaces & {isa.MemorySpace.GLOBAL, isa.MemorySpace.GENERIC})

    defs: set[str] = set()
    uses: set[str] = set()
    if memory is not None:
        data_width = isa.memory_data_width(opcode, modifiers)
        for index, operand in enumerate(operands):
            width = 1 if is_memory_operand(operand) else data_width
            registers = registers_in(operand, width, wide_uniform)
            (defs if index in destinations else uses).update(registers)
            if index in destinations and not any(map(is_memory_operand, operands)):
                uses.update(registers)  # no memory operand found: layout unknown, count both
    else:
        widths = isa.operand_widths(opcode, modifiers, len(operands))
        position = 0
        for index, operand in enumerate(operands):
            width = 1
            if not is_predicate_operand(operand):
                if widths is not None and position < len(widths):
                    width = widths[position]
                position += 1
            registers = registers_in(operand, width)
            if index in destinations:
                defs.update(registers)
                if rule is isa.DestinationRule.ALL:
                    uses.update(registers)
            else:
                uses.update(registers)
    if predicate is not None:
        uses.update(registers_in(predicate.lstrip("!")))

    return Instruction(
        address=address, text=(f"@{predicate} " if predicate else "") + body, predicate=predicate,
        opcode=opcode, modifiers=modifiers, operands=tuple(operands), low=low, high=high,
        defs=frozenset(defs), uses=frozenset(uses), memory=memory, memory_ordered=ordered,
        pinned=isa.pinned_reason(opcode, modifiers, predicate, tuple(operands)),
        branch_label=label_match.group(1) if label_match else None,
    )
