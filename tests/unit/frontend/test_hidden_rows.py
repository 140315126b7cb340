"""Query rows whose mask hides every key: 0 from PyTorch's attention, and now from ours (not 0 / 0)."""

import doctest

import pytest
import torch
import torch.nn.functional as F

import mirage as mi
from benchmarks.unseen import PROGRAMS
from mirage.frontend import hidden_rows
from mirage.frontend.capture import as_module, capture
from mirage.frontend.hidden_rows import zero_hidden_rows


def _qkv(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, 8, 16, generator=generator) for _ in range(3))


def _bool_mask():
    mask = torch.ones(8, 8, dtype=torch.bool)
    mask[3] = False  # query 3 sees no key
    return mask


def _float_mask():
    mask = torch.zeros(2, 1, 8, 8)
    mask[1, :, 5] = float("-inf")
    return mask


class BufferMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", _bool_mask())

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("mask", [_bool_mask(), _float_mask()], ids=["bool", "additive"])
def test_a_row_hidden_whole_is_zero_as_pytorchs_attention_gives_it(mask, gpu_like):
    q, k, v = _qkv()
    q, k, v = (x.expand(2, 2, 8, 16).contiguous() for x in (q, k, v))
    fast = mi.superoptimize(attention, (q, k, v, mask), search=False, use_cache=False, progress=False)
    for seed in range(3):  # the first call, the check on the second, the checked mask after
        q, k, v = (x.expand(2, 2, 8, 16).contiguous() for x in _qkv(seed))
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        got = fast(q, k, v, mask)
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_buffer_mask_hiding_a_row_gets_the_step_and_those_that_hide_none_do_not():
    gm = capture(BufferMask().eval(), _qkv(), {})
    assert sum(n.target is zero_hidden_rows for n in gm.graph.nodes) == 1
    fast = mi.superoptimize(BufferMask().eval(), _qkv(), search=False, use_cache=False, progress=False)
    torch.testing.assert_close(fast(*_qkv()), BufferMask()(*_qkv()), rtol=1e-5, atol=1e-5)
    for name in ("padded_attention", "windowed_attention", "causal_attention"):  # no row hidden whole
        cls, shapes = PROGRAMS[name]
        gm = capture(cls().eval(), tuple(torch.randn(s) for s in shapes), {})
        assert not any(n.target is zero_hidden_rows for n in gm.graph.nodes), name
    gm = capture(as_module(attention), (*_qkv(), _bool_mask()), {})  # an input: unknown until called
    assert sum(n.target is zero_hidden_rows for n in gm.graph.nodes) == 1


def test_a_mask_is_checked_once_on_its_second_call_and_then_costs_nothing():
    out = torch.randn(1, 2, 8, 16)
    visible = torch.zeros(8, 8)
    first = zero_hidden_rows(out, visible)
    assert first is not out and torch.equal(first, out)  # first seen: zeroed by a where, no check
    assert zero_hidden_rows(out, visible) is out  # seen again unchanged: checked, no row hidden
    assert zero_hidden_rows(out, visible) is out
    visible[0, 0] = float("-inf")  # changed in place: seen anew
    assert zero_hidden_rows(out, visible) is not out
    visible[0] = float("-inf")
    zero_hidden_rows(out, visible)
    rows = zero_hidden_rows(out, visible)
    assert torch.equal(rows[..., 0, :], torch.zeros(1, 2, 16))
    assert torch.equal(rows[..., 1:, :], out[..., 1:, :])


def test_the_module_example():
    result = doctest.testmod(hidden_rows)
    assert result.attempted > 0 and result.failed == 0
