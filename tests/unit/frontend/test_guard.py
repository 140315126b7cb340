"""The whole-program check (frontend.guard): the faster of the stitched program and the program as
given runs. On the CPU the timer is replaced; the GPU test times for real (test_gpu.py)."""

import pytest
import torch

import mirage as mi
from mirage.frontend import graphs, guard, runtime
from mirage.frontend.runtime import SubprogramModule


def program(x, w):
    return torch.relu(x @ w) * 2


def _inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(8, 16)


def _timer(times):
    """A timer that gives the program as given ``times["PyTorch"]`` and anything else ``times["µGraphs"]``."""
    def timer(module, args, kwargs):
        module(*args, **kwargs)  # the call runs, on the copies it was given
        given = module is program or getattr(module, "function", None) is program  # as_module's wrapper
        return times[guard.THEIRS] if given else times[guard.OURS]
    return timer


@pytest.mark.parametrize("ours,theirs,runs", [(30.0, 24.0, guard.THEIRS), (20.0, 24.0, guard.OURS),
                                              (24.0, 24.0, guard.OURS)])
def test_the_faster_module_runs(ours, theirs, runs):
    x, w = _inputs()
    verdict = guard.check(lambda x, w: program(x, w) + 0, program, (x, w), {},
                          timer=_timer({guard.OURS: ours, guard.THEIRS: theirs}))
    assert verdict.runs == runs and verdict.pytorch == (runs == guard.THEIRS)
    assert dict(verdict.times) == {guard.OURS: ours, guard.THEIRS: theirs}
    assert f"{ours:.2f} µs a call with the chosen µGraphs, {theirs:.2f} µs in PyTorch" in verdict.note


def test_the_inputs_are_copied_before_timing():
    def writes(x):
        x.add_(1)
        return x

    x = torch.zeros(3)
    guard.check(writes, writes, (x,), {}, timer=lambda m, a, k: float(m(*a, **k).sum()))
    assert torch.equal(x, torch.zeros(3))  # the caller's tensor is unchanged


def test_a_program_that_cannot_be_timed_keeps_the_chosen_graphs():
    def fails(module, args, kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    verdict = guard.check(program, program, _inputs(), {}, timer=fails)
    assert verdict.runs == guard.OURS and not verdict.times
    assert "not timed (RuntimeError: operation not permitted" in verdict.note


def _superoptimize(monkeypatch, times, **options):
    """superoptimize on the CPU with the check made to run (as on a GPU) and its timer replaced."""
    monkeypatch.setattr(runtime, "profile_device", lambda args, kwargs, options: "a GPU")
    monkeypatch.setattr(runtime, "check", lambda ours, given, args, kwargs, copies: guard.check(
        ours, given, args, kwargs, copies, timer=_timer(times)))
    return mi.superoptimize(program, _inputs(), search=False, use_cache=False, progress=False, **options)


def test_superoptimize_runs_the_program_as_given_where_it_is_faster(monkeypatch):
    fast = _superoptimize(monkeypatch, {guard.OURS: 30.0, guard.THEIRS: 24.0})
    spec = fast.specializations[0]
    assert spec.verdict.pytorch and spec.module is fast.program
    assert not [m for m in spec.module.modules() if isinstance(m, SubprogramModule)]
    x, w = _inputs()
    torch.testing.assert_close(fast(x, w), program(x, w))
    report = fast.report()
    assert ("whole program: 30.00 µs a call with the chosen µGraphs, 24.00 µs in PyTorch; PyTorch runs it"
            in report)
    assert "not run: the whole program is faster in PyTorch" in report


def test_superoptimize_keeps_the_stitched_program_where_it_is_faster(monkeypatch):
    fast = _superoptimize(monkeypatch, {guard.OURS: 20.0, guard.THEIRS: 24.0})
    spec = fast.specializations[0]
    assert not spec.verdict.pytorch
    assert [m for m in spec.module.modules() if isinstance(m, SubprogramModule)]
    assert "whole program: 20.00 µs a call with the chosen µGraphs, 24.00 µs in PyTorch" in fast.report()
    x, w = _inputs()
    torch.testing.assert_close(fast(x, w), program(x, w), rtol=1e-5, atol=1e-5)


def test_the_check_can_be_turned_off(monkeypatch):
    fast = _superoptimize(monkeypatch, {guard.OURS: 30.0, guard.THEIRS: 24.0}, whole_program_check=False)
    assert fast.specializations[0].verdict is None and "whole program" not in fast.report()


def test_the_option_must_be_a_bool():
    with pytest.raises(mi.frontend.OptionError, match="whole_program_check must be True or False"):
        mi.superoptimize(program, _inputs(), whole_program_check="yes")


def test_a_program_that_updates_its_buffers_is_not_timed(monkeypatch):
    """Timing would run the program's own updates (a step counter here) thousands of times."""

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x, w):
            self.calls.add_(1)
            return torch.relu(x @ w) * 2

    timed = []
    monkeypatch.setattr(runtime, "profile_device", lambda args, kwargs, options: "a GPU")
    monkeypatch.setattr(runtime, "check", lambda *a: timed.append(a) or guard.Verdict(guard.OURS, {}, ""))
    model = Counting()
    fast = mi.superoptimize(model, _inputs(), search=False, use_cache=False, progress=False)
    fast(*_inputs())
    fast(*_inputs())
    spec = fast.specializations[0]
    assert not timed and not spec.verdict.pytorch
    assert "not timed: it updates its own buffers" in spec.verdict.note
    assert float(model.calls) == 2.0


