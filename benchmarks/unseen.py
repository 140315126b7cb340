"""Programs that no test and no benchmark family names, run end to end: capture, search (with a short
budget), verification, code generation, compilation and timing on the GPU, then the result against
PyTorch eager (and, for attention, PyTorch's fused ``scaled_dot_product_attention``).  Errors are
measured against a float64 copy of the model, eager PyTorch's own beside ours.  Prints one line per
program and writes unseen_<date>.json into ``--out`` (default benchmarks/results).  On a machine
without a GPU the subprograms run through the interpreter and only correctness is reported."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import mirage as mi
from benchmarks.mugraphs.attention import one_kernel
from benchmarks.unseen_models import (
    MODEL_PROGRAMS,
    ConvNeXtMLP,
    InstanceNormReLU,
    LogProbs,
    LogSoftmaxHead,
    MoERouter,
    RWKVChannelMix,
    T5FeedForward,
    TokenLoss,
    TokenProbs,
)
from mirage.mugraph.graph import BlockGraph


class Gate(nn.Module):
    """A residual sum gated by a sigmoid: element-wise ops only."""

    def forward(self, x, r, g):
        return (x + r) * torch.sigmoid(g)


class SoftmaxProjection(nn.Module):
    """A product whose rows go through a softmax (attention scores without the value product)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 512) / 16)

    def forward(self, x):
        return torch.softmax(x @ self.w, dim=-1)


class NormProjection(nn.Module):
    """The rms of each row written out by hand (no ``rms_norm`` op), then a product."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512, 768) / 22)

    def forward(self, x):
        return (x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)) @ self.w


class SwiGLU(nn.Module):
    """Llama's gated product at shapes of no benchmark."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(512, 1024) / 22)
        self.w2 = nn.Parameter(torch.randn(512, 1024) / 22)

    def forward(self, x):
        return F.silu(x @ self.w1) * (x @ self.w2)


class GeluProjection(nn.Module):
    """A projection and GPT-2's GELU written out by hand: one product, nine element-wise ops."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(768, 1024) / 28)

    def forward(self, x):
        y = x @ self.w
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))))


class LayerNormProjection(nn.Module):
    """LayerNorm written out by hand with ``var`` (no ``layer_norm`` op), then a product."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(512, 768) / 22)

    def forward(self, x):
        centred = x - x.mean(-1, keepdim=True)
        return (centred / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)) @ self.w


class BertMLP(nn.Module):
    """BERT's feed-forward layer: a biased projection, the exact (erf) GELU, a biased projection back."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(384, 1536)
        self.down = nn.Linear(1536, 384)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class HeadsAttention(nn.Module):
    """Multi-head attention written out on (batch, heads, seq, dim) tensors: no SDPA call."""

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v

    @staticmethod
    def fused(q, k, v):  # PyTorch's own fused kernel of the same function (timed beside)
        return F.scaled_dot_product_attention(q, k, v, scale=1 / 8.0)


class PrefillAttention(nn.Module):
    """BERT-base's self-attention core over a 512-token prompt, written out with ``* d ** -0.5``."""

    def forward(self, q, k, v):
        return F.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1) @ v

    fused = staticmethod(F.scaled_dot_product_attention)  # its scale is d ** -0.5 too


class CausalAttention(nn.Module):
    """A decoder's causal self-attention over a 512-token prompt, through PyTorch's SDPA call."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class NanoCausalAttention(nn.Module):
    """nanoGPT's attention without flash: a lower-triangular buffer compared with 0 hides the later
    keys through ``masked_fill(..., -inf)`` (captured as the causal pattern, mirage.frontend.fill_masks)."""

    def __init__(self, tokens: int = 512):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(tokens, tokens)).view(1, 1, tokens, tokens))

    def forward(self, q, k, v):
        t = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        return F.softmax(att, dim=-1) @ v

    @staticmethod
    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class GroupedCausalAttention(nn.Module):
    """Llama-style causal self-attention with grouped-query heads (32 query heads, 8 key heads)."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


