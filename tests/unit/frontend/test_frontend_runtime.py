import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mirage as mi
from mirage.frontend import (
    CaptureError,
    ExampleInputsError,
    ExecutorError,
    InputCountError,
    InputDeviceError,
    InputDTypeError,
    InputGradError,
    InputTypeError,
    MirageModule,
    OptionError,
    UnsupportedProgramError,
)
from mirage.frontend.examples import EXAMPLES
from mirage.frontend.runtime import SubprogramModule


def _bigger(inputs):
    """The same inputs with the leading (batch) dim doubled."""
    return tuple(torch.cat([x, x]) for x in inputs)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_equal_eager_and_respecialize_per_shape(name):
    module, inputs = EXAMPLES[name]()
    fast = mi.superoptimize(module, inputs, search=False)
    assert isinstance(fast, MirageModule)
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), module(*inputs), rtol=1e-4, atol=1e-5)
        bigger = _bigger(inputs)
        torch.testing.assert_close(fast(*bigger), module(*bigger), rtol=1e-4, atol=1e-5)
        fast(*inputs)
    assert len(fast.specializations) == 2  # one per shape, reused on the third call
    stitched = fast.specializations[0].module
    runners = [m for m in stitched.modules() if isinstance(m, SubprogramModule)]
    assert len(runners) == len(fast.partition.subprograms) >= 1
    assert "µGraph from reference (search disabled" in fast.report()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype):
    module, (x,) = EXAMPLES["rmsnorm_linear"]()
    module = module.to(dtype)
    x = x.to(dtype)
    fast = mi.superoptimize(module, (x,), search=False)
    with torch.no_grad():
        got, expected = fast(x), module(x)
    assert got.dtype == dtype
    exact = module.double()(x.double())  # the interpreter computes in float64, then rounds once
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 2e-2)
    torch.testing.assert_close(got.double(), exact, rtol=tolerance, atol=tolerance)
    assert (got.double() - exact).abs().max() <= (expected.double() - exact).abs().max() + 1e-12


def test_keyword_inputs_and_nested_outputs():
    def function(x, *, scale):
        return {"out": F.relu(x) * scale, "pair": (x.sum(-1), x * 2.0)}

    x, scale = torch.randn(3, 4), torch.randn(4)
    fast = mi.superoptimize(function, {"x": x, "scale": scale}, search=False)
    got, expected = fast(x=x, scale=scale), function(x, scale=scale)
    torch.testing.assert_close(got["out"], expected["out"])
    torch.testing.assert_close(got["pair"][0], expected["pair"][0])
    torch.testing.assert_close(got["pair"][1], expected["pair"][1])


def test_capture_on_first_call_without_example_inputs():
    module, inputs = EXAMPLES["lora_linear"]()
    fast = mi.superoptimize(module, search=False)
    assert fast.specializations == []
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), module(*inputs), rtol=1e-4, atol=1e-5)
    assert len(fast.specializations) == 1


def test_number_inputs_specialize_by_value():
    def function(x, power):
        return x * power

    x = torch.randn(2, 3)
    fast = mi.superoptimize(function, (x, 2.0), search=False)
    torch.testing.assert_close(fast(x, 3.0), x * 3.0)
    torch.testing.assert_close(fast(x, 2.0), x * 2.0)
    assert len(fast.specializations) == 2


def test_parameters_changed_in_place_are_seen():
    module, (x,) = EXAMPLES["gated_mlp"]()
    fast = mi.superoptimize(module, (x,), search=False)
    with torch.no_grad():
        module.down_proj.weight.mul_(2.0)
        torch.testing.assert_close(fast(x), module(x), rtol=1e-4, atol=1e-5)


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2.0
        return x


def _linear_function(x, w):
    return F.silu(x @ w)


X, W = torch.randn(2, 3), torch.randn(3, 4)

