"""``tune_program`` on the generated LoRA fixture, with the GPU replaced by the synthetic timer: which
schedules are taken (verified, and beating the noise floor), where the tuned cubin is written, and
that the original is never touched."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
from sass_fixtures import FIXTURES, fixture_kernel
from synthetic import SyntheticMeasure

from mirage.codegen.lower_program import CudaProgram
from mirage.codegen.runtime import Program
from mirage.sass.elf import Cubin, changed_ranges
from mirage.sass.evaluate import CandidateResult, CandidateStatus
from mirage.sass.mugraph import (
    DECISIONS,
    ProgramTuningError,
    decide,
    record_tuning,
    recorded_tuning,
    tune_program,
    tuned_cubin_path,
    with_kernel_texts,
    write_tuned_cubin,
)
from mirage.sass.mutation import MoveSet
from mirage.sass.search import Budget, SearchOptions
from mirage.sass.tune import TuneOptions, TuneResult, tune_kernel

KERNEL = "lora_k4"
OPTIONS = TuneOptions(budget=Budget(candidates=12), timing_repeats=3, finalists=2, verify_sets=4,
                      search=SearchOptions(move_set=MoveSet.SIP, repair_stalls=True, redisassemble=False,
                                           progress=False))


@pytest.fixture
def program(tmp_path) -> Program:
    """The fixture program with its cubin copied where the test may write beside it."""
    launch = json.loads((FIXTURES / "mugraph" / "launch.json").read_text())
    cuda = CudaProgram.from_dict(json.loads((FIXTURES / "mugraph" / launch["program"]).read_text()))
    cubin = tmp_path / "kernel.cubin"
    shutil.copyfile(FIXTURES / "mugraph" / launch["cubin"], cubin)
    return Program(cuda, cubin)


class ChangeRewardingMeasure(SyntheticMeasure):
    """Any schedule other than the original runs 2% faster, without noise."""

    def _cost(self, text: bytes) -> float:
        return 1000.0 if text == self.kernel.text_bytes() else 1000.0 / 1.02


@pytest.fixture(scope="module")
def synthetic_result() -> TuneResult:
    """A real search and final timing, with the GPU replaced by a noise-free timer (so significant)."""
    kernel = fixture_kernel("mugraph/lora_m16.cubin", KERNEL)
    measure = ChangeRewardingMeasure(kernel)
    cubin = Cubin.read(FIXTURES / "mugraph" / "lora_m16.cubin")
    return tune_kernel(cubin, kernel, measure, measure.verify, OPTIONS)


class FixedTuner:
    """Stands in for ``tune_cubin``: checks what it is given and answers a prepared result."""

    def __init__(self, result: TuneResult) -> None:
        self.result = result
        self.calls: list[str] = []

    def __call__(self, cubin: Cubin, spec, options: TuneOptions) -> TuneResult:
        assert cubin.data == self.result.original.data and spec.kernel == KERNEL and options is OPTIONS
        self.calls.append(spec.kernel)
        return self.result


def test_a_verified_significant_schedule_is_taken(program, synthetic_result):
    assert synthetic_result.significant and synthetic_result.changed_positions > 0
    original_bytes = program.cubin.read_bytes()
    tuned, results = tune_program(program, OPTIONS, tuner=FixedTuner(synthetic_result))
    assert results == [synthetic_result] and decide(synthetic_result).accepted
    assert tuned is not program and tuned.cuda is program.cuda
    assert tuned.cubin == tuned_cubin_path(program.cubin, tuned.cubin.read_bytes())
    assert tuned.cubin.parent == program.cubin.parent and tuned.cubin.name.startswith("kernel.sass-")
    assert program.cubin.read_bytes() == original_bytes  # the original is never rewritten
    new = Cubin.read(tuned.cubin)
    assert new.text(KERNEL) == synthetic_result.best.text(KERNEL)
    assert new.text(KERNEL) != Cubin.from_bytes(original_bytes).text(KERNEL)
    section = new.text_section(KERNEL)
    assert all(section.offset <= start and end <= section.offset + section.size
               for start, end in changed_ranges(original_bytes, new.data))


def _unverified(result: TuneResult) -> TuneResult:
    failed = CandidateResult(CandidateStatus.WRONG_OUTPUT, detail="output %4.0 differs in 2 bytes (set 7)")
    return dataclasses.replace(result, verification=failed)


def _within_noise(result: TuneResult) -> TuneResult:
    return dataclasses.replace(result, chosen_speedups=(1.004, 0.998, 1.006),
                               noise_speedups=(1.003, 0.997, 1.001))


def _original_kept(result: TuneResult) -> TuneResult:
    return dataclasses.replace(result, best=result.original, changed_positions=0)


# (name, how the tuner's answer differs from a clear win, words of the logged reason)
KEPT = [
    ("verification failed", _unverified, "verification failed (wrong-output"),
    ("gain inside the noise", _within_noise, "does not stand out of the noise floor"),
    ("nothing beat the original", _original_kept, "no schedule beat the original"),
]


@pytest.mark.parametrize("name, change, reason", KEPT, ids=[row[0] for row in KEPT])
def test_the_original_is_kept_and_the_reason_logged(program, synthetic_result, caplog, name, change, reason):
    result = change(synthetic_result)
    with caplog.at_level(logging.INFO, logger="mirage.sass.mugraph"):
        tuned, results = tune_program(program, OPTIONS, tuner=FixedTuner(result))
    assert tuned is program and results == [result]
    assert sorted(path.name for path in program.cubin.parent.iterdir()) == ["kernel.cubin"]
    decision = decide(result)
    assert not decision.accepted and reason in decision.reason
    assert f"{KERNEL}: original kept ({decision.reason})" in caplog.text


def test_without_the_significance_rule_a_verified_faster_median_is_taken(program, synthetic_result):
    result = _within_noise(synthetic_result)
    tuned, _ = tune_program(program, OPTIONS, tuner=FixedTuner(result), require_significant=False)
    assert tuned is not program and Cubin.read(tuned.cubin).text(KERNEL) == result.best.text(KERNEL)
    unverified, _ = tune_program(program, OPTIONS, tuner=FixedTuner(_unverified(synthetic_result)),
                                 require_significant=False)
    assert unverified is program


def test_only_the_named_kernels_are_tuned(program, synthetic_result):
    tuner = FixedTuner(synthetic_result)
    tuned, results = tune_program(program, OPTIONS, kernels=[], tuner=tuner)
    assert tuned is program and results == [] and tuner.calls == []
    tune_program(program, OPTIONS, kernels=[KERNEL], tuner=tuner)
    assert tuner.calls == [KERNEL]


@pytest.mark.parametrize("case, message", [
    ("unknown kernel", "no kernel named lora_k9; its kernels: lora_k4"),
    ("not compiled", "has no cubin"),
])
def test_bad_programs_raise_specific_errors(program, synthetic_result, case, message):
    if case == "not compiled":
        program = Program(program.cuda, None)
    with pytest.raises(ProgramTuningError, match=message):
        tune_program(program, OPTIONS, kernels=["lora_k9"] if case == "unknown kernel" else None,
                     tuner=FixedTuner(synthetic_result))


def test_tuned_cubins_are_content_addressed_and_written_once(tmp_path: Path, synthetic_result):
    original = tmp_path / "kernel.cubin"
    original.write_bytes(synthetic_result.original.data)
    first = write_tuned_cubin(original, synthetic_result.best)
    second = write_tuned_cubin(original, synthetic_result.best)
    assert first == second and first.read_bytes() == synthetic_result.best.data
    assert first.name == f"kernel.sass-{hashlib.sha256(first.read_bytes()).hexdigest()[:16]}.cubin"
    assert original.read_bytes() == synthetic_result.original.data
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["kernel.cubin", first.name])


def test_with_kernel_texts_of_the_original_text_changes_nothing(program):
    text = Cubin.read(program.cubin).text(KERNEL)
    assert with_kernel_texts(program, {KERNEL: text}) is program
    assert with_kernel_texts(program, {}) is program


def test_a_tuned_program_keeps_its_launch_modes(program, synthetic_result):
    """Selection's launch modes (dependent launch, spread blocks) stay with the tuned cubin, whose
    kernels load afresh."""
    chosen = dataclasses.replace(program, dependent_launch=False, spread_blocks=True, poison=True)
    chosen._functions["stale"] = object()
    best = synthetic_result.best.text(KERNEL)
    tuned = with_kernel_texts(chosen, {KERNEL: best})
    assert tuned.cubin != program.cubin and Cubin.read(tuned.cubin).text(KERNEL) == best
    assert (tuned.dependent_launch, tuned.spread_blocks, tuned.poison) == (False, True, True)
    assert tuned._functions == {}


def test_a_tuning_is_recorded_and_taken_again_without_tuning(program, synthetic_result):
    tuner = FixedTuner(synthetic_result)
    tuned, results = tune_program(program, OPTIONS, tuner=tuner)
    assert tuned is not program
    assert recorded_tuning(program, "GPU A") is None  # nothing recorded yet
    record_tuning(program, tuned, results, "GPU A")
    again = recorded_tuning(program, "GPU A")
    assert again is not None and again is not program and again.cubin == tuned.cubin
    assert Cubin.read(again.cubin).text(KERNEL) == Cubin.read(tuned.cubin).text(KERNEL)
    assert recorded_tuning(program, "GPU B") is None  # decided on another GPU: tuned again there
    record = json.loads((Path(program.cubin).parent / DECISIONS).read_text())
    assert record["GPU A"]["kernels"] == [KERNEL] and KERNEL in record["GPU A"]["reasons"]


def test_a_kept_schedule_is_recorded_as_the_program_itself(program, synthetic_result):
    kept = dataclasses.replace(synthetic_result, best=synthetic_result.original)
    tuned, results = tune_program(program, OPTIONS, tuner=FixedTuner(kept))
    assert tuned is program
    record_tuning(program, tuned, results, "GPU A")
    assert recorded_tuning(program, "GPU A") is program


@pytest.mark.parametrize("damage", ["not json", "missing cubin"])
def test_a_damaged_record_is_ignored_with_a_warning(program, synthetic_result, caplog, damage):
    tuned, results = tune_program(program, OPTIONS, tuner=FixedTuner(synthetic_result))
    record_tuning(program, tuned, results, "GPU A")
    if damage == "not json":
        (Path(program.cubin).parent / DECISIONS).write_text("{ truncated")
    else:
        Path(tuned.cubin).unlink()
    with caplog.at_level(logging.WARNING, logger="mirage.sass.mugraph"):
        assert recorded_tuning(program, "GPU A") is None
    assert "ignoring the SASS tuning record" in caplog.text
