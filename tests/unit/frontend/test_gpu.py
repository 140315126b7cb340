"""The CUDA path: generated kernels through mirage.codegen (marked ``gpu``; skipped without CUDA)."""

import pytest
import torch

import mirage as mi
from mirage.frontend.examples import EXAMPLES
from mirage.frontend.executor import Compiled
from mirage.frontend.runtime import SubprogramModule
from tests.gpu.gpu_helpers import LinearRelu as _Linear

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_on_the_gpu_equal_eager(name):
    module, inputs = EXAMPLES[name](4)
    module = module.cuda().half()
    inputs = tuple(x.cuda().half() for x in inputs)
    fast = mi.superoptimize(module, inputs, search=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), module(*inputs), rtol=2e-2, atol=2e-2)
    runners = [m for m in fast.specializations[0].module.modules() if isinstance(m, SubprogramModule)]
    assert all(isinstance(r.executor(inputs[0].device), Compiled) for r in runners)


def test_the_guard_times_the_subprograms_own_torch_ops_on_the_gpu():
    """The guard's runner on the GPU runs the captured fp16 ops (not the fp32 kernel graph) and can be
    timed as the builds are."""
    from mirage.codegen.profile import time_graph
    from mirage.frontend.capture import capture
    from mirage.frontend.partition import partition
    from mirage.frontend.runners import torch_ops_runner

    module, inputs = EXAMPLES["rmsnorm_linear"](4)
    module, inputs = module.cuda().half(), tuple(x.cuda().half() for x in inputs)
    gm = capture(module, inputs, {})
    (sub,) = partition(gm).subprograms
    run = torch_ops_runner(gm, sub)
    outputs = run()
    assert all(o.dtype == torch.float16 and o.is_cuda for o in outputs)
    assert time_graph(run, replays=20).median_us > 0


def test_the_whole_program_check_times_both_on_the_gpu_and_runs_the_faster():
    """frontend.guard with its real timer (CUDA-graph replays): ten products against one."""
    from mirage.frontend import guard

    x = torch.randn(256, 256, device="cuda", dtype=torch.float16)

    def one(x):
        return x @ x

    def ten(x):
        for _ in range(10):
            x = (x @ x) / 16
        return x

    verdict = guard.check(ten, one, (x,), {})
    assert verdict.runs == guard.THEIRS, verdict.note
    assert 0 < verdict.times[guard.THEIRS] < verdict.times[guard.OURS]
    assert guard.check(one, ten, (x,), {}).runs == guard.OURS


def _replayed(fast, inputs, change):
    """``fast(*inputs)`` specialized outside a CUDA graph, then captured, ``change()`` and a replay."""
    from tests.gpu.gpu_helpers import replayed

    fast(*inputs)
    return replayed(fast, inputs, change)


def test_a_cuda_graph_of_the_module_sees_a_non_contiguous_input_change():
    """A transposed view is copied to a contiguous tensor before the kernels; inside a CUDA graph the
    copy is recorded, so a replay after the view's base changed reads the new values."""
    base = torch.randn(128, 64, device="cuda", dtype=torch.float16)
    w = torch.randn(128, 96, device="cuda", dtype=torch.float16) / 8
    x = base.t()  # (64, 128), not contiguous

    def program(x, w):
        return torch.relu(x @ w)

    fast = mi.superoptimize(program, (x, w), search=False, use_cache=False, progress=False)
    out = _replayed(fast, (x, w), lambda: base.copy_(torch.randn_like(base)))
    torch.testing.assert_close(out, program(x, w), rtol=2e-2, atol=2e-2)


def test_a_cuda_graph_of_the_module_sees_a_boolean_mask_change():
    """A boolean attention mask's additive form is cached while the mask is unchanged, but not inside
    a CUDA graph: the replay after the mask changed in place uses the new mask."""
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, 4, 64, 32, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = torch.ones(64, 64, device="cuda", dtype=torch.bool)

    def program(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    fast = mi.superoptimize(program, (q, k, v, mask), search=False, use_cache=False, progress=False)
    out = _replayed(fast, (q, k, v, mask), lambda: mask.copy_(torch.rand(64, 64, device="cuda") < 0.7)
                    .fill_diagonal_(True))
    torch.testing.assert_close(out, program(q, k, v, mask), rtol=2e-2, atol=2e-2)




def test_a_cuda_graph_of_the_module_sees_a_weight_updated_in_place():
    """Calls reuse the transposed weight's copy while the weight is unchanged; a CUDA graph records
    the copy, so a replay after an in-place update (a weight sync) computes with the new weight."""
    model = _Linear(256).cuda().half().eval()
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False,
                            whole_program_check=False)
    with torch.no_grad():
        out = _replayed(fast, (x,), lambda: model.fc.weight.mul_(-1))
        torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(fast(x), model(x), rtol=2e-2, atol=2e-2)  # and a call from Python


def test_the_check_times_a_module_that_copies_a_weight_in_a_caller_graph_too():
    """The whole-program check times calls (the weight's copy made once) and a caller's CUDA graph
    (a copy of the 8 MB weight in every replay) apart."""
    from mirage.frontend import guard

    model = _Linear().cuda().half().eval()
    x = torch.randn(8, 2048, device="cuda", dtype=torch.float16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False,
                            whole_program_check=False)
    stitched = fast.specializations[0].module
    modules = [m for m in stitched.modules() if isinstance(m, SubprogramModule)]
    verdict = guard.check(stitched, model, (x,), {}, lambda: any(m.copies_constants for m in modules))
    assert guard.OURS_IN_GRAPHS in verdict.times, verdict.note
    assert verdict.times[guard.OURS] < verdict.times[guard.OURS_IN_GRAPHS], verdict.note


def test_a_graph_reading_the_calls_copies_sees_an_update_after_a_call():
    """reuse_copies_in_graphs: the graph reads the copy the calls keep; a call after an in-place
    update refreshes it where the graph reads it."""
    from tests.gpu.gpu_helpers import replayed

    model = _Linear(256).cuda().half().eval()
    x = torch.randn(8, 256, device="cuda", dtype=torch.float16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False,
                            whole_program_check=False, reuse_copies_in_graphs=True)
    with torch.no_grad():
        fast(x)

        def update():
            model.fc.weight.mul_(-1)
            fast(x)  # the call that refreshes the copy

        out = replayed(fast, (x,), update)
        torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)
