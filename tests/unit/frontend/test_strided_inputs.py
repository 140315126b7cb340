"""Inputs that arrive as views (Hugging Face's head splits, ``view(b, s, h, d).permute(0, 2, 1, 3)``)
are declared with their strides at capture and read through them in place
(``mirage.codegen.column_major``): no dense copy at each call."""

import copy

import pytest
import torch

import mirage as mi
from benchmarks.unseen import BertSelfAttention, ViTAttention
from mirage.errors import GraphError
from mirage.frontend import capture, partition
from mirage.frontend.capture import as_module


def _attention_inputs(sub):
    return {n.attrs.name: (n.attrs.layout, n.attrs.strides) for n in sub.graph.nodes if n.op.value == "input"}


def test_capture_declares_head_split_views_with_their_strides():
    x = torch.randn(1, 128, 768)
    subs = partition(capture(BertSelfAttention(), (x,), {})).subprograms
    attention = next(s for s in subs if sum(n.op.value == "matmul" for n in s.graph.nodes) == 2)
    # q and v: [12, 128, 64] read 64 apart per head, 2304 per token (slices of the one product of the
    # three stacked weights, mirage.frontend.products); kᵀ: the same transposed
    assert _attention_inputs(attention) == {"permute": ("", (64, 2304, 1)),
                                            "transpose": ("col", (64, 1, 2304)),
                                            "permute_2": ("", (64, 2304, 1))}


def test_a_batch_of_two_declares_its_merged_batch_and_heads_with_two_strides():
    """Batch and heads do not merge into one dim of a view: the (batch · heads) dim is declared split,
    12 heads 64 apart within a batch row, batch rows 64 · 2304 apart; the binding hands the kernels the
    four-dim view, never a copy."""
    x = torch.randn(2, 64, 768)
    subs = partition(capture(BertSelfAttention(), (x,), {})).subprograms
    attention = next(s for s in subs if sum(n.op.value == "matmul" for n in s.graph.nodes) == 2)
    assert _attention_inputs(attention) == {"permute": ("", (64, 2304, 1)),
                                            "transpose": ("col", (64, 1, 2304)),
                                            "permute_2": ("", (64, 2304, 1))}
    declared = {n.attrs.name: n.attrs.split_strides for n in attention.graph.nodes if n.op.value == "input"}
    assert set(declared.values()) == {(0, 12, 64 * 2304)}
    binding = next(b for b in attention.inputs if b.source == "permute")
    source = torch.randn(2, 64, 2304)[:, :, :768].view(2, 64, 12, 64).permute(0, 2, 1, 3)
    viewed = binding.viewed(source)
    assert viewed.shape == (2, 12, 64, 64) and viewed.data_ptr() == source.data_ptr()
    assert torch.equal(viewed.reshape(24, 64, 64), binding.apply(source))


def test_a_batch_of_two_runs_its_views_in_place_and_matches_float64(gpu_like):
    """Through the compiled-kernel executor (the launcher asserts each view arrives as declared)."""
    model = BertSelfAttention().eval()
    x = torch.randn(2, 64, 768)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        for _ in range(2):
            got = fast(x).double()
            torch.testing.assert_close(got, copy.deepcopy(model).double()(x.double()), rtol=1e-4, atol=1e-4)
    assert "read in place: " in fast.report() and "permute_2" in fast.report()


def test_head_split_views_reach_the_kernels_as_they_are(gpu_like):
    """Through the compiled-kernel executor (interpreted behind it), the views arrive with the declared
    strides (the launcher asserts so) and the result matches float64 eager."""
    model = BertSelfAttention().eval()
    x = torch.randn(1, 128, 768)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        got = fast(x).double()
        torch.testing.assert_close(got, copy.deepcopy(model).double()(x.double()), rtol=1e-4, atol=1e-4)
    report = fast.report()
    assert "read in place: " in report and "permute_2" in report and "transpose" in report, report


@pytest.mark.parametrize(("strides", "expected"), [
    ((64, 768, 1), ("", (64, 768, 1))),
    ((64, 1, 768), ("col", (64, 1, 768))),
    ((8192, 64, 1), ("", ())),  # dense row-major
    ((8192, 1, 64), ("col", ())),  # dense column-major
])
def test_the_builder_classifies_strides(strides, expected):
    from mirage.mugraph.graph import input_layout

    shape = (12, 128, 64) if strides[-1] == 1 else (12, 64, 128)
    assert input_layout(shape, strides) == expected


