"""Run ``nvdisasm`` and parse its listing into :class:`~mirage.sass.instruction.Instruction` records.

``nvdisasm`` comes from the ``nvidia-cuda-nvdisasm`` wheel (or a CUDA toolkit); it is located at run
time (:func:`find_nvdisasm`).  Opcodes and operands come from its text; control bits come from the
instruction words, which the listing prints (``-hex``) and which are checked against the cubin.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mirage.sass.elf import Cubin
from mirage.sass.errors import DisassemblyError, ToolNotFoundError
from mirage.sass.instruction import Instruction, parse_instruction

log = logging.getLogger(__name__)

NVDISASM_ENVIRONMENT_VARIABLE = "MIRAGE_NVDISASM"
_WHEEL_LOCATIONS = ("cu13/bin", "cu12/bin", "cuda_nvdisasm/bin")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_LABEL_LINE = re.compile(r"^\s*([.$\w]+):\s*$")
_INSTRUCTION_LINE = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s*(.*?)\s*/\*\s*(0x[0-9a-fA-F]+)\s*\*/\s*$")
_HIGH_WORD_LINE = re.compile(r"^\s*/\*\s*(0x[0-9a-fA-F]+)\s*\*/\s*$")
_HEX_TARGET = re.compile(r"^0x[0-9a-fA-F]+$")
BRANCH_OPCODES_WITH_TARGET = frozenset({"BRA", "BSSY", "CALL", "JMP", "BREAK", "BRXU", "BRX", "JMX"})


@dataclass(frozen=True)
class RawInstruction:
    address: int
    text: str
    low: int
    high: int


@dataclass(frozen=True)
class Disassembly:
    """A kernel's instructions in address order, with the labels and branch targets of the listing."""

    kernel: str
    instructions: tuple[Instruction, ...]
    labels: tuple[tuple[str, int], ...]
    branch_targets: tuple[tuple[int, int], ...]  # (branch address, target address)

    @property
    def label_addresses(self) -> frozenset[int]:
        return frozenset(address for _, address in self.labels)


def find_nvdisasm() -> Path:
    """Locate nvdisasm: ``$MIRAGE_NVDISASM``, the pip wheel, ``PATH``, ``$CUDA_HOME/bin``, Triton's copy."""
    candidates: list[Path] = []
    configured = os.environ.get(NVDISASM_ENVIRONMENT_VARIABLE)
    if configured:
        candidates.append(Path(configured))
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidates.extend(Path(root) / location / "nvdisasm" for location in _WHEEL_LOCATIONS)
    on_path = shutil.which("nvdisasm")
    if on_path:
        candidates.append(Path(on_path))
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            candidates.append(Path(os.environ[variable]) / "bin" / "nvdisasm")
    candidates.append(Path("/usr/local/cuda/bin/nvdisasm"))
    triton = importlib.util.find_spec("triton")
    if triton and triton.origin:
        candidates.append(Path(triton.origin).parent / "backends" / "nvidia" / "bin" / "nvdisasm")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ToolNotFoundError(
        "nvdisasm was not found; install the 'nvidia-cuda-nvdisasm' wheel (pip install "
        f"nvidia-cuda-nvdisasm), put a CUDA toolkit's bin/ on PATH, or set ${NVDISASM_ENVIRONMENT_VARIABLE}")


def run_nvdisasm(arguments: list[str]) -> str:
    command = [str(find_nvdisasm()), *arguments]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DisassemblyError(f"nvdisasm failed (exit {result.returncode}): {' '.join(command)}\n"
                               f"{result.stderr.strip()}")
    return result.stdout