# (name, call, error type, words the message must contain)
BAD_INPUTS = [
    ("unknown option", lambda: mi.superoptimize(_linear_function, (X, W), serach=False), OptionError,
     ["unknown option 'serach'", "did you mean 'search'"]),
    ("option out of range", lambda: mi.superoptimize(_linear_function, (X, W), max_subprogram_ops=0),
     OptionError, ["max_subprogram_ops must be an integer of at least 1", "got 0"]),
    ("split rounds of a wrong kind", lambda: mi.superoptimize(_linear_function, (X, W), split_rounds=True),
     OptionError, ["split_rounds must be an integer of at least 0", "got True"]),
    ("bad executor", lambda: mi.superoptimize(_linear_function, (X, W), executor="gpu"), OptionError,
     ["executor must be one of auto, interpret, cuda"]),
    ("unknown search config", lambda: mi.superoptimize(_linear_function, (X, W), config="bogus"), OptionError,
     ["unknown search config 'bogus'", "'mlp'"]),
    ("misspelt search option", lambda: mi.superoptimize(_linear_function, (X, W),
                                                        search_overrides={"gridims": [[2, 1, 1]]}),
     OptionError, ["unknown search-space option 'gridims'", "did you mean 'griddims'"]),
    ("workers of a wrong kind", lambda: mi.superoptimize(_linear_function, (X, W),
                                                         search_overrides={"workers": "two"}),
     OptionError, ["workers must be None", "got 'two'"]),
    ("search options in a list", lambda: mi.superoptimize(_linear_function, (X, W), search_overrides=[1]),
     OptionError, ["search_overrides must be a dict", "got a list: [1]"]),
    ("a time limit of nan", lambda: mi.superoptimize(_linear_function, (X, W), time_limit_s=float("nan")),
     OptionError, ["time_limit_s must be a finite positive number", "got nan"]),
    ("an infinite time limit", lambda: mi.superoptimize(_linear_function, (X, W), time_limit_s=float("inf")),
     OptionError, ["time_limit_s must be a finite positive number", "got inf"]),
    ("a time limit of zero", lambda: mi.superoptimize(_linear_function, (X, W), time_limit_s=0),
     OptionError, ["time_limit_s must be a finite positive number", "got 0"]),
    ("a cache folder that is a file", lambda: mi.superoptimize(_linear_function, (X, W), cache_dir=__file__),
     OptionError, ["is a file, not a folder"]),
    ("a cache folder that is a number", lambda: mi.superoptimize(_linear_function, (X, W), cache_dir=5),
     OptionError, ["cache_dir must be a folder's path", "got 5"]),
    ("candidates that are a number", lambda: mi.superoptimize(_linear_function, (X, W), candidates=5),
     OptionError, ["candidates must be a list of kernel graphs", "got 5 (int)"]),
    ("max_results of True", lambda: mi.superoptimize(_linear_function, (X, W), max_results=True),
     OptionError, ["max_results must be None or a positive integer", "got True"]),
    ("example inputs on the meta device", lambda: mi.superoptimize(_linear_function, (X.to("meta"), W)),
     InputDeviceError, ["input 0", "'meta' device", "holds shapes but no values"]),
    ("not a program", lambda: mi.superoptimize(42, (X,)), UnsupportedProgramError,
     ["cannot superoptimize 42", "torch.nn.Module instance"]),
    ("a class, not a module", lambda: mi.superoptimize(nn.Linear, (X,)), UnsupportedProgramError,
     ["torch.nn.Module instance"]),
    ("example inputs of a wrong kind", lambda: mi.superoptimize(_linear_function, {X.numpy().tobytes()}),
     ExampleInputsError, ["example_inputs must be a tensor, a tuple or list"]),
    ("an input that is no tensor", lambda: mi.superoptimize(_linear_function, (X, object())),
     ExampleInputsError, ["input of type object is not supported"]),
    ("data-dependent branch", lambda: mi.superoptimize(Branchy(), (X,), search=False), CaptureError,
     ["torch.export could not capture Branchy", "no Python branches on tensor values"]),
    ("inputs the program does not take", lambda: mi.superoptimize(_linear_function, (X, W), search=False)(
        torch.zeros(X.shape[0], X.shape[1] + 1), W), CaptureError,
     [f"on inputs of shapes ({X.shape[0]}, {X.shape[1] + 1}), {tuple(W.shape)}",
      "fails on such inputs in eager mode too, pass inputs it takes"]),
    ("too few inputs", lambda: mi.superoptimize(_linear_function, (X, W), search=False)(X), InputCountError,
     ["captured with 2 input(s)", "called with 1"]),
    ("wrong dtype", lambda: mi.superoptimize(_linear_function, (X, W), search=False)(X.double(), W.double()),
     InputDTypeError, ["has dtype torch.float64", "captured with torch.float32", ".to(torch.float32)"]),
    ("wrong device", lambda: mi.superoptimize(_linear_function, (X, W), search=False)(X.to("meta"), W),
     InputDeviceError, ["is on meta", "captured on cpu", ".to('cpu')"]),
    ("list for a tensor", lambda: mi.superoptimize(_linear_function, (X, W), search=False)(X.tolist(), W),
     InputCountError, ["captured with 2 input(s)", "called with 7", "counts as its elements"]),
    ("number for a tensor", lambda: mi.superoptimize(_linear_function, (X, W), search=False)(X, 1.0),
     InputTypeError, ["input 1", "captured as a tensor", "now a float 1.0"]),
    ("input that needs grad", lambda: mi.superoptimize(_linear_function, (X, W), search=False)(
        X.requires_grad_(), W), InputGradError, ["requires grad", "torch.no_grad()"]),
    ("cuda executor on the cpu", lambda: mi.superoptimize(_linear_function, (X, W), search=False,
                                                          executor="cuda")(X, W),
     ExecutorError, ["executor='cuda' needs CUDA tensors", "executor='interpret'"]),
]