def test_a_square_transposed_weight_is_dense_column_major():
    """nn.Linear(768, 768)'s weight.T: dense, declared "col" with no strides (the graph, its text and its
    hash as before strides were declared)."""
    from mirage.mugraph.graph import dense_strides, input_layout

    assert dense_strides((768, 768), "col") == (1, 768) and dense_strides((4, 6), "col") == (1, 4)
    assert input_layout((768, 768), (1, 768)) == ("col", ())
    x = torch.randn(128, 768)
    (sub,) = partition(capture(torch.nn.Linear(768, 768), (x,), {})).subprograms
    assert _attention_inputs(sub)["weight"] == ("col", ())


def test_the_builder_refuses_strides_that_repeat_elements_or_step_no_inner_dim():
    g = mi.new_kernel_graph()
    with pytest.raises(GraphError, match="repeat elements"):
        g.new_input(dims=(12, 128, 64), strides=(64, 768, 2))
    with pytest.raises(GraphError, match="step neither"):
        g.new_input(dims=(12, 128, 64), strides=(1, 768, 12))


def test_declared_strides_survive_the_text_and_json_forms_and_change_the_hash():
    from mirage.mugraph import serialize, text

    def graph(strides):
        g = mi.new_kernel_graph("heads")
        q = g.new_input(dims=(12, 128, 64), strides=strides, name="q")
        k = g.new_input(dims=(12, 64, 128), strides=(64, 1, 768), name="k")
        g.mark_output(g.matmul(q, k))
        return g.freeze()

    viewed, dense = graph((64, 768, 1)), graph((8192, 64, 1))
    assert "strides=(64,768,1)" in text.to_text(viewed)
    assert "strides" not in text.to_text(dense).split("\n")[1]
    for g in (viewed, dense):
        assert text.parse(text.to_text(g)) == g and serialize.loads(serialize.dumps(g)) == g
    assert viewed.content_hash() != dense.content_hash()


def test_a_broadcast_view_is_declared_with_stride_0_and_laid_out_so():
    """Rotary's table read by every head: strides (0, d, 1). A call passing another layout of the
    same broadcast is copied into it (its first slice); one whose values may differ along the
    broadcast dim is refused, not read wrong."""
    from mirage.codegen.column_major import in_layout
    from mirage.codegen.gpu_check import random_inputs
    from mirage.codegen.runtime import LaunchError
    from mirage.mugraph.graph import input_layout

    assert input_layout((32, 256, 64), (0, 64, 1)) == ("", (0, 64, 1))
    table = torch.randn(1, 256, 64)
    other = table.mT.contiguous().mT.expand(32, 256, 64)  # the same broadcast, column-major rows
    laid = in_layout(other, False, (0, 64, 1))
    assert laid.stride() == (0, 64, 1) and torch.equal(laid, table.expand(32, 256, 64))
    with pytest.raises(LaunchError, match="broadcast along dims"):
        in_layout(torch.randn(32, 256, 64), False, (0, 64, 1))
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(32, 256, 64), strides=(0, 64, 1), dtype=mi.float32)
    g.mark_output(g.exp(x))
    (drawn,) = random_inputs(g.freeze(), device="cpu")
    assert drawn.stride() == (0, 64, 1)


