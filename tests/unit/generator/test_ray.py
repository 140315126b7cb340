"""The same work units on a local Ray instance return the same result set as worker processes."""

from __future__ import annotations

import pytest

import mirage as mi
from mirage.generator import Budget, StopReason, search

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # starting Ray takes ten seconds or more

SPACE = {
    "griddims": [(4, 1, 1)],
    "franges": [4],
    "kernel_ops": ["matmul", "exp"],
    "block_ops": ["matmul", "exp", "accum", "accum_sum"],
    "max_block_ops": 5,
    "max_kernel_ops": 4,
}
QUIET = {"progress": False, "cache": False, "checkpoint": False}


def reference():
    g = mi.new_kernel_graph("tiny")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(x, w)))
    return g.freeze()


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_returns_the_same_result_set_as_processes(local_ray):
    on_ray = search(reference(), backend="ray", workers=2, **SPACE, **QUIET)
    on_processes = search(reference(), backend="processes", workers=2, **SPACE, **QUIET)
    assert on_ray.stats.backend == "ray" and on_processes.stats.backend == "processes"
    assert on_ray.stop_reason is on_processes.stop_reason is StopReason.COMPLETE
    assert on_ray.hashes == on_processes.hashes and len(on_ray) > 5
    assert on_ray.stats.states == on_processes.stats.states


def test_ray_honours_a_state_budget_like_processes(local_ray):
    budget = Budget(states=2000)
    on_ray = search(reference(), backend="ray", workers=2, budget=budget, **SPACE, **QUIET)
    serial = search(reference(), workers=1, budget=budget, **SPACE, **QUIET)
    assert on_ray.stop_reason is serial.stop_reason is StopReason.STATES
    assert on_ray.hashes == serial.hashes
