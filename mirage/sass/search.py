"""What every search policy shares: budgets, stop reasons, the per-candidate record, statistics, and
the bridge from a :class:`~mirage.sass.kernel.Kernel` state to a GPU measurement.

:class:`KernelEvaluator` turns a schedule into a cubin, checks the edit statically (same instructions
per block, re-disassembled), and asks the sandbox for a measurement.  Schedules already measured are
answered from a cache, so a budget counts GPU evaluations.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mirage.sass.elf import Cubin
from mirage.sass.errors import SassError
from mirage.sass.evaluate import CandidateResult, CandidateStatus
from mirage.sass.kernel import Kernel
from mirage.sass.legality import DEFAULT_LATENCY, LatencyRules
from mirage.sass.mutation import Move, MoveSet, check_move, verify_edit

log = logging.getLogger(__name__)


class StopReason(enum.Enum):
    BUDGET = "budget"  # the candidate budget is spent
    TIME = "time"  # the time budget is spent
    COLD = "temperature"  # annealing cooled below its stop temperature
    NO_MOVES = "no-legal-moves"
    STEPS = "step-limit"  # too many steps answered from the cache


@dataclass(frozen=True)
class Budget:
    candidates: int = 500  # GPU evaluations
    time_s: float | None = None
    max_steps_per_candidate: int = 20  # cache hits allowed per evaluation before stopping


@dataclass(frozen=True)
class SearchOptions:
    move_set: MoveSet = MoveSet.SIP
    repair_stalls: bool = False
    latency: LatencyRules = DEFAULT_LATENCY
    redisassemble: bool = True  # re-disassemble every candidate before it runs
    seed: int = 0
    progress: bool = True


@dataclass(frozen=True)
class CandidateRecord:
    step: int
    distance: int  # moves applied since the original
    status: str
    speedup: float | None
    accepted: bool
    move: str
    # a candidate that failed on the GPU, for a post-mortem of the legality model: its instruction words
    # (16 bytes each, hex, control bits included) from the first to the last that differ from the
    # original's, and the position of the first (see :func:`changed_words`, :func:`replay_words`)
    failed_words: tuple[int, tuple[str, ...]] | None = None


def changed_words(original: Kernel, candidate: Kernel) -> tuple[int, tuple[str, ...]]:
    """The window of ``candidate``'s instruction words that differ from ``original``'s: (first
    position, the words of the window in hex)."""
    before, after = original.text_bytes(), candidate.text_bytes()
    words = [k for k in range(0, len(after), 16) if after[k: k + 16] != before[k: k + 16]]
    if not words:
        return 0, ()
    first, last = words[0], words[-1] + 16
    return first // 16, tuple(after[k: k + 16].hex() for k in range(first, last, 16))


def replay_words(original_text: bytes, window: tuple[int, tuple[str, ...]]) -> bytes:
    """The failed candidate's text: ``original_text`` with a :attr:`CandidateRecord.failed_words` window."""
    first, words = window
    patch = bytes.fromhex("".join(words))
    return original_text[: 16 * first] + patch + original_text[16 * first + len(patch):]


def failure_window(original: Kernel, candidate: Kernel, result: CandidateResult):
    """``changed_words`` of a candidate that failed on the GPU, else None."""
    return None if result.speedup is not None else changed_words(original, candidate)


@dataclass(frozen=True)
class SearchResult:
    policy: str
    best: Kernel
    best_speedup: float
    records: tuple[CandidateRecord, ...]
    stop_reason: StopReason
    seconds: float
    evaluations: int
    top: tuple[tuple[float, Kernel], ...] = field(default=(), compare=False)

    @property
    def status_counts(self) -> dict[str, int]:
        return dict(collections.Counter(record.status for record in self.records))

    @property
    def legality_failures(self) -> int:
        """Candidates the legality model allowed that then failed or miscomputed on the GPU."""
        failing = {status.value for status in CandidateStatus if status.failed_on_gpu}
        return sum(1 for record in self.records if record.status in failing)


def text_key(kernel: Kernel) -> str:
    return hashlib.sha256(kernel.text_bytes()).hexdigest()


class KernelEvaluator:
    """Measure schedules of one kernel: static checks, then the GPU (``measure``), with a cache."""

    def __init__(self, original: Kernel, cubin: Cubin, measure: Callable[[Cubin], CandidateResult],
                 options: SearchOptions) -> None:
        self.original = original
        self.cubin = cubin
        self.measure = measure
        self.options = options
        self.cache: dict[str, CandidateResult] = {
            text_key(original): CandidateResult(CandidateStatus.OK, 1.0)}
        self.evaluations = 0
        self.failures: list[tuple[str, CandidateResult]] = []

    def cubin_for(self, kernel: Kernel) -> Cubin:
        return self.cubin.with_text(kernel.name, kernel.text_bytes())

    def __call__(self, kernel: Kernel) -> tuple[CandidateResult, bool]:
        """The measurement of a schedule and whether it came from the cache."""
        key = text_key(kernel)
        if key in self.cache:
            return self.cache[key], True
        try:
            verify_edit(self.original, kernel, redisassemble=self.options.redisassemble)
        except SassError as error:
            result = CandidateResult(CandidateStatus.REJECTED, detail=str(error))
        else:
            self.evaluations += 1
            result = self.measure(self.cubin_for(kernel))
            if result.status.failed_on_gpu:
                self.failures.append((key, result))
                log.warning("candidate failed on the GPU (%s): %s", result.status.value, result.detail)
        self.cache[key] = result
        return result, False


def random_legal_move(kernel: Kernel, options: SearchOptions, generator) -> tuple[Move, tuple] | None:
    """A uniformly chosen legal move (tries candidates in random order); ``None`` if there is none."""
    from mirage.sass.mutation import candidate_moves

    moves = candidate_moves(kernel, options.move_set)
    generator.shuffle(moves)
    for move in moves:
        legality = check_move(kernel, move, latency=options.latency, repair_stalls=options.repair_stalls)
        if legality.ok:
            return move, legality.stall_raises
    return None


def progress_bar(total: int, description: str, enabled: bool):
    """A tqdm bar, off when ``enabled`` is false or MIRAGE_NO_PROGRESS is set."""
    from tqdm.auto import tqdm

    try:
        from mirage import config

        enabled = enabled and config.settings().progress
    except Exception:  # noqa: BLE001 - configuration problems must not stop a search
        pass
    return tqdm(total=total, desc=description, disable=not enabled, leave=False)


class TopList:
    """The best few distinct schedules seen, by measured speedup."""

    def __init__(self, size: int = 3) -> None:
        self.size = size
        self.items: dict[str, tuple[float, Kernel]] = {}

    def offer(self, speedup: float, kernel: Kernel) -> None:
        key = text_key(kernel)
        if key in self.items and self.items[key][0] >= speedup:
            return
        self.items[key] = (speedup, kernel)
        if len(self.items) > self.size:
            worst = min(self.items, key=lambda k: self.items[k][0])
            del self.items[worst]

    def best(self) -> tuple[tuple[float, Kernel], ...]:
        return tuple(sorted(self.items.values(), key=lambda item: -item[0]))


def out_of_time(started: float, budget: Budget) -> bool:
    return budget.time_s is not None and time.perf_counter() - started > budget.time_s
