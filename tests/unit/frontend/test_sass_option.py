"""``superoptimize(..., sass_tune=True)``: the option, and the executor step that tunes a compiled
subprogram's kernels and swaps a tuned cubin in only when the tuner verified the schedule and its gain
beats the noise floor.  The compiler and the GPU are replaced: the program is the committed LoRA
fixture, and ``tune_cubin`` a stand-in that runs the real search and final timing against a
noise-free timer."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

import mirage as mi
from mirage.codegen.lower_program import CudaProgram
from mirage.codegen.runtime import Program
from mirage.frontend.errors import OptionError
from mirage.frontend.executor import Compiled, make_executor
from mirage.frontend.options import Options
from mirage.sass.elf import Cubin
from mirage.sass.errors import EvaluationError
from mirage.sass.evaluate import CandidateResult, CandidateStatus
from mirage.sass.kernel import load_kernel
from mirage.sass.mutation import MoveSet
from mirage.sass.search import Budget, SearchOptions
from mirage.sass.tune import TuneOptions, TuneResult, tune_kernel

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sass" / "mugraph"
KERNEL = "lora_k4"


@pytest.mark.parametrize("given, expected", [({}, False), ({"sass_tune": True}, True),
                                             ({"sass_tune": False}, False)])
def test_the_option_parses(given, expected):
    assert Options.parse(**given).sass_tune is expected


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_non_boolean_is_refused(value):
    with pytest.raises(OptionError, match="sass_tune must be True or False"):
        Options.parse(sass_tune=value)


def test_superoptimize_documents_the_option():
    from mirage.api import superoptimize

    assert "``sass_tune`` (default False" in superoptimize.__doc__


@pytest.fixture
def program(tmp_path) -> Program:
    cuda = CudaProgram.from_dict(json.loads((FIXTURE / "lora_m16.program.json").read_text()))
    shutil.copyfile(FIXTURE / "lora_m16.cubin", tmp_path / "kernel.cubin")
    return Program(cuda, tmp_path / "kernel.cubin")


@pytest.fixture(scope="module")
def clear_win() -> TuneResult:
    """The search and final timing on the fixture kernel with a timer under which any other schedule
    is 2% faster, without noise."""
    cubin = Cubin.read(FIXTURE / "lora_m16.cubin")
    kernel = load_kernel(cubin, KERNEL)
    original = kernel.text_bytes()

    def measure(candidate: Cubin) -> CandidateResult:
        speedup = 1.0 if candidate.text(KERNEL) == original else 1.02
        return CandidateResult(CandidateStatus.OK, speedup=speedup, original_us=10.0,
                               candidate_us=10.0 / speedup)

    def verify(candidate: Cubin, sets: int) -> CandidateResult:
        return CandidateResult(CandidateStatus.OK, detail=f"{sets} input sets")

    options = TuneOptions(budget=Budget(candidates=8), timing_repeats=3, finalists=1, verify_sets=4,
                          search=SearchOptions(move_set=MoveSet.SIP, repair_stalls=True, redisassemble=False,
                                           progress=False))
    return tune_kernel(cubin, kernel, measure, verify, options)


def _within_noise(result: TuneResult) -> TuneResult:
    return dataclasses.replace(result, chosen_speedups=(1.004, 0.998, 1.006),
                               noise_speedups=(1.003, 0.997, 1.001))


def _unverified(result: TuneResult) -> TuneResult:
    crashed = CandidateResult(CandidateStatus.CRASH, detail="illegal address")
    return dataclasses.replace(result, verification=crashed)


def _graph() -> mi.KernelGraph:
    g = mi.new_kernel_graph("lora")
    x = g.new_input(dims=(2, 3), dtype=mi.float16)
    g.mark_output(g.exp(x))
    return g.freeze()


def _fake_gpu(monkeypatch, program: Program, answer):
    """Compilation answers ``program``; the tuner of one kernel answers (or raises) ``answer``."""
    import mirage.codegen
    import mirage.sass.mugraph

    calls = []

    def tune_cubin(cubin, spec, options):
        calls.append((spec.kernel, spec.grid, options.budget.candidates))
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(mirage.codegen, "compile_chosen", lambda graph, build=None: program, raising=False)
    monkeypatch.setattr(mirage.sass.mugraph, "tune_cubin", tune_cubin)
    return calls


def _running(executor) -> Program:
    assert isinstance(executor, Compiled)
    return executor.launch.__self__


def test_a_verified_gain_above_the_noise_swaps_the_tuned_cubin_in(monkeypatch, program, clear_win, caplog):
    calls = _fake_gpu(monkeypatch, program, clear_win)
    with caplog.at_level(logging.INFO, logger="mirage.frontend"):
        executor = make_executor(_graph(), torch.device("cuda"), "cuda", sass_tune=True)
    running = _running(executor)
    assert calls == [(KERNEL, (64, 1, 1), 200)]  # every generated kernel, with the default budget
    assert running is not program and running.cuda is program.cuda
    assert running.cubin.parent == program.cubin.parent and running.cubin != program.cubin
    assert Cubin.read(running.cubin).text(KERNEL) == clear_win.best.text(KERNEL)
    assert program.cubin.read_bytes() == (FIXTURE / "lora_m16.cubin").read_bytes()
    assert f"kernel {KERNEL} runs a tuned SASS schedule: gain +2.00%" in caplog.text


# (name, the tuner's answer, words of the logged reason)
KEPT = [
    ("gain inside the noise", _within_noise, "does not stand out of the noise floor"),
    ("verification failed", _unverified, "verification failed (crash: illegal address)"),
    ("nothing beat the original",
     lambda result: dataclasses.replace(result, best=result.original, changed_positions=0),
     "no schedule beat the original"),
]


@pytest.mark.parametrize("name, change, reason", KEPT, ids=[row[0] for row in KEPT])
def test_otherwise_the_compiled_kernels_run_and_the_log_says_why(monkeypatch, program, clear_win, caplog,
                                                                 name, change, reason):
    _fake_gpu(monkeypatch, program, change(clear_win))
    with caplog.at_level(logging.INFO, logger="mirage.frontend"):
        executor = make_executor(_graph(), torch.device("cuda"), "cuda", sass_tune=True)
    assert _running(executor) is program
    assert sorted(p.name for p in program.cubin.parent.iterdir()) == ["kernel.cubin"]
    assert f"kernel {KERNEL} keeps its compiled schedule" in caplog.text and reason in caplog.text


def test_a_tuning_failure_keeps_the_compiled_kernels(monkeypatch, program, caplog):
    failure = EvaluationError(f"the original kernel {KERNEL} could not be set up on the GPU: no CuPy")
    _fake_gpu(monkeypatch, program, failure)
    executor = make_executor(_graph(), torch.device("cuda"), "cuda", sass_tune=True)
    assert _running(executor) is program
    assert "SASS tuning failed (EvaluationError: the original kernel lora_k4 could not" in caplog.text


def test_without_the_option_nothing_is_tuned(monkeypatch, program, clear_win):
    calls = _fake_gpu(monkeypatch, program, clear_win)
    import mirage.codegen

    monkeypatch.setattr(mirage.codegen, "compile_graph", lambda graph: program.launch, raising=False)
    executor = make_executor(_graph(), torch.device("cuda"), "cuda")
    assert _running(executor) is program and calls == []


def test_a_later_process_takes_the_recorded_schedules_without_tuning(monkeypatch, program, clear_win, caplog):
    """On one GPU (its name) the first executor tunes and records; the next one, as a later process
    would, finds the record beside the cubin and runs the same tuned cubin without tuning."""
    calls = _fake_gpu(monkeypatch, program, clear_win)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU A")
    first = _running(make_executor(_graph(), torch.device("cuda"), "cuda", sass_tune=True))
    with caplog.at_level(logging.INFO, logger="mirage.frontend"):
        second = _running(make_executor(_graph(), torch.device("cuda"), "cuda", sass_tune=True))
    assert len(calls) == 1 and first is not program and second.cubin == first.cubin
    assert "SASS schedules as tuned before on this GPU (tuned cubin)" in caplog.text
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU B")
    make_executor(_graph(), torch.device("cuda"), "cuda", sass_tune=True)
    assert len(calls) == 2  # another GPU tunes for itself
