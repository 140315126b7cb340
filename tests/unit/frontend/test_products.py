"""Sibling products of one input that are only reshaped (query, key and value projections split into
heads) run as one product of the stacked weights, each sibling a slice of it
(``mirage.frontend.products.merged_products``); siblings that feed element-wise ops stay apart, for
the search to fuse with those ops."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mirage as mi
from benchmarks.unseen import BertSelfAttention
from mirage.frontend import capture, partition

_LINEAR = torch.ops.aten.linear.default


def _products(gm) -> int:
    return sum(n.target is _LINEAR for n in gm.graph.nodes)


def _reference(model, *xs):
    with torch.no_grad():
        return copy.deepcopy(model).double()(*(x.double() for x in xs))


class GroupedProjections(nn.Module):
    """Llama's attention: q, k and v projections of different widths (grouped-query heads), no bias."""

    def __init__(self, hidden=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return o.transpose(1, 2).reshape(b, s, -1)


def test_bert_projections_are_one_product_whose_slices_the_heads_read(gpu_like):
    model, x = BertSelfAttention().eval(), torch.randn(1, 128, 768)
    gm = capture(model, (x,), {})
    assert _products(gm) == 1
    products = [s for s in partition(gm).subprograms if s.ops == ("linear",)]
    assert len(products) == 1  # three products of 768 columns before
    (out,) = [n for n in products[0].graph.nodes if n.op.value == "matmul"]
    assert out.outputs[0].shape[-1] == 3 * 768
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)
    assert "one product of 3 stacked weights (query.weight, key.weight, value.weight)" in fast.report()


def test_an_update_in_place_of_one_weight_is_seen_at_the_next_call(gpu_like):
    """The stacked weight is stacked again when one of its parameters changes (version counter)."""
    torch.manual_seed(0)
    model, x = BertSelfAttention(hidden=64, heads=4).eval(), torch.randn(1, 16, 64)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)
        model.key.weight.mul_(-3)
        model.value.bias.add_(1)
        torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)


def test_grouped_query_projections_of_different_widths_merge():
    torch.manual_seed(0)
    model, x = GroupedProjections().eval(), torch.randn(1, 16, 64)
    gm = capture(model, (x,), {})
    assert _products(gm) == 1
    slices = [n for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert [tuple(n.args[2:]) for n in slices] == [(0, 64), (64, 96), (96, 128)]
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)
    assert not any("slice" in op.node for op in fast.partition.pytorch_ops)  # views: no notice


def test_siblings_that_feed_element_wise_ops_stay_apart():
    """SwiGLU's gate and up products join their element-wise ops in one subprogram (GatedMLP)."""
    class SwiGLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up = nn.Linear(32, 64, bias=False), nn.Linear(32, 64, bias=False)

        def forward(self, x):
            return F.silu(self.gate(x)) * self.up(x)

    gm = capture(SwiGLU(), (torch.randn(4, 32),), {})
    assert _products(gm) == 2 and len(partition(gm).subprograms) == 1


def test_siblings_that_differ_in_bias_or_input_stay_apart():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(32, 16), nn.Linear(32, 16, bias=False)
            self.c = nn.Linear(32, 16)

        def forward(self, x, y):  # a and b differ in bias, a and c in input
            return (self.a(x).view(4, 4, 4), self.b(x).view(4, 4, 4), self.c(y).view(4, 4, 4))

    x, y = torch.randn(4, 32), torch.randn(4, 32)
    model = Mixed().eval()
    gm = capture(model, (x, y), {})
    assert _products(gm) == 3
    fast = mi.superoptimize(model, (x, y), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        for got, want in zip(fast(x, y), model(x, y), strict=True):
            torch.testing.assert_close(got, want)


def test_the_parameters_become_rows_of_the_stack_the_product_reads():
    """No second copy of the weights: the parameters (the same objects, the same values) view the
    stacked weight, which a call reads as it is; a parameter given other storage since is stacked
    anew, and a second specialization reads the same stack."""
    from mirage.frontend.products import StackedParameters

    torch.manual_seed(0)
    model, x = BertSelfAttention(hidden=64, heads=4).eval(), torch.randn(1, 16, 64)
    weights = [model.query.weight, model.key.weight, model.value.weight]
    values = [w.detach().clone() for w in weights]
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    gm = fast.specializations[0].module
    stacks = [m for m in gm.modules() if isinstance(m, StackedParameters)]
    assert len(stacks) == 2  # weights, biases
    (stack,) = [m for m in stacks if m._stack.dim() == 2]
    assert all(torch.equal(w, v) for w, v in zip(weights, values, strict=True))
    assert [w.data_ptr() for w in weights] == [stack._stack[k * 64].data_ptr() for k in range(3)]
    assert stack(*weights) is stack._stack
    with torch.no_grad():
        model.value.weight.data = model.value.weight.data.clone() * 2  # other storage
        assert not stack._viewed(tuple(weights))
        torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)
        again = mi.superoptimize(model, (torch.randn(1, 8, 64),), search=False, use_cache=False,
                                 progress=False)
        y = torch.randn(1, 8, 64)
        torch.testing.assert_close(again(y).double(), _reference(model, y), rtol=1e-4, atol=1e-4)


