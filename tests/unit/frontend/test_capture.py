import pytest
import torch
import torch.fx as fx
import torch.nn as nn

import mirage as mi
from mirage.frontend.capture import (
    FunctionModule,
    TensorSpec,
    ValueSpec,
    as_module,
    capture,
    check_call,
    conform_call,
    signature_of,
)
from mirage.frontend.errors import (
    ExampleInputsError,
    InputCountError,
    InputDeviceError,
    InputDTypeError,
    InputTypeError,
    UnsupportedProgramError,
)

X = torch.zeros(2, 3)


def test_signature_records_tensors_and_values():
    signature = signature_of((X, 2.0), {"flag": True, "maybe": None})
    tensor = TensorSpec((2, 3), torch.float32, torch.device("cpu"))
    assert signature.leaves == (tensor, ValueSpec("float", "2.0"), ValueSpec("bool", "True"),
                                ValueSpec("NoneType", "None"))
    assert signature == signature_of((torch.ones(2, 3), 2.0), {"flag": True, "maybe": None})
    assert signature != signature_of((torch.ones(4, 3), 2.0), {"flag": True, "maybe": None})


CALLS = [
    # captured (args), called (args), error or None
    ((X,), (torch.ones(5, 3),), None),  # a new shape is fine: it re-specializes
    ((X, 1), (X, 2), None),  # so is a new value
    ((X,), (X, X), InputCountError),
    (((X, X),), ([X, X],), InputCountError),  # another container structure
    ((X,), (1.0,), InputTypeError),
    ((X,), (X.double(),), InputDTypeError),
    ((X,), (X.to("meta"),), InputDeviceError),
]


@pytest.mark.parametrize(("captured", "called", "error"), CALLS)
def test_check_call(captured, called, error):
    was, now = signature_of(captured, {}), signature_of(called, {})
    if error is None:
        check_call(was, now, "f")
    else:
        with pytest.raises(error):
            check_call(was, now, "f")


def test_unsupported_leaf_type():
    with pytest.raises(ExampleInputsError, match="input of type set is not supported"):
        signature_of(({1, 2},), {})


def test_as_module():
    linear = nn.Linear(2, 2)
    assert as_module(linear) is linear
    wrapped = as_module(torch.relu)
    assert isinstance(wrapped, FunctionModule) and wrapped.function is torch.relu
    with pytest.raises(UnsupportedProgramError, match="cannot superoptimize a str"):
        as_module("relu")


def test_capture_gives_aten_ops_and_keeps_parameters_as_attributes():
    module = nn.Sequential(nn.Linear(3, 4), nn.SiLU())
    gm = capture(module, (X,), {})
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.linear.default" in targets and "aten.silu.default" in targets
    assert [n.op for n in gm.graph.nodes].count("get_attr") == 2
    torch.testing.assert_close(gm(X), module(X))