class WindowedAttention(nn.Module):
    """Local attention over a 512-token prompt: each query sees the keys within 128 positions, a
    boolean mask (a buffer) passed to SDPA."""

    def __init__(self, tokens: int = 512, window: int = 128):
        super().__init__()
        positions = torch.arange(tokens)
        self.register_buffer("window", (positions[:, None] - positions[None, :]).abs() < window)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.window)


class PaddedAttention(nn.Module):
    """A BERT-style encoder's attention over a batch of 4 prompts padded to 256 tokens: a boolean
    key-padding mask of shape (4, 1, 1, 256) (a buffer), which broadcasts over heads and queries."""

    def __init__(self, lengths: tuple[int, ...] = (256, 200, 131, 64), tokens: int = 256):
        super().__init__()
        keep = torch.arange(tokens)[None, :] < torch.tensor(lengths)[:, None]
        self.register_buffer("keep", keep[:, None, None, :])

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.keep)


class BiasedAttention(nn.Module):
    """Attention with an additive bias of the scores shared by all heads (ALiBi- or T5-style),
    written out."""

    def forward(self, q, k, v, bias):
        return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias, dim=-1) @ v

    @staticmethod
    def fused(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


class WideHeadAttention(PrefillAttention):
    """Prefill attention with heads of 128 dims over 1,024 tokens."""


class DecodeAttention(nn.Module):
    """One decoding step: one query a head against 4,096 cached keys (FlashDecoding's case)."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    fused = staticmethod(F.scaled_dot_product_attention)


class Float32Softmax(nn.Module):
    """Attention as Hugging Face's eager path writes it: the probabilities in float32, then back."""

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2) / 8.0
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v

    @staticmethod
    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=1 / 8.0)


class InplaceMLP(nn.Module):
    """A feed-forward layer with an in-place activation (``nn.ReLU(inplace=True)``) and dropout in
    eval mode, as older models write it."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(512, 2048)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.1)
        self.down = nn.Linear(2048, 512)

    def forward(self, x):
        return self.down(self.drop(self.act(self.up(x))))


class StableAttention(nn.Module):
    """Attention with its softmax spelled out stably, as research code writes it."""

    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2) / 8.0
        e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
        return (e / e.sum(-1, keepdim=True)) @ v

    @staticmethod
    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=1 / 8.0)


class EinsumAttention(nn.Module):
    """Attention written with einsum."""

    def forward(self, q, k, v):
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
        return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v)

    @staticmethod
    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=1 / 8.0)


class RotaryAttention(nn.Module):
    """Llama's attention core: rotary embedding of q and k (rotate_half by slices), grouped-query
    heads repeated with repeat_interleave, causal attention."""

    @staticmethod
    def rotate_half(x):
        return torch.cat((-x[..., 32:], x[..., :32]), dim=-1)

    def forward(self, q, k, v, cos, sin):
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        k, v = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class GPT2Attention(nn.Module):
    """Hugging Face GPT-2's eager attention: scores divided by sqrt(d), hidden by ``where`` against
    the dtype's lowest value from a lower-triangular buffer, softmax, values."""

    def __init__(self, positions: int = 1024):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions, dtype=torch.bool))
                             .view(1, 1, positions, positions))

    def forward(self, q, k, v):
        t = q.size(-2)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype,
                                                                device=q.device)
        lowest = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(self.bias[:, :, :t, :t], w, lowest)
        return torch.matmul(torch.softmax(w, dim=-1), v)


class ShiftedAttention(nn.Module):
    """x-transformers' attention: the scores shifted by their detached row maximum before the softmax."""

    def forward(self, q, k, v):
        sim = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        sim = sim - sim.amax(dim=-1, keepdim=True).detach()
        return sim.softmax(dim=-1) @ v

    @staticmethod
    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


class SoftcapAttention(nn.Module):
    """Gemma 2's attention logits soft-capped: ``tanh(s / cap) · cap`` of the scaled scores before the
    softmax (``attn_logit_softcapping``, 50)."""

    def __init__(self, cap: float = 50.0):
        super().__init__()
        self.cap = cap

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        scores = torch.tanh(scores / self.cap) * self.cap
        return torch.matmul(torch.softmax(scores, dim=-1), v)


