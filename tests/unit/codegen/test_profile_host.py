"""Host timing (``profile.host_times``) without a GPU: the functions' rounds are taken in turn, and
each gets the median of its rounds; the demo reports both sides' device and host times from it."""

from __future__ import annotations

import mirage.codegen.profile as profile


def test_rounds_are_taken_in_turn_and_medians_kept(monkeypatch):
    order = []
    # each call of a advances the clock by 1 s, of b by 3 s, except in b's third round (a slow spell)
    spells = {("b", 2): 30}
    rounds = {"a": 0, "b": 0}
    now = [0.0]

    def make(name, cost):
        def fn():
            order.append(name)
            now[0] += spells.get((name, rounds[name]), cost)
        return fn

    fns = {"a": make("a", 1.0), "b": make("b", 3.0)}

    def synchronize():
        if len(order) > 10:  # after the warm-up: a round has ended
            rounds[order[-1]] += 1

    monkeypatch.setattr(profile.time, "perf_counter", lambda: now[0])
    times = profile.host_times(fns, calls=2, rounds=3, synchronize=synchronize)
    assert order[:10] == ["a"] * 5 + ["b"] * 5  # warm-up
    assert order[10:] == ["a", "a", "b", "b"] * 3  # the rounds in turn
    assert times["a"] == 1e6  # µs a call
    assert times["b"] == 3e6  # the slow round is not the median


def test_the_demo_times_eager_and_ours_on_both_sides(monkeypatch):
    import torch

    import mirage.frontend.demo as demo

    monkeypatch.setattr(profile, "time_graph", lambda fn: type("T", (), {"median_us": fn()})())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    device, host = demo._time_cuda(lambda: 4.0, lambda: 2.0, lambda: 3.0)
    assert device == {"eager": 4.0, "mirage": 2.0}  # a graph replaying module is timed on the host only
    assert set(host) == {"eager", "mirage", "replayed"} and all(us >= 0 for us in host.values())


def test_a_repair_after_a_failed_capture_that_fails_too_is_reported(monkeypatch, caplog):
    import logging

    import torch

    def broken(*args, **kwargs):
        raise RuntimeError("no capture here")

    monkeypatch.setattr(torch.cuda, "graph", broken)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda index: __import__("contextlib").nullcontext())
    with caplog.at_level(logging.WARNING, logger="mirage.codegen.profile"):
        profile._end_failed_capture(0)  # does not raise: the capture's own error is the one to raise
    (record,) = [r for r in caplog.records if "resetting torch's random state" in r.getMessage()]
    assert "no capture here" in record.getMessage() and "GPU 0" in record.getMessage()
