"""``masked_fill(scores, mask, -inf)`` captured as ``scores + fill`` (mirage.frontend.fill_masks), on
nanoGPT's attention (a lower-triangular buffer compared with 0) and on masks from inputs."""

from __future__ import annotations

import pytest
import torch

import mirage as mi
from benchmarks.unseen import NanoCausalAttention
from mirage.frontend.fill_masks import MaskPatternError
from mirage.mugraph.graph import KernelInput


def _qkv(shape=(1, 2, 8, 4)):
    return tuple(torch.randn(shape, generator=torch.Generator().manual_seed(i)) for i in range(3))


def _patterns(sub):
    return sorted(n.attrs.pattern for n in sub.graph.nodes if isinstance(n.attrs, KernelInput))


def test_a_causal_masked_fill_is_one_subprogram_whose_mask_names_the_pattern():
    model, (q, k, v) = NanoCausalAttention(tokens=8), _qkv()
    fast = mi.superoptimize(model, (q, k, v), search=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    (sub,) = fast.partition.subprograms
    assert _patterns(sub) == ["", "", "", "causal:8"]
    expected = model.double()(*(x.double() for x in (q, k, v)))
    torch.testing.assert_close(fast(q, k, v).double(), expected, rtol=1e-5, atol=1e-6)


def test_a_buffer_changed_away_from_the_pattern_raises_and_one_kept_causal_runs():
    model, (q, k, v) = NanoCausalAttention(tokens=8), _qkv()
    fast = mi.superoptimize(model, (q, k, v), search=False)
    fast(q, k, v)
    buffers = [b for name, b in fast.named_buffers() if name.endswith("bias")]
    assert buffers, "the captured module keeps the model's buffer"
    for b in buffers:
        b.mul_(2.0)  # still 0 exactly where it was: the same mask, recomputed
    torch.testing.assert_close(fast(q, k, v), model(q, k, v))
    for b in buffers:
        b.fill_(1.0)  # every key visible: no longer the causal mask the kernels would compute
    with pytest.raises(MaskPatternError, match="superoptimize the model again"):
        fast(q, k, v)


def test_a_mask_from_an_input_is_added_unfolded_and_a_finite_fill_is_left_alone():
    def padded(q, k, v, keep):
        att = (q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
        return torch.softmax(att, dim=-1) @ v

    def finite(q, k, v, keep):
        att = (q @ k.transpose(-2, -1)).masked_fill(~keep, -1e4)
        return torch.softmax(att, dim=-1) @ v

    q, k, v = _qkv()
    keep = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    keep[..., 5:] = False
    fast = mi.superoptimize(padded, (q, k, v, keep), search=False)
    assert not any("masked_fill" in op.target for op in fast.partition.pytorch_ops)
    (sub,) = fast.partition.subprograms  # the scores, their fill and the attention: one subprogram
    assert _patterns(sub) == ["", "", "", ""]  # computed from an input: no promise
    torch.testing.assert_close(fast(q, k, v, keep), padded(q, k, v, keep))
    left = mi.superoptimize(finite, (q, k, v, keep), search=False)
    assert any("masked_fill" in op.target for op in left.partition.pytorch_ops)
    torch.testing.assert_close(left(q, k, v, keep), finite(q, k, v, keep))


def test_a_negated_mask_is_filled_where_the_mask_is_false():
    """``masked_fill(s, ~keep, -inf)``: the negation is not computed (a new tensor every call); the fill
    of keep's False entries is, once while keep is unchanged, and again after it changes in place."""
    def padded(q, k, v, keep):
        return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf")), dim=-1) @ v

    q, k, v = _qkv()
    keep = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(5)) < 0.6
    keep[..., 0] = True
    fast = mi.superoptimize(padded, (q, k, v, keep), search=False, use_cache=False, progress=False)
    captured = fast.specializations[0].captured
    assert not [n for n in captured.nodes if n.op == "call_function" and "bitwise_not" in str(n.target)]
    assert not fast.partition.pytorch_ops
    torch.testing.assert_close(fast(q, k, v, keep), padded(q, k, v, keep))
    keep[..., 3:] = ~keep[..., 3:]
    keep[..., 0] = True
    torch.testing.assert_close(fast(q, k, v, keep), padded(q, k, v, keep))


class AdditiveCausal(torch.nn.Module):
    """An additive causal mask kept as a buffer of 0 and −inf, sliced to the prompt and added."""

    def __init__(self, tokens: int = 8, sdpa: bool = False):
        super().__init__()
        self.sdpa = sdpa
        self.register_buffer("mask", torch.full((tokens, tokens), float("-inf")).triu(1))

    def forward(self, q, k, v):
        t = q.size(-2)
        if self.sdpa:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:t, :t])
        return torch.softmax(q @ k.transpose(-2, -1) * 0.5 + self.mask[:t, :t], dim=-1) @ v


