"""In-place ops in a captured program (``relu_``, ``add_``, ``nn.ReLU(inplace=True)``) are made
out-of-place at capture (``capture._functional``): they fuse with their neighbours instead of running
in PyTorch between two subprograms, and updates of inputs and buffers still happen as in eager mode."""

from __future__ import annotations

import torch
import torch.nn as nn

import mirage as mi
from mirage.frontend.capture import as_module, capture


class OnTemporary(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.mul_(2.0)
        y.add_(1.0)
        return y.relu()


class InplaceRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.linear(x)) * 3


class UpdatesInput(nn.Module):
    def forward(self, x):
        x.add_(1.0)
        return x * 2


class RunningStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(16)

    def forward(self, x):
        return self.norm(x).relu() * 2


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_capture_leaves_no_in_place_op_but_the_updates_of_inputs():
    gm = capture(as_module(OnTemporary()), (torch.randn(4, 8),), {})
    assert not any(t.endswith("_.Tensor") or t.endswith("_.default") for t in _targets(gm))
    gm = capture(as_module(UpdatesInput()), (torch.randn(4, 8),), {})
    assert _targets(gm).count("aten.copy_.default") == 1  # the input's update, after the graph


def _optimized(module, *inputs):
    return mi.superoptimize(module, inputs, time_limit_s=5, executor="interpret")


def test_in_place_ops_fuse_with_their_neighbours():
    torch.manual_seed(0)
    for module, x in ((OnTemporary(), torch.randn(8, 64)), (InplaceRelu(), torch.randn(8, 32))):
        module.eval()
        with torch.no_grad():
            optimized = _optimized(module, x.clone())
            got, want = optimized(x.clone()), module(x.clone())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        report = optimized.report()
        assert "1 subprogram(s)" in report and "0 compute op(s) left in PyTorch" in report, report


def test_updates_of_inputs_and_buffers_happen_as_in_eager_mode():
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    eager_x, mirage_x = x.clone(), x.clone()
    optimized = _optimized(UpdatesInput(), x.clone())
    torch.testing.assert_close(optimized(mirage_x), UpdatesInput()(eager_x))
    torch.testing.assert_close(mirage_x, eager_x)  # the input was updated in place, once
    torch.testing.assert_close(mirage_x, x + 1)

    module, reference = RunningStats().train(), RunningStats().train()
    reference.load_state_dict(module.state_dict())
    batch = torch.randn(8, 16)
    optimized = _optimized(module, batch.clone())
    torch.testing.assert_close(optimized(batch.clone()), reference(batch.clone()))
    torch.testing.assert_close(module.norm.running_mean, reference.norm.running_mean)
    torch.testing.assert_close(module.norm.running_var, reference.norm.running_var)
    assert not torch.equal(module.norm.running_mean, torch.zeros(16))  # updated, not left as it was
