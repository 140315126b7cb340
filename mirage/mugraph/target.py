"""Facts about GPUs that graphs and kernels depend on, as data (read from the device when present)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    compute_capability: int  # 90 for sm_90
    smem_per_block: int  # bytes of shared memory one block may use (opt-in maximum)
    sm_count: int
    max_threads_per_block: int = 1024
    max_blocks_per_kernel: int = 4096  # search-space bound, as Mirage's
    arch_suffix: str = ""  # "a" for the architecture-specific sm_90a features

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability}{self.arch_suffix}"

    @property
    def gencode(self) -> str:
        cc = f"{self.compute_capability}{self.arch_suffix}"
        return f"-gencode=arch=compute_{cc},code=sm_{cc}"


TARGETS = {
    "H100": Target("H100", 90, 227 * 1024, 132, arch_suffix="a"),
    "H200": Target("H200", 90, 227 * 1024, 132, arch_suffix="a"),
    "A100": Target("A100", 80, 163 * 1024, 108),
    "L40S": Target("L40S", 89, 99 * 1024, 142),
}
DEFAULT_TARGET = TARGETS["H100"]


def detect_target() -> Target:
    """The current CUDA device's target, or the default (H100) when there is no GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return DEFAULT_TARGET
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - no usable CUDA runtime means the default target
        return DEFAULT_TARGET
    cc = props.major * 10 + props.minor
    smem = getattr(props, "shared_memory_per_block_optin", DEFAULT_TARGET.smem_per_block)
    return Target(props.name, cc, int(smem), props.multi_processor_count,
                  arch_suffix="a" if cc == 90 else "")
