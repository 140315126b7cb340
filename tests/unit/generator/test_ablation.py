"""The Table 5 command: rows written as JSON, and --append keeps earlier rows (a new run replaces one)."""

from __future__ import annotations

import json

from mirage.generator import ablation


def test_rows_accumulate_with_append_and_a_rerun_replaces_its_row(tmp_path):
    out = tmp_path / "table5.json"
    common = ["--ops", "5", "--cap", "0.25", "--workers", "1", "--out", str(out)]
    ablation.main([*common, "--modes", "all rules"])
    first = json.loads(out.read_text())
    assert [(r["max_block_ops"], r["disabled_rules"]) for r in first["rows"]] == [(5, [])]
    assert first["rows"][0]["machine"]["cpus"] > 0 and "| 5 |" in first["table"]

    ablation.main([*common, "--modes", "no abstract expressions", "--append"])
    ablation.main([*common, "--modes", "all rules", "--append"])
    rows = json.loads(out.read_text())["rows"]
    keys = [(r["max_block_ops"], r["disabled_rules"]) for r in rows]
    assert keys == [(5, []), (5, ["abstract_expression"])]
    assert all(r["cap_s"] == 0.25 and isinstance(r["complete"], bool) for r in rows)

    ablation.main([*common, "--modes", "all rules"])  # without --append: only this run's rows
    assert len(json.loads(out.read_text())["rows"]) == 1
