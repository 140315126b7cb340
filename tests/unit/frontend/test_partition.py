import logging
import shutil

import pytest
import torch
import torch.nn.functional as F

import mirage as mi
from mirage.frontend import Budget, capture, partition
from mirage.frontend.capture import as_module
from mirage.frontend.draw import partition_dot
from mirage.frontend.examples import EXAMPLES
from mirage.frontend.partition import max_exps_on_a_path
from mirage.mugraph.ops import Op

# example -> number of subprograms (view/reshape between projections and attention cut GQA in three)
EXPECTED = {"gated_mlp": 1, "rmsnorm_linear": 1, "manual_rmsnorm_linear": 1, "gqa_decode": 3,
            "gqa_decode_manual": 3, "lora_linear": 1, "ngpt_update": 1}


def _partition(function, inputs, **budget):
    gm = capture(as_module(function), inputs, {})
    return gm, partition(gm, Budget(**budget))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_examples_partition_completely(name):
    module, inputs = EXAMPLES[name]()
    _, part = _partition(module, inputs)
    assert len(part.subprograms) == EXPECTED[name], str(part)
    assert part.pytorch_ops == ()
    for sub in part.subprograms:
        assert max_exps_on_a_path(sub.graph) <= 1
        assert sub.num_ops <= Budget().max_ops


def test_rms_norm_by_hand_becomes_one_rms_norm_op():
    module, inputs = EXAMPLES["manual_rmsnorm_linear"]()
    _, part = _partition(module, inputs)
    ops = [n.op for n in part.subprograms[0].graph.nodes if n.op is not Op.INPUT]
    assert ops == [Op.RMS_NORM, Op.MUL, Op.MATMUL]


@pytest.mark.parametrize(("function", "scalars"), [
    (lambda x: torch.tanh(x / 8.0 / 50.0) * 50.0, [0.0025, 50.0]),  # Gemma 2's soft-capped scores
    (lambda x: torch.exp(x * 2.0 * 0.5), []),  # products that cancel: none
    (lambda x: torch.exp(x * 3.0) + x * 3.0 * 2.0, [3.0, 6.0]),  # the inner product has another use
])
def test_products_by_numbers_in_a_row_are_one(function, scalars):
    x = torch.randn(4, 8)
    gm, part = _partition(function, (x,))
    (sub,) = part.subprograms
    found = [n.attrs.value for n in sub.graph.nodes if n.op is Op.MUL_SCALAR]
    assert found == pytest.approx(scalars), str(sub.graph)
    torch.testing.assert_close(mi.superoptimize(function, (x,), search=False, progress=False)(x), function(x))


