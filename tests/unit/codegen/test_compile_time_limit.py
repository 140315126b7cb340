"""A compiler run past ``MIRAGE_COMPILE_TIME_LIMIT`` is stopped, with the processes it started, and
fails as a build with a message that names the limit (a µGraph of odd tiles once kept cicc busy for
minutes and stalled a whole selection)."""

from __future__ import annotations

import time

import pytest

from mirage.codegen import compile as compiling
from mirage.codegen.compile import CompileError, Stage
from mirage.errors import MirageError


def test_a_run_past_the_limit_fails_and_leaves_no_process(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_COMPILE_TIME_LIMIT", "0.5")
    marker = tmp_path / "child-finished"
    start = time.perf_counter()
    with pytest.raises(CompileError, match="compile time limit") as error:
        compiling._run(Stage.CUBIN, ["sh", "-c", f"sleep 2; touch {marker}"], tmp_path)
    assert time.perf_counter() - start < 1.5 and error.value.stage is Stage.CUBIN
    time.sleep(2.0)
    assert not marker.exists()  # the shell's child was stopped too


def test_a_run_within_the_limit_returns_its_output(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_COMPILE_TIME_LIMIT", "10")
    assert compiling._run(Stage.CUBIN, ["sh", "-c", "echo built"], tmp_path).stdout == "built\n"
    with pytest.raises(CompileError, match="exit status 3"):
        compiling._run(Stage.CUBIN, ["sh", "-c", "exit 3"], tmp_path)


@pytest.mark.parametrize("value", ["soon", "0", "-4"])
def test_a_limit_that_is_not_a_positive_number_is_refused(monkeypatch, value):
    monkeypatch.setenv("MIRAGE_COMPILE_TIME_LIMIT", value)
    with pytest.raises(MirageError, match="MIRAGE_COMPILE_TIME_LIMIT"):
        compiling.time_limit_s()
