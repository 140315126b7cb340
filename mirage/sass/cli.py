"""Command line of the SASS tuner, for people who tune by hand.

``mirage sass show CUBIN --kernel K`` prints every instruction with its decoded control bits, the
registers it reads and writes, the instructions its operands come from and why it is pinned.
``mirage sass swap CUBIN --kernel K ADDR_A ADDR_B -o OUT`` swaps two adjacent instructions, or refuses
(exit status 2) with the legality model's reason.  ``mirage sass check CUBIN`` lists the instructions
of every kernel that the GPU cannot run (:mod:`mirage.codegen.miscompile`; exit status 1 when there
are some), for a cubin built elsewhere or one that stops with an illegal-instruction error.  Also
runs standalone:
``python -m mirage.sass.cli show kernel.cubin --kernel my_kernel``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from mirage.codegen.compile import cubin_to_sass
from mirage.codegen.miscompile import describe, faulting_instructions
from mirage.errors import MirageError
from mirage.sass.elf import Cubin
from mirage.sass.kernel import Kernel, load_kernel
from mirage.sass.legality import check_swap
from mirage.sass.mutation import verify_edit

log = logging.getLogger(__name__)
REFUSED = 2


def _address(text: str) -> int:
    try:
        return int(text, 0) if text.lower().startswith("0x") else int(text, 16)
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an instruction address (hex, e.g. 0x01b0)") from error


def _kernel_name(cubin: Cubin, requested: str | None) -> str:
    if requested:
        return requested
    names = cubin.kernel_names()
    if len(names) != 1:
        raise MirageError(
            f"the cubin holds {len(names)} kernels ({', '.join(names)}); pick one with --kernel")
    return names[0]


def producers(kernel: Kernel, position: int) -> list[str]:
    """``register<-address`` for each register an instruction reads, from the nearest earlier writer
    in its block."""
    instruction = kernel.instructions[position]
    block = kernel.block(position)
    found = []
    for register in sorted(instruction.uses):
        for earlier in range(position - 1, block.start - 1, -1):
            if register in kernel.instructions[earlier].defs:
                found.append(f"{register}<-{kernel.instructions[earlier].address:04x}")
                break
    return found


def format_kernel(kernel: Kernel, with_legality: bool = False) -> str:
    lines = [f"// kernel {kernel.name}: {len(kernel)} instructions, {len(kernel.blocks)} basic blocks"]
    for position, instruction in enumerate(kernel.instructions):
        block = kernel.block(position)
        if position == block.start:
            predecessors = ",".join(str(p) for p in block.predecessors) or "-"
            successors = ",".join(str(s) for s in block.successors) or "-"
            lines.append(f"// block {block.index}  preds {predecessors}  succs {successors}")
        notes = []
        sources = producers(kernel, position)
        if sources:
            notes.append("from " + " ".join(sources))
        if instruction.defs:
            notes.append("writes " + ",".join(sorted(instruction.defs)))
        if instruction.pinned:
            notes.append(f"pinned: {instruction.pinned}")
        if with_legality and position + 1 < len(kernel):
            legality = check_swap(kernel, position, position + 1)
            rule = legality.rule.value if legality.rule else "ok"
            notes.append(f"swap-next: {rule}")
        lines.append(f"  /*{instruction.address:04x}*/ {instruction.control.text():28s} "
                     f"{instruction.text:52s} ; {' | '.join(notes)}")
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    cubin = Cubin.read(args.cubin)
    kernel = load_kernel(cubin, _kernel_name(cubin, args.kernel))
    sys.stdout.write(format_kernel(kernel, with_legality=args.legality) + "\n")
    return 0


def cmd_swap(args: argparse.Namespace) -> int:
    cubin = Cubin.read(args.cubin)
    kernel = load_kernel(cubin, _kernel_name(cubin, args.kernel))
    first, second = kernel.position_of(args.address_a), kernel.position_of(args.address_b)
    legality = check_swap(kernel, first, second, repair_stalls=args.repair_stalls)
    if not legality:
        sys.stderr.write(f"refused ({legality.rule.value}): {legality.reason}\n")  # type: ignore[union-attr]
        return REFUSED
    edited = kernel.swapped(min(first, second), legality.stall_raises)
    verify_edit(kernel, edited)
    cubin.with_text(kernel.name, edited.text_bytes()).write(args.output)
    raised = ", ".join(f"{edited.instructions[p].address:04x}->S{s:02d}" for p, s in legality.stall_raises)
    sys.stdout.write(f"swapped {args.address_a:04x} and {args.address_b:04x}"
                     f"{' (stalls raised: ' + raised + ')' if raised else ''}; wrote {args.output}\n")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    cubin = Path(args.cubin)
    if not cubin.is_file():
        raise MirageError(f"{cubin} is not a file: give the path of a .cubin")
    found = faulting_instructions(cubin_to_sass(cubin.resolve()))
    if not found:
        sys.stdout.write(f"{cubin}: no instruction the GPU cannot run\n")
        return 0
    sys.stdout.write(describe(found) + "\nmirage's own builds rebuild such a kernel with "
                     "-DMIRAGE_ASSUME_THREAD_INDEX=0; elsewhere, build without that assumption or "
                     "with another nvcc\n")
    return 1


def add_subparsers(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Mount ``sass show``, ``sass swap`` and ``sass check`` on a parent command line's subparsers."""
    sass = subparsers.add_parser("sass", help="inspect and hand-edit the SASS schedule of a cubin")
    commands = sass.add_subparsers(dest="sass_command", metavar="SASS_COMMAND")
    commands.required = True

    show = commands.add_parser("show", help="instructions with control bits, def/use and dependences")
    show.add_argument("cubin", help="path to a .cubin")
    show.add_argument("--kernel", help="kernel name (needed when the cubin holds several)")
    show.add_argument("--legality", action="store_true", help="also say whether each adjacent swap is legal")
    show.set_defaults(run=cmd_show)

    swap = commands.add_parser("swap", help="swap two adjacent instructions, or refuse with the reason")
    swap.add_argument("cubin", help="path to a .cubin")
    swap.add_argument("address_a", type=_address, metavar="ADDR_A", help="instruction address, e.g. 0x01b0")
    swap.add_argument("address_b", type=_address, metavar="ADDR_B", help="the adjacent instruction's address")
    swap.add_argument("--kernel", help="kernel name (needed when the cubin holds several)")
    swap.add_argument("-o", "--output", required=True, help="where to write the edited cubin")
    swap.add_argument("--repair-stalls", action="store_true",
                      help="allow the swap when raising a stall count keeps every distance")
    swap.set_defaults(run=cmd_swap)

    check = commands.add_parser("check", help="list the instructions the GPU cannot run (ptxas miscompiles)")
    check.add_argument("cubin", help="path to a .cubin")
    check.set_defaults(run=cmd_check)
    return sass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirage.sass.cli", description=__doc__.splitlines()[0])
    add_subparsers(parser.add_subparsers(dest="command", metavar="COMMAND"))
    arguments = parser.parse_args(["sass", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return int(arguments.run(arguments) or 0)
    except MirageError as error:
        sys.stderr.write(f"mirage sass: error: {error}\n")
        return REFUSED


if __name__ == "__main__":
    sys.exit(main())
