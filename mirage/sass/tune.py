"""Entry points: tune any cubin given a launch description, or a Triton kernel's cubin.

>>> options = TuneOptions(budget=Budget(candidates=500))                  # doctest: +SKIP
>>> result = tune_cubin(Cubin.read("k.cubin"), spec, options)            # doctest: +SKIP
>>> result.gain_percent, result.spread_percent, result.significant       # doctest: +SKIP

After the search, the best few schedules are timed again in independent repeats (each repeat its own
interleaved rounds against the original), the original is timed against itself the same way (the
noise floor), the schedule with the best mean is checked against the original on many fresh input
sets, and the result says whether its gain stands out of the noise.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from mirage.sass.annealing import AnnealingSchedule, anneal
from mirage.sass.elf import Cubin
from mirage.sass.evaluate import CandidateResult, CandidateStatus, EvaluatorOptions, SandboxEvaluator
from mirage.sass.kernel import Kernel, load_kernel
from mirage.sass.launch import LaunchSpec
from mirage.sass.ppo import PPOConfig, learn
from mirage.sass.search import Budget, KernelEvaluator, SearchOptions, SearchResult

log = logging.getLogger(__name__)
POLICIES = ("annealing", "ppo")


@dataclass(frozen=True)
class TuneOptions:
    policy: str = "annealing"
    budget: Budget = field(default_factory=Budget)
    search: SearchOptions = field(default_factory=SearchOptions)
    evaluator: EvaluatorOptions = field(default_factory=EvaluatorOptions)
    schedule: AnnealingSchedule = field(default_factory=AnnealingSchedule)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    finalists: int = 3
    timing_repeats: int = 5
    verify_sets: int = 64

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is not one of {POLICIES}")


@dataclass(frozen=True)
class TuneResult:
    kernel: str
    policy: str
    original: Cubin
    best: Cubin
    search: SearchResult
    chosen_speedups: tuple[float, ...]  # repeats of the chosen schedule against the original
    noise_speedups: tuple[float, ...]  # repeats of the original against itself
    finalist_means: tuple[float, ...]  # median speedup of each re-timed finalist
    verification: CandidateResult
    changed_positions: int

    @property
    def gain_percent(self) -> float:
        """Median gain of the chosen schedule over the timing repeats (robust to a stray repeat)."""
        return (statistics.median(self.chosen_speedups) - 1.0) * 100.0 if self.chosen_speedups else 0.0

    @property
    def mean_gain_percent(self) -> float:
        return (statistics.fmean(self.chosen_speedups) - 1.0) * 100.0 if self.chosen_speedups else 0.0

    @property
    def spread_percent(self) -> float:
        """Standard deviation of the chosen schedule's gain over the timing repeats."""
        return statistics.stdev(self.chosen_speedups) * 100.0 if len(self.chosen_speedups) > 1 else 0.0

    @property
    def noise_percent(self) -> float:
        return statistics.stdev(self.noise_speedups) * 100.0 if len(self.noise_speedups) > 1 else 0.0

    @property
    def significant(self) -> bool:
        """Every timing repeat of the chosen schedule beats every repeat of the original against
        itself, and the mean gain exceeds twice the combined standard error."""
        if len(self.chosen_speedups) < 2 or len(self.noise_speedups) < 2 or self.changed_positions == 0:
            return False
        error = (statistics.variance(self.chosen_speedups) / len(self.chosen_speedups)
                 + statistics.variance(self.noise_speedups) / len(self.noise_speedups)) ** 0.5
        separated = min(self.chosen_speedups) > max(self.noise_speedups)
        difference = statistics.fmean(self.chosen_speedups) - statistics.fmean(self.noise_speedups)
        return separated and difference > 2 * error

    def summary(self) -> dict:
        search = self.search
        return {
            "kernel": self.kernel, "policy": self.policy, "candidates": search.evaluations,
            "stop_reason": search.stop_reason.value, "search_seconds": round(search.seconds, 1),
            "status_counts": search.status_counts, "legality_failures": search.legality_failures,
            "search_best_speedup": search.best_speedup, "finalist_mean_speedups": list(self.finalist_means),
            "chosen_speedups": list(self.chosen_speedups), "noise_speedups": list(self.noise_speedups),
            "gain_percent": self.gain_percent, "mean_gain_percent": self.mean_gain_percent,
            "spread_percent": self.spread_percent,
            "noise_percent": self.noise_percent, "significant": self.significant,
            "verification": {"status": self.verification.status.value, "detail": self.verification.detail},
            "changed_positions": self.changed_positions,
            "returned_original": self.best.data == self.original.data,
            "records": [record.__dict__ for record in search.records],
        }


