"""More programs of no test for ``benchmarks.unseen``: blocks as other model families write them."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LogSoftmaxHead(nn.Module):
    """A classifier's log-probabilities: a projection to 1,000 classes, then ``log_softmax``."""

    def __init__(self, dim: int = 768, classes: int = 1000):
        super().__init__()
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return F.log_softmax(self.head(x), -1)


class LogProbs(nn.Module):
    """A sampler's log-probabilities of next tokens: logits over a vocabulary, divided by a temperature."""

    def forward(self, logits):
        return torch.log_softmax(logits / 0.7, -1)


class TokenProbs(nn.Module):
    """A sampler's probabilities of next tokens: the softmax of logits divided by a temperature."""

    def forward(self, logits):
        return torch.softmax(logits / 0.7, -1)


class TokenLoss(nn.Module):
    """Each token's cross-entropy against its target (an evaluation's per-token loss): the targets are
    a buffer, as the program's inputs are the logits alone."""

    def __init__(self, rows: int = 8, vocabulary: int = 32000):
        super().__init__()
        seeded = torch.Generator().manual_seed(0)
        self.register_buffer("targets", torch.randint(0, vocabulary, (rows,), generator=seeded))

    def forward(self, logits):
        return F.cross_entropy(logits, self.targets, reduction="none")


class InstanceNormReLU(nn.Module):
    """A style-transfer network's norm and activation: ``nn.InstanceNorm2d`` with a gain and bias per
    channel, then ReLU (fast neural style's residual blocks)."""

    def __init__(self, channels: int = 64):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels, affine=True)

    def forward(self, x):
        return torch.relu(self.norm(x))


class T5FeedForward(nn.Module):
    """T5's feed-forward layer: its RMS norm written out (no mean subtracted), ReLU, the residual."""

    def __init__(self, dim: int = 512, inner: int = 2048):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.wi, self.wo = nn.Linear(dim, inner, bias=False), nn.Linear(inner, dim, bias=False)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return x + self.wo(F.relu(self.wi(h)))


class RWKVChannelMix(nn.Module):
    """RWKV's channel mixing: a squared ReLU key, its value projection, gated by a sigmoid receptance."""

    def __init__(self, dim: int = 768):
        super().__init__()
        self.key, self.value = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)
        self.receptance = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return torch.sigmoid(self.receptance(x)) * self.value(torch.square(torch.relu(self.key(x))))


class MoERouter(nn.Module):
    """A mixture-of-experts router: the experts' probabilities and the z-loss of its logits
    (the mean squared logsumexp, ST-MoE's)."""

    def __init__(self, dim: int = 1024, experts: int = 64):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)

    def forward(self, x):
        logits = self.gate(x)
        return torch.softmax(logits, -1), torch.logsumexp(logits, -1).square().mean()


class ConvNeXtMLP(nn.Module):
    """ConvNeXt's block after its depthwise convolution: channels moved last, LayerNorm, an MLP with
    GELU, a layer scale, channels moved back, the residual."""

    def __init__(self, channels: int = 96):
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.fc1, self.fc2 = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.full((channels,), 0.1))

    def forward(self, x):
        y = self.fc2(F.gelu(self.fc1(self.norm(x.permute(0, 2, 3, 1))))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class GemmaMLP(nn.Module):
    """Gemma's feed-forward layer: a GEGLU whose gate goes through the tanh-approximate GELU."""

    def __init__(self, dim: int = 512, inner: int = 2048):
        super().__init__()
        self.gate_proj, self.up_proj = (nn.Linear(dim, inner, bias=False) for _ in range(2))
        self.down_proj = nn.Linear(inner, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``x · rsqrt(mean(x²) + eps) · (1 + w)`` all in float32, then cast back."""

    def __init__(self, dim: int = 2048, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.randn(dim) / 10), eps

    def forward(self, x):
        wide = x.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class FusedAddRMSNorm(nn.Module):
    """vLLM's fused_add_rms_norm (its native form): the residual sum and its RMSNorm, both returned."""

    def __init__(self, dim: int = 4096, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x, residual):
        x = x + residual
        residual = x
        wide = x.float()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return wide.to(x.dtype) * self.weight, residual


class DistillationLoss(nn.Module):
    """Knowledge distillation (Hinton's): each row's KL divergence of the student's tempered
    log-probabilities from the teacher's (``kl_div`` with ``log_target``), times T²."""

    def __init__(self, temperature: float = 2.0):
        super().__init__()
        self.t = temperature

    def forward(self, student, teacher):
        t = self.t
        kl = F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), reduction="none",
                      log_target=True)
        return kl.sum(-1) * (t * t)


