"""Profile-guided selection: compile every candidate, time each on the GPU, keep the fastest that is
right.

``select_fastest(reference, candidates)`` generates CUDA for each candidate µGraph under each
optimizer variant (pipeline depth), compiles them all in parallel, times every program with
CUDA-graph replays on the same inputs (in each launch mode of :data:`LAUNCH_MODES` where the GPU has
programmatic dependent launch: :mod:`mirage.codegen.dependent_launch`), times the builds that could
win again, in turn (:func:`final_round`: one timing each leaves the pick to the GPU's noise of the
moment), then float-checks candidates in order of speed against the reference (float64 on the CPU,
outputs poisoned beforehand) and returns the first that passes. Builds that time within ``ties``
(1 %, about the noise of one timing) of the fastest count as equally fast and keep the candidates'
order, so that two selections over the same candidates pick the same one although their timings
differ by noise. Failures are recorded, never hidden.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mirage.errors import MirageError
from mirage.mugraph.graph import KernelGraph

log = logging.getLogger(__name__)


class SelectionError(MirageError):
    """No candidate compiled, ran and matched the reference."""


@dataclass(frozen=True)
class Variant:
    """One way to build a candidate: the µGraph, the optimizer's pipeline depth, whether inputs
    that every block loads alike are multicast to clusters of blocks (OptimizerOptions.multicast_cluster),
    and whether online-softmax chains run on warpgroup MMAs (OptimizerOptions.warpgroup_softmax), with
    each P·V issued with the next Q·K (OptimizerOptions.defer_values) or not, and with their K and V
    copied by TMA (OptimizerOptions.tma_copies) or not."""

    graph: KernelGraph
    stages: int = 2
    multicast_cluster: int = 0
    warpgroup_softmax: bool = False
    defer_values: bool = False
    tma_copies: bool = False

    @property
    def label(self) -> str:
        multicast = f"/mc{self.multicast_cluster}" if self.multicast_cluster > 1 else ""
        warpgroup = ("/wgd" if self.defer_values else "/wg") if self.warpgroup_softmax else ""
        tma = "/tma" if self.tma_copies else ""
        return f"{self.graph.content_hash()[:10]}/s{self.stages}{multicast}{warpgroup}{tma}"

    @property
    def options(self):
        """The optimizer options of this build."""
        from mirage.codegen.runtime import BuildChoice

        return BuildChoice(self.stages, multicast_cluster=self.multicast_cluster,
                           warpgroup_softmax=self.warpgroup_softmax, defer_values=self.defer_values,
                           tma_copies=self.tma_copies).options()


@dataclass
class Trial:
    variant: Variant
    median_us: float | None = None  # in the faster launch mode
    error: float | None = None
    failure: str | None = None
    dependent_launch: bool = True  # the fastest launch mode (runtime.Program.dependent_launch...
    spread_blocks: bool = False  # ...and Program.spread_blocks)
    launch_us: dict[str, float] = field(default_factory=dict)  # median per launch mode timed
    programs: dict[str, object] = field(default_factory=dict, repr=False)  # the build per launch mode

    def as_dict(self) -> dict:
        return {"variant": self.variant.label, "stages": self.variant.stages,
                "multicast_cluster": self.variant.multicast_cluster,
                "warpgroup_softmax": self.variant.warpgroup_softmax,
                "defer_values": self.variant.defer_values, "tma_copies": self.variant.tma_copies,
                "grids": [b.grid_dim for b in self.variant.graph.block_graphs()],
                "forloop_ranges": [b.forloop_range for b in self.variant.graph.block_graphs()],
                "median_us": self.median_us, "dependent_launch": self.dependent_launch,
                "spread_blocks": self.spread_blocks, "launch_us": self.launch_us,
                "relative_error": self.error, "failure": self.failure}

    @property
    def build(self):
        from mirage.codegen.runtime import BuildChoice

        v = self.variant
        return BuildChoice(v.stages, self.dependent_launch, self.spread_blocks, v.multicast_cluster,
                           v.warpgroup_softmax, v.defer_values, v.tma_copies)


@dataclass
class Selection:
    best: Trial | None
    trials: list[Trial] = field(default_factory=list)
    program: object = None  # the compiled Program of the winner
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"best": self.best.as_dict() if self.best else None, "seconds": self.seconds,
                "trials": [t.as_dict() for t in self.trials]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=1))


# (name, Program.dependent_launch, Program.spread_blocks): the launch modes timed per build
LAUNCH_MODES = (("plain", False, False), ("dependent", True, False), ("dependent_spread", True, True))
# the final round: the builds (in a launch mode) within FINAL_SPREAD of the fastest, FINAL_MOST of them
# at most, each timed FINAL_ROUNDS times more, in turn
FINAL_SPREAD, FINAL_MOST, FINAL_ROUNDS = 0.15, 4, 3


def final_round(trials: Sequence[Trial], time_one, spread: float = FINAL_SPREAD, most: int = FINAL_MOST,
                rounds: int = FINAL_ROUNDS) -> int:
    """Time the builds that could win again, ``rounds`` times each, taking them in turn, and give each
    the median of all its timings; a trial then takes its fastest launch mode anew.  ``time_one``
    times a program (µs).  Timings of one build made seconds apart can differ by more than what
    separates the builds of a small kernel (the unseen programs' gate: its pick timed 1.57 µs in
    selection and 1.29 µs moments later), so the first timings alone may pick by noise.  Returns how
    many builds were timed again."""
    entries = [(t, name, us) for t in trials if t.median_us is not None for name, us in t.launch_us.items()
               if name in t.programs]
    if not entries:
        return 0
    fastest = min(us for _, _, us in entries)
    contenders = sorted((e for e in entries if e[2] <= fastest * (1 + spread)), key=lambda e: e[2])[:most]
    if len(contenders) < 2 or rounds < 1:
        return 0
    times = {(id(t), name): [us] for t, name, us in contenders}
    for _ in range(rounds):
        for t, name, _ in contenders:
            times[(id(t), name)].append(time_one(t.programs[name]))
    modes = {name: (overlap, spread) for name, overlap, spread in LAUNCH_MODES}
    for t, name, _ in contenders:
        t.launch_us[name] = statistics.median(times[(id(t), name)])
    for t in {id(t): t for t, _, _ in contenders}.values():
        name = min(t.launch_us, key=t.launch_us.__getitem__)
        t.median_us, t.program = t.launch_us[name], t.programs[name]  # type: ignore[attr-defined]
        t.dependent_launch, t.spread_blocks = modes[name]
    return len(contenders)


def ranking(trials: Sequence[Trial], ties: float = 0.01) -> list[Trial]:
    """The timed trials in the order their float checks run: those within ``ties`` of the fastest in
    the candidates' order, then the rest by time."""
    timed = [t for t in trials if t.median_us is not None]
    if not timed:
        return []
    fastest = min(t.median_us for t in timed)  # type: ignore[type-var]
    tied = [t for t in timed if t.median_us <= fastest * (1 + ties)]  # type: ignore[operator]
    return tied + sorted((t for t in timed if t not in tied), key=lambda t: t.median_us)  # type: ignore[arg-type]


