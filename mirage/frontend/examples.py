"""Example PyTorch modules, written the way models are written, with their example inputs.

They are the frontend's acceptance programs (tests, the user guide and ``mirage demo`` use them):
a Llama-style gated MLP, RMSNorm followed by a linear layer, a grouped-query-attention decode step
(through ``scaled_dot_product_attention`` or written out), a LoRA linear layer and an nGPT-style
normalized residual update.  ``EXAMPLES[name](scale)`` returns ``(module, example_inputs)``; scale 1
is small enough for the CPU interpreter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


class GatedMLP(nn.Module):
    """down(silu(gate(x)) · up(x)), as in Llama."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RMSNormLinear(nn.Module):
    """A linear layer after an RMSNorm (the paper's Figure 3)."""

    def __init__(self, hidden: int, out_features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.proj = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class ManualRMSNormLinear(nn.Module):
    """The same, with the norm written out: x · rsqrt(mean(x²) + eps) · w."""

    def __init__(self, hidden: int, out_features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))
        self.eps = eps
        self.proj = nn.Linear(hidden, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return self.proj(normed)


class GQADecode(nn.Module):
    """One decode step of grouped-query attention over a KV cache (query heads share KV heads)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, use_sdpa: bool = True) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.use_sdpa = use_sdpa

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        if self.use_sdpa:
            q = self.q_proj(x).view(batch, self.heads, 1, self.head_dim)
            attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        else:  # the same, written out: the query heads of a group become rows
            group = self.heads // self.kv_heads
            q = self.q_proj(x).view(batch, self.kv_heads, group, self.head_dim)
            scores = (q @ k_cache.transpose(-1, -2)) / math.sqrt(self.head_dim)
            attn = torch.softmax(scores, dim=-1) @ v_cache
        return self.o_proj(attn.reshape(batch, self.heads * self.head_dim))


class LoRALinear(nn.Module):
    """A frozen linear layer plus a low-rank update: W x + (alpha/r) · B A x."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = nn.Linear(in_features, out_features, bias=False)
        self.lora_a = nn.Linear(in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, out_features, bias=False)
        nn.init.normal_(self.lora_b.weight, std=0.02)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scaling


class NGPTUpdate(nn.Module):
    """nGPT's normalized residual update: h ← norm(h + α (norm(h_block) − h)), norm = L2 on the sphere."""

    def __init__(self, hidden: int, alpha_init: float = 0.05) -> None:
        super().__init__()
        self.alpha_scale = 1.0 / math.sqrt(hidden)
        self.alpha = nn.Parameter(torch.full((hidden,), self.alpha_scale))
        self.alpha_init = alpha_init

    def forward(self, h: torch.Tensor, block_out: torch.Tensor) -> torch.Tensor:
        lr = self.alpha * (self.alpha_init / self.alpha_scale)
        return F.normalize(h + lr * (F.normalize(block_out, dim=-1) - h), dim=-1)


def _seeded(make: Callable[[], tuple]) -> tuple:
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        return make()
    finally:
        torch.random.set_rng_state(generator_state)


def gated_mlp(scale: int = 1):
    return _seeded(lambda: (GatedMLP(64 * scale, 128 * scale).eval(), (torch.randn(4, 64 * scale),)))


def rmsnorm_linear(scale: int = 1):
    return _seeded(lambda: (RMSNormLinear(64 * scale, 96 * scale).eval(), (torch.randn(2, 64 * scale),)))


def manual_rmsnorm_linear(scale: int = 1):
    return _seeded(lambda: (ManualRMSNormLinear(64 * scale, 96 * scale).eval(),
                            (torch.randn(2, 3, 64 * scale),)))


def gqa_decode(scale: int = 1, use_sdpa: bool = True):
    def make():
        module = GQADecode(64 * scale, heads=8, kv_heads=2, use_sdpa=use_sdpa).eval()
        dim = module.head_dim
        return module, (torch.randn(2, 64 * scale), torch.randn(2, 2, 16 * scale, dim),
                        torch.randn(2, 2, 16 * scale, dim))

    return _seeded(make)


def lora_linear(scale: int = 1):
    return _seeded(lambda: (LoRALinear(64 * scale, 80 * scale, rank=8).eval(), (torch.randn(4, 64 * scale),)))


def ngpt_update(scale: int = 1):
    return _seeded(lambda: (NGPTUpdate(64 * scale).eval(),
                            (F.normalize(torch.randn(3, 64 * scale), dim=-1), torch.randn(3, 64 * scale))))


EXAMPLES: dict[str, Callable[..., tuple]] = {
    "gated_mlp": gated_mlp,
    "rmsnorm_linear": rmsnorm_linear,
    "manual_rmsnorm_linear": manual_rmsnorm_linear,
    "gqa_decode": gqa_decode,
    "gqa_decode_manual": lambda scale=1: gqa_decode(scale, use_sdpa=False),
    "lora_linear": lora_linear,
    "ngpt_update": ngpt_update,
}