class T5Attention(nn.Module):
    """T5's attention: unscaled scores plus a learned position bias, the softmax taken in float32 and
    cast back with ``type_as``."""

    def __init__(self, heads: int = 8, tokens: int = 128):
        super().__init__()
        self.position_bias = nn.Parameter(torch.randn(1, heads, tokens, tokens) / 8)

    def forward(self, q, k, v):
        scores = torch.matmul(q, k.transpose(3, 2)) + self.position_bias
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        return torch.matmul(weights, v)


class QKNormAttention(nn.Module):
    """QK-norm as Qwen3 and OLMo 2 write it: each head's q and k normalized by ``F.rms_norm`` with a
    learned weight, then causal SDPA (the suite's qknorm normalizes keys already transposed)."""

    def __init__(self, head_dim: int = 64):
        super().__init__()
        self.q_weight = nn.Parameter(1 + torch.randn(head_dim) / 8)
        self.k_weight = nn.Parameter(1 + torch.randn(head_dim) / 8)

    def forward(self, q, k, v):
        q = F.rms_norm(q, (q.shape[-1],), self.q_weight, eps=1e-6)
        k = F.rms_norm(k, (k.shape[-1],), self.k_weight, eps=1e-6)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class BertSelfAttention(nn.Module):
    """Hugging Face BERT's eager self-attention: three projections, each split into heads by
    ``view(b, s, h, d).permute(0, 2, 1, 3)`` (views that no copy makes dense), scaled scores, softmax,
    values, heads merged back."""

    def __init__(self, hidden: int = 768, heads: int = 12):
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

    def split(self, x):
        return x.view(*x.shape[:2], self.heads, self.dim).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return context.permute(0, 2, 1, 3).reshape(x.shape)


class ViTAttention(nn.Module):
    """timm's ViT attention: one qkv product split by ``reshape(b, n, 3, h, d).permute(2, 0, 3, 1, 4)``."""

    def __init__(self, dim: int = 384, heads: int = 6):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v)
        return self.proj(o.transpose(1, 2).reshape(b, n, c))


class BertOutput(nn.Module):
    """BERT's output block: the down projection, then a residual and a LayerNorm of its rows."""

    def __init__(self, inner: int = 3072, hidden: int = 768):
        super().__init__()
        self.dense, self.norm = nn.Linear(inner, hidden), nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, h, x):
        return self.norm(self.dense(h) + x)


class LlamaAttention(nn.Module):
    """Llama's self-attention as Hugging Face writes it, without rotary embeddings (``rotary_attention``
    has them): q, k and v projections of one input (grouped-query heads: 16 query heads, 4 key
    heads), split into heads by ``view(b, s, h, d).transpose(1, 2)``, causal SDPA, heads merged back by
    ``transpose(1, 2).reshape(b, s, h·d)``, the output projection."""

    def __init__(self, hidden: int = 1024, heads: int = 16, kv_heads: int = 4):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    """A pre-norm MLP block: LayerNorm, a gated product, its down projection and the residual."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(512)
        self.gate = nn.Linear(512, 1024, bias=False)
        self.up = nn.Linear(512, 1024, bias=False)
        self.down = nn.Linear(1024, 512, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm: the mean of squares in float32, the weight after the cast back."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        wide = x.to(torch.float32)
        variance = wide.pow(2).mean(-1, keepdim=True)
        return self.weight * (wide * torch.rsqrt(variance + self.eps)).to(x.dtype)


class LlamaLayer(nn.Module):
    """A whole Llama decoder layer as Hugging Face writes it: RMSNorm, q/k/v projections, rotary
    embedding (``rotate_half`` by slices, tables as buffers), grouped-query heads repeated, causal SDPA,
    the output projection and residual, RMSNorm, the SwiGLU MLP and its residual."""

    def __init__(self, dim: int = 512, heads: int = 8, kv_heads: int = 2, inner: int = 1376,
                 tokens: int = 128):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.ln1, self.ln2 = LlamaRMSNorm(dim), LlamaRMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k, self.v = (nn.Linear(dim, kv_heads * self.head_dim, bias=False) for _ in range(2))
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate, self.up = (nn.Linear(dim, inner, bias=False) for _ in range(2))
        self.down = nn.Linear(inner, dim, bias=False)
        inverse = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(tokens).float(), inverse)
        angles = torch.cat((angles, angles), -1)[None, None]
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    def heads_of(self, x, heads):
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = self.heads_of(self.q(h), self.heads), self.heads_of(self.k(h), self.kv_heads), \
            self.heads_of(self.v(h), self.kv_heads)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        q = q * cos + RotaryAttention.rotate_half(q) * sin
        k = k * cos + RotaryAttention.rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))

class GPT2Block(nn.Module):
    """A whole GPT-2 block as nanoGPT writes it: LayerNorm, one qkv product split by ``split``, causal
    SDPA, heads merged by ``contiguous().view``, the projection and residual, LayerNorm, the tanh-GELU
    MLP and its residual."""

    def __init__(self, dim: int = 384, heads: int = 6):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class AlibiAttention(nn.Module):
    """Bloom's attention: ``baddbmm(alibi, q, kᵀ, beta=1, alpha=1/√d)`` adds the ALiBi bias while it
    scales the scores, on 3-D (batch · heads, tokens, dim) tensors."""

    def forward(self, q, k, v, alibi):
        scores = torch.baddbmm(alibi, q, k.transpose(1, 2), beta=1.0, alpha=1 / math.sqrt(q.shape[-1]))
        return torch.bmm(torch.softmax(scores, -1), v)


class CosineSimilarity(nn.Module):
    """CLIP's logits: both sides L2-normalized by ``F.normalize``, then one product."""

    def forward(self, x, y):
        return F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).t()


