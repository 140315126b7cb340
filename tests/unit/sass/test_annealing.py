from __future__ import annotations

import pytest
from sass_fixtures import fixture_cubin
from synthetic import SyntheticMeasure

from mirage.sass.annealing import AnnealingSchedule, anneal
from mirage.sass.mutation import MoveSet, verify_edit
from mirage.sass.search import Budget, KernelEvaluator, SearchOptions, StopReason, replay_words


@pytest.mark.parametrize("move_set", list(MoveSet))
def test_annealing_improves_a_synthetic_objective_within_budget(cute_gemm, move_set):
    measure = SyntheticMeasure(cute_gemm)
    options = SearchOptions(move_set=move_set, repair_stalls=True, redisassemble=False, progress=False)
    evaluate = KernelEvaluator(cute_gemm, fixture_cubin("cute_gemm.cubin"), measure, options)
    result = anneal(cute_gemm, evaluate, Budget(candidates=60), options)
    assert result.evaluations == 60 == measure.calls
    assert result.stop_reason is StopReason.BUDGET
    assert result.best_speedup == max([1.0] + [r.speedup for r in result.records if r.speedup])
    if move_set is MoveSet.SIP:  # every SIP move changes the objective; most adjacent swaps do not
        assert result.best_speedup > 1.0
    verify_edit(cute_gemm, result.best, redisassemble=True)


def test_sip_schedule_cools_to_a_stop(elementwise_x4):
    measure = SyntheticMeasure(elementwise_x4)
    options = SearchOptions(move_set=MoveSet.SWAP, repair_stalls=True, redisassemble=False, progress=False)
    evaluate = KernelEvaluator(elementwise_x4, fixture_cubin("elementwise.cubin"), measure, options)
    result = anneal(elementwise_x4, evaluate, Budget(candidates=10_000), options,
                    AnnealingSchedule(initial_temperature=0.4, cooling=0.9, stop_temperature=0.05))
    assert result.stop_reason in (StopReason.COLD, StopReason.STEPS)
    assert len(result.records) <= 20  # ln(0.125) / ln(0.9) ≈ 19.7 steps


def test_failed_candidates_are_counted_and_never_accepted(cute_gemm):
    measure = SyntheticMeasure(cute_gemm, fail_every=5)
    options = SearchOptions(move_set=MoveSet.SIP, repair_stalls=True, redisassemble=False, progress=False)
    evaluate = KernelEvaluator(cute_gemm, fixture_cubin("cute_gemm.cubin"), measure, options)
    result = anneal(cute_gemm, evaluate, Budget(candidates=40), options)
    failed = [r for r in result.records if r.status == "wrong-output"]
    assert len(failed) == 8 == result.legality_failures
    assert not any(r.accepted for r in failed)
    # each failure keeps the words that differ from the original, enough to rebuild the candidate
    original = cute_gemm.text_bytes()
    assert all(r.failed_words is None for r in result.records if r.status == "ok")
    for record in failed:
        first, words = record.failed_words
        assert words and words[0] != original[16 * first: 16 * first + 16].hex()
        text = replay_words(original, record.failed_words)
        assert len(text) == len(original) and text != original
        assert sorted(text[k: k + 8] for k in range(0, len(text), 16)) == sorted(
            original[k: k + 8] for k in range(0, len(original), 16))  # a permutation, stall bits aside