@pytest.mark.parametrize("seed", range(40))
def test_random_views_are_declared_or_refused_and_laid_out_with_their_values(seed):
    """Views from permutes, slices, transposes and expands of random tensors: each is either refused
    by ``input_layout`` or declared so that a dense copy laid out again (``in_layout``) has exactly the
    declared strides and the view's values."""
    from mirage.codegen.column_major import in_layout
    from mirage.mugraph.graph import dense_strides, input_layout

    g = torch.Generator().manual_seed(seed)

    def pick(n):
        return int(torch.randint(n, (1,), generator=g))

    base = torch.randn([2 + pick(5) for _ in range(3 + pick(2))], generator=g)
    view = base.permute(*torch.randperm(base.dim(), generator=g).tolist())
    if pick(2):
        view = view[..., : max(1, view.shape[-1] - pick(3))]
    if pick(3) == 0:
        view = view.select(0, 0).unsqueeze(0).expand(3, *view.shape[1:])
    shape = tuple(view.shape)
    try:
        layout, strides = input_layout(shape, view.stride())
    except ValueError:
        return
    declared = strides or dense_strides(shape, layout)
    if 0 in strides:  # a broadcast: a dense copy may differ along it (refused); the view itself is read
        from mirage.codegen.runtime import LaunchError

        with pytest.raises(LaunchError, match="broadcast"):
            in_layout(view.contiguous(), False, strides)
        assert in_layout(view, False, strides) is view
        return
    laid = in_layout(view.contiguous(), layout == "col" and not strides, strides or None)
    if not strides and layout == "":
        assert laid.is_contiguous()
    else:
        assert all(s == d for s, d, n in zip(laid.stride(), declared, shape, strict=True) if n > 1)
    assert torch.equal(laid, view)


class _FusedQKV(torch.nn.Module):
    """timm's ViT attention: one projection to q, k and v, split by reshape and permute."""

    def __init__(self, dim: int = 192, heads: int = 3):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, dim * 3)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        return (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)


class _SharedBias(torch.nn.Module):
    """A bias of the scores shared by the heads, expanded to them."""

    def forward(self, q, k, v, bias):
        return (q @ k.transpose(-1, -2) + bias.expand(q.shape[0], q.shape[1], -1, -1)).softmax(-1) @ v


@pytest.mark.parametrize("case", ["fused_qkv", "shared_bias"])
def test_slices_of_a_fused_projection_and_expanded_biases_reach_the_kernels_as_views(case, gpu_like):
    """q, k and v of one projection are non-dense slices ((d, 3·h·d, 1) apart); an expanded bias has
    stride 0 over the heads: each declared so, passed as it is (the launcher asserts it), and the result
    is float64 eager's."""
    if case == "fused_qkv":
        model, inputs = _FusedQKV().eval(), (torch.randn(1, 64, 192),)
        wanted = {"getitem": (64, 576, 1), "transpose": (64, 1, 576), "getitem_2": (64, 576, 1)}
    else:
        qkv = tuple(torch.randn(1, 4, 64, 32) for _ in range(3))
        model, inputs = _SharedBias(), (*qkv, torch.randn(1, 1, 64, 64))
        wanted = {"expand": (0, 64, 1)}
    subs = partition(capture(model, inputs, {})).subprograms
    declared = {name: strides for s in subs for name, (_, strides) in _attention_inputs(s).items() if strides}
    assert declared == wanted
    fast = mi.superoptimize(model, inputs, search=False, use_cache=False, progress=False)
    with torch.no_grad():
        got = fast(*inputs).double()
        want = copy.deepcopy(model).double()(*(t.double() for t in inputs))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [1, 2])
def test_grouped_query_folds_are_declared_views_and_match_float64(gpu_like, batch):
    """Llama's q of 16 heads folded into 4 groups of key heads, (b · 4, 4 · s, d): the group and the
    token take two strides in the rows (64 and 1536), and at batch 2 batch and key heads two more; the
    head merge after the attention likewise. Through the compiled-kernel executor (the launcher
    asserts each view arrives as declared) the program matches float64."""
    from benchmarks.unseen import LlamaAttention

    model = LlamaAttention().eval()
    x = torch.randn(batch, 64, 1024)
    subs = partition(capture(model, (x,), {})).subprograms
    attention = next(s for s in subs if sum(n.op.value == "matmul" for n in s.graph.nodes) == 2)
    q = next(attention.graph.nodes[n].attrs for n in attention.graph.input_nodes
             if attention.graph.nodes[n].attrs.name == "transpose")
    assert q.strides == (256, 1536, 1) and q.splits()[1] == (64, 64)
    assert (0 in q.splits()) == (batch > 1)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
        torch.testing.assert_close(fast(x).double(), want, rtol=1e-4, atol=1e-4)