# the chain's forms a selection may time: (OptimizerOptions.warpgroup_softmax, .defer_values,
# .tma_copies); the deferred P·V only with TMA copies, the in-step one with and without
# (attention_tma_h100_2026-11-23.json: TMA faster in 32 of 36 builds)
WARPGROUP_FORMS = ((False, False, False), (True, False, False), (True, False, True), (True, True, True))
Form = tuple[bool, bool] | tuple[bool, bool, bool]


def variants(candidates: Sequence[KernelGraph], stages: Sequence[int] = (2, 3, 4),
             multicast: Sequence[int] = (0,), warpgroup: Sequence[Form] = ((False, False),)
             ) -> list[Variant]:
    """Every candidate at every depth in ``stages``, multicast size and chain form; the warpgroup forms
    also one stage deeper than ``stages`` goes: their swizzled tiles are unpadded, so the deeper ring
    fits where the warp form's does, and on gqa_b8 every warpgroup member ran fastest at depth 4
    (explore_h100_2026-11-23_depths.json)."""
    deeper = (max(stages) + 1,) if stages and any(form[0] for form in warpgroup) else ()
    return [Variant(g, s, m, *w) for g in candidates for s in (*stages, *deeper) for m in multicast
            for w in warpgroup if s in stages or w[0]]