class DenseFeatureNorm(nn.Module):
    """DenseCL's dense projection head output: each location's features L2-normalized over the
    channels of a (batch, channels, locations) tensor (``F.normalize(x, dim=1)``)."""

    def forward(self, x):
        return F.normalize(x, dim=1)


class SlotAttentionStep(nn.Module):
    """Slot Attention's (Locatello et al.) routing: the softmax over the slots (dim 1), each slot's
    weights renormalized over the inputs, then the weighted mean of the values."""

    def forward(self, slots, k, v):
        attn = torch.einsum("bid,bjd->bij", slots, k) * slots.shape[-1] ** -0.5
        attn = attn.softmax(dim=1) + 1e-8
        attn = attn / attn.sum(dim=-1, keepdim=True)
        return torch.einsum("bjd,bij->bid", v, attn)


class SigLIPLoss(nn.Module):
    """SigLIP's pairwise sigmoid loss: normalized embeddings, logits scaled by ``t.exp()`` plus a bias,
    −log σ(label · logit) with +1 on the diagonal and −1 elsewhere (a buffer), summed over pairs."""

    def __init__(self, batch: int = 16):
        super().__init__()
        self.t_prime = nn.Parameter(torch.tensor(math.log(10.0)))
        self.b = nn.Parameter(torch.tensor(-10.0))
        self.register_buffer("labels", 2 * torch.eye(batch) - 1)

    def forward(self, image, text):
        logits = F.normalize(image, dim=-1) @ F.normalize(text, dim=-1).t() * self.t_prime.exp() + self.b
        return -F.logsigmoid(self.labels * logits).sum() / image.shape[0]


class DiTModulate(nn.Module):
    """DiT's adaLN modulation: a LayerNorm without affine parameters, then ``x · (1 + scale) + shift``
    with shift and scale projected from the SiLU of the conditioning vector."""

    def __init__(self, dim: int = 384):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ada = nn.Linear(dim, 2 * dim)

    def forward(self, x, c):
        shift, scale = self.ada(F.silu(c)).chunk(2, dim=1)
        return self.norm(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class SpectrogramNorm(nn.Module):
    """An audio tagger's input norm: each clip's log-mel spectrogram normalized over its frames and mel
    bins together (``nn.LayerNorm((frames, mels))``, affine)."""

    def __init__(self, frames: int = 100, mels: int = 80):
        super().__init__()
        self.norm = nn.LayerNorm((frames, mels))

    def forward(self, x):
        return self.norm(x)


class MixtralRouter(nn.Module):
    """Mixtral's router: the gate's softmax in float32, the top 2 experts (``topk``), their weights
    renormalized and cast back; returns the weights and the experts chosen."""

    def __init__(self, dim: int = 512, experts: int = 8, top: int = 2):
        super().__init__()
        self.gate, self.top = nn.Linear(dim, experts, bias=False), top

    def forward(self, x):
        weights = F.softmax(self.gate(x), dim=1, dtype=torch.float)
        weights, experts = torch.topk(weights, self.top, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts


class GPTJRotary(nn.Module):
    """GPT-J's rotary embedding of (batch, tokens, heads, dim) queries: the first 64 dims rotated in
    interleaved pairs (``x[..., ::2]``, ``x[..., 1::2]``, stacked and flattened), the rest passed on."""

    def __init__(self, tokens: int = 128, rotary: int = 64):
        super().__init__()
        self.rotary = rotary
        inverse = 1.0 / (10000 ** (torch.arange(0, rotary, 2).float() / rotary))
        angles = torch.outer(torch.arange(tokens).float(), inverse).repeat_interleave(2, -1)[None, :, None]
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())

    @staticmethod
    def rotate_every_two(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

    def forward(self, q):
        rot, rest = q[..., :self.rotary], q[..., self.rotary:]
        rot = rot * self.cos + self.rotate_every_two(rot) * self.sin
        return torch.cat([rot, rest], dim=-1)


class AdamWStep(nn.Module):
    """One AdamW step written out element-wise (as a foreach-free optimizer does): the moments
    updated, bias-corrected, and the decoupled weight decay; the second moment is a positive buffer."""

    def __init__(self, shape=(256, 1024), lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 decay: float = 0.01, step: int = 10):
        super().__init__()
        self.lr, self.betas, self.eps, self.decay, self.step = lr, betas, eps, decay, step
        self.register_buffer("v", torch.rand(shape, generator=torch.Generator().manual_seed(0)) + 0.1)

    def forward(self, p, g, m):
        b1, b2 = self.betas
        m = b1 * m + (1 - b1) * g
        v = b2 * self.v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** self.step), v / (1 - b2 ** self.step)
        return p - self.lr * (m_hat / (torch.sqrt(v_hat) + self.eps) + self.decay * p), m, v


class MinPFilter(nn.Module):
    """Min-p sampling (Hugging Face's MinPLogitsWarper): tokens whose probability is under 0.1 of the
    top one are hidden with ``masked_fill(-inf)``, then the softmax of what is left."""

    def forward(self, logits):
        probs = torch.softmax(logits, dim=-1)
        hidden = probs < 0.1 * probs.amax(dim=-1, keepdim=True)
        return torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1)