def run_search(kernel: Kernel, evaluate: KernelEvaluator, options: TuneOptions) -> SearchResult:
    if options.policy == "ppo":
        return learn(kernel, evaluate, options.budget, options.search, options.ppo)
    return anneal(kernel, evaluate, options.budget, options.search, options.schedule)


def _repeats(measure: Callable[[Cubin], CandidateResult], cubin: Cubin, count: int) -> tuple[float, ...]:
    speedups = []
    for _ in range(count):
        result = measure(cubin)
        if result.speedup is None:
            return ()
        speedups.append(result.speedup)
    return tuple(speedups)


def tune_kernel(cubin: Cubin, kernel: Kernel, measure: Callable[[Cubin], CandidateResult],
                verify: Callable[[Cubin, int], CandidateResult], options: TuneOptions) -> TuneResult:
    """The search and the final timing and verification, with the GPU behind two callables."""
    evaluate = KernelEvaluator(kernel, cubin, measure, options.search)
    search = run_search(kernel, evaluate, options)
    noise = _repeats(measure, cubin, options.timing_repeats)
    original_text = kernel.text_bytes()
    finalists = [(speedup, state) for speedup, state in search.top if state.text_bytes() != original_text]
    timed = []
    for _, state in finalists[: options.finalists]:
        repeats = _repeats(measure, evaluate.cubin_for(state), options.timing_repeats)
        if repeats:
            timed.append((statistics.fmean(repeats), repeats, state))
    timed.sort(key=lambda item: -statistics.median(item[1]))
    chosen, chosen_repeats = kernel, noise
    verification = CandidateResult(CandidateStatus.OK, detail="the original schedule")
    for _, repeats, state in timed:
        result = verify(evaluate.cubin_for(state), options.verify_sets)
        if result.status is CandidateStatus.OK:
            chosen, chosen_repeats, verification = state, repeats, result
            break
        log.warning("finalist failed verification on fresh inputs (%s): %s", result.status.value,
                    result.detail)
        verification = result
    changed = sum(1 for a, b in zip(kernel.instructions, chosen.instructions, strict=True) if a.low != b.low)
    if chosen is kernel or statistics.median(chosen_repeats) <= 1.0:
        best_cubin = cubin  # nothing beat the original: keep it
    else:
        best_cubin = evaluate.cubin_for(chosen)
    return TuneResult(kernel=kernel.name, policy=options.policy, original=cubin, best=best_cubin,
                      search=search,
                      chosen_speedups=chosen_repeats, noise_speedups=noise,
                      finalist_means=tuple(statistics.median(repeats) for _, repeats, _ in timed),
                      verification=verification,
                      changed_positions=changed if best_cubin is not cubin else 0)


def tune_cubin(cubin: Cubin, spec: LaunchSpec, options: TuneOptions | None = None) -> TuneResult:
    """Tune the schedule of ``spec.kernel`` in ``cubin`` on the GPU of this machine."""
    options = options or TuneOptions()
    kernel = load_kernel(cubin, spec.kernel)
    with SandboxEvaluator(cubin, spec, options.evaluator) as evaluator:
        return tune_kernel(cubin, kernel, evaluator.evaluate, evaluator.verify, options)