def _graphed_timer(times, seen):
    """Like _timer, with ours in a caller's CUDA graph timed as ``times[OURS_IN_GRAPHS]``: the timing
    that stands for calls from Python is the one inside ``graphs.standing_for_calls``."""
    def timer(module, args, kwargs):
        module(*args, **kwargs)
        standing = graphs._state.__dict__.get("calls", False)
        seen.append(standing)
        if module is program or getattr(module, "function", None) is program:
            return times[guard.THEIRS]
        return times[guard.OURS] if standing else times[guard.OURS_IN_GRAPHS]
    return timer


@pytest.mark.parametrize("graphed,in_graphs", [(30.0, guard.THEIRS), (22.0, guard.OURS)])
def test_ours_copying_strided_parameters_is_timed_in_a_caller_graph_too(graphed, in_graphs):
    seen = []
    times = {guard.OURS: 20.0, guard.OURS_IN_GRAPHS: graphed, guard.THEIRS: 24.0}
    verdict = guard.check(lambda x, w: program(x, w) + 0, program, _inputs(), {}, lambda: True,
                          timer=_graphed_timer(times, seen))
    assert seen == [True, False, False]  # calls, then a caller's graph, then the program as given
    assert verdict.runs == guard.OURS and not verdict.pytorch
    assert verdict.pytorch_in_graphs == (in_graphs == guard.THEIRS)
    assert dict(verdict.times) == times
    assert (f"20.00 µs a call with the chosen µGraphs ({graphed:.2f} µs in a CUDA graph, which copies "
            "strided parameters in every replay), 24.00 µs in PyTorch") in verdict.note
    switched = "a CUDA graph captured around the module runs PyTorch" in verdict.note
    assert switched == (in_graphs == guard.THEIRS)


def test_ours_that_copies_nothing_is_timed_once():
    seen = []
    verdict = guard.check(lambda x, w: program(x, w) + 0, program, _inputs(), {}, lambda: False,
                          timer=_graphed_timer({guard.OURS: 20.0, guard.THEIRS: 24.0}, seen))
    assert seen == [True, False] and set(verdict.times) == {guard.OURS, guard.THEIRS}
    assert not verdict.pytorch_in_graphs and "CUDA graph" not in verdict.note


def test_a_caller_graph_runs_the_program_as_given_where_it_is_faster_there(monkeypatch):
    """Calls from Python run the µGraphs; a capture that must record the copies of strided parameters
    (a caller's CUDA graph) runs the program as given."""
    calls = []

    def counted(x, w):
        calls.append(1)
        return program(x, w)

    times = {guard.OURS: 20.0, guard.OURS_IN_GRAPHS: 30.0, guard.THEIRS: 24.0}
    monkeypatch.setattr(runtime, "profile_device", lambda args, kwargs, options: "a GPU")
    monkeypatch.setattr(runtime, "check", lambda ours, given, args, kwargs, copies: guard.check(
        ours, given, args, kwargs, lambda: True, timer=lambda m, a, k: (
            times[guard.THEIRS] if getattr(m, "function", None) is counted
            else times[guard.OURS if graphs._state.__dict__.get("calls") else guard.OURS_IN_GRAPHS])))
    fast = mi.superoptimize(counted, _inputs(), search=False, use_cache=False, progress=False)
    spec = fast.specializations[0]
    assert not spec.verdict.pytorch and spec.verdict.pytorch_in_graphs and spec.graph_module is fast.program
    x, w = _inputs()
    calls.clear()
    torch.testing.assert_close(fast(x, w), program(x, w), rtol=1e-5, atol=1e-5)
    assert not calls  # a call runs the µGraphs
    monkeypatch.setattr(graphs, "recording_constants", lambda tensors: True)  # as in a caller's capture
    torch.testing.assert_close(fast(x, w), program(x, w))
    torch.testing.assert_close(fast(x, w=w), program(x, w))  # the keyword path too
    assert len(calls) == 2
    assert "a CUDA graph captured around the module runs PyTorch, faster there" in fast.report()


@pytest.mark.parametrize("reuse", [False, True])
def test_a_module_reading_the_calls_copies_in_graphs_is_not_timed_there(monkeypatch, reuse):
    asked = []
    monkeypatch.setattr(runtime, "profile_device", lambda args, kwargs, options: "a GPU")
    monkeypatch.setattr(SubprogramModule, "copies_constants", property(lambda self: True))
    monkeypatch.setattr(runtime, "check", lambda ours, given, args, kwargs, copies: asked.append(copies())
                        or guard.Verdict(guard.OURS, {}, ""))
    mi.superoptimize(program, _inputs(), search=False, use_cache=False, progress=False,
                     reuse_copies_in_graphs=reuse)
    assert asked == [not reuse]
    with pytest.raises(mi.frontend.OptionError, match="reuse_copies_in_graphs must be True or False"):
        mi.superoptimize(program, _inputs(), reuse_copies_in_graphs="yes")
