"""A deterministic stand-in for GPU timing: a schedule is faster the earlier its memory instructions
issue.  Lets the search policies be tested on the CPU against a landscape with a known direction."""

from __future__ import annotations

from mirage.sass.elf import Cubin
from mirage.sass.evaluate import CandidateResult, CandidateStatus
from mirage.sass.kernel import Kernel


class SyntheticMeasure:
    def __init__(self, kernel: Kernel, fail_every: int = 0) -> None:
        self.kernel = kernel
        self.memory_words = {ins.low for ins in kernel.instructions if ins.memory is not None}
        self.base = self._cost(kernel.text_bytes())
        self.fail_every = fail_every
        self.calls = 0

    def _cost(self, text: bytes) -> float:
        lows = [int.from_bytes(text[i: i + 8], "little") for i in range(0, len(text), 16)]
        return 1000.0 + sum(position for position, low in enumerate(lows) if low in self.memory_words)

    def __call__(self, cubin: Cubin) -> CandidateResult:
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            return CandidateResult(CandidateStatus.WRONG_OUTPUT, detail="synthetic failure")
        cost = self._cost(cubin.text(self.kernel.name))
        return CandidateResult(CandidateStatus.OK, speedup=self.base / cost, original_us=self.base,
                               candidate_us=cost)

    def verify(self, cubin: Cubin, input_sets: int) -> CandidateResult:
        return CandidateResult(CandidateStatus.OK, detail=f"{input_sets} synthetic sets")
