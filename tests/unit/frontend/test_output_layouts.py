"""The frontend declares a subprogram's output laid out as the PyTorch ops after it need it
(``KernelGraph.output_strides``): a head merge after an attention becomes a view, and SDPA's eager
layout needs no copy after the kernels."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import mirage as mi
from benchmarks.unseen import BertSelfAttention
from mirage.frontend import capture, partition

MERGED = (64, 768, 1)  # [12, 128, 64] laid out as [128, 12, 64]


def _attention(sub):
    return sum(n.op.value == "matmul" for n in sub.graph.nodes) == 2


def test_a_head_merge_after_the_attention_is_declared():
    """BERT's ``context.permute(0, 2, 1, 3).reshape(b, s, h·d)``: the attention's [12, 128, 64] result
    is written as [128, 12, 64], so that the merge is a view."""
    subs = partition(capture(BertSelfAttention(), (torch.randn(1, 128, 768),), {})).subprograms
    (attention,) = [s for s in subs if _attention(s)]
    assert attention.graph.output_strides == (MERGED,)


class _SDPA(nn.Module):
    def forward(self, x):  # [b, s, h·d] -> heads -> SDPA -> merged by a view of eager's layout
        q = x.view(1, 128, 12, 64).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(1, 128, 768)


def test_sdpas_eager_layout_is_declared_and_needs_no_copy_after_the_kernels(gpu_like):
    model, x = _SDPA(), torch.randn(1, 128, 768)
    subs = partition(capture(model, (x,), {})).subprograms
    (attention,) = [s for s in subs if _attention(s)]
    assert attention.graph.output_strides == (MERGED,)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), copy.deepcopy(model)(x.double()), rtol=1e-4, atol=1e-4)


def test_a_value_read_by_more_than_the_merge_stays_row_major():
    class Both(nn.Module):
        def forward(self, q, k, v):
            o = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
            return o.permute(0, 2, 1, 3).reshape(1, 128, 768), o.sum()

    x = torch.randn(1, 12, 128, 64)
    subs = partition(capture(Both(), (x, x, x), {})).subprograms
    assert all(s.graph.output_strides == () for s in subs)
