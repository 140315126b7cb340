"""Split-row µGraphs for long-row log_softmax and logsumexp (mirage.generator.split_rows): the
pattern they take, the same function as the reference in float64 far outside exp's range, stable as
written, and the frontend's choice among them where the search finds nothing."""

from __future__ import annotations

import numpy as np
import pytest

import mirage as mi
from mirage.generator import split_rows
from mirage.mugraph.ops import Op
from mirage.optimizer.softmax import online_softmax, unstable_exps
from tests.unit.optimizer.optimizer_graphs import interpret


def lse_reference(rows: int, cols: int, log_softmax: bool, scale: float = 1 / 0.7, rank: int = 2):
    g = mi.new_kernel_graph("lse")
    x = g.new_input((1,) * (rank - 2) + (rows, cols), mi.float16)
    x = g.add_scalar(g.mul_scalar(x, scale), 0.25)
    lse = g.log(g.reduction(g.exp(x), rank - 1))
    g.mark_output(g.sub(x, lse) if log_softmax else lse)
    return g.freeze()


def softmax_reference(rows: int, cols: int, scale: float = 1.0):
    g = mi.new_kernel_graph("softmax")
    e = g.exp(g.mul_scalar(g.new_input((rows, cols), mi.float16), scale))
    g.mark_output(g.div(e, g.reduction(e, 1)))
    return g.freeze()


@pytest.mark.parametrize("log_softmax", [True, False], ids=["log_softmax", "logsumexp"])
def test_long_rows_of_few_rows_get_split_candidates_computing_the_reference(log_softmax):
    reference = lse_reference(8, 32000, log_softmax)
    found = split_rows.match(reference)
    assert found.log_softmax is log_softmax
    assert [n.op.value for n in found.chain] == ["mul_scalar", "add_scalar"]
    graphs = split_rows.candidates(reference)
    assert [(b.grid_dim, b.block_dim[0]) for b in (g.block_graphs()[0] for g in graphs)] == [
        ((8, 16, 1), 128), ((8, 16, 1), 256), ((8, 8, 1), 128), ((8, 8, 1), 256)]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 32000)) * 60  # exp(x / 0.7) reaches e^250: far past float32, not float64
    x[1] -= 400.0
    want = interpret(reference, [x])[0]
    for graph in graphs[::3]:
        assert graph.output_types == reference.output_types
        np.testing.assert_allclose(interpret(graph, [x])[0], want, rtol=1e-9, atol=1e-9)
        assert unstable_exps(graph) == 0
        assert online_softmax(graph)[0] == graph  # written stable: the rewrite leaves it


def test_a_softmax_over_a_vocabulary_writes_exp_of_x_less_the_logsumexp():
    """``exp(f(x) − lse)``: the same function, and no value past 1 (finite in float16's range) where
    the reference's own exps overflow."""
    from tests.unit.optimizer.optimizer_graphs import run_fp16_range

    reference = softmax_reference(8, 32000, scale=1 / 0.7)
    assert split_rows.match(reference).form == split_rows.SOFTMAX
    graphs = split_rows.candidates(reference)
    assert [b.grid_dim for b in graphs[0].block_graphs()] == [(8, 16, 1), (8, 16, 1)]
    x = np.random.default_rng(2).standard_normal((8, 32000)) * 60
    want = interpret(reference, [x])[0]
    for graph in graphs[::3]:
        np.testing.assert_allclose(interpret(graph, [x])[0], want, rtol=1e-9, atol=1e-12)
        fp16 = run_fp16_range(graph, [x])[0]
        assert np.isfinite(fp16).all() and fp16.max() <= 1.0
    assert not np.isfinite(run_fp16_range(reference, [x])[0]).all()


