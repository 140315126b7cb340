"""Inputs whose last dim splits over a broadcast (``KernelInput.split_last``) on a GPU: the builds that
read a gain of one value a channel through its strides pass the float check, whether their tiles hold
several spans, lie in one, or straddle them (then copied); group norms through ``mirage.superoptimize``
read their gain and bias in place, keep no copy, match float64, and a CUDA graph of them sees the
parameters updated in place."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")

import mirage as mi  # noqa: E402
from benchmarks.mugraphs.broadcast_rows import scaled_rows  # noqa: E402
from mirage.codegen.gpu_check import check_on_gpu  # noqa: E402
from mirage.codegen.lower_program import generate_cuda_program  # noqa: E402
from mirage.codegen.runtime import build_many  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("blocks", "per_group", "in_place"), [(1, 8, True), (16, 8, True), (2, 3, False)])
def test_a_gain_read_through_its_strides_passes_the_float_check(blocks, per_group, in_place):
    graph = scaled_rows(blocks, per_group)
    (program,) = build_many([generate_cuda_program(graph, None)])
    assert program.cuda.split_inputs == ((1,) if in_place else ())
    result = check_on_gpu(graph, program.with_poison())
    assert result.passed, result.as_dict()


def _group_norm(x, norm) -> torch.Tensor:
    return torch.nn.functional.silu(torch.nn.functional.group_norm(
        x.double(), norm.num_groups, norm.weight.double(), norm.bias.double(), norm.eps))


@pytest.mark.parametrize(("shape", "groups"), [((2, 64, 16, 16), 8), ((2, 320, 64, 64), 32)])
def test_a_group_norm_reads_its_gain_in_place_and_a_cuda_graph_sees_updates(shape, groups):
    from gpu_helpers import replayed

    from mirage.frontend.runtime import SubprogramModule

    norm = torch.nn.GroupNorm(groups, shape[1]).cuda().half()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
        norm.bias.normal_(0.0, 0.2)
    model = torch.nn.Sequential(norm, torch.nn.SiLU()).eval()
    x = torch.randn(shape, device="cuda", dtype=torch.float16) * 2 + 1
    fast = mi.superoptimize(model, (x,), time_limit_s=5, progress=False, use_cache=False)
    modules = [m for m in fast.specializations[0].module.modules() if isinstance(m, SubprogramModule)]
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), _group_norm(x, norm), rtol=2e-3, atol=2e-2)
        views = [len(e.views) for m in modules for e in m._executors.values()]
        assert views == [2], fast.report()  # the gain and the bias, as the view of their split dims
        assert all(m.kept_copies == (0, 0) and not m.copies_constants for m in modules)
        assert "kept copies" not in fast.report()

        def update():
            norm.weight.mul_(-1)
            norm.bias.add_(0.5)

        out = replayed(fast, (x,), update)
        torch.testing.assert_close(out.double(), _group_norm(x, norm), rtol=2e-3, atol=2e-2)
