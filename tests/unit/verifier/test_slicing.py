"""One slice of a batched program (mirage.verifier.slicing): exact where the leading dim is
independent, refused elsewhere; the search's checker verifies candidates on it and finds the same
µGraphs as with whole verifications."""

from __future__ import annotations

import doctest

import mirage as mi
from mirage.generator import Budget, StopReason, search
from mirage.verifier import slicing, verify
from mirage.verifier.slicing import batch_slice
from tests.unit.verifier.verifier_graphs import small_attention


def _one_kernel(scale: float, heads: int = 8, grid_x: int = 8) -> mi.KernelGraph:
    """FlashAttention's one kernel of (heads, 1, 4) blocks at 64 keys; ``scale`` on the scores."""
    g = mi.new_kernel_graph()
    q = g.new_input(dims=(heads, 64, 32), dtype=mi.float16)
    k = g.new_input(dims=(heads, 32, 64), dtype=mi.float16)
    v = g.new_input(dims=(heads, 64, 32), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(grid_x, 1, 4), block_dim=(128, 1, 1), forloop_range=1,
                                  reduction_dimx=32)
    tq = tb.new_input(q, input_map=(0, -1, 1), forloop_dim=-1)
    tk = tb.new_input(k, input_map=(0, -1, -1), forloop_dim=2)
    tv = tb.new_input(v, input_map=(0, -1, -1), forloop_dim=1)
    e = tb.exp(tb.mul_scalar(tb.matmul(tq, tk), scale))
    total = tb.forloop_accum(e, "sum")
    out = tb.div(tb.forloop_accum(tb.matmul(e, tv)), total)
    tb.new_output(out, output_map=(0, -1, 1))
    (o,) = g.customized([q, k, v], tb)
    g.mark_output(o)
    return g.freeze()


def test_the_module_example_runs():
    result = doctest.testmod(slicing)
    assert result.attempted > 0 and result.failed == 0


def test_an_equivalent_graph_has_an_equivalent_slice_and_a_wrong_one_a_wrong_slice():
    reference = small_attention(heads=8, queries=64, keys=64, dim=32, fused=False)  # scale 0.5
    right, wrong = _one_kernel(0.5), _one_kernel(0.5 / 8)
    assert verify(reference, right).equivalent and not verify(reference, wrong).equivalent
    sliced = batch_slice(right)
    assert sliced is not None and sliced.nodes[3].attrs.grid_dim == (1, 1, 4)
    assert verify(batch_slice(reference), sliced).equivalent
    assert not verify(batch_slice(reference), batch_slice(wrong)).equivalent
    # FlashDecoding's two kernels (key splits on y, a combine) slice too
    decoding = small_attention(heads=8, queries=64, keys=64, dim=32, kv_splits=4)
    assert verify(batch_slice(reference), batch_slice(decoding)).equivalent


def test_graphs_whose_leading_dim_is_not_independent_have_no_slice():
    assert batch_slice(_one_kernel(0.5, heads=8, grid_x=4)) is None  # two heads a block
    # a map of the leading dim on another grid axis, or iterated by the for-loop
    assert slicing._one_block_an_index((0, -1, 1), 2) and not slicing._one_block_an_index((1, -1, 0), -1)
    assert not slicing._one_block_an_index((0, -1, -1), 0)
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 16, 4), dtype=mi.float16)
    g.mark_output(g.add(x, g.mul_scalar(g.new_input(dims=(1, 16, 4), dtype=mi.float16), 2.0)))
    assert batch_slice(g.freeze()) is None  # a computed tensor broadcast along the leading dim
    g = mi.new_kernel_graph()
    g.mark_output(g.matmul(g.new_input(dims=(8, 16), dtype=mi.float16),
                           g.new_input(dims=(16, 4), dtype=mi.float16)))
    assert batch_slice(g.freeze()) is None  # rank 2: the leading dim is a product's rows
    g = mi.new_kernel_graph()
    g.mark_output(g.exp(g.new_input(dims=(1, 16), dtype=mi.float16)))
    assert batch_slice(g.freeze()) is None  # nothing to save