@pytest.mark.parametrize(("name", "function", "subprograms"), [
    ("softmax_of_softmax", lambda x: torch.softmax(torch.softmax(x, -1) * 3.0, -1), 2),
    ("exp_of_exp", lambda x: torch.exp(torch.exp(x) * 0.1), 2),
    ("two_exps_side_by_side", lambda x: torch.exp(x) + torch.exp(2.0 * x), 1),
])
def test_at_most_one_exp_on_any_path(name, function, subprograms):
    x = torch.randn(3, 5)
    _, part = _partition(function, (x,))
    assert len(part.subprograms) == subprograms
    assert all(max_exps_on_a_path(s.graph) <= 1 for s in part.subprograms)
    fast = mi.superoptimize(function, (x,), search=False)
    torch.testing.assert_close(fast(x), function(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("max_ops", [1, 2, 3])
def test_budget_limits_subprogram_size(max_ops):
    module, (x,) = EXAMPLES["gated_mlp"]()
    _, part = _partition(module, (x,), max_ops=max_ops)
    assert all(s.num_ops <= max_ops for s in part.subprograms)
    assert len(part.subprograms) >= -(-5 // max_ops)
    fast = mi.superoptimize(module, (x,), search=False, max_subprogram_ops=max_ops)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), module(x), rtol=1e-4, atol=1e-5)


def test_no_cycle_through_pytorch_ops():
    def function(x):
        a = x * 2.0
        b = torch.cumsum(a, -1)  # runs in PyTorch, between a and c
        return a + b

    x = torch.randn(3, 4)
    gm, part = _partition(function, (x,))
    owner = {name: s.name for s in part.subprograms for name in s.nodes}
    assert owner["mul"] != owner["add"]
    fast = mi.superoptimize(function, (x,), search=False)
    torch.testing.assert_close(fast(x), function(x))


def test_one_subprogram_feeds_several_outputs():
    def function(x, w):
        h = F.silu(x @ w)
        return h, h.sum(-1, keepdim=True), h * 2.0

    x, w = torch.randn(4, 6), torch.randn(6, 5)
    _, part = _partition(function, (x, w))
    (sub,) = part.subprograms
    assert len(sub.outputs) == 3
    fast = mi.superoptimize(function, (x, w), search=False)
    for got, expected in zip(fast(x, w), function(x, w), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_unsupported_op_gets_a_one_line_notice(caplog):
    def function(x, w):
        return torch.cumsum(F.silu(x @ w), -1) * 2.0

    x, w = torch.randn(4, 6), torch.randn(6, 5)
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        fast = mi.superoptimize(function, (x, w), search=False)
        fast(torch.randn(4, 6), w)
        fast(torch.randn(8, 6), w)  # a new shape: captured again, no repeated notice
    notices = [r.getMessage() for r in caplog.records if "runs in PyTorch" in r.getMessage()]
    assert notices == ["mirage: aten.cumsum.default (cumsum) runs in PyTorch: no µGraph lowering"]
    assert len(fast.specializations) == 2
    torch.testing.assert_close(fast(x, w), function(x, w), rtol=1e-5, atol=1e-5)


def test_text_form_lists_bindings_and_graphs():
    module, inputs = EXAMPLES["gated_mlp"]()
    _, part = _partition(module, inputs)
    text = str(part)
    assert text.startswith("partition: 1 subprogram(s) covering 5 torch op(s)")
    assert ": x as f32[4,64]" in text
    assert "gate_proj_weight.permute(1, 0) as f32[64,128]" in text
    assert 'kernel_graph "sp0"' in text


def test_dot_picture_marks_subprograms_and_pytorch_ops(tmp_path):
    def function(x):
        return torch.cumsum(torch.softmax(x, -1), -1)

    gm, part = _partition(function, (torch.randn(2, 8),))
    dot = partition_dot(gm.graph, part)
    assert "subgraph cluster_sp0" in dot and "(online softmax)" in dot
    assert '"cumsum"' in dot and "color=red" in dot
    assert dot.count("->") >= 3
    fast = mi.superoptimize(function, (torch.randn(2, 8),), search=False)
    assert fast.draw_partition(str(tmp_path / "p.dot")).endswith("p.dot")
    assert "subgraph cluster_sp0" in (tmp_path / "p.dot").read_text()
    if shutil.which("dot"):
        fast.draw_partition(str(tmp_path / "p.svg"))
        assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")


def test_four_dim_broadcasts_are_held_at_rank_three():
    """Rotary embedding's q·cos + rotate(q)·sin with (1, 1, s, d) tables: the graph tensors merge the
    leading dims (rank 3, which the search's grids map) and the tables broadcast over them."""

    def rotary(q, r, cos, sin):
        return q * cos + r * sin

    inputs = (torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(1, 1, 8, 16),
              torch.randn(1, 1, 8, 16))
    gm = capture(as_module(rotary), inputs, {})
    (sub,) = partition(gm).subprograms
    shapes = sorted(tuple(t.shape) for t in sub.graph.input_types)
    assert shapes == [(1, 8, 16), (1, 8, 16), (8, 8, 16), (8, 8, 16)]
    fast = mi.superoptimize(rotary, inputs, search=False, use_cache=False, progress=False)
    expected = rotary(*(x.double() for x in inputs))
    torch.testing.assert_close(fast(*inputs).double(), expected, rtol=1e-6, atol=1e-6)


def test_attention_is_a_product_cut():
    """A fruitless subprogram of a prologue and attention splits before the attention."""
    from mirage.frontend.partition import product_cuts

    def rotary_attention(q, k, v, cos):
        return F.scaled_dot_product_attention(q * cos, k, v)

    inputs = (torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16),
              torch.randn(1, 1, 8, 16))
    gm = capture(as_module(rotary_attention), inputs, {})
    (only,) = partition(gm).subprograms
    (cut,) = product_cuts(gm, only)
    assert only.ops[only.nodes.index(cut)] == "scaled_dot_product_attention"


def test_a_product_without_a_next_layer_is_cut_from_its_epilogue():
    """BERT's output block, LayerNorm(h·Wᵀ + b + x): no product reads a computed value, so a fruitless
    subprogram splits after the projection, through the views between them, and the residual and the
    norm become a search of their own."""
    from benchmarks.unseen import BertOutput
    from mirage.frontend.partition import product_cuts

    model = BertOutput(inner=64, hidden=32).eval()

    def viewed(h, x):  # the projection's rows reshaped before the residual
        return model.norm(model.dense(h).view(2, 4, 32) + x)

    cases = [(model, (torch.randn(8, 64), torch.randn(8, 32)), ("linear",)),
             (viewed, (torch.randn(8, 64), torch.randn(2, 4, 32)), ("linear", "view"))]
    for program, inputs, product in cases:
        gm = capture(as_module(program), inputs, {})
        (only,) = partition(gm).subprograms
        (cut,) = product_cuts(gm, only)
        assert only.ops[only.nodes.index(cut)] == "add"
        parts = partition(gm, cuts=frozenset({cut})).subprograms
        assert [p.ops for p in parts] == [product, ("add", "layer_norm")]


def _adamw(p, g, m, v):
    """An AdamW step written out element-wise: 16 ops, no product, three results."""
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    m_hat, v_hat = m / (1 - 0.9 ** 10), v / (1 - 0.999 ** 10)
    return p - 1e-3 * (m_hat / (torch.sqrt(v_hat) + 1e-8) + 0.01 * p), m, v


def test_a_chain_of_no_product_splits_by_size_and_its_parts_stay_apart():
    """A subprogram of no matrix product that no µGraph beat is split by size (``size_segments``): its
    compute ops in segments of ``SIZE_CUT_OPS`` in program order, no part joining ops of two segments
    (a later op reading values of several would merge them again), every op in one part."""
    from mirage.frontend.partition import SIZE_CUT_OPS, size_segments

    inputs = tuple(torch.randn(4, 8) for _ in range(3)) + (torch.rand(4, 8) + 0.1,)
    gm, part = _partition(_adamw, inputs)
    (whole,) = part.subprograms
    segments = size_segments(gm, whole)
    assert len(segments) == sum(op != "view" for op in whole.ops) > SIZE_CUT_OPS
    assert len(set(segments.values())) == -(-len(segments) // SIZE_CUT_OPS)
    split = partition(gm, Budget(), frozenset(), segments)
    assert len(split.subprograms) >= len(set(segments.values())) and split.pytorch_ops == ()
    assert sorted(n for s in split.subprograms for n in s.nodes) == sorted(whole.nodes)
    for sub in split.subprograms:
        assert len({segments[n] for n in sub.nodes if n in segments}) == 1, sub.nodes
    assert size_segments(gm, split.subprograms[0]) == {}  # a part fits one segment: not split again


def _centred_step(p, g, m, v):
    """An optimizer step whose update is centred a column: 15 graph ops, one of them a column sum (so
    no one-kernel row-wise µGraph, mirage.generator.rowwise, takes it whole)."""
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    u = m / (torch.sqrt(v) + 1e-8)
    return p - 1e-3 * (u - u.mean(0, keepdim=True)), m, v


def test_a_chain_of_no_product_that_no_graph_beats_is_split_and_its_parts_searched():
    """Through ``superoptimize``: the whole chain's search finds nothing (its one-kernel form needs
    more block ops than the search holds), so it is split by size and the parts searched; the results
    stay float64 PyTorch's."""
    inputs = tuple(torch.randn(4, 8) for _ in range(3)) + (torch.rand(4, 8) + 0.1,)
    fast = mi.superoptimize(_centred_step, inputs, time_limit_s=2, use_cache=False, progress=False)
    assert len(fast.partition.subprograms) > 1 and "before a split: 14 torch ops" in fast.report()
    for got, want in zip(fast(*inputs), _centred_step(*(x.double() for x in inputs)), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_an_element_wise_chain_too_long_for_the_search_is_one_generated_kernel():
    """AdamW's step whole: its search finds nothing, its one-kernel element-wise µGraph
    (mirage.generator.rowwise) runs instead of a split into parts."""
    inputs = tuple(torch.randn(4, 8) for _ in range(3)) + (torch.rand(4, 8) + 0.1,)
    fast = mi.superoptimize(_adamw, inputs, time_limit_s=1, use_cache=False, progress=False)
    assert len(fast.partition.subprograms) == 1 and "before a split" not in fast.report()
    (choice,) = fast.specializations[0].choices.values()
    assert choice.source == "row-wise" and choice.detail.startswith("search skipped")
    for got, want in zip(fast(*inputs), _adamw(*(x.double() for x in inputs)), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_torch_ops_of_several_graph_ops_count_as_their_mean_in_a_size_split():
    """A distillation loss's two tempered ``log_softmax``es and their difference: five torch ops but
    eleven kernel-graph ops, split so that no part holds both ``log_softmax``es."""
    from mirage.frontend.partition import size_segments

    def two_log_softmaxes(s, t):
        return torch.log_softmax(t / 2, -1) - torch.log_softmax(s / 2, -1)

    gm, part = _partition(two_log_softmaxes, (torch.randn(4, 64), torch.randn(4, 64)))
    (whole,) = part.subprograms
    assert len(whole.ops) == 5 and whole.num_ops > 6
    split = partition(gm, Budget(), frozenset(), size_segments(gm, whole))
    assert len(split.subprograms) > 1
    assert all(s.ops.count("log_softmax") <= 1 for s in split.subprograms)
