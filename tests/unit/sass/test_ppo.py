from __future__ import annotations

import numpy as np
import pytest
from sass_fixtures import fixture_cubin
from synthetic import SyntheticMeasure

from mirage.sass.mutation import MoveSet, verify_edit
from mirage.sass.ppo import FEATURES, PPOConfig, action_mask, features, learn
from mirage.sass.search import Budget, KernelEvaluator, SearchOptions

pytest.importorskip("torch")


def test_features_have_one_row_per_instruction(cute_gemm):
    rows = features(cute_gemm)
    assert rows.shape == (len(cute_gemm), FEATURES)
    assert np.isfinite(rows).all()
    pinned = [p for p, ins in enumerate(cute_gemm.instructions) if ins.pinned]
    assert (rows[pinned, 28] == 1.0).all()


def test_mask_allows_exactly_the_legal_moves(cute_gemm):
    options = SearchOptions(move_set=MoveSet.SIP, repair_stalls=False)
    mask, raises = action_mask(cute_gemm, options)
    from mirage.sass.mutation import legal_moves

    legal = {2 * m.position + (0 if m.direction < 0 else 1) for m, _ in legal_moves(cute_gemm, MoveSet.SIP)}
    assert set(np.flatnonzero(mask)) == legal
    assert set(raises) == legal


def test_ppo_learns_within_budget_and_proposes_only_legal_moves(cute_gemm):
    measure = SyntheticMeasure(cute_gemm)
    options = SearchOptions(move_set=MoveSet.SIP, repair_stalls=True, redisassemble=False, progress=False,
                            seed=3)
    evaluate = KernelEvaluator(cute_gemm, fixture_cubin("cute_gemm.cubin"), measure, options)
    config = PPOConfig(episode_length=8, steps_per_update=16, epochs=2, minibatch=8)
    result = learn(cute_gemm, evaluate, Budget(candidates=32), options, config)
    assert result.evaluations == 32
    assert result.best_speedup >= 1.0
    verify_edit(cute_gemm, result.best, redisassemble=True)
    assert all(record.status == "ok" for record in result.records)
