from __future__ import annotations

import pytest
from sass_fixtures import FIXTURES

from mirage.sass import cli
from mirage.sass.elf import Cubin, changed_ranges
from mirage.sass.kernel import load_kernel
from mirage.sass.legality import check_swap

ELEMENTWISE = str(FIXTURES / "elementwise.cubin")


def _first_pair(kernel, legal: bool) -> tuple[int, int]:
    for position in range(len(kernel) - 1):
        if bool(check_swap(kernel, position, position + 1)) == legal:
            return kernel.instructions[position].address, kernel.instructions[position + 1].address
    raise AssertionError("no such pair")


def test_show_prints_control_bits_dependences_and_pins(capsys):
    assert cli.main(["show", ELEMENTWISE, "--kernel", "scaled_add", "--legality"]) == 0
    out = capsys.readouterr().out
    assert "/*00e0*/ [B------:R-:W3:-:S01]" in out and "LDG.E.CONSTANT R4, desc[UR4][R4.64]" in out
    assert "from R4<-00d0" in out
    assert "pinned: control flow (EXIT)" in out
    assert "swap-next: register-dependence" in out and "swap-next: ok" in out


def test_swap_writes_an_edited_cubin(tmp_path, capsys):
    kernel = load_kernel(Cubin.read(ELEMENTWISE), "scaled_add_x4")
    first, second = _first_pair(kernel, legal=True)
    output = tmp_path / "edited.cubin"
    status = cli.main(["swap", ELEMENTWISE, "--kernel", "scaled_add_x4", hex(first), hex(second),
                       "-o", str(output)])
    assert status == 0
    original, edited = Cubin.read(ELEMENTWISE), Cubin.read(output)
    section = original.text_section("scaled_add_x4")
    ranges = changed_ranges(original.data, edited.data)
    start, end = section.offset + first, section.offset + second + 16
    assert ranges and all(start <= a and b <= end for a, b in ranges)
    assert "swapped" in capsys.readouterr().out


def test_refused_swap_exits_2_with_the_reason(tmp_path, capsys):
    kernel = load_kernel(Cubin.read(ELEMENTWISE), "scaled_add")
    first, second = _first_pair(kernel, legal=False)
    output = tmp_path / "never.cubin"
    status = cli.main(["swap", ELEMENTWISE, "--kernel", "scaled_add", hex(first), hex(second),
                       "-o", str(output)])
    assert status == cli.REFUSED
    assert "refused (" in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.parametrize("arguments, message", [
    (["swap", ELEMENTWISE, "0xe0", "0xf0", "-o", "x.cubin"], "pick one with --kernel"),
    (["swap", ELEMENTWISE, "--kernel", "scaled_add", "0xe8", "0xf8", "-o", "x.cubin"], "not an instruction"),
    (["show", ELEMENTWISE, "--kernel", "nope"], "no section '.text.nope'"),
])
def test_bad_input_exits_2_with_a_message(arguments, message, capsys):
    assert cli.main(arguments) == cli.REFUSED
    assert message in capsys.readouterr().err


def test_top_level_command_mounts_sass(capsys):
    mirage_cli = pytest.importorskip("mirage.cli")
    assert mirage_cli.main(["sass", "show", ELEMENTWISE, "--kernel", "scaled_add"]) == 0
    assert "LDG.E.CONSTANT" in capsys.readouterr().out


MISCOMPILED = str(FIXTURES / "miscompiled" / "random_1.cubin")


def test_check_lists_the_instructions_the_gpu_cannot_run(capsys):
    assert cli.main(["check", MISCOMPILED]) == 1
    out = capsys.readouterr().out
    assert "random_1_k4+0x0c60: LDGSTS.E.BYPASS.LTC128B.128 [R7+UR0], desc[UR1][R4.64]" in out
    assert "random_1_k4+0x0fd0:" in out and "2 instruction(s)" in out
    assert "-DMIRAGE_ASSUME_THREAD_INDEX=0" in out


def test_check_passes_a_runnable_cubin_and_refuses_a_missing_file(capsys, tmp_path):
    assert cli.main(["check", ELEMENTWISE]) == 0
    assert "no instruction the GPU cannot run" in capsys.readouterr().out
    assert cli.main(["check", str(tmp_path / "none.cubin")]) == cli.REFUSED
    assert "is not a file" in capsys.readouterr().err
