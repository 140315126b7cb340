"""GELUs written with ``erf`` by hand are captured as ``gelu`` (mirage.frontend.activations)."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
import torch.nn.functional as F

import mirage as mi
import mirage.frontend.activations
from mirage.frontend.capture import as_module, capture

SPELLINGS = {
    "bert": lambda h: 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0))),
    "halved_last": lambda h: h * (1 + torch.erf(h * 0.7071067811865476)) / 2,
    "one_after": lambda h: h * 0.5 * (torch.erf(h / math.sqrt(2.0)) + 1.0),
    "x_last": lambda h: (1.0 + torch.erf(h / math.sqrt(2.0))) * 0.5 * h,
}


def _targets(function, x):
    gm = capture(as_module(function), (x,), {})
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_a_gelu_written_with_erf_is_captured_as_one_gelu(name):
    function = SPELLINGS[name]
    x = torch.randn(4, 32) * 4
    assert _targets(function, x) == ["aten.gelu.default"]
    fast = mi.superoptimize(lambda w, x: function(x @ w), (torch.randn(32, 16), torch.randn(4, 32)),
                            search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    w, x = torch.randn(32, 16), torch.randn(4, 32) * 4
    torch.testing.assert_close(fast(w, x).double(), F.gelu(x.double() @ w.double()), rtol=1e-5, atol=1e-6)


def test_a_rounded_root_of_two_or_a_shared_erf_is_left_as_written():
    x = torch.randn(4, 32)
    rounded = _targets(lambda h: h * 0.5 * (1.0 + torch.erf(h / 1.41421)), x)
    assert "aten.erf.default" in rounded and "aten.gelu.default" not in rounded

    def shared(h):
        e = torch.erf(h / math.sqrt(2.0))
        return 0.5 * h * (1.0 + e), e

    targets = _targets(shared, x)
    assert "aten.gelu.default" in targets and "aten.erf.default" in targets
    fast = mi.superoptimize(shared, (x,), search=False, use_cache=False, progress=False)
    for got, want in zip(fast(x), shared(x.double()), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_docstring_examples():
    assert doctest.testmod(mirage.frontend.activations).failed == 0