def parse_listing(listing: str) -> dict[str, tuple[list[RawInstruction], dict[str, int]]]:
    """Split an ``nvdisasm -hex`` listing into per-kernel raw instructions and labels.

    A listing of a raw binary (``-b``) has no sections; its code is returned under the key ``""``.
    """
    kernels: dict[str, tuple[list[RawInstruction], dict[str, int]]] = {}
    current = ""
    pending_labels: list[str] = []
    lines = listing.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        section = _SECTION.match(line)
        if section:
            current = section.group(1)
            kernels.setdefault(current, ([], {}))
            pending_labels = []
            continue
        label = _LABEL_LINE.match(line)
        if label:
            pending_labels.append(label.group(1))
            continue
        instruction = _INSTRUCTION_LINE.match(line)
        if not instruction:
            continue
        high_match = _HIGH_WORD_LINE.match(lines[index]) if index < len(lines) else None
        if not high_match:
            raise DisassemblyError(
                f"nvdisasm listing: no second instruction word after line {index}: {line!r}")
        index += 1
        address = int(instruction.group(1), 16)
        text = instruction.group(2).strip().rstrip(";").strip()
        instructions, labels = kernels.setdefault(current, ([], {}))
        for name in pending_labels:
            labels[name] = address
        pending_labels = []
        instructions.append(RawInstruction(address, text, int(instruction.group(3), 16),
                                           int(high_match.group(1), 16)))
    return kernels


def build_disassembly(kernel: str, raw: list[RawInstruction], labels: dict[str, int]) -> Disassembly:
    instructions = tuple(parse_instruction(r.address, r.text, r.low, r.high) for r in raw)
    targets = []
    for instruction in instructions:
        if instruction.opcode not in BRANCH_OPCODES_WITH_TARGET:
            continue
        if instruction.branch_label is not None:
            if instruction.branch_label in labels:
                targets.append((instruction.address, labels[instruction.branch_label]))
            continue
        literal = next((op for op in reversed(instruction.operands) if _HEX_TARGET.match(op)), None)
        if literal is not None:
            targets.append((instruction.address, int(literal, 16)))
    return Disassembly(kernel=kernel, instructions=instructions, labels=tuple(sorted(labels.items())),
                       branch_targets=tuple(targets))


def disassemble(cubin: Cubin, kernel: str) -> Disassembly:
    """Disassemble one kernel of a cubin and check the listing against the cubin's bytes."""
    text = cubin.text(kernel)
    with tempfile.TemporaryDirectory(prefix="mirage-sass-") as directory:
        path = Path(directory) / "kernel.cubin"
        path.write_bytes(cubin.data)
        listing = run_nvdisasm(["-c", "-hex", str(path)])
    kernels = parse_listing(listing)
    if kernel not in kernels:
        raise DisassemblyError(
            f"nvdisasm printed no code for kernel {kernel!r}; it printed {sorted(kernels)}")
    raw, labels = kernels[kernel]
    _check_words(kernel, raw, text)
    return build_disassembly(kernel, raw, labels)


def disassemble_raw(text: bytes, sm_version: int) -> list[RawInstruction]:
    """Disassemble bare instruction bytes (``nvdisasm -b SM90a``); branch targets print as addresses."""
    architecture = f"SM{sm_version}a" if sm_version >= 90 else f"SM{sm_version}"
    with tempfile.TemporaryDirectory(prefix="mirage-sass-") as directory:
        path = Path(directory) / "kernel.bin"
        path.write_bytes(text)
        listing = run_nvdisasm(["-b", architecture, "-hex", str(path)])
    raw, _ = parse_listing(listing).get("", ([], {}))
    _check_words("<raw>", raw, text)
    return raw


def _check_words(kernel: str, raw: list[RawInstruction], text: bytes) -> None:
    expected = len(text) // 16
    if len(raw) != expected:
        raise DisassemblyError(f"kernel {kernel}: nvdisasm listed {len(raw)} instructions, the section holds "
                               f"{expected}")
    for position, instruction in enumerate(raw):
        word = text[position * 16: position * 16 + 16]
        if instruction.address != position * 16 or word != (
                instruction.low.to_bytes(8, "little") + instruction.high.to_bytes(8, "little")):
            raise DisassemblyError(f"kernel {kernel}: listing and cubin disagree at {position * 16:#06x}")
