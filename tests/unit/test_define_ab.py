"""benchmarks.define_ab finds each pick of a suite record in its case's family (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.define_ab import pick

SUITE = Path(__file__).parents[2] / "benchmarks" / "results" / "suite_2026-11-26.json"


@pytest.mark.parametrize("case", ["gqa_b1", "lora_m16", "gatedmlp_m1"])
def test_pick_is_the_recorded_winner(case):
    record = next(c for c in json.loads(SUITE.read_text())["cases"] if c["case"] == case)
    best = record["selection"]["best"]
    graph = pick(case, best)
    assert graph.content_hash().startswith(best["variant"].split("/")[0])  # lora: one of 4 of its grids
    assert [list(b.grid_dim) for b in graph.block_graphs()] == best["grids"]


def test_pick_falls_back_to_the_grids_and_names_a_missing_one():
    record = next(c for c in json.loads(SUITE.read_text())["cases"] if c["case"] == "ntrans_b1")
    best = dict(record["selection"]["best"], variant="0000000000/s2")
    assert [list(b.grid_dim) for b in pick("ntrans_b1", best).block_graphs()] == best["grids"]
    with pytest.raises(LookupError, match="no member"):
        pick("ntrans_b1", dict(best, grids=[[7, 7, 7]]))
