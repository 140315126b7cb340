"""Profile-guided selection (mirage.codegen.select) on the CPU, with the GPU parts replaced by fakes:
which build and launch mode wins, what a failing build or a failing float check does."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import mirage.codegen.dependent_launch as dependent_launch
import mirage.codegen.gpu_check as gpu_check
import mirage.codegen.profile as profile
import mirage.codegen.runtime as runtime
from benchmarks.mugraphs import CASES
from benchmarks.variants import variants
from mirage.codegen.select import LAUNCH_MODES, SelectionError, select_fastest


@dataclasses.dataclass
class FakeProgram:
    """Stands for a compiled Program: its time per launch mode comes from ``times``."""

    name: str
    times: dict  # launch-mode name -> µs
    wrong: bool = False
    broken: bool = False
    dependent_launch: bool = True
    spread_blocks: bool = False

    def load(self) -> None:
        if self.broken:
            raise RuntimeError("the kernel failed to launch")

    def launch(self, inputs):
        return self

    @property
    def mode(self) -> str:
        return next(n for n, overlap, spread in LAUNCH_MODES
                    if (overlap, spread) == (self.dependent_launch, self.spread_blocks))


def _select(monkeypatch, programs: list[FakeProgram], overlap: bool = True):
    monkeypatch.setattr(runtime, "build_many", lambda cuda, max_workers=None: programs)
    monkeypatch.setattr(profile, "time_graph",
                        lambda fn, replays=100: SimpleNamespace(median_us=fn().times[fn().mode]))
    monkeypatch.setattr(dependent_launch, "available", lambda device: overlap)
    monkeypatch.setattr(gpu_check, "check_on_gpu", lambda reference, program, inputs=None: SimpleNamespace(
        passed=not program.wrong, worst_error=1.0 if program.wrong else 1e-4,
        failure=lambda: "relative error 1" if program.wrong else ""))
    inputs = [SimpleNamespace(device=SimpleNamespace(index=0))]
    case = CASES["gqa_b1"]
    candidates = variants("gqa_b1")[: len(programs)]
    return select_fastest(case.reference(), candidates, inputs, stages=(2,), warpgroup=((False, False),))


def _times(plain, dependent, spread):
    return {"plain": plain, "dependent": dependent, "dependent_spread": spread}


def test_the_fastest_build_wins_in_its_fastest_launch_mode(monkeypatch):
    programs = [FakeProgram("a", _times(9.0, 8.5, 8.8)), FakeProgram("b", _times(9.5, 9.1, 7.9))]
    selection = _select(monkeypatch, programs)
    best = selection.best
    assert selection.program.name == "b" and best.median_us == 7.9
    assert (best.dependent_launch, best.spread_blocks) == (True, True)
    assert best.build.as_dict() == {"stages": 2, "dependent_launch": True, "spread_blocks": True,
                                    "multicast_cluster": 0, "warpgroup_softmax": False, "defer_values": False,
                                    "tma_copies": False}
    assert selection.trials[0].launch_us == _times(9.0, 8.5, 8.8)
    assert selection.as_dict()["trials"][0]["dependent_launch"] is True  # a's best mode: dependent


def test_builds_within_the_noise_of_the_fastest_keep_the_candidates_order(monkeypatch):
    """b is 0.5 % faster than a: a tie, so a (the earlier candidate) wins; c, 5 % faster, wins."""
    tied = [FakeProgram("a", _times(8.0, 8.0, 8.0)), FakeProgram("b", _times(7.96, 7.96, 7.96))]
    assert _select(monkeypatch, tied).program.name == "a"
    clear = tied + [FakeProgram("c", _times(7.6, 7.6, 7.6))]
    assert _select(monkeypatch, clear).program.name == "c"
    wrong_first = [FakeProgram("a", _times(8.0, 8.0, 8.0), wrong=True),
                   FakeProgram("b", _times(7.96, 7.96, 7.96))]
    assert _select(monkeypatch, wrong_first).program.name == "b"


def test_without_dependent_launch_only_plain_launches_are_timed(monkeypatch):
    programs = [FakeProgram("a", _times(9.0, 1.0, 1.0))]
    selection = _select(monkeypatch, programs, overlap=False)
    assert selection.best.median_us == 9.0 and selection.best.launch_us == {"plain": 9.0}
    assert not selection.program.dependent_launch


def test_a_wrong_or_broken_build_is_recorded_and_the_next_fastest_kept(monkeypatch):
    programs = [FakeProgram("fast but wrong", _times(5.0, 5.0, 5.0), wrong=True),
                FakeProgram("broken", _times(1.0, 1.0, 1.0), broken=True),
                FakeProgram("right", _times(8.0, 7.0, 7.5))]
    selection = _select(monkeypatch, programs)
    assert selection.program.name == "right" and selection.best.median_us == 7.0
    wrong, broken, _ = selection.trials
    assert wrong.failure.startswith("float check") and broken.failure.startswith("run: RuntimeError")
    assert broken.median_us is None


def test_no_right_build_is_an_error_that_names_the_failures(monkeypatch):
    with pytest.raises(SelectionError, match="float check"):
        _select(monkeypatch, [FakeProgram("wrong", _times(5.0, 5.0, 5.0), wrong=True)])


def _record_builds(monkeypatch) -> tuple[list, list]:
    """Selection with builds recorded (each timed 0.1 µs faster than the one before, in every launch
    mode), every float check passing; returns the list the builds go to and the inputs."""
    built = []

    def build_many(programs, max_workers=None):
        built.extend(programs)
        return [FakeProgram(str(i), _times(9.0, 9.0, 9.0 - 0.1 * i)) for i in range(len(programs))]

    monkeypatch.setattr(runtime, "build_many", build_many)
    monkeypatch.setattr(profile, "time_graph", lambda fn, replays=100: SimpleNamespace(
        median_us=fn().times[fn().mode]))
    monkeypatch.setattr(dependent_launch, "available", lambda device: True)
    monkeypatch.setattr(gpu_check, "check_on_gpu", lambda reference, program, inputs=None: SimpleNamespace(
        passed=True, worst_error=1e-4, failure=lambda: ""))
    return built, [SimpleNamespace(device=SimpleNamespace(index=0))]


def test_multicast_builds_join_only_where_an_input_is_loaded_alike(monkeypatch):
    """rmsnorm_b8's members get a second build each with X multicast to clusters of two (timed like
    any other, and the winner's build choice carries it); GQA's have no such input, so no extra
    builds."""
    built, inputs = _record_builds(monkeypatch)
    rms = variants("rmsnorm_b8")[:2]
    selection = select_fastest(CASES["rmsnorm_b8"].reference(), rms, inputs, stages=(2,))
    assert [k.cluster for p in built for k in p.kernels] == [(1, 1, 1), (2, 1, 1)] * 2
    assert [t.variant.label.endswith("/mc2") for t in selection.trials] == [False, True] * 2
    assert selection.best.build.multicast_cluster == 2  # the last build timed fastest
    assert runtime.BuildChoice.from_dict(selection.best.build.as_dict()) == selection.best.build
    built.clear()
    gqa = select_fastest(CASES["gqa_b1"].reference(), variants("gqa_b1")[:2], inputs, stages=(2,),
                         warpgroup=((False, False),))
    assert len(gqa.trials) == 2 and all(k.cluster == (1, 1, 1) for p in built for k in p.kernels)


def test_warpgroup_builds_join_only_where_a_chain_qualifies(monkeypatch):
    """GQA's members get more builds each with the chain on warpgroup MMAs (in step, in step with K and V
    copied by TMA, deferred with TMA), at the depths asked for and one deeper (its swizzled tiles and
    tensor maps in the code, the choice carried by the winner's build); rmsnorm has no chain, so no
    extra builds."""
    built, inputs = _record_builds(monkeypatch)
    gqa = select_fastest(CASES["gqa_b8"].reference(), variants("gqa_b8")[:2], inputs, stages=(2,),
                         multicast=(0,))
    labels = ["s2", "s2/wg", "s2/wg/tma", "s2/wgd/tma", "s3/wg", "s3/wg/tma", "s3/wgd/tma"]
    assert [t.variant.label.split("/", 1)[-1] for t in gqa.trials] == labels * 2
    assert ["Swizzled128Layout" in p.code for p in built] == [False] + [True] * 6 + [False] + [True] * 6
    deferred = [False, False, False, True, False, False, True]
    assert ["mirage::gen::NoTile, true, true>" in p.code for p in built] == deferred * 2  # Q·K from registers
    tma = [False, False, True, True, False, True, True]
    assert ["TensorMapIterator" in p.code for p in built] == tma * 2
    assert [bool(k.tensor_maps) for p in built for k in p.kernels[:1]] == tma * 2
    assert gqa.best.build.warpgroup_softmax and gqa.best.build.defer_values  # the last build timed fastest
    assert gqa.best.build.stages == 3 and gqa.best.build.tma_copies
    assert runtime.BuildChoice.from_dict(gqa.best.build.as_dict()) == gqa.best.build
    options = gqa.best.build.options()
    assert options.warpgroup_softmax and options.defer_values and options.tma_copies
    built.clear()
    rms = select_fastest(CASES["rmsnorm_b8"].reference(), variants("rmsnorm_b8")[:2], inputs, stages=(2,),
                         multicast=(0,))
    assert len(rms.trials) == 2 and not any("Swizzled128Layout" in p.code for p in built)


def test_builds_that_generate_the_same_code_are_timed_once(monkeypatch):
    """nTrans runs row-local from global memory: no pipelined input, so its depths 2 and 3 are one
    build, timed once; rmsnorm's depths differ and are both timed."""
    built, inputs = _record_builds(monkeypatch)
    ntrans = select_fastest(CASES["ntrans_b8"].reference(), variants("ntrans_b8"), inputs, stages=(2, 3),
                            multicast=(0,), warpgroup=((False, False),))
    assert [t.variant.stages for t in ntrans.trials] == [2] * len(variants("ntrans_b8"))
    assert len({p.code for p in built}) == len(built)
    built.clear()
    rms = select_fastest(CASES["rmsnorm_b8"].reference(), variants("rmsnorm_b8")[:1], inputs, stages=(2, 3),
                         multicast=(0,), warpgroup=((False, False),))
    assert [t.variant.stages for t in rms.trials] == [2, 3]


def test_a_lucky_first_timing_does_not_win_the_final_round(monkeypatch):
    """a's dependent launch timed 7.0 µs once, then 9.0 µs each time again; b's 7.5 µs every time:
    the final round times both again, in turn, and b wins. c (20 µs) is never timed again."""
    programs = [FakeProgram("a", _times(9.5, 7.0, 9.5)), FakeProgram("b", _times(9.5, 9.5, 7.5)),
                FakeProgram("c", _times(20.0, 20.0, 20.0))]
    order = []

    def time_graph(fn, replays=100):
        program = fn()
        order.append((program.name, program.mode))
        lucky = program.name == "a" and order.count(("a", "dependent")) > 1
        return SimpleNamespace(median_us=9.0 if lucky else program.times[program.mode])

    _select(monkeypatch, programs)  # installs the fakes; then a timer whose first timing of a is lucky
    monkeypatch.setattr(profile, "time_graph", time_graph)
    order.clear()
    selection = select_fastest(CASES["gqa_b1"].reference(), variants("gqa_b1")[:3],
                               [SimpleNamespace(device=SimpleNamespace(index=0))], stages=(2,),
                               warpgroup=((False, False),))
    assert selection.program.name == "b" and selection.best.median_us == 7.5
    again = order[9:]  # after the first timings (3 builds × 3 modes)
    assert again == [("a", "dependent"), ("b", "dependent_spread")] * 3
    a = selection.trials[0]
    assert a.launch_us["dependent"] == 9.0 and a.median_us == 9.0 and not a.spread_blocks


def test_the_final_round_leaves_a_clear_winner_alone():
    from mirage.codegen.select import Trial, final_round

    fast, slow = (Trial(None, median_us=us, launch_us={"plain": us}, programs={"plain": us})
                  for us in (5.0, 6.0))
    assert final_round([fast, slow], time_one=lambda p: pytest.fail("timed again")) == 0
    assert final_round([], time_one=lambda p: 0.0) == 0