def test_capture_of_a_graph_module():
    traced = fx.symbolic_trace(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    gm = capture(traced, (X,), {})
    assert any(str(n.target) == "aten.relu.default" for n in gm.graph.nodes)


def _two(x, y, scale=1.0):
    return (x @ y) * scale


Y = torch.zeros(3, 2)


@pytest.mark.parametrize(("first", "args", "kwargs", "expected"), [
    ((2, ()), (X,), {"y": Y}, ((X, Y), {})),  # y by keyword, captured by position
    ((2, ()), (), {"y": Y, "x": X}, ((X, Y), {})),
    ((0, ("x", "y")), (X, Y), {}, ((), {"x": X, "y": Y})),  # captured by keyword
    ((1, ("y",)), (), {"y": Y, "x": X}, ((X,), {"y": Y})),
    ((2, ()), (X,), {"z": Y}, ((X,), {"z": Y})),  # no parameter z: left as it is
    ((2, ()), (X,), {"scale": 2.0}, ((X,), {"scale": 2.0})),  # other inputs than captured: left
])
def test_calls_conform_to_the_first_capture_by_parameter_name(first, args, kwargs, expected):
    got = conform_call(FunctionModule(_two), first, args, kwargs)
    assert len(got[0]) == len(expected[0]) and all(a is b for a, b in zip(got[0], expected[0], strict=True))
    assert got[1].keys() == expected[1].keys() and all(got[1][k] is v for k, v in expected[1].items())


def test_a_function_captured_by_keyword_runs_when_called_by_position():
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    fast = mi.superoptimize(_two, {"x": a, "y": b}, search=False, use_cache=False, progress=False)
    torch.testing.assert_close(fast(a, b), _two(a, b))
    torch.testing.assert_close(fast(a, y=b), _two(a, b))
    with pytest.raises(InputCountError, match="another structure"):
        fast((a, b))


def test_causal_attention_is_captured_with_its_mask_and_restored_for_pytorch():
    """Capture gives ``is_causal=True`` its mask as a buffer of 0 and −inf (the form the search
    takes); ``restore_causal`` puts the flag back where the node runs in PyTorch, whose causal
    kernels are faster than its masked ones. Both forms compute PyTorch's causal attention."""
    import torch.nn.functional as F

    from mirage.frontend.capture import CAUSAL_MASK, as_module, capture, restore_causal

    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(i)) for i in range(3))
    gm = capture(as_module(causal), (q, k, v), {})
    masks = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target.startswith(CAUSAL_MASK)]
    assert len(masks) == 1
    mask = getattr(gm, masks[0].target)
    assert mask.shape == (5, 5) and bool(mask.isneginf().equal(torch.ones(5, 5, dtype=torch.bool).triu(1)))
    torch.testing.assert_close(gm(q, k, v), causal(q, k, v))
    restore_causal(gm.graph)
    gm.recompile()
    (sdpa,) = [n for n in gm.graph.nodes if n.op == "call_function" and "attention" in str(n.target)]
    assert sdpa.kwargs["is_causal"] is True and sdpa.kwargs["attn_mask"] is None
    assert not [n for n in gm.graph.nodes if n.op == "get_attr"]
    torch.testing.assert_close(gm(q, k, v), causal(q, k, v))


