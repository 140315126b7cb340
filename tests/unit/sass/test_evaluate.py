"""Process control of the sandbox on the CPU, with a stand-in for the GPU side."""

from __future__ import annotations

import pytest
import sandbox_stub
from sass_fixtures import fixture_cubin

from mirage.sass.evaluate import CandidateStatus, EvaluatorOptions, Isolation, SandboxEvaluator
from mirage.sass.launch import BufferArgument, LaunchSpec, ScalarArgument

SPEC = LaunchSpec(kernel="scaled_add", grid=(16, 1, 1), block=(256, 1, 1), arguments=(
    BufferArgument("x", (4096,), "float32"), BufferArgument("y", (4096,), "float32"),
    BufferArgument("out", (4096,), "float32", output=True), ScalarArgument("alpha", "float32", 0.5),
    ScalarArgument("n", "int32", 4096)))


@pytest.fixture
def evaluator():
    options = EvaluatorOptions(timeout_s=3.0, startup_timeout_s=60.0)
    with SandboxEvaluator(fixture_cubin("elementwise.cubin"), SPEC, options,
                          worker_target=sandbox_stub.serve) as sandbox:
        yield sandbox


def test_good_candidate_is_timed(evaluator):
    result = evaluator.evaluate(b"FAST candidate")
    assert result.status is CandidateStatus.OK
    assert result.speedup == pytest.approx(10.0 / 9.0, rel=1e-6)
    assert result.gain_percent == pytest.approx(11.11, abs=0.01)


@pytest.mark.parametrize("data, status", [
    (b"WRONG", CandidateStatus.WRONG_OUTPUT),
    (b"ERROR", CandidateStatus.CRASH),
    (b"CRASH", CandidateStatus.CRASH),
    (b"HANG", CandidateStatus.TIMEOUT),
])
def test_failures_are_classified_and_the_process_replaced(evaluator, data, status):
    assert evaluator.evaluate(b"same").status is CandidateStatus.OK
    result = evaluator.evaluate(data)
    assert result.status is status
    assert result.status.failed_on_gpu
    assert evaluator._process is None  # the process that saw the failure is gone
    after = evaluator.evaluate(b"same")  # a fresh process answers the next candidate
    assert after.status is CandidateStatus.OK


def test_per_candidate_isolation_starts_a_process_each_time():
    options = EvaluatorOptions(timeout_s=3.0, isolation=Isolation.PER_CANDIDATE)
    with SandboxEvaluator(fixture_cubin("elementwise.cubin"), SPEC, options,
                          worker_target=sandbox_stub.serve) as sandbox:
        for _ in range(2):
            assert sandbox.evaluate(b"x").status is CandidateStatus.OK
            assert sandbox._process is None


def test_spec_must_match_the_parameter_table():
    from mirage.sass.errors import LaunchSpecError

    bad = LaunchSpec(kernel="scaled_add", grid=(1, 1, 1), block=(32, 1, 1),
                     arguments=SPEC.arguments[:4])
    with pytest.raises(LaunchSpecError, match="takes 5 parameters"):
        SandboxEvaluator(fixture_cubin("elementwise.cubin"), bad)


def test_launch_spec_round_trips_through_json():
    assert LaunchSpec.from_json(SPEC.to_json()) == SPEC