class ChunkedGLU(nn.Module):
    """A gated linear unit whose gate and value are the halves of one projection (``chunk(2, -1)``)."""

    def __init__(self, dim: int = 512, inner: int = 1024):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * inner)

    def forward(self, x):
        value, gate = self.proj(x).chunk(2, -1)
        return value * F.silu(gate)


class ConvBlock(nn.Module):
    """A convolution, BatchNorm in eval mode and ReLU: the convolution has no µGraph lowering; the norm
    (each channel's affine map, at capture) and the ReLU are one subprogram."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


class MambaDt(nn.Module):
    """Mamba's step sizes: the low-rank projection up to the inner width, its bias, then softplus."""

    def __init__(self, rank: int = 48, inner: int = 1536):
        super().__init__()
        self.dt_proj = nn.Linear(rank, inner)

    def forward(self, x):
        return F.softplus(self.dt_proj(x))


class MishMLP(nn.Module):
    """An MLP with Mish between its two projections (YOLOv4's activation)."""

    def __init__(self, dim: int = 512, inner: int = 1024):
        super().__init__()
        self.up, self.down = nn.Linear(dim, inner), nn.Linear(inner, dim)

    def forward(self, x):
        return self.down(F.mish(self.up(x)))


class GroupNormSiLU(nn.Module):
    """A diffusion U-Net's norm and activation: ``nn.GroupNorm`` (32 groups), then SiLU."""

    def __init__(self, channels: int = 320, groups: int = 32):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x):
        return F.silu(self.norm(x))