def test_vocabularies_of_no_power_of_two_are_cut_into_equal_slices_of_any_count():
    """GPT-2's 50,257 columns are 29 slices of 1,733; BERT's 30,522 have no count of 1,025–4,096
    columns a slice, so 6 of 5,087; a prime length none."""
    assert split_rows.split_counts(32000) == [16, 8] and split_rows.split_counts(128256) == [64, 32]
    assert split_rows.split_counts(50257) == [29] and split_rows.split_counts(30522) == [6]
    assert split_rows.split_counts(100003) == []
    reference = lse_reference(4, 50257, True)
    (graph, _) = split_rows.candidates(reference)  # one count, two thread counts
    assert [b.grid_dim for b in graph.block_graphs()] == [(4, 29, 1), (4, 29, 1)]
    x = np.random.default_rng(3).standard_normal((4, 50257)) * 30
    np.testing.assert_allclose(interpret(graph, [x])[0], interpret(reference, [x])[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("form", ["logsumexp", "log_softmax", "softmax"])
def test_masked_tails_and_rows_all_minus_inf_give_pytorchs_values(form):
    """A vocabulary's masked tail fills whole slices with −inf: their maxima are floored at the dtype's
    lowest finite value, so their sums are 0, not NaN (which would spoil the row); a row all −inf gives
    PyTorch's −inf (logsumexp) or NaN (log_softmax, softmax), a +inf logit PyTorch's inf or NaN."""
    torch = pytest.importorskip("torch")
    reference = (softmax_reference(8, 32000, scale=1 / 0.7) if form == "softmax"
                 else lse_reference(8, 32000, form == "log_softmax"))
    x = np.random.default_rng(4).standard_normal((8, 32000)) * 10
    x[0, 30000:] = -np.inf  # the last slice of 2,000 and half of the one before
    x[1] = -np.inf
    x[2, 7] = np.inf  # PyTorch: logsumexp inf, the softmaxes NaN
    x[3, 5:31000:3] = -np.inf
    t = torch.from_numpy(x / 0.7 if form == "softmax" else x / 0.7 + 0.25)
    want = {"logsumexp": lambda: torch.logsumexp(t, -1, keepdim=True),
            "log_softmax": lambda: torch.log_softmax(t, -1),
            "softmax": lambda: torch.softmax(t, -1)}[form]().numpy()
    for graph in split_rows.candidates(reference)[::2]:
        with np.errstate(invalid="ignore"):
            got = interpret(graph, [x])[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-9, atol=1e-12)


def test_short_rows_many_rows_and_other_programs_get_none():
    assert split_rows.candidates(lse_reference(8, 4096, True)) == []  # one block a row does well
    assert split_rows.candidates(lse_reference(512, 32000, True)) == []  # rows fill the SMs
    # 256 rows: the counts whose grids stay within a kernel's 4,096 blocks (16 and 8 slices; 32 would not)
    assert split_rows.split_counts(32000, 256) == [16, 8] and split_rows.split_counts(128256, 128) == [32]
    assert [b.grid_dim for b in split_rows.candidates(lse_reference(256, 32000, True))[0].block_graphs()] == [
        (256, 16, 1), (256, 16, 1)]
    assert split_rows.candidates(lse_reference(8, 32000, True, rank=3)) == []
    g = mi.new_kernel_graph("sum_of_exps")  # no log, no division
    g.mark_output(g.reduction(g.exp(g.new_input((8, 32000), mi.float16)), 1))
    assert split_rows.match(g.freeze()) is None
    assert len(split_rows.candidates(lse_reference(4, 128256, False))) == 4  # Llama 3's vocabulary


def test_the_frontend_runs_a_split_candidate_where_the_search_finds_nothing(monkeypatch):
    from mirage.frontend import optimize

    reference = lse_reference(4, 8192, True)
    monkeypatch.setattr(optimize, "run_search", lambda reference, settings, progress=True: (
        None, "search found nothing (stubbed)", [], False))
    choice = optimize.choose(reference, optimize.SearchSettings(time_limit_s=1), progress=False)
    assert choice.source == "split rows"
    assert "split-row µGraph(s) float-checked" in choice.detail
    assert [b.grid_dim for b in choice.graph.block_graphs()] == [(4, 4, 1), (4, 4, 1)]
    x = np.random.default_rng(1).standard_normal((4, 8192)) * 30
    np.testing.assert_allclose(interpret(choice.graph, [x])[0], interpret(reference, [x])[0], rtol=1e-9)
    key = optimize.cache_key(reference, optimize.SearchSettings())
    assert key != optimize.cache_key(lse_reference(4, 8192, True, scale=1.0), optimize.SearchSettings())


def test_a_language_model_heads_log_probs_get_split_rows_after_the_product():
    """``log_softmax(lm_head(x) / 0.7)``: the whole finds nothing in its budget, so the partition cuts
    the product from the log_softmax, and the log_softmax over 16,384 logits gets the split-row
    µGraphs; the result is PyTorch's in float64."""
    torch = pytest.importorskip("torch")

    head = torch.nn.Linear(64, 16384, bias=False).eval()
    x = torch.randn(8, 64)

    def log_probs(v):
        return torch.log_softmax(head(v) / 0.7, -1)

    fast = mi.superoptimize(log_probs, (x,), time_limit_s=2, progress=False, use_cache=False)
    assert "split-row µGraph(s) float-checked" in fast.report()
    with torch.no_grad():
        want = torch.log_softmax(x.double() @ head.weight.double().t() / 0.7, -1)
        torch.testing.assert_close(fast(x).double(), want, rtol=1e-5, atol=1e-5)


def masked_reference(rows: int, cols: int, form: str = "softmax", bias_shape=None):
    """A sampler's masked logits: ``softmax(x / t + mask)`` (min-p, top-k: the mask 0 or −inf), or a
    ``log_softmax`` of the logits plus a bias of ``bias_shape`` (a logit bias a token)."""
    g = mi.new_kernel_graph("masked")
    x = g.new_input((rows, cols), mi.float16)
    other = g.new_input(bias_shape or (rows, cols), mi.float16)
    z = g.add(g.mul_scalar(x, 1 / 0.7), other)
    if form == "softmax":
        e = g.exp(z)
        g.mark_output(g.div(e, g.reduction(e, 1)))
    else:
        g.mark_output(g.sub(z, g.log(g.reduction(g.exp(z), 1))))
    return g.freeze()


@pytest.mark.parametrize(("form", "bias_shape"), [("softmax", None), ("log_softmax", (1, 32000))])
def test_logits_with_a_mask_or_a_bias_get_split_candidates(form, bias_shape):
    """The chain f may add another input (a mask of −inf, a bias a token): both kernels read its tile
    beside x's, by its broadcast; a slice all −inf (the vocabulary's masked tail) gives 0, not NaN."""
    reference = masked_reference(8, 32000, form, bias_shape)
    found = split_rows.match(reference)
    assert [n.op.value for n in found.chain] == ["mul_scalar", "add"] and found.form == form
    graphs = split_rows.candidates(reference)
    assert len(graphs) == 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 32000)) * 8
    other = rng.standard_normal(bias_shape or (8, 32000))
    if form == "softmax":
        other = np.where(rng.random((8, 32000)) < 0.9, -np.inf, 0.0)  # 90 % of the tokens hidden
        other[:, 30000:] = -np.inf  # whole slices hidden
    want = interpret(reference, [x, other])[0]
    assert np.isfinite(want).all()
    for graph in graphs:
        assert graph.input_types == reference.input_types
        (first, second) = graph.block_graphs()
        assert sum(n.op is Op.INPUT for n in first.nodes) == 2  # x and the mask or bias
        np.testing.assert_allclose(interpret(graph, [x, other])[0], want, rtol=1e-9, atol=1e-9)
        # the softmax's second exp is shifted by the row's logsumexp, which the analysis counts apart
        assert unstable_exps(graph) == (form == "softmax")


