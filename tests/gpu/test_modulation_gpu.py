"""Programs whose searched µGraphs the GPU check used to refuse or the frontend held apart, on a GPU:
DiT's modulated norm in rows of (batch · tokens), its shift and scale read through a split rows' dim
(one kernel, float64 agreement); and a quotient whose float64 values lie beyond float16 (AdamW's
``m / (sqrt(v) + eps)`` on normal inputs), whose overflows the check takes as the rounded reference."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from benchmarks.unseen_models import DiTModulate  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_modulated_norm_runs_as_one_searched_kernel_and_matches_float64():
    from mirage.frontend.runtime import SubprogramModule

    model = DiTModulate().cuda().half().eval()
    x, c = torch.randn(2, 64, 384, device="cuda").half(), torch.randn(2, 384, device="cuda").half()
    fast = mi.superoptimize(model, (x, c), time_limit_s=8, progress=False, use_cache=False)
    spec = fast.specializations[0]
    norm = spec.partition.subprograms[-1]
    assert {t.shape[0] for t in norm.graph.output_types} == {128}, fast.report()
    assert spec.choices[norm.name].source == "search", fast.report()
    modules = [m for m in spec.module.modules() if isinstance(m, SubprogramModule)]
    assert all(m.kept_copies == (0, 0) for m in modules)
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double(), c.double())
        torch.testing.assert_close(fast(x, c).double(), want, rtol=2e-3, atol=2e-2)


def test_a_quotient_beyond_float16_passes_where_its_overflows_are_right():
    """a / b on normal inputs: three of its float64 quotients (seed 0) lie beyond float16's range."""
    import numpy as np

    from mirage.codegen.gpu_check import random_inputs

    g = mi.new_kernel_graph("quotient")
    a, b = g.new_input(dims=(256, 1024)), g.new_input(dims=(256, 1024))
    g.mark_output(g.div(a, b))
    graph = g.freeze()
    (reference,) = mi.interpret(graph, [t.cpu() for t in random_inputs(graph, seed=0)])
    assert int(np.count_nonzero(np.abs(reference) > 65504)) == 3
    result = check_on_gpu(graph, seed=0)
    assert result.passed, result.as_dict()