PROGRAMS = {
    "gate": (Gate, [(8, 1024), (8, 1024), (8, 1024)]),
    "softmax_projection": (SoftmaxProjection, [(16, 256)]),
    "norm_projection": (NormProjection, [(4, 512)]),
    "swiglu": (SwiGLU, [(4, 512)]),
    "block": (Block, [(8, 512)]),
    "gelu_projection": (GeluProjection, [(8, 768)]),
    "layernorm_projection": (LayerNormProjection, [(4, 512)]),
    "bert_mlp": (BertMLP, [(8, 384)]),
    "bert_attention": (BertSelfAttention, [(1, 128, 768)]),
    "bert_attention_b2": (BertSelfAttention, [(2, 128, 768)]),  # (batch · heads) of two strides
    "bert_output": (BertOutput, [(128, 3072), (128, 768)]),
    "llama_layer": (LlamaLayer, [(1, 128, 512)]),  # a whole decoder layer: 35 torch ops
    "gpt2_block": (GPT2Block, [(1, 128, 384)]),
    "alibi_attention": (AlibiAttention, [(16, 128, 64)] * 3 + [(16, 128, 128)]),
    "cosine_similarity": (CosineSimilarity, [(64, 512), (256, 512)]),
    "chunked_glu": (ChunkedGLU, [(8, 512)]),
    "conv_block": (ConvBlock, [(2, 16, 32, 32)]),
    "groupnorm_silu": (functools.partial(GroupNormSiLU, 64, 8), [(2, 64, 16, 16)]),  # groups of 2,048
    "sd_groupnorm_silu": (GroupNormSiLU, [(2, 320, 64, 64)]),  # SD's first level: groups of 40,960
    "sd_groupnorm_silu_640": (functools.partial(GroupNormSiLU, 640), [(2, 640, 32, 32)]),  # its second
    "sd_groupnorm_silu_b8": (GroupNormSiLU, [(8, 320, 64, 64)]),  # a batch of 8: 256 rows of 40,960
    "style_instance_norm": (InstanceNormReLU, [(1, 64, 256, 256)]),  # 64 rows of 65,536
    "mamba_dt": (MambaDt, [(1, 512, 48)]),
    "mish_mlp": (MishMLP, [(8, 512)]),
    "log_softmax_head": (LogSoftmaxHead, [(32, 768)]),
    "token_log_probs": (LogProbs, [(8, 32000)]),  # Llama's vocabulary
    "llama3_log_probs": (LogProbs, [(4, 128256)]),  # Llama 3's vocabulary: split rows
    "gpt2_log_probs": (LogProbs, [(8, 50257)]),  # GPT-2's: 29 slices of 1,733 columns
    "batch_log_probs": (LogProbs, [(64, 32000)]),  # 64 rows: split rows since they take up to 256
    "token_probs": (TokenProbs, [(8, 32000)]),
    "token_loss": (TokenLoss, [(8, 32000)]),  # the log_softmax lowered, the targets' pick in PyTorch
    "t5_feed_forward": (T5FeedForward, [(1, 128, 512)]),
    "rwkv_channel_mix": (RWKVChannelMix, [(1, 128, 768)]),
    "moe_router": (MoERouter, [(128, 1024)]),
    "convnext_mlp": (ConvNeXtMLP, [(2, 96, 28, 28)]),
    "vit_attention_b2": (ViTAttention, [(2, 197, 384)]),  # timm's ViT-S: 197 tokens, 6 heads, one qkv
    "llama_attention": (LlamaAttention, [(1, 256, 1024)]),
    "prefill_projection": (functools.partial(nn.Linear, 768, 768), [(1, 128, 768)]),  # BERT's, alone
    "heads_attention": (HeadsAttention, [(2, 8, 128, 64)] * 3),
    "vit_heads_attention": (HeadsAttention, [(1, 12, 197, 64)] * 3),  # ViT-B's 197 tokens: uneven grids
    "clip_heads_attention": (HeadsAttention, [(1, 8, 77, 64)] * 3),  # CLIP's text tower: 77 tokens
    "clip_causal_attention": (CausalAttention, [(1, 8, 77, 64)] * 3),  # CLIP's text tower is causal
    # a prompt of 100 tokens: blocks of 15 or 50 query rows, each run in whole 16-row tiles (padded)
    "prompt_attention": (HeadsAttention, [(1, 12, 100, 64)] * 3),
    "prompt_causal_attention": (CausalAttention, [(1, 12, 100, 64)] * 3),
    # Llama-style grouped heads over the 100-token prompt: 4 query heads a key head fold into 400 rows
    "prompt_grouped_attention": (GroupedCausalAttention, [(1, 32, 100, 64)] + [(1, 8, 100, 64)] * 2),
    # a bias of the scores over ViT's 197 tokens (BEiT's relative positions, here shared by the heads)
    "vit_biased_attention": (BiasedAttention, [(1, 12, 197, 64)] * 3 + [(197, 197)]),
    # Stable Diffusion's cross-attention at 32 × 32 latents: 1024 queries over CLIP's 77 text tokens
    "sd_cross_attention": (HeadsAttention, [(2, 8, 1024, 80)] + [(2, 8, 77, 80)] * 2),
    # Stable Diffusion 1.5's first level (64 × 64 latents, 8 heads of 40): its cross- and self-attention
    "sd15_cross_attention": (PrefillAttention, [(2, 8, 4096, 40)] + [(2, 8, 77, 40)] * 2),
    "sd15_self_attention": (PrefillAttention, [(2, 8, 4096, 40)] * 3),
    # its third level (16 × 16 latents, heads of 160: the one-kernel body over the search's default
    # shared-memory estimate) and DiT-XL/2's heads of 72 over 256 patches
    "sd15_deep_self_attention": (PrefillAttention, [(2, 8, 256, 160)] * 3),
    "dit_attention": (PrefillAttention, [(2, 16, 256, 72)] * 3),
    "prefill_attention": (PrefillAttention, [(1, 12, 512, 64)] * 3),
    "causal_attention": (CausalAttention, [(1, 12, 512, 64)] * 3),
    "biased_attention": (BiasedAttention, [(1, 12, 512, 64)] * 3 + [(512, 512)]),
    "nano_causal_attention": (NanoCausalAttention, [(1, 12, 512, 64)] * 3),
    "grouped_causal_attention": (GroupedCausalAttention, [(1, 32, 256, 64)] + [(1, 8, 256, 64)] * 2),
    "long_causal_attention": (CausalAttention, [(1, 16, 2048, 64)] * 3),
    "windowed_attention": (WindowedAttention, [(1, 12, 512, 64)] * 3),
    "padded_attention": (PaddedAttention, [(4, 12, 256, 64)] * 3),
    "wide_head_attention": (WideHeadAttention, [(1, 16, 1024, 128)] * 3),
    "decode_attention": (DecodeAttention, [(1, 32, 1, 128)] + [(1, 32, 4096, 128)] * 2),
    "float32_softmax": (Float32Softmax, [(1, 12, 512, 64)] * 3),
    "inplace_mlp": (InplaceMLP, [(16, 512)]),
    "stable_attention": (StableAttention, [(1, 12, 512, 64)] * 3),
    "shifted_attention": (ShiftedAttention, [(1, 12, 512, 64)] * 3),
    "einsum_attention": (EinsumAttention, [(1, 12, 512, 64)] * 3),
    "gpt2_attention": (GPT2Attention, [(1, 12, 512, 64)] * 3),
    "softcap_attention": (SoftcapAttention, [(1, 8, 256, 64)] * 3),
    "t5_attention": (T5Attention, [(1, 8, 128, 64)] * 3),
    "qknorm_attention": (QKNormAttention, [(1, 16, 256, 64)] * 3),
    "rotary_attention": (RotaryAttention, [(1, 32, 256, 64)] + [(1, 8, 256, 64)] * 2 + [(1, 1, 256, 64)] * 2),
}
PROGRAMS.update(MODEL_PROGRAMS)  # benchmarks.unseen_models: more model families


