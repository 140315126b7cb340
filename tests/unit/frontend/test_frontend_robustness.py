"""Programs of kinds users write that no other test covered, each of which failed before its fix: a
transposed 3-D input of an element-wise op, functions that run modules (a bound ``forward``, a
closure), first calls from several threads, pickling, superoptimizing or tracing a superoptimized
module, and example inputs the capture cannot take."""

from __future__ import annotations

import copy
import functools
import io
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mirage as mi
from mirage.frontend import CaptureError, ExampleInputsError

OPTIONS = {"search": False, "use_cache": False, "progress": False}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).eval()


@pytest.mark.parametrize("program", [
    lambda x: x.transpose(1, 2).exp() * 2,
    lambda x: F.layer_norm(x.transpose(1, 2), (4,)) @ torch.linspace(-1, 1, 8, dtype=x.dtype).reshape(4, 2),
    lambda x: x.transpose(1, 2) - x.transpose(1, 2).mean(-1, keepdim=True),
], ids=["exp", "layer_norm_linear", "centred"])
def test_a_transposed_3d_input_of_an_element_wise_op_runs_as_eager(program, gpu_like):
    """(2, 4, 5).transpose(1, 2) merged to (10, 4) is a column-major view whose rows split in two:
    the graph's input cannot declare it (its builder raised GraphError out of the partitioner); it is
    now bound row-major, a copy."""
    fast = mi.superoptimize(program, (torch.randn(2, 4, 5),), **OPTIONS)
    assert len(fast.partition.subprograms) >= 1
    for _ in range(2):
        x = torch.randn(2, 4, 5)
        torch.testing.assert_close(fast(x).double(), program(x.double()), rtol=1e-5, atol=1e-5)


def test_a_bound_forward_is_captured_again_when_its_module_changes():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    x = torch.randn(64, 8)
    fast = mi.superoptimize(model.forward, (x,), **OPTIONS)
    with torch.no_grad():
        assert (fast(x) == 0).float().mean() > 0.3  # dropout, as captured in training
        model.eval()
        torch.testing.assert_close(fast(x), model(x))  # not dropout any more
        model[0].weight = nn.Parameter(torch.randn(8, 8))
        torch.testing.assert_close(fast(x), model(x))  # the new weight


def test_modules_that_a_function_reads_from_its_closure_or_globals_are_watched():
    model = _mlp()
    x = torch.randn(4, 8)
    for program in (lambda t: model(t) * 2, functools.partial(_uses_global, 3.0)):
        _GLOBAL.load_state_dict(model.state_dict())
        fast = mi.superoptimize(program, (x,), **OPTIONS)
        with torch.no_grad():
            torch.testing.assert_close(fast(x), program(x))
            model[0].weight = nn.Parameter(torch.randn(16, 8))
            _GLOBAL[0].weight = nn.Parameter(torch.randn(16, 8))
            torch.testing.assert_close(fast(x), program(x))
            model.half()
            _GLOBAL.half()
            torch.testing.assert_close(fast(x.half()), program(x.half()), rtol=2e-2, atol=2e-3)
        model.float()
        _GLOBAL.float()


_GLOBAL = _mlp()


def _uses_global(scale, x):
    return _GLOBAL(x) * scale


def test_first_calls_from_several_threads_each_give_what_eager_gives():
    """torch.export traces through fake tensors that it swaps into the module: two captures at once
    read each other's (CaptureError: cpu and meta tensors mixed, or a module hierarchy mismatch)."""
    model = _mlp()
    fast = mi.superoptimize(model, **OPTIONS)
    inputs = [torch.randn(k + 1, 8) for k in range(4)]
    with torch.no_grad():
        wanted = [model(x) for x in inputs]
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def call(k):
        try:
            with torch.no_grad():
                results[k] = fast(inputs[k])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for k, want in enumerate(wanted):
        torch.testing.assert_close(results[k], want)
    assert len(fast.specializations) == len(inputs)


def test_a_superoptimized_module_pickles_and_captures_again_after_loading():
    model = _mlp()
    x = torch.randn(4, 8)
    fast = mi.superoptimize(model, (x,), **OPTIONS)
    fast(x)
    buffer = io.BytesIO()
    torch.save(fast, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert not loaded.specializations
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
        twin = copy.deepcopy(fast)
        twin.program[0].weight.mul_(2)  # the copy's own weights
        torch.testing.assert_close(twin(x), twin.program(x))
        torch.testing.assert_close(fast(x), model(x))


def test_superoptimizing_a_superoptimized_module_starts_from_its_program():
    model = _mlp()
    x = torch.randn(4, 8)
    fast = mi.superoptimize(model, (x,), **OPTIONS)
    again = mi.superoptimize(fast, (x,), **OPTIONS, max_subprogram_ops=2)
    assert again.program is model
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x))


def test_a_model_holding_a_superoptimized_module_compiles_and_does_not_export():
    torch._dynamo.reset()
    model = _mlp()
    x = torch.randn(4, 8)
    fast = mi.superoptimize(model, (x,), **OPTIONS)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = fast

        def forward(self, t):
            return self.inner(t) * 2 + 1

    outer = Outer()
    compiled = torch.compile(outer, backend="eager")
    with torch.no_grad():
        for rows in (4, 3):
            t = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(t), model(t) * 2 + 1)
    with pytest.raises(CaptureError, match="module.program"):
        torch.export.export(outer, (x,))
    torch._dynamo.reset()


def test_example_inputs_that_capture_cannot_take_are_named():
    with pytest.raises(ExampleInputsError, match="keys must be strings"):
        mi.superoptimize(lambda x: x * 2, {0: torch.randn(2)}, **OPTIONS)

    def softmax(x, dtype=torch.float32):
        return torch.softmax(x, -1, dtype=dtype)

    x = torch.randn(2, 4).half()
    unsupported = r"dtype is not supported \(torch.float32\).*functools.partial"
    with pytest.raises(ExampleInputsError, match=unsupported):
        mi.superoptimize(softmax, {"x": x, "dtype": torch.float32}, **OPTIONS)
    fast = mi.superoptimize(functools.partial(softmax, dtype=torch.float32), (x,), **OPTIONS)
    torch.testing.assert_close(fast(x), softmax(x))


class _Optional(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, *, scale=1.0, mask=None):
        y = self.linear(x) * scale
        return y if mask is None else y.masked_fill(mask, 0.0)


def test_a_call_with_other_keyword_inputs_says_which_and_what_to_do():
    """An optional keyword input given where the first call left it out: the error named the counts
    and said that a list passed for a tensor counts as its elements, which was not the cause."""
    from mirage.frontend import InputCountError, InputDeviceError

    model, x = _Optional().eval(), torch.randn(4, 8)
    fast = mi.superoptimize(model, {"x": x, "scale": 0.5}, **OPTIONS)
    with torch.no_grad():
        torch.testing.assert_close(fast(x, scale=0.5), model(x, scale=0.5))
        with pytest.raises(InputCountError, match="scale, x by keyword.*mask, scale by keyword") as info:
            fast(x, scale=0.5, mask=torch.rand(4, 8) > 0.5)
        assert "counts as its elements" not in str(info.value)
        with pytest.raises(InputDeviceError, match="is on meta.*holds shapes but no values") as info:
            fast(x=x.to("meta"), scale=0.5)
        assert "again on meta" not in str(info.value)
