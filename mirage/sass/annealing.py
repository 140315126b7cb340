"""Simulated annealing over legal moves, with SIP's schedule as the default.

Fitness is the measured gain over the original kernel in percent (speedup − 1) × 100.  A move to a
schedule with gain Δ higher is always taken; a worse one with probability exp(Δ / T).  T starts at
0.4, is multiplied by 0.997 after every step and the search stops at 0.05 (about 692 steps) or when
the budget is spent.  Candidates that fail or miscompute are never accepted.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from mirage.sass.kernel import Kernel
from mirage.sass.search import (
    Budget,
    CandidateRecord,
    KernelEvaluator,
    SearchOptions,
    SearchResult,
    StopReason,
    TopList,
    failure_window,
    out_of_time,
    progress_bar,
    random_legal_move,
)


@dataclass(frozen=True)
class AnnealingSchedule:
    initial_temperature: float = 0.4
    cooling: float = 0.997
    stop_temperature: float = 0.05


def anneal(original: Kernel, evaluate: KernelEvaluator, budget: Budget, options: SearchOptions,
           schedule: AnnealingSchedule = AnnealingSchedule()) -> SearchResult:
    generator = random.Random(options.seed)
    started = time.perf_counter()
    current, current_gain, distance = original, 0.0, 0
    top = TopList()
    top.offer(1.0, original)
    records: list[CandidateRecord] = []
    temperature = schedule.initial_temperature
    step = 0
    stop = StopReason.BUDGET
    start_evaluations = evaluate.evaluations
    with progress_bar(budget.candidates, f"anneal {original.name}", options.progress) as bar:
        while True:
            used = evaluate.evaluations - start_evaluations
            if used >= budget.candidates:
                stop = StopReason.BUDGET
                break
            if temperature <= schedule.stop_temperature:
                stop = StopReason.COLD
                break
            if out_of_time(started, budget):
                stop = StopReason.TIME
                break
            if step >= budget.candidates * budget.max_steps_per_candidate:
                stop = StopReason.STEPS
                break
            choice = random_legal_move(current, options, generator)
            if choice is None:
                stop = StopReason.NO_MOVES
                break
            move, raises = choice
            description = move.describe(current)
            candidate = current.swapped(move.swap_position, raises)
            result, cached = evaluate(candidate)
            accepted = False
            if result.speedup is not None:
                gain = result.gain_percent or 0.0
                delta = gain - current_gain
                if delta > 0 or generator.random() < math.exp(delta / temperature):
                    current, current_gain, accepted = candidate, gain, True
                    distance += 1
                top.offer(result.speedup, candidate)
            if not cached:
                records.append(CandidateRecord(step=step, distance=distance, status=result.status.value,
                                               speedup=result.speedup, accepted=accepted, move=description,
                                               failed_words=failure_window(original, candidate, result)))
                bar.update(1)
                bar.set_postfix(best=f"{(top.best()[0][0] - 1) * 100:+.2f}%", T=f"{temperature:.3f}")
            temperature *= schedule.cooling
            step += 1
    best_speedup, best = top.best()[0]
    return SearchResult(policy="annealing", best=best, best_speedup=best_speedup, records=tuple(records),
                        stop_reason=stop, seconds=time.perf_counter() - started,
                        evaluations=evaluate.evaluations - start_evaluations, top=top.best())