@pytest.mark.parametrize(("name", "call", "error", "words"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_clear_errors(name, call, error, words):
    X.requires_grad_(False)
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, mi.MirageError)
    for word in words:
        assert word in str(info.value)
    X.requires_grad_(False)


def test_repeated_calls_run_the_flat_graph_with_the_same_results_and_checks():
    """A call of positional tensors like an earlier one skips the pytree signature and the exported
    module's flattening, hooks and guards: same values and structure, and the checks of a call that
    differs (dtype, grad) still come."""

    def program(x, w):
        return torch.relu(x @ w), {"rows": x.sum(-1)}

    x, w = torch.randn(2, 3), torch.randn(3, 4)
    fast = mi.superoptimize(program, (x, w), search=False, use_cache=False, progress=False)
    first = fast(x, w)
    spec = fast.specializations[0]
    assert spec._flat is None  # the first call took the checked path
    again = fast(x, w)
    assert spec._flat is not None and spec._flat is not spec.module
    assert type(again) is tuple and set(again[1]) == {"rows"}
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(again, program(x, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputDTypeError):
        fast(x.double(), w.double())
    with pytest.raises(InputGradError):
        fast(x.requires_grad_(), w)
    other = torch.randn(5, 3)  # another shape: its own specialization, then its own flat runs
    torch.testing.assert_close(fast(other, w)[0], fast(other, w)[0], rtol=0, atol=0)
    assert len(fast.specializations) == 2


def test_a_graph_module_without_pytree_codegen_runs_as_it_is():
    from mirage.frontend.runtime import flat_runner

    traced = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)  # plain codegen: nothing to flatten
    assert flat_runner(traced) is None


class _NormThenProject(nn.Module):
    """A LayerNorm written out (several torch ops), a parameter, and a product: one subprogram."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return (centred * torch.rsqrt(centred.var(-1, keepdim=True, unbiased=False) + 1e-5)) @ self.weight


def test_the_torch_ops_runner_computes_the_subprogram_with_its_own_ops():
    """The guard against PyTorch times what runs where no µGraph is kept: the subprogram's captured
    torch ops, parameters read from the program, outside values drawn in their own shapes and dtypes."""
    from mirage.frontend.capture import capture
    from mirage.frontend.partition import partition
    from mirage.frontend.runners import torch_ops_runner

    model = _NormThenProject().double()
    gm = capture(model, (torch.randn(4, 16, dtype=torch.float64),), {})
    (sub,) = partition(gm).subprograms
    torch.manual_seed(7)
    run = torch_ops_runner(gm, sub, "cpu")
    torch.manual_seed(7)
    x = torch.randn(4, 16, dtype=torch.float64)  # the same draw as the runner's one outside value
    (out,) = run()
    assert out.dtype == torch.float64 and out.shape == (4, 8)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-12, atol=1e-12)
