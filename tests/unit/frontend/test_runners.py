"""What the GPU guard of a subprogram's choice times (mirage.frontend.runners): PyTorch's own ops on
inputs laid out as traced, and the copies a kept build adds around its kernels, which the guard
charges to the build (none for BERT's and Llama's attention, whose views, split dims included, are
read in place and whose outputs are written as the head merge needs them)."""

import torch

from benchmarks.unseen import BertSelfAttention, LlamaAttention
from mirage.frontend import capture, partition
from mirage.frontend.optimize import pytorch_us
from mirage.frontend.runners import boundary_runner, sample, torch_ops_runner


def _attention(gm):
    return next(s for s in partition(gm).subprograms if s.ops != ("linear",))


def test_grouped_query_attention_adds_no_copies_at_batch_one_or_two():
    """q folded into rows of 4 query heads a key head is declared as a view of split rows, and the
    result as the head merge's layout (two strides where one cannot do): nothing to copy."""
    for batch in (1, 2):
        gm = capture(LlamaAttention().eval(), (torch.randn(batch, 256, 1024),), {})
        assert all(boundary_runner(gm, s, "cpu") is None for s in partition(gm).subprograms)


def test_an_undeclared_view_is_charged_its_copy():
    """Heads over three dims whose strides do not merge, (2, 2, 4) at 4096, 32 and 64 elements: the
    merged dim would need three strides, so the binding copies, and the guard charges it to the build."""

    class ThreeStrides(torch.nn.Module):
        def forward(self, x):
            q = x.permute(0, 3, 2, 1, 4)  # (2, 2, 4, 16, 32)
            return torch.softmax(q @ q.transpose(-1, -2), dim=-1) @ q

    gm = capture(ThreeStrides().eval(), (torch.randn(2, 16, 4, 2, 32),), {})
    copies = boundary_runner(gm, _attention(gm), "cpu")
    assert copies is not None and all(t.is_contiguous() for t in copies())


def test_bert_attention_adds_no_copies_at_batch_one_or_two():
    for batch in (1, 2):
        gm = capture(BertSelfAttention().eval(), (torch.randn(batch, 128, 768),), {})
        assert boundary_runner(gm, _attention(gm), "cpu") is None


def test_declared_views_a_build_copies_are_charged():
    """BERT at batch 2: q, kᵀ and v are declared as split views; a build whose kernels read them in
    place adds no copies, one that reads only kᵀ so is charged the copies of q and v."""
    gm = capture(BertSelfAttention().eval(), (torch.randn(2, 128, 768),), {})
    attention = _attention(gm)
    every = frozenset(range(len(attention.inputs)))
    assert boundary_runner(gm, attention, "cpu", in_place=every) is None
    key = next(k for k, b in enumerate(attention.inputs) if "transpose" in b.source)
    copies = boundary_runner(gm, attention, "cpu", in_place={key})
    assert copies is not None and len(copies()) == len(attention.inputs) - 1
    assert all(t.is_contiguous() for t in copies())


def test_pytorchs_ops_run_on_inputs_laid_out_as_traced():
    """The head splits reach PyTorch's attention as the views they are, as in the program."""
    gm = capture(BertSelfAttention().eval(), (torch.randn(1, 128, 768),), {})
    view = torch.empty(1, 128, 2304)[..., :768].view(1, 128, 12, 64).permute(0, 2, 1, 3)
    drawn = sample(view, "cpu")
    assert drawn.stride() == view.stride() and drawn.shape == view.shape
    (out,) = torch_ops_runner(gm, _attention(gm), "cpu")()
    assert out.shape == (1, 12, 128, 64) and torch.isfinite(out).all()
    assert pytorch_us(None, lambda: None) is None  # nothing to time


def test_selection_tells_the_guard_which_views_its_winner_copies(monkeypatch):
    """BERT's attention at batch 2 built as its reference graph (its products run through torch, so
    no declared view is read in place): profile selection reports no input read in place, and the
    guard is charged the copies of q, kᵀ and v."""
    from types import SimpleNamespace

    from mirage.codegen import select
    from mirage.codegen.lower_program import generate_cuda_program
    from mirage.frontend import optimize

    gm = capture(BertSelfAttention().eval(), (torch.randn(2, 128, 768),), {})
    attention = _attention(gm)

    def built_as_given(reference, candidates, stages):
        trial = select.Trial(select.Variant(candidates[0]), median_us=4.0)
        program = SimpleNamespace(cuda=generate_cuda_program(candidates[0], None))
        return select.Selection(trial, [trial], program)

    monkeypatch.setattr(select, "select_fastest", built_as_given)
    *_, in_place = optimize.profile_choice(attention.graph, [attention.graph])
    assert in_place == frozenset()
    copies = boundary_runner(gm, attention, "cpu", in_place=in_place)
    assert copies is not None and len(copies()) == 3