def test_a_second_specialization_reads_the_same_stack():
    from mirage.frontend.products import StackedParameters

    model = BertSelfAttention(hidden=64, heads=4).eval()
    fast = mi.superoptimize(model, (torch.randn(1, 16, 64),), search=False, use_cache=False, progress=False)
    with torch.no_grad():
        y = torch.randn(1, 8, 64)
        torch.testing.assert_close(fast(y).double(), _reference(model, y), rtol=1e-4, atol=1e-4)
    stacks = [m._stack.data_ptr() for spec in fast.specializations for m in spec.module.modules()
              if isinstance(m, StackedParameters) and m._stack.dim() == 2]
    assert len(stacks) == 2 and stacks[0] == stacks[1]


def test_merge_products_off_leaves_the_parameters_as_they_are():
    """``merge_products=False``: three products, each parameter in its own storage (for libraries that
    refuse tensors sharing storage); on, the state dict keeps its keys and values."""
    model, x = BertSelfAttention(hidden=64, heads=4).eval(), torch.randn(1, 16, 64)
    before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False, merge_products=False)
    assert sum(n.target is _LINEAR for n in fast.specializations[0].captured.nodes) == 3
    assert all(v.data_ptr() == before[k][0] for k, v in model.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)
    mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, (_, v) in before.items())
    with pytest.raises(mi.frontend.OptionError, match="merge_products must be True or False"):
        mi.superoptimize(model, (x,), merge_products="no")


def test_parameters_that_share_storage_stay_tied():
    """Two Parameters over one storage (a tie by ``nn.Parameter(other.data)``): not re-pointed, so an
    update of one is still an update of the other; the stack is copied while they are unchanged."""
    from mirage.frontend.products import StackedParameters

    model, x = BertSelfAttention(hidden=64, heads=4).eval(), torch.randn(1, 16, 64)
    twin = copy.deepcopy(model)
    for m in (model, twin):
        m.key.weight = torch.nn.Parameter(m.query.weight.data)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    assert model.key.weight.data_ptr() == model.query.weight.data_ptr()
    (stack,) = [m for m in fast.specializations[0].module.modules()
                if isinstance(m, StackedParameters) and m.names[0].endswith("weight")]
    assert stack._stack is None
    with torch.no_grad():
        model.query.weight.mul_(2)
        twin.query.weight.mul_(2)
        torch.testing.assert_close(model(x), twin(x))
        torch.testing.assert_close(fast(x).double(), _reference(twin, x), rtol=1e-4, atol=1e-4)


def test_specializations_stacking_in_other_orders_do_not_take_the_parameters_from_each_other(caplog):
    import logging

    class Flip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

        def forward(self, x):
            b, n, _ = x.shape
            order = (self.q, self.k, self.v) if n < 10 else (self.v, self.k, self.q)
            q, k, v = (f(x).view(b, n, 4, 8).transpose(1, 2) for f in order)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    model = Flip().eval()
    x1, x2 = torch.randn(2, 8, 32), torch.randn(2, 12, 32)
    fast = mi.superoptimize(model, (x1,), search=False, use_cache=False, progress=False)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        for x in (x2, x1, x2, x1):
            torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)
    assert not [r for r in caplog.records if "capturing it again" in r.getMessage()]
    assert len(fast.specializations) == 2


def test_a_deep_copy_of_the_module_runs():
    model, x = BertSelfAttention(hidden=64, heads=4).eval(), torch.randn(1, 16, 64)
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    other = copy.deepcopy(fast)
    with torch.no_grad():
        torch.testing.assert_close(other(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)


def test_a_transposed_parameter_keeps_its_strides():
    model, x = BertSelfAttention(hidden=64, heads=4).eval(), torch.randn(1, 16, 64)
    model.value.weight = torch.nn.Parameter(model.value.weight.detach().t().contiguous().t())
    strides = [p.stride() for p in (model.query.weight, model.key.weight, model.value.weight)]
    fast = mi.superoptimize(model, (x,), search=False, use_cache=False, progress=False)
    assert [p.stride() for p in (model.query.weight, model.key.weight, model.value.weight)] == strides
    with torch.no_grad():
        torch.testing.assert_close(fast(x).double(), _reference(model, x), rtol=1e-4, atol=1e-4)