@pytest.mark.parametrize("sdpa", [False, True])
def test_an_additive_causal_buffer_is_promised_and_checked_when_it_changes(sdpa):
    model, (q, k, v) = AdditiveCausal(sdpa=sdpa), _qkv()
    fast = mi.superoptimize(model, (q, k, v), search=False)
    assert not fast.partition.pytorch_ops
    (sub,) = fast.partition.subprograms
    assert _patterns(sub) == ["", "", "", "causal:8"]
    torch.testing.assert_close(fast(q, k, v), model(q, k, v))
    (mask,) = [b for name, b in fast.named_buffers() if name.endswith("mask")]
    mask.zero_()  # no longer causal
    with pytest.raises(MaskPatternError):
        fast(q, k, v)


def test_a_non_causal_buffer_and_is_causal_keep_their_forms():
    window = AdditiveCausal()
    window.mask = torch.zeros(8, 8)  # a bias of zeros: read, no promise
    q, k, v = _qkv()
    fast = mi.superoptimize(window, (q, k, v), search=False)
    (sub,) = fast.partition.subprograms
    assert _patterns(sub) == ["", "", "", ""]
    torch.testing.assert_close(fast(q, k, v), window(q, k, v))
    causal = mi.superoptimize(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True), (q, k, v), search=False)
    (sub,) = causal.partition.subprograms
    assert any(b.source.startswith("_causal_mask_8x8") for b in sub.inputs)


def test_a_norms_zero_bias_is_no_causal_mask_and_may_be_trained():
    """An instance norm's bias starts at zeros, one value a row after its decomposition: the values of
    a causal mask one key wide.  A parameter makes no pattern's promise, so a bias trained since the
    capture gives its new values instead of a MaskPatternError."""
    model = torch.nn.Sequential(torch.nn.InstanceNorm2d(8, affine=True), torch.nn.ReLU())
    x = torch.randn(1, 8, 16, 16)
    fast = mi.superoptimize(model, (x,), search=False)
    assert all(_patterns(sub) == [""] * len(_patterns(sub)) for sub in fast.partition.subprograms)
    with torch.no_grad():
        model[0].bias.add_(0.5)
        torch.testing.assert_close(fast(x), model(x))


@pytest.mark.parametrize("form", ["fill", "additive"])
def test_a_causal_mask_built_in_the_forward_from_constants_is_folded_and_promised(form):
    def attention(q, k, v):
        t = q.size(-2)
        scores = q @ k.transpose(-2, -1)
        if form == "fill":
            scores = scores.masked_fill(torch.triu(torch.ones(t, t), diagonal=1).bool(), float("-inf"))
        else:
            scores = scores + torch.full((t, t), float("-inf")).triu(1)
        return torch.softmax(scores, dim=-1) @ v

    q, k, v = _qkv()
    fast = mi.superoptimize(attention, (q, k, v), search=False)
    assert not fast.partition.pytorch_ops  # no kernel builds the mask at each call
    (sub,) = fast.partition.subprograms
    assert _patterns(sub) == ["", "", "", "causal:8"]
    torch.testing.assert_close(fast(q, k, v), attention(q, k, v))


class WhereMasked(torch.nn.Module):
    """Hugging Face GPT-2's masking: ``where(bias[..., :t, :t], scores, finfo.min)``, then a softmax."""

    def __init__(self, keep: torch.Tensor, softmax: bool = True):
        super().__init__()
        self.register_buffer("bias", keep)
        self.softmax = softmax

    def forward(self, q, k, v):
        t = q.size(-2)
        scores = q @ k.transpose(-2, -1) * 0.5
        lowest = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
        scores = torch.where(self.bias[:, :, :t, :t], scores, lowest)
        return torch.softmax(scores, dim=-1) @ v if self.softmax else scores


def _lower_triangle(n=8):
    return torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)


