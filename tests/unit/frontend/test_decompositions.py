"""Composite ops written at capture as the ops they stand for (``mirage.frontend.decompositions``):
``nn.GroupNorm`` lowers whole into one subprogram (a mean, the centred values' ``rms_norm``, the
channels' gain and bias) and computes what PyTorch computes, checked against float64 PyTorch, in
float32 and in float16 with activations large enough that float16 squares would overflow."""

from __future__ import annotations

import doctest
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mirage as mi
import mirage.frontend.decompositions
from mirage.frontend.capture import capture
from mirage.frontend.runtime import SubprogramModule
from mirage.mugraph.ops import Op

NORM_OPS = {Op.REDUCTION: 1, Op.MUL_SCALAR: 1, Op.SUB: 1, Op.RMS_NORM: 1}


def _ops(fast) -> dict:
    (sub,) = fast.partition.subprograms
    return dict(Counter(n.op for n in sub.graph.nodes if n.op is not Op.INPUT))


@pytest.mark.parametrize("shape, groups", [((2, 8, 4, 4), 4), ((2, 6, 10), 3), ((1, 4, 2, 3, 3), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_is_one_subprogram_and_matches_float64(shape, groups, affine):
    torch.manual_seed(0)
    norm = nn.GroupNorm(groups, shape[1], affine=affine)
    if affine:
        with torch.no_grad():
            norm.weight.normal_(), norm.bias.normal_()
    x = torch.randn(*shape)
    fast = mi.superoptimize(norm, (x,), search=False)
    assert not fast.partition.pytorch_ops
    assert _ops(fast) == NORM_OPS | ({Op.MUL: 1, Op.ADD: 1} if affine else {})
    expected = norm.double()(x.double())
    torch.testing.assert_close(fast(x).double(), expected, rtol=1e-5, atol=1e-5)


def test_a_group_norms_gain_and_bias_in_the_groups_frame_are_kept_until_they_change():
    """The gain and bias, one value a channel, are broadcast to the groups' frame ((batch · groups,
    values a group)) where a program takes that frame's shape (here the interpreter; generated kernels
    read them through their strides instead, tests/gpu/test_broadcast_rows_gpu.py): the copies are made
    at the first call and kept while the parameters keep their versions; a trained gain is copied
    again."""
    torch.manual_seed(1)
    norm = nn.GroupNorm(4, 8)
    x = torch.randn(2, 8, 3, 3)
    (sub,) = mi.superoptimize(norm, (x,), search=False).partition.subprograms
    fast = mi.superoptimize(norm, (x,), search=False, candidates=[sub.graph])  # the reference runs
    torch.testing.assert_close(fast(x), norm(x), rtol=1e-5, atol=1e-5)
    (module,) = [m for spec in fast.specializations for m in spec.module.modules()
                 if isinstance(m, SubprogramModule)]
    assert module.kept_copies == (2, 2 * 8 * 18 * 4)  # two float32 frames of (2 · 4 groups, 18 values)
    kept = {slot: copy.data_ptr() for slot, (_, copy) in module.kept._copies.items()}
    fast(x)
    assert {slot: copy.data_ptr() for slot, (_, copy) in module.kept._copies.items()} == kept
    with torch.no_grad():
        norm.weight.mul_(3.0)
        torch.testing.assert_close(fast(x), norm(x), rtol=1e-5, atol=1e-5)
    assert "kept copies: 2 parameter(s)" in fast.report()


def test_float16_group_norm_with_large_activations():
    """Values of ±300: their float16 squares would overflow; rms_norm accumulates in float32."""
    torch.manual_seed(1)
    x = (300 * torch.randn(2, 8, 5, 5)).half()
    weight, bias = torch.randn(8).half(), torch.randn(8).half()
    fast = mi.superoptimize(lambda x, w, b: F.silu(F.group_norm(x, 4, w, b)), (x, weight, bias), search=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    expected = F.silu(F.group_norm(x.double(), 4, weight.double(), bias.double()))
    got = fast(x, weight, bias)
    assert torch.isfinite(got).all()
    eager_error = (F.silu(F.group_norm(x, 4, weight, bias)).double() - expected).abs().max()
    assert (got.double() - expected).abs().max() <= 2 * eager_error + 1e-3


def test_docstring_examples():
    result = doctest.testmod(mirage.frontend.decompositions)
    assert result.attempted > 0 and result.failed == 0


class _ResidualDropout(nn.Module):
    """A residual add after a dropout of a tensor computed elsewhere (the attention's output)."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x, attention):
        return F.relu(x + self.drop(attention)) * 2.0


def test_a_dropout_that_drops_nothing_is_removed_at_capture():
    x, a = torch.randn(4, 16), torch.randn(4, 16)
    model = _ResidualDropout().eval()
    fast = mi.superoptimize(model, (x, a), search=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    captured = fast.specializations[0].captured
    assert not any(n.op == "call_function" and "dropout" in str(n.target) for n in captured.nodes)
    torch.testing.assert_close(fast(x, a), model(x, a))
    p_zero = mi.superoptimize(lambda x, a: F.relu(x + F.dropout(a, 0.0, training=True)), (x, a), search=False)
    assert not p_zero.partition.pytorch_ops


@pytest.mark.parametrize("shape, dim", [((8, 64), -1), ((2, 16, 10), 1)])
def test_glu_lowers_through_pytorchs_decomposition(shape, dim):
    """``F.glu`` (Conformer's convolution module, wav2vec's): its halves as views, a sigmoid and a product."""
    torch.manual_seed(2)
    x = torch.randn(*shape)
    fast = mi.superoptimize(lambda x: F.glu(x, dim), (x,), search=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    torch.testing.assert_close(fast(x).double(), F.glu(x.double(), dim), rtol=1e-5, atol=1e-6)


class _PReLU(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.act = torch.nn.PReLU(channels)
        torch.nn.init.uniform_(self.act.weight, 0.05, 0.5)

    def forward(self, x):
        return self.act(x)


@pytest.mark.parametrize("shape, channels", [((4, 8, 5, 5), 8), ((4, 8), 8), ((3, 6, 7), 1)])
def test_prelu_lowers_as_relus_with_its_slopes_per_channel(shape, channels):
    """``nn.PReLU``: ``relu(x) − w · relu(−x)``, one slope a channel (dim 1) or one for all; what
    PyTorch gives at ±inf and NaN too."""
    torch.manual_seed(3)
    model = _PReLU(channels).eval()
    x = torch.randn(*shape)
    x.view(-1)[:3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), model.double()(x.double()), rtol=1e-6, atol=1e-7,
                                   equal_nan=True)


@pytest.mark.parametrize("function", [lambda x, a, b: torch.addcmul(x, a, b, value=0.5),
                                      lambda x, a, b: torch.addcdiv(x, a, b.exp(), value=2.0),
                                      lambda x, a, b: F.relu6(x * 4) + a * b],
                         ids=["addcmul", "addcdiv", "relu6"])
def test_addcmul_addcdiv_and_relu6_lower_through_pytorchs_decompositions(function):
    torch.manual_seed(4)
    xs = tuple(torch.randn(4, 16) for _ in range(3))
    fast = mi.superoptimize(function, xs, search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    torch.testing.assert_close(fast(*xs).double(), function(*(x.double() for x in xs)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("norm, shape", [(nn.BatchNorm2d(8), (2, 8, 6, 6)), (nn.BatchNorm1d(16), (4, 16)),
                                         (nn.BatchNorm1d(8, affine=False), (2, 8, 5))])
def test_an_eval_batch_norm_is_each_channels_affine_map_fused_with_what_follows(norm, shape):
    """BatchNorm in eval mode: ``(x − mean) / √(var + eps) · w + b`` from the running statistics, one
    subprogram with the ReLU after it, against float64 PyTorch."""
    torch.manual_seed(5)
    with torch.no_grad():
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2.0)
        if norm.affine:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    model = torch.nn.Sequential(norm, torch.nn.ReLU()).eval()
    x = torch.randn(*shape)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops and len(fast.partition.subprograms) == 1
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), model.double()(x.double()), rtol=1e-5, atol=1e-6)


def test_a_training_batch_norm_is_left_as_it_is():
    """In training mode a batch norm normalizes by the batch's statistics and updates its running ones:
    it is not the eval form's affine map, so capture keeps it whole."""
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(8), torch.nn.ReLU()).train()
    gm = capture(model, (torch.randn(4, 8),), {})
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.rsqrt.default" not in targets and any("batch_norm" in t for t in targets)


def _bce(a, b):
    return F.binary_cross_entropy_with_logits(a * 40, b.sigmoid(), reduction="none")


def _bce_weighted(a, b):
    return F.binary_cross_entropy_with_logits(a * 40, b.sigmoid(), pos_weight=b.abs() + 0.5)


REDUCTIONS = {
    "mv": lambda a, b: torch.relu(a @ b[0]),
    "vm": lambda a, b: b[:, 0] @ a.t(),
    "addmv": lambda a, b: torch.addmv(b[:, 0], a, b[0], beta=0.5, alpha=2.0),
    "outer": lambda a, b: torch.outer(a[0], b[1]).exp(),
    "dot": lambda a, b: torch.dot(a[0], b[0]) * 2.0,
    "frobenius": lambda a, b: torch.linalg.norm(a - b),
    "cosine_similarity": lambda a, b: F.cosine_similarity(a, b, dim=0) + F.cosine_similarity(a, b * 0.0),
    "pairwise_distance": lambda a, b: F.pairwise_distance(a, b) + (a * 2.0).norm(dim=0),
    "mse": lambda a, b: F.mse_loss(a, b),
    "l1_sum": lambda a, b: F.l1_loss(a, b, reduction="sum"),
    "bce": _bce,
    "bce_pos_weight": _bce_weighted,
    "instance_norm": lambda a, b: F.instance_norm(a.reshape(2, 8, 4, 4), weight=b[0, :8] + 1, bias=b[1, :8]),
    "kl_div": lambda a, b: F.kl_div(F.log_softmax(a, -1), F.log_softmax(b / 2, -1), reduction="batchmean",
                                    log_target=True),  # a distillation loss
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_vector_products_norms_losses_and_instance_norm_lower_whole(name):
    """Products with a vector (``W @ x``, ``addmv``, ``outer``, ``dot``), the 2-norm, cosine similarity
    (against zeros too, where the clamp of the norms decides), the losses (binary
    cross-entropy with logits of ±40 too, through ``log_sigmoid``; ``kl_div`` of log-probabilities) and
    ``instance_norm``: no op left in PyTorch, the result float64 PyTorch's."""
    function = REDUCTIONS[name]
    torch.manual_seed(6)
    xs = (torch.randn(16, 16), torch.randn(16, 16))
    fast = mi.superoptimize(function, xs, search=False, use_cache=False, progress=False)
    assert not fast.partition.pytorch_ops
    torch.testing.assert_close(fast(*xs).double(), function(*(x.double() for x in xs)), rtol=1e-5, atol=1e-5)


def test_instance_norm_modules_lower_unless_they_track_running_statistics_in_training():
    """``nn.InstanceNorm2d``: a group norm of a group a channel; in eval mode with running statistics,
    each channel's affine map from them; in training with running statistics it updates them, and
    capture keeps it whole."""
    torch.manual_seed(7)
    x = torch.randn(2, 6, 5, 5)
    tracked = nn.InstanceNorm2d(6, affine=True, track_running_stats=True)
    with torch.no_grad():
        tracked.running_mean.uniform_(-1, 1)
        tracked.running_var.uniform_(0.5, 2.0)
        tracked.weight.uniform_(0.5, 1.5)
    for model in (nn.InstanceNorm2d(6, affine=True), tracked.eval()):
        fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
        assert not fast.partition.pytorch_ops
        with torch.no_grad():
            torch.testing.assert_close(fast(x).double(), model.double()(x.double()), rtol=1e-5, atol=1e-5)
        model.float()
    gm = capture(tracked.train(), (x,), {})
    assert any("instance_norm" in str(n.target) for n in gm.graph.nodes if n.op == "call_function")


CROSS_ENTROPIES = {
    "mean": lambda x, t: F.cross_entropy(x / 0.7, t),
    "sum_ignored": lambda x, t: F.cross_entropy(x, t, ignore_index=3, reduction="sum"),
    "weighted": lambda x, t: F.cross_entropy(x, t, weight=x[0].abs() + 0.5),
    "smoothed": lambda x, t: F.cross_entropy(x * 20, t, label_smoothing=0.1),
    "none_3d": lambda x, t: F.cross_entropy(x.reshape(4, 2, -1).transpose(1, 2), t.reshape(4, 2),
                                           reduction="none"),
}


@pytest.mark.parametrize("name", sorted(CROSS_ENTROPIES))
def test_cross_entropy_lowers_its_log_softmax(name):
    """``F.cross_entropy`` is written as PyTorch's decomposition: the log_softmax over the classes a
    subprogram (where the classes are the last dim), the pick of each target's log-probability
    (``nll_loss``, a gather) in PyTorch and reported, with label smoothing's masks of ignored targets;
    every option is PyTorch's, in float64."""
    function = CROSS_ENTROPIES[name]
    torch.manual_seed(8)
    x, t = torch.randn(8, 300) * 4, torch.randint(0, 300, (8,))
    t[1] = 3  # an ignored target where ignore_index is 3
    fast = mi.superoptimize(function, (x, t), search=False, use_cache=False, progress=False)
    left = {op.target for op in fast.partition.pytorch_ops}
    assert "aten.nll_loss_nd.default" in left and "aten.cross_entropy_loss.default" not in left
    if name != "none_3d":  # the classes are dim 1 of three there: log_softmax is lowered on the last dim
        assert "aten.log_softmax.int" not in left
        assert any(Op.LOG in {n.op for n in s.graph.nodes} for s in fast.partition.subprograms)
    torch.testing.assert_close(fast(x, t).double(), function(x.double(), t), rtol=1e-6, atol=1e-6)
