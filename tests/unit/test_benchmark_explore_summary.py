"""An exploration's record read back (``python -m benchmarks.explore --summarize``): members ranked by
their fastest launch mode, not by the dependent launch alone."""

from __future__ import annotations

import json

import pytest

from benchmarks import explore


def _row(label, dependent, plain=None, spread=None, passed=True):
    row = {"label": label, "stages": 2, "options": {}, "median_us": dependent, "passed": passed}
    if plain is not None:
        row["median_us_plain_launch"] = plain
    if spread is not None:
        row["median_us_spread"] = spread
    return row


def test_best_mode_is_the_fastest_timed_mode():
    assert explore.best_mode(_row("a", 9.0, plain=7.5, spread=8.0)) == (7.5, "plain")
    assert explore.best_mode(_row("b", 6.0)) == (6.0, "dependent")


def test_summarize_ranks_by_the_best_mode_and_counts_outcomes(tmp_path, capsys):
    rows = [_row("slow_dependent_fast_spread", 9.0, plain=9.5, spread=5.0),
            _row("fast_dependent", 6.0, plain=6.5, spread=6.2),
            _row("wrong", 1.0, passed=False),
            {"label": "broken", "stages": 2, "options": {}, "failure": "compile: error"}]
    record = {"cases": {"gqa_b1": rows}}
    lines = explore.summarize(record, top=5)
    assert lines[0] == "gqa_b1: 2 passed, 1 wrong, 1 failed"
    assert "5.00 µs (spread)  slow_dependent_fast_spread" in lines[1]
    assert "[dependent 9.00, plain 9.50, spread 5.00]" in lines[1]
    assert "6.00 µs (dependent)  fast_dependent" in lines[2] and len(lines) == 3  # the wrong one is left out
    path = tmp_path / "explore.json"
    path.write_text(json.dumps(record))
    assert explore.main(["--summarize", str(path), "--top", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1].strip().startswith("gqa_b1  5.00 µs (spread)")


def test_summarize_refuses_an_unreadable_record(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit):
        explore.main(["--summarize", str(tmp_path / "bad.json")])
    with pytest.raises(SystemExit):
        explore.main([])  # neither --cases nor --summarize