def test_vit_attention_at_batch_two_declares_its_split_heads_and_matches_float64(gpu_like):
    """197 tokens, 6 heads: q, kᵀ and v are (b·h) rows of 64 and 197 · 1152 apart, the head merge after
    the attention 64 and 197 · 384 apart."""
    model = ViTAttention().eval()
    x = torch.randn(2, 197, 384)
    subs = partition(capture(model, (x,), {})).subprograms
    attention = next(s for s in subs if s.ops == ("scaled_dot_product_attention",))
    splits = {n.attrs.name: n.attrs.split_strides for n in attention.graph.nodes if n.op.value == "input"}
    assert set(splits.values()) == {(0, 6, 197 * 1152)}
    assert attention.graph.output_strides == ((64, 384, 1, 0, 6, 197 * 384),)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double())
        torch.testing.assert_close(fast(x).double(), want, rtol=1e-4, atol=1e-4)


def test_a_key_padding_mask_broadcast_over_heads_is_a_split_view(gpu_like):
    """A (4, 1, 1, 256) additive mask broadcast to the scores of 4 · 12 heads: held as (48, 1, 256), one
    row of keys a head, whose merged dim steps 0 within a batch row's heads and 256 between rows: read
    as it is, not expanded (and not over the queries, which add the same row: the chain's key-padding
    MaskTile)."""
    from benchmarks.unseen import PaddedAttention

    model = PaddedAttention().eval()
    xs = tuple(torch.randn(4, 12, 256, 64) for _ in range(3))
    (sub,) = partition(capture(model, xs, {})).subprograms
    (node,) = [n for n in sub.graph.input_nodes if sub.graph.nodes[n].attrs.name == "additive_mask"]
    mask = sub.graph.nodes[node].attrs
    assert sub.graph.nodes[node].outputs[0].shape == (48, 1, 256)
    assert mask.strides[0] == 0 and mask.strides[2] == 1 and mask.splits() == {0: (12, 256)}
    fast = mi.superoptimize(model, xs, search=False, use_cache=False, progress=False)
    with torch.no_grad():
        want = copy.deepcopy(model).double()(*(x.double() for x in xs))
        torch.testing.assert_close(fast(*xs).double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("computed", [True, False])
def test_a_modulation_over_the_tokens_is_held_in_rows_of_batch_and_tokens(gpu_like, computed):
    """DiT's adaLN: ``norm(x) · (1 + scale[:, None]) + shift[:, None]``, shift and scale one row a batch
    index. The norm's rows merge batch and tokens, over which ``1 + scale`` broadcasts in part: that
    sum is computed again from scale read through a split rows' dim (tokens stride 0), so the region
    stays in the flat frame of (batch · tokens) rows, one graph for the search, no copy."""
    from benchmarks.unseen_models import DiTModulate

    def modulate(x, shift, scale):
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)
        return h * (1 + scale[:, None]) + shift[:, None] if computed else h * scale[:, None] + shift[:, None]

    x, c = torch.randn(2, 64, 384), torch.randn(2, 384)
    shift, scale = torch.randn(2, 384), torch.randn(2, 384)
    (sub,) = partition(capture(as_module(modulate), (x, shift, scale), {})).subprograms
    assert all(n.outputs[0].shape[0] == 128 for n in sub.graph.nodes)  # rows of batch · tokens
    declared = [sub.graph.nodes[i].attrs for i in sub.graph.input_nodes if sub.graph.nodes[i].attrs.strides]
    assert [(a.strides, a.split_strides) for a in declared] == [((0, 1), (0, 64, 384))] * 2
    fast = mi.superoptimize(modulate, (x, shift, scale), search=False, use_cache=False, progress=False)
    want = modulate(x.double(), shift.double(), scale.double())
    torch.testing.assert_close(fast(x, shift, scale).double(), want, rtol=1e-4, atol=1e-4)
    assert "kept copies" not in fast.report()

    model = DiTModulate().eval()  # the same through a module's projection: its chunks are rows 768 apart
    subs = partition(capture(model, (x, c), {})).subprograms
    assert {n.outputs[0].shape[0] for n in subs[-1].graph.nodes} == {128}
    assert {subs[-1].graph.nodes[i].attrs.split_strides for i in subs[-1].graph.input_nodes} == {
        (), (0, 64, 768)}
    fast = mi.superoptimize(model, (x, c), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        want = copy.deepcopy(model).double()(x.double(), c.double())
        torch.testing.assert_close(fast(x, c).double(), want, rtol=1e-4, atol=1e-4)
