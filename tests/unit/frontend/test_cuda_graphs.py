"""``Options.cuda_graphs``: repeated calls replayed from a CUDA graph of their own (frontend.graphs).

The option's parsing and the backend's mode run on the CPU; the replays themselves are marked ``gpu``.
"""

import logging

import pytest
import torch
import torch.nn as nn

import mirage as mi
from mirage.frontend.errors import OptionError
from mirage.frontend.graphs import GraphedCall
from tests.gpu.gpu_helpers import LinearRelu


def test_the_option_is_a_flag():
    with pytest.raises(OptionError, match="cuda_graphs must be True or False"):
        mi.superoptimize(nn.ReLU(), (torch.ones(2),), cuda_graphs="yes", search=False, use_cache=False)


def test_reduce_overhead_mode_turns_the_graphs_on_and_other_modes_warn(caplog):
    from mirage.frontend.backend import mirage_backend

    gm = torch.fx.symbolic_trace(nn.ReLU())
    assert mirage_backend(gm, [torch.ones(2)], mode="reduce-overhead").mirage_module.options.cuda_graphs
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        run = mirage_backend(gm, [torch.ones(2)], mode="max-autotune")
    assert not run.mirage_module.options.cuda_graphs
    assert any("mode='reduce-overhead' means cuda_graphs=True" in r.getMessage() for r in caplog.records)


def test_on_the_cpu_the_option_changes_nothing():
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    x = torch.randn(3, 8)
    fast = mi.superoptimize(model, (x,), cuda_graphs=True, search=False, use_cache=False, progress=False)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fast(x), model(x))
    assert fast.specializations[0].graphed is None


def _fast(model, x, **options):
    return mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False, cuda_graphs=True,
                            **options)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
def test_replays_see_new_inputs_and_keep_earlier_results(check):
    model = LinearRelu(256).cuda().half().eval()
    xs = [torch.randn(8, 256, device="cuda", dtype=torch.float16) for _ in range(4)]
    fast = _fast(model, xs[0], whole_program_check=check)
    with torch.no_grad():
        outs = [fast(x) for x in xs]  # the first specializes, the second captures, the rest replay
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)
    graphed = fast.specializations[0].graphed
    assert graphed is not None and graphed.failed is None and graphed.captures == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_replays_see_a_weight_updated_in_place_and_a_replaced_one():
    model = LinearRelu(256).cuda().half().eval()
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    fast = _fast(model, x)
    with torch.no_grad():
        fast(x), fast(x)
        model.fc.weight.mul_(-1)  # the graph copies the transposed weight in each replay
        torch.testing.assert_close(fast(x), model(x), rtol=2e-2, atol=2e-2)
        model.fc.weight = nn.Parameter(torch.randn_like(model.fc.weight) / 16)  # captured again
        fast(x)
        torch.testing.assert_close(fast(x), model(x), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_torch_compile_reduce_overhead_replays():
    model = LinearRelu(256).cuda().half().eval()
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    compiled = torch.compile(model, backend="mirage", mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn_like(x)
            torch.testing.assert_close(compiled(x), model(x), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_a_parameter_passed_as_input_is_read_in_place_and_a_new_one_captures_again():
    w = nn.Parameter(torch.randn(64, 64, device="cuda"))
    call = GraphedCall(lambda args: (args[0] @ args[1],), "product")
    x = torch.randn(4, 64, device="cuda")
    torch.testing.assert_close(call((x, w))[0], x @ w)
    with torch.no_grad():
        w.mul_(2)  # same address: read in place by the replay
    torch.testing.assert_close(call((x, w))[0], x @ w)
    assert call.captures == 1
    v = nn.Parameter(torch.randn(64, 64, device="cuda"))
    torch.testing.assert_close(call((x, v))[0], x @ v)
    assert call.captures == 2 and call.failed is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_a_call_that_cannot_be_captured_runs_without_the_graph(caplog):
    def run(args):
        total = args[0].sum().item()  # a host synchronization: not allowed under capture
        return args[0] * total

    call = GraphedCall(run, "synchronizing")
    x = torch.randn(16, device="cuda")
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        out = call((x,))
    torch.testing.assert_close(out, x * x.sum().item())
    assert call.failed is not None and "capture failed" in call.failed
    assert any("not replayed from a CUDA graph" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(call((2 * x,)), 2 * x * (2 * x).sum().item())  # and later calls too
    assert torch.randn(4, device="cuda").isfinite().all()  # the failed capture left torch's RNG usable


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_a_failed_capture_leaves_random_ops_working():
    from mirage.codegen.profile import graph_capture

    x = torch.randn(8, device="cuda")
    with pytest.raises(Exception):  # noqa: B017 - whichever error torch raises for a sync in a capture
        with graph_capture(torch.cuda.CUDAGraph()):
            x * x.sum().item()
    assert torch.randn(4, device="cuda").isfinite().all()
    assert torch.rand(4, device="cuda").isfinite().all()


def _adds_one(x, y):
    x.add_(1)
    return x * y


def test_a_program_writing_into_its_inputs_is_known():
    from mirage.frontend.capture import updates_inputs

    x, y = torch.randn(4), torch.randn(4)
    fast = mi.superoptimize(_adds_one, (x.clone(), y), search=False, use_cache=False, progress=False)
    assert updates_inputs(fast.specializations[0].captured)
    pure = mi.superoptimize(lambda x, y: x * y, (x, y), search=False, use_cache=False, progress=False)
    assert not updates_inputs(pure.specializations[0].captured)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_a_program_writing_into_its_inputs_is_not_replayed(caplog):
    x, y = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    fast = mi.superoptimize(_adds_one, (x.clone(), y), search=False, use_cache=False, progress=False,
                            cuda_graphs=True)
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        for _ in range(3):
            before = x.clone()
            torch.testing.assert_close(fast(x, y), (before + 1) * y)
            torch.testing.assert_close(x, before + 1)  # the caller's tensor itself was written
    assert any("writes into its inputs" in r.getMessage() for r in caplog.records)