def test_a_where_with_the_lowest_value_before_a_softmax_is_the_causal_attention():
    model = WhereMasked(_lower_triangle())
    q, k, v = _qkv()
    fast = mi.superoptimize(model, (q, k, v), search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    (sub,) = fast.partition.subprograms
    assert "causal:8" in _patterns(sub)
    for seed in range(2):
        q, k, v = (x * (seed + 1) for x in _qkv())
        torch.testing.assert_close(fast(q, k, v), model(q, k, v))


def test_a_lowest_value_fill_not_before_a_softmax_or_hiding_a_row_stays_as_written():
    q, k, v = _qkv()
    scores = WhereMasked(_lower_triangle(), softmax=False)  # the filled scores are the output
    fast = mi.superoptimize(scores, (q, k, v), search=False, use_cache=False, progress=False)
    assert any("masked_fill" in op.target for op in fast.partition.pytorch_ops)
    torch.testing.assert_close(fast(q, k, v), scores(q, k, v))
    hiding = _lower_triangle()
    hiding[..., 3, :] = False  # row 3 sees no key: eager spreads it evenly, −inf would not
    model = WhereMasked(hiding)
    fast = mi.superoptimize(model, (q, k, v), search=False, use_cache=False, progress=False)
    assert any("masked_fill" in op.target for op in fast.partition.pytorch_ops)
    torch.testing.assert_close(fast(q, k, v), model(q, k, v))


def test_a_buffer_changed_to_hide_a_whole_row_is_refused_at_the_next_call():
    keep = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(3)) < 0.6
    keep[..., 0] = True
    model = WhereMasked(keep)
    q, k, v = _qkv()
    fast = mi.superoptimize(model, (q, k, v), search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    torch.testing.assert_close(fast(q, k, v), model(q, k, v))
    model.bias[..., 5, :] = False
    with pytest.raises(MaskPatternError, match="hides every key of some row"):
        fast(q, k, v)


def test_a_callers_capture_reads_a_promised_mask_as_computed_and_computes_an_unpromised_one(monkeypatch):
    """In a caller's CUDA graph a fold promised as a pattern is the value the calls checked (computing
    it again in every replay, three kernels for GPT-2's mask, gives the same tensor); a fold with no
    promise is recorded, so that replays see its buffers change."""
    from mirage.frontend import graphs
    from mirage.frontend.fill_masks import FoldedConstant

    bias = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    made = []

    class Hidden(torch.nn.Module):
        def forward(self, b):
            made.append(1)
            return ~b

    from mirage.frontend.fill_masks import _versions

    promised, unpromised = (FoldedConstant(Hidden(), pattern) for pattern in ("causal:4", ""))
    for fold in (promised, unpromised):  # as a call from Python left them
        fold._value, fold._key = fold.function(bias), _versions((bias,))
    monkeypatch.setattr(graphs, "capturing", lambda tensors: True)  # a caller's capture, recording
    made.clear()
    assert promised(bias) is promised._value and made == []
    assert unpromised(bias) is not unpromised._value and made == [1]


def test_a_callers_capture_reuses_the_additive_form_of_a_promised_mask_only(monkeypatch):
    from mirage.frontend import graphs
    from mirage.frontend.fill_masks import fill_mask

    hidden, other = (~torch.tril(torch.ones(4, 4, dtype=torch.bool)) for _ in range(2))
    promised, unpromised = fill_mask(hidden, torch.float16, "causal:4"), fill_mask(other, torch.float16)
    monkeypatch.setattr(graphs, "capturing", lambda tensors: True)
    assert fill_mask(hidden, torch.float16, "causal:4") is promised
    again = fill_mask(other, torch.float16)
    assert again is not unpromised and torch.equal(again, unpromised)


def test_a_callers_capture_reads_gpt2s_causal_mask_as_the_last_call_computed_it(monkeypatch):
    """GPT-2's mask, folded from its ``bias`` buffer: the fold itself carries no pattern (it is
    boolean), the additive form it feeds does; in a caller's capture neither is computed again."""
    from mirage.frontend import graphs
    from mirage.frontend.fill_masks import FoldedConstant

    model = WhereMasked(torch.tril(torch.ones(1, 1, 16, 16, dtype=torch.bool)))
    q, k, v = _qkv()
    fast = mi.superoptimize(model, (q, k, v), search=False, use_cache=False, progress=False)
    want = fast(q, k, v)  # a call from Python computes and checks both
    (fold,) = [m for m in fast.specializations[0].module.modules() if isinstance(m, FoldedConstant)]
    assert fold.derived_pattern == "causal:8" and fold.pattern == ""
    computed = []
    fold.function.register_forward_hook(lambda *_: computed.append(1))
    monkeypatch.setattr(graphs, "capturing", lambda tensors: True)  # a caller's capture, recording
    torch.testing.assert_close(fast(q, k, v), want)
    assert computed == []
