"""Suite files timed in several calls on one machine merge into one report (benchmarks.run --merge)."""

from __future__ import annotations

import json

import pytest

from benchmarks import run


def _suite(cases: list[str], device: str = "H100", bandwidth: float = 2.4e12, floor: float = 1.4) -> dict:
    rows = [{"case": c, "times_us": {"mirage": {"median_us": 10.0}, "torch_compile": {"median_us": 12.0}},
             "failures": {}, "best_us": 12.0, "limit_us": floor, "speedup": 1.2, "of_limit": floor / 10}
            for c in cases]
    facts = {"device": device, "driver": "580", "torch": "2.11", "date": "2026-11-22"}
    return {"facts": facts, "bandwidth_bytes_per_s": bandwidth, "launch_floor_us": floor, "cases": rows}


def test_merge_orders_the_cases_and_records_each_call(tmp_path):
    first, second = _suite(["lora_m16", "gqa_b1"]), _suite(["gatedmlp_m1"], bandwidth=2.5e12, floor=1.7)
    paths = []
    for k, suite in enumerate((second, first)):
        paths.append(tmp_path / f"part{k}.json")
        paths[-1].write_text(json.dumps(suite))
    assert run.main(["--merge", *map(str, paths), "--out", str(tmp_path / "out")]) == 0
    merged = json.loads((tmp_path / "out" / "suite_2026-11-22.json").read_text())
    assert [c["case"] for c in merged["cases"]] == ["gqa_b1", "lora_m16", "gatedmlp_m1"]  # the suite's order
    assert [c["cases"] for c in merged["calls"]] == [["gatedmlp_m1"], ["lora_m16", "gqa_b1"]]
    assert merged["calls"][0]["launch_floor_us"] == 1.7
    table = (tmp_path / "out" / "suite_2026-11-22.md").read_text()
    assert "| gatedmlp_m1 | " in table and "timed in 2 calls" in table
    assert "gatedmlp_m1: copy bandwidth 2.50 TB/s, launch floor 1.70 µs" in table
    assert "Geometric mean speedup over the best baseline: 1.20 (3 cases)" in table


def test_merge_refuses_other_devices_and_repeated_cases():
    with pytest.raises(SystemExit, match="different devices"):
        run.merge([_suite(["gqa_b1"]), _suite(["gqa_b8"], device="H200")])
    with pytest.raises(SystemExit, match="more than one file"):
        run.merge([_suite(["gqa_b1"]), _suite(["gqa_b1"])])


def test_baselines_from_other_calls_hold_each_case_against_its_fastest(tmp_path):
    """``--baselines-from``: a case's fastest baseline over every call counts, ours from the merged
    file alone; the report gives that mean beside the one as measured."""
    merged, other = _suite(["gqa_b1", "lora_m16"]), _suite(["lora_m16", "gatedmlp_m1"])
    other["cases"][0]["times_us"] = {"mirage": {"median_us": 1.0}, "eager": {"median_us": 11.0}}
    paths = [tmp_path / "merged.json", tmp_path / "other.json"]
    for path, suite in zip(paths, (merged, other), strict=True):
        path.write_text(json.dumps(suite))
    out = tmp_path / "out"
    assert run.main(["--merge", str(paths[0]), "--baselines-from", str(paths[1]), "--out", str(out)]) == 0
    result = json.loads((out / "suite_2026-11-22.json").read_text())
    across = result["baselines_across_calls"]
    # lora_m16: eager's 11.0 in the other call beats torch.compile's 12.0; ours stays 10.0 (not the 1.0)
    assert across["speedup"] == pytest.approx({"gqa_b1": 1.2, "lora_m16": 1.1})
    assert across["geometric_mean"] == pytest.approx((1.2 * 1.1) ** 0.5)
    assert "gatedmlp_m1" not in across["speedup"]  # not in the merged file
    table = (out / "suite_2026-11-22.md").read_text()
    assert "any of 2 suite files" in table and ": 1.15 (gqa_b1 1.20, lora_m16 1.10)." in table
    with pytest.raises(SystemExit, match="different devices"):
        run.fastest_baselines(merged, [_suite(["gqa_b1"], device="H200")])