class CumulativeLayerNorm(nn.Module):
    """Conv-TasNet's causal cumulative LayerNorm (cLN) on (batch, channels, frames): running means and
    variances over all channels of the frames so far (``cumsum``), then a gain and bias a channel."""

    def __init__(self, channels: int = 128, frames: int = 64, eps: float = 1e-8):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(1, channels, 1))
        self.bias = nn.Parameter(torch.zeros(1, channels, 1))
        self.register_buffer("count", torch.arange(channels, channels * (frames + 1), channels).float())
        self.eps = eps

    def forward(self, x):
        cum_sum = torch.cumsum(x.sum(1), dim=1)
        cum_pow_sum = torch.cumsum(x.pow(2).sum(1), dim=1)
        cum_mean = cum_sum / self.count
        cum_var = (cum_pow_sum - 2 * cum_mean * cum_sum) / self.count + cum_mean.pow(2)
        cum_std = (cum_var + self.eps).sqrt()
        return (x - cum_mean.unsqueeze(1)) / cum_std.unsqueeze(1) * self.gain + self.bias


class RMSpropStep(nn.Module):
    """RMSprop with momentum written out element-wise (Keras' defaults): the mean square (a positive
    buffer), the step scaled by its root, the momentum buffer; three outputs."""

    def __init__(self, shape=(512, 1024), lr: float = 1e-3, alpha: float = 0.9, eps: float = 1e-7,
                 momentum: float = 0.9):
        super().__init__()
        self.lr, self.alpha, self.eps, self.momentum = lr, alpha, eps, momentum
        self.register_buffer("square", torch.rand(shape, generator=torch.Generator().manual_seed(0)) + 0.1)

    def forward(self, p, g, buf):
        square = self.alpha * self.square + (1 - self.alpha) * g * g
        buf = self.momentum * buf + g / (torch.sqrt(square) + self.eps)
        return p - self.lr * buf, square, buf


class SnakeActivation(nn.Module):
    """BigVGAN's Snake activation, ``x + sin²(αx) / α`` with a learned α a channel, on (batch, channels,
    frames) activations: α broadcasts over the batch and the frames."""

    def __init__(self, channels: int = 256):
        super().__init__()
        self.alpha = nn.Parameter(torch.rand(1, channels, 1) + 0.5)

    def forward(self, x):
        return x + torch.sin(self.alpha * x) ** 2 / (self.alpha + 1e-9)


MODEL_PROGRAMS = {
    "gemma_mlp": (GemmaMLP, [(16, 512)]),
    "gemma_rms_norm": (GemmaRMSNorm, [(1, 64, 2048)]),
    "fused_add_rms_norm": (FusedAddRMSNorm, [(32, 4096), (32, 4096)]),  # two outputs
    "distillation_loss": (DistillationLoss, [(32, 1000), (32, 1000)]),
    "dense_feature_norm": (DenseFeatureNorm, [(4, 256, 128)]),  # a norm over dim 1 of 3
    "slot_attention": (SlotAttentionStep, [(2, 8, 64), (2, 128, 64), (2, 128, 64)]),  # softmax over dim 1
    "siglip_loss": (SigLIPLoss, [(16, 512), (16, 512)]),
    "dit_modulate": (DiTModulate, [(2, 64, 384), (2, 384)]),
    "spectrogram_norm": (SpectrogramNorm, [(4, 100, 80)]),  # LayerNorm over the last two dims
    "mixtral_router": (MixtralRouter, [(64, 512)]),  # topk stays in PyTorch
    "gptj_rotary": (GPTJRotary, [(1, 128, 8, 128)]),  # strided slices
    "adamw_step": (AdamWStep, [(256, 1024)] * 3),  # three outputs
    "min_p_filter": (MinPFilter, [(8, 32000)]),  # amax and masked_fill
    "cumulative_layer_norm": (CumulativeLayerNorm, [(2, 128, 64)]),  # cumsum
    "rmsprop_step": (RMSpropStep, [(512, 1024)] * 3),  # element-wise, three outputs
    "snake_activation": (SnakeActivation, [(4, 256, 512)]),  # α a channel, over batch and frames
}
