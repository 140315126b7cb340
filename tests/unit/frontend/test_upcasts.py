"""Upcast islands: float16 values widened to float32 for an accurate computation stay in one
subprogram when the island is absorbed (``rms_norm``), and fall back to PyTorch casts when a widened
value would be stored narrower, unless ``upcasts="input_precision"``."""

import pytest
import torch

import mirage as mi
from benchmarks import suite
from benchmarks.unseen import Float32Softmax
from benchmarks.variants import variants
from mirage.frontend import OptionError
from mirage.frontend.capture import as_module, capture
from mirage.frontend.optimize import strip_names
from mirage.frontend.partition import Budget
from mirage.mugraph.ops import Op


def _superoptimize(function, inputs, **options):
    return mi.superoptimize(function, inputs, search=False, executor="interpret", **options)


def _inputs(*shapes, dtype=torch.float16):
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(s, generator=generator).to(dtype) for s in shapes)


def _relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.double() - expected).norm() / expected.norm())


def _ops(graph) -> list[Op]:
    return [n.op for n in graph.nodes if n.op is not Op.INPUT]


def llama_rms(x, w):  # the float32 island written as in Hugging Face's LlamaRMSNorm
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return w * (x.float() * torch.rsqrt(variance + suite.EPS)).to(x.dtype)


# program, input shapes, dtype, rms_norm ops expected in the one subprogram
ABSORBED = [
    ("rmsnorm", suite.rmsnorm, ((2, 64), (64,), (64, 32)), torch.float16, 1),
    ("rmsnorm_bf16", suite.rmsnorm, ((2, 64), (64,), (64, 32)), torch.bfloat16, 1),
    ("ntrans", suite.ntrans, ((3, 64), (3, 64), (3, 64)), torch.float16, 2),
    ("llama_rms", llama_rms, ((4, 64), (64,)), torch.float16, 1),
]


@pytest.mark.parametrize(("name", "function", "shapes", "dtype", "norms"), ABSORBED,
                         ids=[case[0] for case in ABSORBED])
def test_islands_absorbed_into_rms_norm_make_one_subprogram(name, function, shapes, dtype, norms):
    inputs = _inputs(*shapes, dtype=dtype)
    fast = _superoptimize(function, inputs)
    part = fast.partition
    assert len(part.subprograms) == 1 and not part.pytorch_ops and not part.kept_upcasts, str(part)
    graph = part.subprograms[0].graph
    assert _ops(graph).count(Op.RMS_NORM) == norms
    assert not {Op.SQUARE, Op.REDUCTION, Op.SQRT} & set(_ops(graph))  # the island is gone
    assert all(t.dtype == graph.input_types[0].dtype for t in graph.input_types)
    out = fast(*inputs)
    assert out.dtype == dtype
    expected = function(*(x.double() for x in inputs))
    tolerance = 1e-2 if dtype == torch.bfloat16 else 2e-3
    assert _relative_error(out, expected) < tolerance
    assert "aten.to" not in fast.specializations[0].module.code  # the read-through cast does not run


def test_capture_drops_the_dtype_asserts_on_computed_values():
    gm = capture(as_module(suite.rmsnorm), _inputs((2, 64), (64,), (64, 32)), {})
    asserts = [n for n in gm.graph.nodes if "assert_tensor_metadata" in str(n.target)]
    assert asserts and all(n.args[0].op == "placeholder" for n in asserts)


QKNORM = ((2, 8, 16), (2, 16, 32), (2, 32, 16))


def test_qknorm_keeps_the_norm_over_a_non_last_dim_in_float32_by_default(caplog):
    inputs = _inputs(*QKNORM)
    fast = _superoptimize(suite.qknorm, inputs)
    part = fast.partition
    assert len(part.subprograms) == 2, str(part)
    (kept,) = part.kept_upcasts  # k.float(): its sums over dim 1 would be stored in float16
    assert "upcasts='input_precision'" in kept.reason
    normalized_k = next(s for s in part.subprograms if Op.EXP not in _ops(s.graph))
    assert {t.dtype for t in normalized_k.graph.input_types} == {mi.float32}
    assert kept.notice() in [r.getMessage() for r in caplog.records]
    expected = suite.qknorm(*(x.double() for x in inputs))
    assert _relative_error(fast(*inputs), expected) < 2e-3


def test_qknorm_is_one_subprogram_at_input_precision():
    inputs = _inputs(*QKNORM)
    fast = _superoptimize(suite.qknorm, inputs, upcasts="input_precision")
    part = fast.partition
    assert len(part.subprograms) == 1 and not part.kept_upcasts, str(part)
    assert _ops(part.subprograms[0].graph).count(Op.RMS_NORM) == 1  # rms(q); rms(k, dim=1) stays a sum
    expected = suite.qknorm(*(x.double() for x in inputs))
    assert _relative_error(fast(*inputs), expected) < 2e-3


def sum_of_squares(x):  # the user wants the float32 result
    return x.float().pow(2).sum(-1) * 0.5


def test_a_float32_result_stays_float32_accurate():
    (x,) = _inputs((4, 64))
    expected = sum_of_squares(x.double())
    fast = _superoptimize(sum_of_squares, (x,))
    (kept,) = fast.partition.kept_upcasts
    (sub,) = fast.partition.subprograms
    assert sub.graph.input_types[0].dtype == mi.float32  # the cast runs in PyTorch, before the graph
    out = fast(x)
    assert out.dtype == torch.float32
    assert _relative_error(out, expected) < 1e-6  # not rounded to float16 anywhere
    at_input_precision = _superoptimize(sum_of_squares, (x,), upcasts="input_precision")
    (sub,) = at_input_precision.partition.subprograms
    assert sub.graph.input_types[0].dtype == mi.float16 and not at_input_precision.partition.kept_upcasts
    assert at_input_precision(x).dtype == torch.float32


