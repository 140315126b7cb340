"""The ``scalar_chain`` check: what it cuts, that it keeps every µGraph a whole search verifies, and
that a reference which chains scalars switches it off."""

from __future__ import annotations

import mirage as mi
from mirage.generator import Budget, search
from mirage.generator.scalars import chained_scalars
from mirage.mugraph.ops import Op


def _scaled_sum() -> mi.KernelGraph:
    g = mi.new_kernel_graph("scaled_sum")
    x, y = g.new_input((8, 64), mi.float16, name="x"), g.new_input((8, 64), mi.float16, name="y")
    g.mark_output(g.add(g.mul_scalar(x, 0.5), y))
    return g.freeze()


def test_a_whole_search_finds_the_same_mugraphs_with_the_check_and_without():
    """A space small enough to exhaust both ways: the check cuts thousands of candidates and loses
    no verified µGraph."""
    results = [search(_scaled_sum(), "mlp", max_block_ops=5, max_kernel_ops=5, budget=Budget(time_s=120),
                      workers=1, progress=False, cache=False, checkpoint=False, disabled_rules=disabled)
               for disabled in ((), ("scalar_chain",))]
    on, off = results
    assert on.stop_reason.value == off.stop_reason.value == "search space exhausted"
    assert on.stats.pruned["scalar_chain"] > 1000 and off.stats.pruned.get("scalar_chain", 0) == 0
    assert len(on.found) > 0
    assert sorted(str(f.graph) for f in on.found) == sorted(str(f.graph) for f in off.found)


def test_only_scalars_applied_twice_on_one_path_of_the_reference_are_chained():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    once = g.mul_scalar(x, 0.5)
    g.mark_output(g.add(g.exp(once), g.add_scalar(once, 1.0)))  # one of each on every path
    assert chained_scalars(g.freeze()) == frozenset()
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    g.mark_output(g.add_scalar(g.sqrt(g.add_scalar(x, 1.0)), 2.0))  # two sums by a number, a sqrt between
    assert chained_scalars(g.freeze()) == frozenset({Op.ADD_SCALAR})
