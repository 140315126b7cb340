"""More programs of no test for ``benchmarks.unseen``: blocks as other model families write them."""

from __future__ import annotations

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