@pytest.mark.parametrize("value", ["fp32", None, True])
def test_bad_upcasts_values_name_the_choices(value):
    with pytest.raises(OptionError, match="'exact', 'input_precision'"):
        _superoptimize(sum_of_squares, _inputs((4, 64)), upcasts=value)
    with pytest.raises(ValueError, match="'exact', 'input_precision'"):
        Budget(upcasts=value)


# suite case, options: the hand-written fused µGraphs of the case are candidates of the one subprogram
SUITE = [("rmsnorm_b1", {}), ("ntrans_b1", {}), ("qknorm_b1", {"upcasts": "input_precision"})]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "options"), SUITE, ids=[case for case, _ in SUITE])
def test_suite_programs_choose_the_fused_candidates(case, options):
    workload = next(w for w in suite.WORKLOADS if w.name == case)
    inputs = workload.inputs(device="cpu")
    candidates = variants(case)
    fast = _superoptimize(workload.function, inputs, candidates=candidates, **options)
    (spec,) = fast.specializations
    assert len(spec.partition.subprograms) == 1, str(spec.partition)
    choice = spec.choices["sp0"]
    assert choice.source == "candidate", choice.detail
    assert strip_names(choice.graph) in {strip_names(g) for g in candidates}
    expected = workload.function(*(x.double() for x in inputs))
    assert _relative_error(fast(*inputs), expected) < 2e-3


def softmax_in_float32(x):  # as Hugging Face's eager attention computes its probabilities
    return torch.softmax(x, -1, dtype=torch.float32)


def sum_in_float32(x):
    return x.sum(-1, dtype=torch.float32) * 2


@pytest.mark.parametrize("function", [softmax_in_float32, sum_in_float32])
def test_a_dtype_argument_is_an_upcast_of_the_operand(function):
    """``softmax(x, dtype=float32)`` of a float16 ``x`` is computed in float32, as PyTorch does: capture
    writes the argument as a cast before the op (which the upcasts option then governs); before, the
    op ran in float16 and only its result was widened (3e-4 off float64 for the softmax)."""
    (x,) = _inputs((8, 64))
    gm = capture(as_module(function), (x,), {})
    casts = [n for n in gm.graph.nodes if n.target is torch.ops.aten.to.dtype]
    assert len(casts) == 1 and casts[0].args[1] is torch.float32
    assert all(n.kwargs.get("dtype") is None for n in gm.graph.nodes if n.op == "call_function")
    out = _superoptimize(function, (x,))(x)
    assert out.dtype == torch.float32
    assert _relative_error(out, function(x.double())) < 1e-6


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pytorch_computes_a_half_precision_softmax_as_its_float32_round_trip(dtype, device):
    """The premise of the capture rewrite below: both compute in float32 and round once, so they
    differ at most in the last bit (where the two kernels sum in another order)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU")
    for shape in [(64, 1000), (8, 64), (3, 17), (4, 4096)]:
        (x,) = _inputs(shape, dtype=dtype)
        x = (x * 8).to(device)
        for dim in (-1, 0):
            half, wide = torch.softmax(x, dim), torch.softmax(x.float(), dim).to(dtype)
            steps = (half.view(torch.int16).int() - wide.view(torch.int16).int()).abs().max()
            assert steps <= 1, (shape, dim)  # non-negative floats order as their bit patterns


def t5_attention(q, k, v):  # scores.float() and type_as
    scores = q @ k.transpose(-1, -2)
    return torch.softmax(scores.float(), dim=-1).type_as(scores) @ v


@pytest.mark.parametrize("function", [Float32Softmax(), t5_attention], ids=["hugging_face", "t5"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_float32_softmax_cast_back_is_the_half_precision_softmax(function, dtype):
    """The float32 island of attention's probabilities becomes the softmax of the scores as they are:
    one subprogram, the attention, instead of three around casts kept in PyTorch."""
    q, k, v = _inputs((1, 2, 64, 32), (1, 2, 64, 32), (1, 2, 64, 32), dtype=dtype)
    gm = capture(as_module(function), (q, k, v), {})
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert not [n for n in calls if n.target in (torch.ops.aten.to.dtype, torch.ops.aten.type_as.default)]
    (softmax,) = [n for n in calls if n.target is torch.ops.aten.softmax.int]
    assert softmax.meta["val"].dtype == dtype and softmax.args[0].meta["val"].dtype == dtype
    torch.testing.assert_close(gm(q, k, v), function(q, k, v), rtol=0, atol=0)
    fast = _superoptimize(function, (q, k, v))
    (spec,) = fast.specializations
    assert len(spec.partition.subprograms) == 1 and not spec.partition.kept_upcasts, str(spec.partition)
    out = fast(q, k, v)
    assert out.dtype == dtype
    assert _relative_error(out, function(*(t.double() for t in (q, k, v)))) < 1e-2


def widened_elsewhere(x):  # the float32 scores are read again: the island stays
    wide = x.float()
    return torch.softmax(wide, -1).to(x.dtype), wide.sum(-1)


def narrowed_to_another_dtype(x):  # float16 in, bfloat16 out: not a round trip
    return torch.softmax(x.float(), -1).to(torch.bfloat16)


@pytest.mark.parametrize("function", [widened_elsewhere, narrowed_to_another_dtype, softmax_in_float32])
def test_a_float32_softmax_stays_float32_unless_it_is_only_cast_back(function):
    (x,) = _inputs((8, 64))
    gm = capture(as_module(function), (x,), {})
    (softmax,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.softmax.int]
    assert softmax.args[0].meta["val"].dtype == torch.float32