def test_the_search_finds_the_same_graphs_with_the_slice_check(monkeypatch):
    """A complete search of a batched product and scale: candidates that slice are verified on their
    slice alone, accepted or rejected there (a scale applied twice passes the abstract expressions),
    and the search verifies the same µGraphs as with whole verifications; those it accepted and
    rejected on their slice are equivalent and not, verified whole."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 16, 32), dtype=mi.float16)
    w = g.new_input(dims=(8, 32, 16), dtype=mi.float16)
    g.mark_output(g.mul_scalar(g.matmul(x, w), 0.5))
    reference = g.freeze()
    space = dict(griddims=[(8, 1, 1), (8, 2, 1)], franges=[1, 2], workers=1, progress=False, cache=False,
                 kernel_ops=["matmul", "mul_scalar=0.5"], max_kernel_ops=3, max_block_ops=6,
                 block_ops=["matmul", "mul_scalar=0.5", "exp", "accum=sum", "accum=none"])
    decided = {True: [], False: []}
    original = slicing.SlicedVerifier.verify_slice

    def counted(self, candidate):
        result = original(self, candidate)
        if result is not None:
            decided[result.equivalent].append(candidate)
        return result

    monkeypatch.setattr(slicing.SlicedVerifier, "verify_slice", counted)
    with_slices = search(reference, "mlp", budget=Budget(time_s=300), **space)
    monkeypatch.setattr(slicing, "batch_slice", lambda graph: None)
    without = search(reference, "mlp", budget=Budget(time_s=300), **space)
    assert with_slices.stop_reason is without.stop_reason is StopReason.COMPLETE
    assert len(decided[False]) > 100 and len(decided[True]) > 100  # 523 and 444 when written
    found = [sorted(g.content_hash() for g in result.graphs) for result in (with_slices, without)]
    assert found[0] == found[1]
    assert not any(verify(reference, candidate).equivalent for candidate in decided[False][::50])
    assert all(verify(reference, candidate).equivalent for candidate in decided[True][::50])


def test_an_input_shared_by_every_index_is_read_whole_by_the_slice():
    """An additive mask of (1, queries, keys) that all heads share: the reference broadcasts it, the
    one-kernel and the FlashDecoding µGraph read it with no map of the heads; all three slice, keeping
    the mask whole, and the slices verify as the whole graphs do (a wrong scale: not)."""
    from tests.unit.verifier.verifier_graphs import masked_attention

    reference = masked_attention(heads=8)
    sliced = batch_slice(reference)
    assert sliced is not None
    assert [n.outputs[0].shape for n in sliced.nodes if n.op.value == "input"] == [
        (1, 64, 32), (1, 32, 64), (1, 64, 32), (1, 64, 64)]
    for form in ("whole", "split"):
        candidate = masked_attention(heads=8, form=form)
        assert verify(reference, candidate).equivalent and verify(sliced, batch_slice(candidate)).equivalent
    right, wrong = (_plus_shared(scale) for scale in (1.0, 2.0))
    assert batch_slice(right) is not None and batch_slice(wrong) is not None
    assert verify(batch_slice(right), batch_slice(_plus_shared(1.0))).equivalent
    assert not verify(batch_slice(right), batch_slice(wrong)).equivalent


def _plus_shared(scale: float) -> mi.KernelGraph:
    """scale · x + m, x (8, 16, 4) and m (1, 16, 4) broadcast over x's leading dim."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 16, 4), dtype=mi.float16)
    m = g.new_input(dims=(1, 16, 4), dtype=mi.float16)
    g.mark_output(g.add(g.mul_scalar(x, scale), m))
    return g.freeze()


def test_the_frontend_float_checks_one_index_where_both_graphs_slice(monkeypatch):
    """The frontend's last float check before a searched µGraph runs takes the slices where both graphs
    have one, and still rejects a wrong candidate (its slice is wrong too); a candidate with no exact
    slice (two heads a block) is checked whole."""
    import mirage.verifier
    from mirage.frontend.optimize import _float_check
    from mirage.verifier.slicing import sliced_pair

    reference = small_attention(heads=8, queries=64, keys=64, dim=32, fused=False)
    pair = sliced_pair(reference, _one_kernel(0.5))
    assert pair is not None and all(g.input_types[0].shape == (1, 64, 32) for g in pair)
    assert sliced_pair(reference, _one_kernel(0.5, heads=8, grid_x=4)) is None
    seen = []
    check = mirage.verifier.float_check
    monkeypatch.setattr(mirage.verifier, "float_check",
                        lambda a, b, **kw: seen.append(b.input_types[0].shape[0]) or check(a, b, **kw))
    assert _float_check(reference, _one_kernel(0.5))[0]
    assert not _float_check(reference, _one_kernel(0.5 / 8))[0]
    assert _float_check(reference, _one_kernel(0.5, heads=8, grid_x=4))[0]
    assert seen == [1, 1, 8]