# µGraphs written by hand for programs whose search did not reach them (docs/performance.md): each is
# also run as the only candidate (``search=False``), timed as given_us, against what the search found
GIVEN = {
    "softcap_attention": lambda: one_kernel(heads=8, queries=256, keys=256, dim=64, rows=64, key_tile=64,
                                            cap=50.0),
}


def _op_text(node) -> str:
    """A kernel-graph op's name; a fused kernel (``customized``) adds its grid (and the spans of an uneven
    one) and loop count."""
    block = node.attrs if isinstance(node.attrs, BlockGraph) else None
    spans = f" spans={block.spans}" if block is not None and any(block.spans) else ""
    return node.op.value if block is None else (
        f"{node.op.value} grid={block.grid_dim}{spans} loop={block.forloop_range}")


def _kernels(fast) -> dict[str, list[str]]:
    """The ops of the kernel graph chosen for each subprogram (a ``customized`` op is one fused kernel)."""
    return {name: [_op_text(n) for n in choice.graph.nodes if n.op.value != "input"]
            for spec in fast.specializations for name, choice in spec.choices.items()}


def _read_in_place(fast) -> dict[str, list[str]]:
    """Per subprogram, the inputs its compiled kernels read in place where they arrive transposed
    (``mirage.codegen.column_major``); empty before the first call, or off the GPU."""
    from mirage.frontend.runtime import SubprogramModule

    return {name: module.read_in_place for spec in fast.specializations
            for name, module in spec.module.named_children()
            if isinstance(module, SubprogramModule) and module.read_in_place}