def test_repeat_interleave_over_a_dim_is_captured_as_an_expand():
    """``k.repeat_interleave(2, dim=1)`` (grouped-query heads) becomes unsqueeze, expand and reshape,
    which the lowering takes; the values are those of eager mode."""
    import torch.nn.functional as F

    def attention(q, k, v):
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        return F.scaled_dot_product_attention(q, k, v)

    inputs = (torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))
    gm = capture(as_module(attention), inputs, {})
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.repeat_interleave.self_int not in targets
    assert torch.ops.aten.expand.default in targets
    fast = mi.superoptimize(attention, inputs, search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    expected = attention(*(x.double() for x in inputs))
    torch.testing.assert_close(fast(*inputs).double(), expected, rtol=1e-5, atol=1e-5)


def _targets(program, inputs):
    gm = capture(as_module(program), inputs, {})
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("row_max", [lambda s: s.max(dim=-1, keepdim=True).values,
                                     lambda s: torch.amax(s, -1, keepdim=True)], ids=["max", "amax"])
def test_a_softmax_spelled_out_stably_is_captured_as_softmax(row_max):
    import torch.nn.functional as F

    def attention(q, k, v):
        s = q @ k.transpose(-1, -2) / 8
        e = torch.exp(s - row_max(s))
        return (e / e.sum(-1, keepdim=True)) @ v

    inputs = tuple(torch.randn(1, 2, 8, 16) for _ in range(3))
    targets = _targets(attention, inputs)
    assert torch.ops.aten.softmax.int in targets
    aten = torch.ops.aten
    assert not {aten.max.dim, aten.amax.default, aten.exp.default} & set(targets)
    fast = mi.superoptimize(attention, inputs, search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    q, k, v = (x.double() for x in inputs)
    expected = F.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v
    torch.testing.assert_close(fast(*inputs).double(), expected, rtol=1e-5, atol=1e-5)


def test_a_stable_softmax_keeps_its_exponentials_where_others_read_them():
    def program(s):
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True), e.mean(-1)

    inputs = (torch.randn(4, 16),)
    targets = _targets(program, inputs)
    assert torch.ops.aten.softmax.int in targets and torch.ops.aten.exp.default in targets
    fast = mi.superoptimize(program, inputs, search=False, use_cache=False, progress=False)
    for got, want in zip(fast(*inputs), program(*inputs), strict=True):
        torch.testing.assert_close(got, want)


def _over_other_dims(s):
    e = torch.exp(s - s.amax(0, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _other_sum(s):
    return torch.exp(s - s.amax(-1, keepdim=True)) / torch.exp(s).sum(-1, keepdim=True)


@pytest.mark.parametrize("program", [_over_other_dims, _other_sum], ids=["other_dims", "other_sum"])
def test_what_only_looks_like_a_stable_softmax_stays_as_written(program):
    inputs = (torch.randn(4, 16),)
    assert torch.ops.aten.softmax.int not in _targets(program, inputs)
    fast = mi.superoptimize(program, inputs, search=False, use_cache=False, progress=False)
    torch.testing.assert_close(fast(*inputs), program(*inputs))


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def test_concatenated_slices_of_one_tensor_are_captured_as_a_signed_selection_product():
    """rotary embedding's rotate_half: x @ S for the ±1 selection matrix S (a buffer), exactly."""

    def rotary(q, cos, sin):
        return q * cos + _rotate_half(q) * sin

    inputs = (torch.randn(1, 4, 8, 16, dtype=torch.float16), torch.randn(1, 1, 8, 16, dtype=torch.float16),
              torch.randn(1, 1, 8, 16, dtype=torch.float16))
    gm = capture(as_module(rotary), inputs, {})
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert aten.cat.default not in targets and aten.slice.Tensor not in targets
    assert aten.matmul.default in targets
    (selection,) = [b for name, b in gm.named_buffers() if name.startswith("_selection_")]
    assert selection.shape == (16, 16) and sorted(selection.abs().sum(0).tolist()) == [1.0] * 16
    torch.testing.assert_close(gm(*inputs), rotary(*inputs), rtol=0, atol=0)  # exact: one ±1 term a column
    fast = mi.superoptimize(rotary, inputs, search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    expected = rotary(*(x.double() for x in inputs))
    torch.testing.assert_close(fast(*inputs).double(), expected, rtol=2e-3, atol=2e-3)


def _rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def test_interleaved_slices_stacked_and_flattened_are_a_signed_selection_product():
    """GPT-J's rotary (rotate_every_two): x @ S as well, each output column one ±1 term, exactly."""

    def rotary(q, cos, sin):
        return q * cos + _rotate_every_two(q) * sin

    inputs = (torch.randn(1, 4, 8, 16, dtype=torch.float16), torch.randn(8, 16, dtype=torch.float16),
              torch.randn(8, 16, dtype=torch.float16))
    gm = capture(as_module(rotary), inputs, {})
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    aten = torch.ops.aten
    assert not {aten.stack.default, aten.slice.Tensor, aten.flatten.using_ints} & set(targets)
    (selection,) = [b for name, b in gm.named_buffers() if name.startswith("_selection_")]
    assert selection[1, 0] == -1 and selection[0, 1] == 1
    assert sorted(selection.abs().sum(0).tolist()) == [1.0] * 16
    torch.testing.assert_close(gm(*inputs), rotary(*inputs), rtol=0, atol=0)
    fast = mi.superoptimize(rotary, inputs, search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    expected = rotary(*(x.double() for x in inputs))
    torch.testing.assert_close(fast(*inputs).double(), expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("program", [
    lambda x, y: torch.stack((-x[..., 1::2], y[..., ::2]), dim=-1).flatten(-2),  # two tensors
    # not the last dims
    lambda x, y: torch.stack((-x[..., 1::2], x[..., ::2]), dim=0).flatten(0, 1) * y[0, 0],
], ids=["two_tensors", "leading_dims"])
def test_other_stacks_stay_as_written(program):
    inputs = (torch.randn(4, 8, dtype=torch.float16), torch.randn(4, 8, dtype=torch.float16))
    assert torch.ops.aten.stack.default in _targets(program, inputs)


def test_float32_slices_stay_slices():
    """A float32 product may run on TF32 tensor cores (rounding x), so float32 keeps its slices."""
    inputs = (torch.randn(4, 16),)
    assert torch.ops.aten.cat.default in _targets(_rotate_half, inputs)


@pytest.mark.parametrize("program", [lambda x, y: torch.cat((x[..., :4], y[..., 4:]), dim=-1),
                                     lambda x, y: torch.cat((x[:2], x[2:]), dim=0) + y],
                         ids=["two_tensors", "leading_dim"])
def test_other_concatenations_stay_as_written(program):
    inputs = (torch.randn(4, 8, dtype=torch.float16), torch.randn(4, 8, dtype=torch.float16))
    assert torch.ops.aten.cat.default in _targets(program, inputs)


def test_a_capture_on_aliased_inputs_serves_distinct_ones():
    """torch.export traces one tensor passed twice as one input; capture copies the repeat first, so
    that self-attention captured as attn(x, x, x) computes attn(q, k, v) for distinct tensors."""

    def program(a, b):
        return a * 2 + b

    x = torch.randn(4, 8)
    gm = capture(as_module(program), (x, x), {})
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(gm(a, b), program(a, b))
    view = x[1:]  # a view shares its base's memory: copied as well
    torch.testing.assert_close(capture(as_module(program), (x[:-1], view), {})(a[1:], b[1:]),
                               program(a[1:], b[1:]))


def test_a_kv_cache_written_in_place_after_an_aliased_capture():
    """A decoding step that writes k and v into cache buffers (in place) and attends over them,
    superoptimized with one tensor as q, k and v, then called with distinct ones: outputs and
    caches as in eager mode at every step."""
    import torch.nn.functional as F

    class Decode(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("kc", torch.zeros(1, 2, 8, 16))
            self.register_buffer("vc", torch.zeros(1, 2, 8, 16))

        def forward(self, q, k, v, pos: int):
            self.kc[:, :, pos] = k[:, :, 0]
            self.vc[:, :, pos] = v[:, :, 0]
            return F.scaled_dot_product_attention(q, self.kc[:, :, : pos + 1], self.vc[:, :, : pos + 1])

    torch.manual_seed(0)
    model, eager = Decode(), Decode()
    x = torch.randn(1, 2, 1, 16)
    fast = mi.superoptimize(model, (x, x, x, 0), search=False, use_cache=False, progress=False)
    for pos in range(3):
        q, k, v = (torch.randn(1, 2, 1, 16) for _ in range(3))
        torch.testing.assert_close(fast(q, k, v, pos), eager(q, k, v, pos))
        torch.testing.assert_close(model.kc, eager.kc, rtol=0, atol=0)
        torch.testing.assert_close(model.vc, eager.vc, rtol=0, atol=0)


def test_repeated_heads_stay_contiguous_for_the_views_after_them():
    """One key head repeated for two query heads, then einsum (whose decomposition views its operands):
    the expand's reshape alone would be a stride-0 view that those views cannot take."""

    def attention(q, k, v):
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        return torch.softmax(torch.einsum("bhqd,bhkd->bhqk", q, k) / 4, -1) @ v

    inputs = (torch.randn(2, 2, 16, 16), torch.randn(2, 1, 16, 16), torch.randn(2, 1, 16, 16))
    fast = mi.superoptimize(attention, inputs, search=False, use_cache=False, progress=False)
    expected = attention(*(x.double() for x in inputs))
    torch.testing.assert_close(fast(*inputs).double(), expected, rtol=1e-5, atol=1e-5)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()


def test_superoptimize_and_calls_under_inference_mode(gpu_like):
    """torch.export cannot trace inputs made under torch.inference_mode(); capture traces copies."""
    model = _mlp()
    with torch.inference_mode():
        fast = mi.superoptimize(model, (torch.randn(4, 16),), search=False, use_cache=False, progress=False)
        for _ in range(2):
            x = torch.randn(4, 16)
            torch.testing.assert_close(fast(x), model(x))
        model[0].weight.mul_(-1)  # an update in place, seen by the next call
        torch.testing.assert_close(fast(x), model(x))


def test_a_model_built_under_inference_mode_is_refused_with_what_to_do():
    with torch.inference_mode():
        model = _mlp()
    with pytest.raises(mi.frontend.CaptureError, match=r"0.weight \(and 3 more\) was created under "
                       r"torch.inference_mode\(\).*build or load the model outside inference mode"):
        mi.superoptimize(model, (torch.randn(4, 16),), search=False, use_cache=False, progress=False)


def test_a_zero_dim_full_operand_is_the_number_it_holds_in_its_dtype():
    """GPT-2 divides its scores by ``torch.full([], sqrt(d))``: captured as a division by the number
    (sqrt(128) as float16 holds it: 11.3125), so that no PyTorch op is left before the subprogram."""
    def program(x):
        root = torch.full([], 128 ** 0.5, dtype=x.dtype, device=x.device)
        return torch.softmax(x / root * torch.full([], 0.5, dtype=x.dtype), dim=-1)

    x = torch.randn(4, 16).half()
    fast = mi.superoptimize(program, (x,), search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    numbers = [a for n in fast.specializations[0].captured.nodes if n.op == "call_function"
               for a in n.args if isinstance(a, float)]
    assert 11.3125 in numbers and 0.5 in numbers
    torch.testing.assert_close(fast(x).float(), program(x).float(), rtol=2e-3, atol=2e-3)


class _FusedGateUp(torch.nn.Module):
    """Phi-3's MLP: one projection for the gate and the up states, chunked in two."""

    def __init__(self, d=16, ff=32, bias=False):
        super().__init__()
        self.gate_up = torch.nn.Linear(d, 2 * ff, bias=bias)
        self.down = torch.nn.Linear(ff, d, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(up * torch.nn.functional.silu(gate))


@pytest.mark.parametrize("bias", [False, True])
def test_a_chunked_projection_is_two_products_of_the_weight_rows(bias, gpu_like):
    """Each piece is a product of its rows of the weight, so the gated product is one subprogram;
    the rows view the parameter, so an update in place is seen at the next call."""
    torch.manual_seed(0)
    model = _FusedGateUp(bias=bias).eval()
    x = torch.randn(4, 16)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    assert len(fast.partition.subprograms) == 1 and not fast.partition.pytorch_ops
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 16)
            torch.testing.assert_close(fast(x), model(x))
        model.gate_up.weight[:8].mul_(-2)  # gate rows only
        torch.testing.assert_close(fast(x), model(x))


def test_a_split_into_heads_keeps_its_one_product():
    """q, k and v split from one projection and reshaped into heads stay one product (three would
    each be a subprogram of their own before the attention)."""
    class FusedQKV(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = (t.view(2, 8, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, dim=-1))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    gm = capture(FusedQKV(), (torch.randn(2, 8, 16),), {})
    assert sum(n.target is torch.ops.aten.linear.default for n in gm.graph.nodes) == 1


def test_a_piece_of_a_split_projection_that_nothing_reads_is_not_computed():
    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 48)

        def forward(self, x):
            a, _, c = self.fc(x).split(16, dim=-1)
            return torch.nn.functional.silu(a) * c

    model, x = Gated().eval(), torch.randn(4, 16)
    gm = capture(model, (x,), {})
    assert sum(n.target is torch.ops.aten.linear.default for n in gm.graph.nodes) == 2
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))


def test_selection_docstring_examples():
    import doctest

    import mirage.frontend.selections

    result = doctest.testmod(mirage.frontend.selections)
    assert result.attempted > 0 and result.failed == 0


def _shifted(s):  # x-transformers' attention
    return (s - s.amax(dim=-1, keepdim=True).detach()).softmax(dim=-1)


def _shifted_by_max_values(s):
    return torch.softmax(s - s.max(dim=1, keepdim=True).values, dim=1)


@pytest.mark.parametrize("program", [_shifted, _shifted_by_max_values], ids=["amax", "max_values"])
def test_a_softmax_of_scores_shifted_by_their_row_maximum_is_captured_as_the_softmax(program):
    inputs = (torch.randn(4, 16) * 30,)
    targets = _targets(program, inputs)
    aten = torch.ops.aten
    assert aten.softmax.int in targets
    assert not {aten.amax.default, aten.max.dim, aten.sub.Tensor} & set(targets)
    fast = mi.superoptimize(program, inputs, search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    expected = torch.softmax(inputs[0].double(), -1)
    torch.testing.assert_close(fast(*inputs).double(), expected, rtol=1e-6, atol=1e-7)


def _shifted_over_another_dim(s):
    return torch.softmax(s - s.amax(0, keepdim=True), -1)


def _shifted_and_read(s):
    shifted = s - s.amax(-1, keepdim=True)
    return torch.softmax(shifted, -1), shifted


@pytest.mark.parametrize("program", [_shifted_over_another_dim, _shifted_and_read], ids=["other_dim", "read"])
def test_a_shift_that_changes_the_function_or_is_read_elsewhere_stays(program):
    inputs = (torch.randn(4, 16),)
    targets = _targets(program, inputs)
    assert torch.ops.aten.sub.Tensor in targets
    fast = mi.superoptimize(program, inputs, search=False, use_cache=False, progress=False)
    got, want = fast(*inputs), program(*inputs)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,),
                    strict=True):
        torch.testing.assert_close(a, b)
