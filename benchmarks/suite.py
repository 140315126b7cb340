"""The benchmark programs of BENCHMARKS.md in plain PyTorch, with their inputs and baselines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

EPS = 1e-6


def rms(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(dim, keepdim=True).to(x.dtype) + EPS)


def gqa(q, k, v):
    return torch.softmax((q @ k) / 8, dim=-1) @ v


def qknorm(q, k, v):
    return torch.softmax((rms(q) @ rms(k, dim=1)) / 8, dim=-1) @ v


def rmsnorm(x, g, w):
    return (rms(x) * g) @ w


def ntrans(h, x, a):
    return rms(x + a * (rms(h) - x))


def lora(x, w, la, lb):
    return x @ w + (x @ la) @ lb


def gatedmlp(x, w1, w2):
    return F.silu(x @ w1) * (x @ w2)


PROGRAMS: dict[str, Callable] = {"gqa": gqa, "qknorm": qknorm, "rmsnorm": rmsnorm, "ntrans": ntrans,
                                 "lora": lora, "gatedmlp": gatedmlp}


def shapes(program: str, size: int) -> list[tuple[int, ...]]:
    b = size
    return {
        "gqa": [(2 * b, 256, 64), (2 * b, 64, 4096), (2 * b, 4096, 64)],
        "qknorm": [(2 * b, 256, 64), (2 * b, 64, 4096), (2 * b, 4096, 64)],
        "rmsnorm": [(2 * b, 4096), (4096,), (4096, 6144)],
        "ntrans": [(b, 4096)] * 3,
        "lora": [(size, 256), (256, 4096), (256, 16), (16, 4096)],
        "gatedmlp": [(size, 4096), (4096, 4096), (4096, 4096)],
    }[program]


@dataclass(frozen=True)
class Workload:
    name: str
    program: str
    size: int

    def inputs(self, device: str = "cuda", dtype=torch.float16, seed: int = 0) -> list[torch.Tensor]:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return [torch.randn(s, generator=generator).to(device=device, dtype=dtype)
                for s in shapes(self.program, self.size)]

    @property
    def function(self) -> Callable:
        return PROGRAMS[self.program]

    def min_bytes(self, dtype_size: int = 2) -> int:
        """Each input read once, each output written once."""
        total = sum(_numel(s) for s in shapes(self.program, self.size))
        return (total + _numel(self.output_shape())) * dtype_size

    def output_shape(self) -> tuple[int, ...]:
        s = shapes(self.program, self.size)
        match self.program:
            case "gqa" | "qknorm":
                return s[0]
            case "rmsnorm":
                return (s[0][0], s[2][1])
            case "ntrans":
                return s[0]
            case "lora":
                return (s[0][0], s[1][1])
            case "gatedmlp":
                return (s[0][0], s[1][1])
        raise KeyError(self.program)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


WORKLOADS = [Workload(f"{p}_b{b}", p, b) for b in (1, 8) for p in ("gqa", "qknorm", "rmsnorm", "ntrans")]
WORKLOADS += [Workload("lora_m16", "lora", 16)]
WORKLOADS += [Workload(f"gatedmlp_m{m}", "gatedmlp", m) for m in (8, 1)]


def sdpa_baselines(workload: Workload, inputs: list[torch.Tensor]) -> dict[str, Callable]:
    """SDPA with each backend; inputs laid out (batch, heads, seq, dim), keys not transposed."""
    if workload.program not in ("gqa", "qknorm"):
        return {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs
    qs, ks, vs = q.unsqueeze(0), k.transpose(1, 2).contiguous().unsqueeze(0), v.unsqueeze(0)
    normalize = workload.program == "qknorm"
    out = {}
    for name, backend in [("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa_math", SDPBackend.MATH)]:
        def run(backend=backend):
            qq, kk = (rms(qs), rms(ks)) if normalize else (qs, ks)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qq, kk, vs, scale=1 / 8)
        out[name] = run
    return out
