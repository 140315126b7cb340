"""What the GPU guard of a subprogram's choice times (mirage.frontend.runners): PyTorch's own ops on
inputs laid out as traced, and the copies a kept build adds around its kernels, which the guard
charges to the build (Llama's grouped-query attention: q folded into rows by a copy, the result laid
out again for the head merge; BERT's attention: none, its views read in place and its output written
as the merge needs it)."""

import torch

from benchmarks.unseen import BertSelfAttention, LlamaAttention
from mirage.frontend import capture, partition
from mirage.frontend.optimize import pytorch_us
from mirage.frontend.runners import boundary_runner, sample, torch_ops_runner


def _attention(gm):
    return next(s for s in partition(gm).subprograms if s.ops != ("linear",))


def test_grouped_query_attention_pays_for_two_copies_around_its_kernels():
    gm = capture(LlamaAttention().eval(), (torch.randn(1, 256, 1024),), {})
    copies = boundary_runner(gm, _attention(gm), "cpu")
    q, out = copies()
    assert q.shape == (4, 1024, 64) and q.is_contiguous()  # 4 query heads a key head, folded into rows
    assert out.shape == (1, 16, 256, 64) and out.stride() == (256 * 1024, 64, 1024, 1)  # SDPA's layout
    assert all(boundary_runner(gm, s, "cpu") is None for s in partition(gm).subprograms
               if s.ops == ("linear",))


def test_bert_attention_adds_no_copies():
    gm = capture(BertSelfAttention().eval(), (torch.randn(1, 128, 768),), {})
    assert boundary_runner(gm, _attention(gm), "cpu") is None


def test_pytorchs_ops_run_on_inputs_laid_out_as_traced():
    """The head splits reach PyTorch's attention as the views they are, as in the program."""
    gm = capture(BertSelfAttention().eval(), (torch.randn(1, 128, 768),), {})
    view = torch.empty(1, 128, 2304)[..., :768].view(1, 128, 12, 64).permute(0, 2, 1, 3)
    drawn = sample(view, "cpu")
    assert drawn.stride() == view.stride() and drawn.shape == view.shape
    (out,) = torch_ops_runner(gm, _attention(gm), "cpu")()
    assert out.shape == (1, 12, 128, 64) and torch.isfinite(out).all()
    assert pytorch_us(None, lambda: None) is None  # nothing to time
