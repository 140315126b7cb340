"""``benchmarks.torch_path_choices``: what the PyTorch path picks for suite cases, a line a subprogram;
on a CPU without timings."""

import pytest

from benchmarks import torch_path_choices


def test_each_subprogram_of_a_case_gets_a_line(capsys):
    torch_path_choices.main(["--cases", "ntrans_b1", "--time-limit", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("ntrans_b1 sp") for line in lines)
    assert "given candidate(s) verified" in lines[0] and "row-wise µGraph(s) verified" in lines[0]


def test_an_unknown_case_is_named():
    with pytest.raises(SystemExit) as stop:
        torch_path_choices.main(["--cases", "ntrans_b1,attention_b3"])
    assert stop.value.code == 2