def test_a_chain_that_is_no_path_is_no_match():
    g = mi.new_kernel_graph()
    x, y = g.new_input((8, 32000), mi.float16), g.new_input((8, 32000), mi.float16)
    z = g.add(g.exp(x), g.silu(y))  # an exp before the row's, and two branches
    g.mark_output(g.sub(z, g.log(g.reduction(g.exp(z), 1))))
    assert split_rows.match(g.freeze()) is None


def test_min_p_sampling_runs_its_masked_softmax_as_split_rows():
    """Min-p over 8 × 32,000 logits through ``superoptimize``: the maximum and the comparison stay in
    PyTorch, the masked softmax after them (``softmax(logits + mask)``, the mask 0 or −inf) takes the
    split-row µGraphs; the result is eager PyTorch's in float32."""
    torch = pytest.importorskip("torch")
    from benchmarks.unseen_models import MinPFilter

    model = MinPFilter().eval()
    logits = torch.randn(8, 32000, generator=torch.Generator().manual_seed(0)) * 3
    fast = mi.superoptimize(model, (logits,), time_limit_s=1, progress=False, use_cache=False)
    (spec,) = fast.specializations
    masked = [s for s in spec.partition.subprograms if len(s.graph.input_types) == 2]
    assert [spec.choices[s.name].source for s in masked] == ["split rows"], fast.report()
    with torch.no_grad():
        torch.testing.assert_close(fast(logits), model(logits), rtol=1e-4, atol=1e-6)
