"""Sandboxed evaluation of candidate cubins on the GPU.

Every candidate runs in a separate, killable process (:mod:`mirage.sass.worker`) with a timeout: an
illegal-address error kills the CUDA context of the process that raised it, and a broken schedule
can hang.  By default one sandbox process serves candidates until anything goes wrong (a CUDA error,
a timeout, wrong outputs, or the original kernel no longer reproducing its outputs afterwards), and
is then killed and replaced; ``Isolation.PER_CANDIDATE`` starts a fresh process for every candidate.
A candidate's time counts only after its outputs matched the original's on several input sets.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import multiprocessing
import statistics
import time
from dataclasses import dataclass

from mirage.sass.elf import Cubin
from mirage.sass.errors import EvaluationError
from mirage.sass.launch import LaunchSpec, check_against_cubin

log = logging.getLogger(__name__)


class CandidateStatus(enum.Enum):
    OK = "ok"
    WRONG_OUTPUT = "wrong-output"  # ran, but computed something else
    CRASH = "crash"  # a CUDA error, or the sandbox process died
    TIMEOUT = "timeout"  # no answer in time; the process was killed
    POISONED = "poisoned"  # afterwards the original kernel no longer reproduced its outputs
    REJECTED = "rejected"  # refused before the GPU (static verification)

    @property
    def failed_on_gpu(self) -> bool:
        return self in (CandidateStatus.WRONG_OUTPUT, CandidateStatus.CRASH, CandidateStatus.TIMEOUT,
                        CandidateStatus.POISONED)


class Isolation(enum.Enum):
    PERSISTENT = "persistent"  # one process until something goes wrong
    PER_CANDIDATE = "per-candidate"  # a fresh process for each candidate


@dataclass(frozen=True)
class EvaluatorOptions:
    input_sets: int = 4  # seeded input sets whose reference outputs are kept
    test_sets: int = 3  # of those, how many each candidate must reproduce before it is timed
    rounds: int = 9  # alternating timing rounds (candidate, original) per candidate
    warmup_rounds: int = 2  # rounds run first and not counted
    target_round_us: float = 1000.0  # launches per round are chosen to fill about this long
    timeout_s: float = 30.0
    startup_timeout_s: float = 180.0
    isolation: Isolation = Isolation.PERSISTENT
    seed: int = 1234


@dataclass(frozen=True)
class CandidateResult:
    status: CandidateStatus
    speedup: float | None = None  # median original time / median candidate time
    original_us: float | None = None
    candidate_us: float | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def gain_percent(self) -> float | None:
        return None if self.speedup is None else (self.speedup - 1.0) * 100.0


class SandboxEvaluator:
    """Evaluate candidate cubins of one kernel against the original, each in a sandbox process."""

    def __init__(self, original: Cubin, spec: LaunchSpec, options: EvaluatorOptions | None = None,
                 worker_target=None) -> None:
        check_against_cubin(spec, original)
        self.worker_target = worker_target  # the sandbox's entry point; default mirage.sass.worker.serve
        self.original = original
        self.spec = spec
        self.options = options or EvaluatorOptions()
        self.seeds = [self.options.seed + index for index in range(self.options.input_sets)]
        self.calibration: dict = {}
        self.restarts = 0
        self.evaluated = 0
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection = None

    # -- process management -----------------------------------------------------------------------

    def __enter__(self) -> SandboxEvaluator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self) -> None:
        from mirage.sass import worker

        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        target = self.worker_target or worker.serve
        self._process = context.Process(target=target, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._connection = parent
        setup = {"spec": self.spec, "original": self.original.data, "seeds": self.seeds,
                 "target_round_us": self.options.target_round_us}
        reply = self._request("setup", setup, self.options.startup_timeout_s)
        if reply is None or reply.get("status") != "ok":
            detail = "no answer" if reply is None else reply.get("detail", reply)
            self._kill()
            raise EvaluationError(
                f"the original kernel {self.spec.kernel} could not be set up on the GPU: {detail}")
        self.calibration = reply
        if reply.get("unwritten_outputs"):
            log.warning("the original kernel left %d output elements NaN (unwritten or NaN data)",
                        reply["unwritten_outputs"])

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=10)
        self._process = None
        self._connection = None

    def close(self) -> None:
        if self._process is not None and self._process.is_alive() and self._connection is not None:
            try:
                self._connection.send(("stop", None))
                self._process.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def _request(self, kind: str, payload: dict, timeout: float) -> dict | None:
        assert self._connection is not None
        try:
            self._connection.send((kind, payload))
            if not self._connection.poll(timeout):
                return None
            return self._connection.recv()
        except (EOFError, BrokenPipeError, OSError):
            return {"status": "crash", "detail": "the sandbox process died"}

    def _ensure_started(self) -> None:
        if self._process is None or not self._process.is_alive():
            if self._process is not None:
                self.restarts += 1
            self._kill()
            self._start()

    # -- evaluation -------------------------------------------------------------------------------

    def evaluate(self, candidate: Cubin | bytes) -> CandidateResult:
        data = candidate.data if isinstance(candidate, Cubin) else candidate
        started = time.perf_counter()
        self._ensure_started()
        self.evaluated += 1
        sets = list(range(min(self.options.test_sets, self.options.input_sets)))
        reply = self._request("evaluate", {"cubin": data, "sets": sets, "rounds": self.options.rounds,
                                           "warmup_rounds": self.options.warmup_rounds,
                                           "tag": f"candidate{self.evaluated}"}, self.options.timeout_s)
        result = self._result(reply, time.perf_counter() - started)
        if result.status is not CandidateStatus.OK or self.options.isolation is Isolation.PER_CANDIDATE:
            self._kill()  # never let a process that saw a failure judge the next candidate
        return result

    def _result(self, reply: dict | None, seconds: float) -> CandidateResult:
        if reply is None:
            return CandidateResult(CandidateStatus.TIMEOUT, detail=f"no answer in {self.options.timeout_s} s",
                                   seconds=seconds)
        status = reply.get("status")
        if status == "ok":
            original = statistics.median(reply["original_us"])
            candidate = statistics.median(reply["candidate_us"])
            return CandidateResult(CandidateStatus.OK, speedup=original / candidate, original_us=original,
                                   candidate_us=candidate, seconds=seconds)
        mapped = {"wrong-output": CandidateStatus.WRONG_OUTPUT, "poisoned": CandidateStatus.POISONED}
        return CandidateResult(mapped.get(status, CandidateStatus.CRASH), detail=str(reply.get("detail", "")),
                               seconds=seconds)

    def verify(self, candidate: Cubin | bytes, input_sets: int = 64) -> CandidateResult:
        """Check a candidate against the original on many fresh input sets."""
        data = candidate.data if isinstance(candidate, Cubin) else candidate
        started = time.perf_counter()
        self._ensure_started()
        seeds = [self.options.seed + 100_000 + index for index in range(input_sets)]
        reply = self._request("verify", {"cubin": data, "seeds": seeds},
                              self.options.timeout_s + 0.5 * input_sets)
        if reply is not None and reply.get("status") == "ok":
            return CandidateResult(CandidateStatus.OK, detail=f"{input_sets} input sets",
                                   seconds=time.perf_counter() - started)
        result = self._result(reply, time.perf_counter() - started)
        self._kill()
        return dataclasses.replace(result, status=result.status if result.status is not CandidateStatus.OK
                                   else CandidateStatus.CRASH)

    def time_repeats(self, candidate: Cubin | bytes, repeats: int) -> list[float]:
        """Speedups of independent timing repeats (each its own interleaved rounds): the run-to-run
        spread of a result.  Timing the original against itself gives the noise floor."""
        speedups = []
        for _ in range(repeats):
            result = self.evaluate(candidate)
            if result.status is not CandidateStatus.OK:
                raise EvaluationError(
                    f"a candidate that passed before failed a timing repeat: {result.detail}")
            assert result.speedup is not None
            speedups.append(result.speedup)
        return speedups