def select_fastest(reference: KernelGraph, candidates: Sequence[KernelGraph], inputs: Sequence | None = None,
                   stages: Sequence[int] = (2, 3, 4), max_workers: int | None = None,
                   replays: int = 100, ties: float = 0.01, multicast: Sequence[int] = (0, 2),
                   warpgroup: Sequence[Form] = WARPGROUP_FORMS, final_rounds: int = FINAL_ROUNDS
                   ) -> Selection:
    """Build every candidate at every pipeline depth in ``stages`` (and, where the µGraph has inputs
    that every block loads alike, with them multicast to clusters of each size in ``multicast``; where
    it has an online-softmax chain that qualifies, in each of the chain's forms that ``warpgroup``
    lists: warp or warpgroup MMAs, P·V deferred or not, K and V copied by TMA or not), time each on
    the GPU, time the builds that could win ``final_rounds`` times more (:func:`final_round`; 0: not
    at all), and keep the fastest that matches ``reference``."""
    from mirage.codegen import dependent_launch
    from mirage.codegen.gpu_check import check_on_gpu, random_inputs
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.codegen.profile import time_graph
    from mirage.codegen.runtime import build_many

    start = time.perf_counter()
    trials = [Trial(v) for v in variants(candidates, stages, multicast, warpgroup)]
    programs, built = [], []
    seen: set[tuple[str, str]] = set()
    for trial in list(trials):
        try:
            program = generate_cuda_program(trial.variant.graph, None, options=trial.variant.options)
        except MirageError as error:
            if trial.variant.stages not in stages:  # the warpgroup forms' extra depth: only where it fits
                trials.remove(trial)
                continue
            trial.failure = f"generate: {type(error).__name__}: {str(error).splitlines()[0]}"
            continue
        if trial.variant.multicast_cluster > 1 and all(k.cluster_size == 1 for k in program.kernels):
            trials.remove(trial)  # nothing to multicast: the same build as without
            continue
        if trial.variant.warpgroup_softmax and not any(
                k.softmax_chain is not None and k.softmax_chain.warpgroup for k in program.prepared.kernels):
            trials.remove(trial)  # no chain in the warpgroup form: the same build as without
            continue
        if trial.variant.tma_copies and not any(k.tensor_maps for k in program.kernels):
            trials.remove(trial)  # no input copied by TMA: the same build as without
            continue
        build = (program.code, repr(program.kernels))
        if build in seen:  # e.g. another depth of kernels without a pipeline (row-local from global memory)
            trials.remove(trial)
            continue
        seen.add(build)
        programs.append(program)
        built.append(trial)
    compiled = dict(zip(map(id, built), build_many(programs, max_workers=max_workers), strict=True))
    if inputs is None:
        inputs = random_inputs(reference, seed=0)
    inputs = list(inputs)
    for trial in built:
        program = compiled[id(trial)]
        if isinstance(program, Exception):
            trial.failure = f"compile: {str(program).splitlines()[0]}"
            continue
        try:
            program.load()
            overlap_ok = dependent_launch.available(inputs[0].device.index)
            for name, overlap, spread in LAUNCH_MODES if overlap_ok else LAUNCH_MODES[:1]:
                # where early-launched blocks land decides what pays: time each mode
                variant = dataclasses.replace(program, dependent_launch=overlap, spread_blocks=spread)
                us = time_graph(lambda p=variant: p.launch(inputs), replays=replays).median_us
                trial.launch_us[name], trial.programs[name] = us, variant
                if trial.median_us is None or us < trial.median_us:
                    trial.median_us, trial.program = us, variant  # type: ignore[attr-defined]
                    trial.dependent_launch, trial.spread_blocks = overlap, spread
        except Exception as error:  # noqa: BLE001 - a failing candidate is recorded and skipped
            trial.failure = f"run: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            trial.median_us = None  # not ranked
    final_round(trials, lambda p: time_graph(lambda: p.launch(inputs), replays=replays).median_us,
                rounds=final_rounds)
    best = None
    for trial in ranking(trials, ties):
        result = check_on_gpu(reference, trial.program, inputs=inputs)  # type: ignore[attr-defined]
        trial.error = result.worst_error
        if result.passed:
            best = trial
            break
        trial.failure = f"float check: {result.failure()}"
    selection = Selection(best, trials, getattr(best, "program", None), time.perf_counter() - start)
    if best is None:
        reasons = "; ".join(f"{t.variant.label}: {t.failure}" for t in trials[:5])
        raise SelectionError(f"none of {len(trials)} candidate builds compiled, ran and matched the "
                             f"reference ({reasons})")
    log.info("selected %s (launch %s): %.2f µs of %d builds in %.1f s", best.variant.label,
             best.build, best.median_us, len(trials), selection.seconds)
    return selection
