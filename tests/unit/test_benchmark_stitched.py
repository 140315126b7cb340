"""benchmarks.stitched: where a stitched program's time goes beyond its kernels (times on a GPU)."""

import pytest
import torch

from benchmarks import stitched


def test_without_a_gpu_it_says_it_needs_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="times on a GPU"):
        stitched.main(["--programs", "gate"])


@pytest.mark.gpu
def test_a_program_is_profiled_whole_alone_and_by_kernel():
    row = stitched.profile("gate", time_limit=15.0)
    assert row["stitched_us"] > 0 and row["eager_us"] > 0
    assert set(row["alone_us"]) == {"sp0"} and row["alone_us"]["sp0"] > 0
    assert any(k["name"].startswith("sp0") for k in row["replay_kernels"]), row["replay_kernels"]
    assert row["stitched_us_without_dependent_launch"] > 0