def _reference(model, inputs) -> tuple[object, str]:
    """The outputs to measure errors against: a float64 copy of the model on float64 inputs, or where it
    does not run so (an op of no float64 kernel), the model's own; and which of the two."""
    with torch.no_grad():
        try:
            return copy.deepcopy(model).double()(*(x.double() for x in inputs)), "float64"
        except (RuntimeError, TypeError, NotImplementedError):
            return model(*inputs), "eager"


def _relative_error(fn, inputs, want) -> float:
    """The largest error of any of ``fn``'s outputs against ``want``, relative to that output's largest
    value."""
    with torch.no_grad():
        got = fn(*inputs)
    pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
    return max(((g.double() - w.double()).abs().max() / w.double().abs().max()).item() for g, w in pairs)


def main(argv=None) -> None:
    from benchmarks.stream_floor import program_arguments, write_record

    args = program_arguments(__doc__, argv, time_limit=15.0, compile_option=True)
    wanted = args.wanted
    from mirage.codegen.profile import device_facts, time_graph
    from mirage.frontend import graphs

    device = "cuda" if torch.cuda.is_available() else "cpu"
    facts = device_facts() if device == "cuda" else {"device": "cpu", "date": time.strftime("%Y-%m-%d")}
    rows = []
    torch.manual_seed(0)
    for name, (cls, shapes) in PROGRAMS.items():
        if wanted and name not in wanted:
            continue
        model = cls().to(device).half().eval()
        inputs = tuple(torch.randn(s, device=device).half() for s in shapes)
        start = time.time()
        row = {"program": name, "time_limit_s": args.time_limit, "split_rounds": args.split_rounds}
        try:
            fast = mi.superoptimize(model, inputs, time_limit_s=args.time_limit, use_cache=False,
                                    progress=False, split_rounds=args.split_rounds)
            # against float64 (``reference``), with eager PyTorch's own error beside it: an error of ours
            # above eager's is what to look at, one of both is the program's (its float16 rounding)
            want, row["reference"] = _reference(model, inputs)
            row["relative_error"] = _relative_error(fast, inputs, want)
            row["eager_relative_error"] = _relative_error(model, inputs, want)
            row["seconds"] = time.time() - start
            row["report"] = fast.report()
            row["kernels"] = _kernels(fast)
            row["read_in_place"] = _read_in_place(fast)
            if device == "cuda":
                with torch.no_grad():
                    # mirage_us: calls from Python (a transposed weight that no kernel reads in place is
                    # copied once per version);
                    # mirage_graph_us: in a caller's CUDA graph (frontend.graphs)
                    timed = [("eager_us", model, False), ("mirage_us", fast, True),
                             ("mirage_graph_us", fast, False)]
                    if hasattr(model, "fused"):
                        timed.append(("sdpa_us", model.fused, False))
                    if args.compile:
                        compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
                        compiled(*inputs)  # compiled and tuned here, not inside the timing
                        timed.append(("torch_compile_us", compiled, False))
                    if name in GIVEN:
                        given = mi.superoptimize(model, inputs, search=False, candidates=[GIVEN[name]()],
                                                 use_cache=False, progress=False)
                        row["given_relative_error"] = _relative_error(given, inputs, want)
                        row["given_kernels"] = _kernels(given)
                        timed += [("given_us", given, True), ("given_graph_us", given, False)]
                    for key, fn, calls in timed:
                        with graphs.standing_for_calls() if calls else contextlib.nullcontext():
                            row[key] = time_graph(lambda fn=fn, xs=inputs: fn(*xs), replays=100).median_us
        except mi.MirageError as error:
            row["error"] = f"{type(error).__name__}: {error}"
        rows.append(row)
        print({k: v for k, v in row.items() if k != "report"}, flush=True)
        write_record(args.out, "unseen", facts, rows)  # after each program: a cut-off run keeps its rows


if __name__ == "__main__":
    main()
