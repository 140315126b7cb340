from __future__ import annotations

from sass_fixtures import fixture_cubin
from synthetic import SyntheticMeasure

from mirage.sass.mutation import MoveSet
from mirage.sass.search import Budget, SearchOptions
from mirage.sass.tune import TuneOptions, tune_kernel


def test_tune_kernel_times_finalists_verifies_and_reports(cute_gemm):
    measure = SyntheticMeasure(cute_gemm)
    options = TuneOptions(budget=Budget(candidates=40), timing_repeats=3, finalists=2,
                          search=SearchOptions(move_set=MoveSet.SIP, repair_stalls=True, progress=False))
    cubin = fixture_cubin("cute_gemm.cubin")
    result = tune_kernel(cubin, cute_gemm, measure, measure.verify, options)
    assert result.gain_percent > 0
    assert result.spread_percent == 0.0 and result.noise_percent == 0.0  # the synthetic timer has no noise
    assert result.best.data != cubin.data and result.changed_positions > 0
    summary = result.summary()
    assert summary["candidates"] == 40 and summary["legality_failures"] == 0
    assert summary["verification"]["status"] == "ok"
    assert summary["returned_original"] is False
    # the returned cubin differs from the original only inside the kernel's text section
    section = cubin.text_section("cute_gemm_tn")
    changed = [i for i, (a, b) in enumerate(zip(cubin.data, result.best.data, strict=True)) if a != b]
    assert section.offset <= changed[0] and changed[-1] < section.offset + section.size
