"""Random attention programs as models write them: SDPA, or the scores written out (with ``@`` or
``einsum``, softmax or a softmax spelled out stably), causal or not, grouped-query heads repeated
with ``repeat_interleave``, and a prologue (a scale, q and k norms, rotary embedding by slices, an
additive bias). Each runs its reference graphs (``search=False``) on fresh inputs and must give what
float64 eager PyTorch gives."""

import random

import pytest
import torch
import torch.nn.functional as F

import mirage as mi
from tests.unit.frontend.frontend_calls import float64_calls


def _attention(seed: int):
    rnd = random.Random(seed)
    b, h, s, d = rnd.choice([1, 2]), rnd.choice([2, 4]), rnd.choice([16, 32]), rnd.choice([8, 16])
    kv_heads = rnd.choice([h, 1])
    causal = rnd.random() < 0.4
    prologue = rnd.choice(["none", "scale", "norms", "rotary", "bias"])
    form = rnd.choice(["sdpa", "written", "stable", "einsum"])

    def program(q, k, v, table):
        if prologue == "scale":
            q = q * 0.7
        elif prologue == "norms":
            q, k = F.rms_norm(q, (d,)), F.rms_norm(k, (d,))
        elif prologue == "rotary":
            cos = table[..., :d]
            q = q * cos + torch.cat((-q[..., d // 2:], q[..., : d // 2]), -1) * (1 - cos)
        if kv_heads != h:
            k, v = k.repeat_interleave(h // kv_heads, dim=1), v.repeat_interleave(h // kv_heads, dim=1)
        bias = table[..., :s] if prologue == "bias" else None
        if form == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  attn_mask=None if causal else bias)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) if form == "einsum" else q @ k.transpose(-1, -2)
        scores = scores / d ** 0.5
        if bias is not None:
            scores = scores + bias
        if causal:
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        if form == "stable":
            e = torch.exp(scores - scores.amax(-1, keepdim=True))
            return (e / e.sum(-1, keepdim=True)) @ v
        return torch.softmax(scores, -1) @ v

    generator = torch.Generator().manual_seed(seed)

    def inputs():
        q = torch.randn(b, h, s, d, generator=generator)
        k, v = (torch.randn(b, kv_heads, s, d, generator=generator) for _ in range(2))
        return q, k, v, torch.rand(1, 1, s, max(s, d), generator=generator)

    return program, inputs


def _check(seed: int, calls: int) -> None:
    program, inputs = _attention(seed)
    fast = mi.superoptimize(program, inputs(), search=False, use_cache=False, progress=False)
    for got, expected in float64_calls(fast, program, inputs, calls):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", range(40))
def test_a_random_attention_gives_what_eager_float64_gives(seed):
    _check(seed, calls=1)


@pytest.mark.parametrize("seed", range(0, 40, 2))
def test_a_random_attention_through_the_compiled_executor_gives_it_call_after_call(seed, gpu_like):
    """The same through the GPU path's executor (its input copies and caches), three calls."""
    _check(seed, calls=3)
