"""FlashDecoding headers derived from an attention reference's shapes, and the strided
accumulator's width taken from its head dim."""

from __future__ import annotations

import mirage as mi
from mirage.generator import Budget, StopReason, flash_decoding, search
from mirage.generator.space import SearchSpace
from mirage.verifier import verify


def _attention(heads: int, queries: int, dim: int, keys: int) -> mi.KernelGraph:
    g = mi.new_kernel_graph()
    q = g.new_input(dims=(heads, queries, dim), dtype=mi.float16)
    k = g.new_input(dims=(heads, dim, keys), dtype=mi.float16)
    v = g.new_input(dims=(heads, keys, dim), dtype=mi.float16)
    e = g.exp(g.mul_scalar(g.matmul(q, k), dim ** -0.5))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
    return g.freeze()


def test_the_headers_follow_the_shapes():
    layout = flash_decoding.overrides(_attention(2, 256, 64, 4096))
    assert layout["griddims"] == [(2, 4, 16), (2, 8, 16), (2, 16, 16), (2, 16, 1)]
    assert layout["franges"] == [1, 2, 4, 8]  # at least 64 keys an iteration, in one split or another
    assert "max_block_ops" not in layout  # decoding: 2 heads × 16 groups of rows, too few unsplit
    few = flash_decoding.overrides(_attention(8, 8, 32, 64))
    assert few["griddims"] == [(8, 4, 1), (8, 1, 1)] and few["franges"] == [1]
    many = flash_decoding.overrides(_attention(16, 128, 64, 1024))
    # one kernel of 16 or 64 query rows a block, 64 or 128 keys an iteration; then the splits
    assert many["griddims"][:2] == [(16, 1, 8), (16, 1, 2)] and many["max_block_ops"] == 10
    assert {8, 16} <= set(many["franges"]) and [(0, -1, 1), (0, -1, -1), (0, -1, -1)] in many["imap_combos"]
    # where 64-row blocks still give 64 blocks or more (12 heads × 8 groups), they come first
    assert flash_decoding.overrides(_attention(12, 512, 64, 512))["griddims"][:2] == [(12, 1, 8), (12, 1, 32)]
    # long prompts: 128-row blocks first where they give 256 blocks or more (Stable Diffusion 1.5's 4,096
    # tokens over 16 heads: 512), not where they would give fewer (2,048 tokens over 12 heads: 192)
    assert flash_decoding.overrides(_attention(16, 4096, 40, 4096))["griddims"][:3] == [
        (16, 1, 32), (16, 1, 64), (16, 1, 256)]
    assert flash_decoding.overrides(_attention(12, 2048, 64, 2048))["griddims"][:2] == [
        (12, 1, 32), (12, 1, 128)]


def test_wide_heads_raise_the_shared_memory_estimate_to_their_one_kernel_body():
    """Heads of 160 (Stable Diffusion 1.5's third level) in 64-row blocks: the one-kernel body's tensors
    take 144 KB by the search's estimate, over the space's 96 KB, so the headers raise the limit to it
    (before, only forms that divide in a second kernel were found); heads of 64 keep the default."""
    from benchmarks.mugraphs.attention import one_kernel

    layout = flash_decoding.overrides(_attention(16, 256, 160, 256))
    assert layout["griddims"][0] == (16, 1, 4)
    (block,) = [n.attrs for n in one_kernel(16, 256, 256, 160, rows=64, key_tile=64).nodes
                if n.op.value == "customized"]
    body = sum(n.outputs[0].nbytes for n in block.nodes if n.outputs and n.op.value != "output")
    assert body > 96 * 1024 and body <= layout["shared_memory_bytes"] <= 227 * 1024
    assert "shared_memory_bytes" not in flash_decoding.overrides(_attention(12, 512, 64, 512))


def test_other_programs_get_no_headers():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    g.mark_output(g.matmul(g.exp(g.matmul(x, g.new_input(dims=(64, 32), dtype=mi.float16))),
                           g.new_input(dims=(32, 16), dtype=mi.float16)))
    assert flash_decoding.overrides(g.freeze()) is None  # rank 2
    few_keys = flash_decoding.overrides(_attention(2, 16, 32, 16))  # too few keys to split: one kernel
    assert few_keys["griddims"] == [(2, 1, 1)] and few_keys["franges"] == [1]
    g = mi.new_kernel_graph()
    q, k, mask, v = (g.new_input(dims=d, dtype=mi.float16)
                     for d in ((8, 64, 32), (8, 32, 64), (1, 1, 64), (8, 64, 32)))
    e = g.exp(g.add(g.mul_scalar(g.matmul(q, k), 0.125), mask))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
    per_key = flash_decoding.overrides(g.freeze())  # a key-padding mask: one row that every query adds
    attention = [combo for combo in per_key["imap_combos"] if len(combo) == 4]  # not the combine's
    assert attention and all(combo[2][0] == -1 and combo[2][2] == -1 for combo in attention)  # no rows
    assert [combo[2] for combo in attention] == [(-1, 2, -1)]  # keys split on y (FlashDecoding's grids)


def _masked(order: str, mask_heads: int) -> mi.KernelGraph:
    """Attention of 8 heads, 64 queries and keys, with its additive mask made the ``order``-th input."""
    g = mi.new_kernel_graph()
    shapes = {"q": (8, 64, 32), "k": (8, 32, 64), "m": (mask_heads, 64, 64), "v": (8, 64, 32)}
    t = {name: g.new_input(dims=shapes[name], dtype=mi.float16) for name in order}
    e = g.exp(g.add(g.mul_scalar(g.matmul(t["q"], t["k"]), 0.125), t["m"]))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), t["v"]))
    return g.freeze()


def test_a_mask_is_tiled_as_the_scores_are():
    """An additive mask of the scores gets the scores' maps in every header, wherever it stands among
    the inputs: query groups on z, the keys split on y and iterated by the loop, heads on x unless
    all heads share it. Its input and its add take two block ops more, and the two graph-defined ops
    of FlashDecoding one kernel op more than the space's default of five."""
    shared = flash_decoding.overrides(_masked("qkmv", 1))
    assert shared["imap_combos"][0] == [(0, -1, 1), (0, 2, -1), (-1, 2, 1), (0, 1, -1)]
    assert shared["fmap_combos"][0] == [-1, 2, 2, 1]
    assert shared["max_block_ops"] == 12 and shared["max_kernel_ops"] == 6
    assert shared["shared_memory_bytes"] == 128 * 1024  # room for a 64 × 128 masked tile
    assert "shared_memory_bytes" not in flash_decoding.overrides(_attention(8, 64, 32, 64))
    per_head = flash_decoding.overrides(_masked("mvqk", 8))
    assert per_head["imap_combos"][0] == [(0, 2, 1), (0, 1, -1), (0, -1, 1), (0, 2, -1)]
    assert per_head["fmap_combos"][0] == [2, 1, -1, 2]


def test_the_masked_member_of_64_rows_and_128_keys_is_in_the_space():
    """The fastest masked form measured (64-row blocks, 128 keys an iteration) needs more shared
    memory by the search's estimate than the space's 96 KB; the masked headers raise it, and its
    one-kernel µGraph is found under its own header within a few hundred states."""
    from mirage.optimizer.softmax import StableExps
    from tests.unit.verifier.verifier_graphs import masked_attention

    reference = masked_attention(heads=12, queries=512, keys=512, dim=64)
    layout = {**flash_decoding.overrides(reference), "griddims": [(12, 1, 8)], "franges": [4]}
    result = search(reference, "attention", budget=Budget(states=5000), progress=False, cache=False,
                    workers=1, stop_when=_one_kernel, keep_when=StableExps.of(reference), **layout)
    assert result.stop_reason is StopReason.TARGET, result.stats.summary()
    (graph,) = result.graphs
    assert [(b.grid_dim, b.forloop_range) for b in graph.block_graphs()] == [((12, 1, 8), 4)]


def test_a_masked_attention_is_found_with_the_headers():
    """Causal attention's shape of µGraph: softmax(Q·K/8 + M)·V, found and verified as one kernel
    with the mask tiled beside the scores; its exps are stabilised by the online-softmax rewrite."""
    from tests.unit.verifier.verifier_graphs import masked_attention

    _assert_one_kernel_found(masked_attention(heads=8, queries=128, keys=64, dim=32), _one_kernel)


def test_the_strided_accumulator_takes_the_head_dim():
    assert SearchSpace.named("attention").resolve(_attention(8, 64, 32, 64)).reduction_dimx == 32
    assert SearchSpace.named("attention").resolve(_attention(2, 256, 64, 4096)).reduction_dimx == 64
    assert SearchSpace.named("mlp").resolve(_attention(8, 64, 32, 64)).reduction_dimx == 64
    own = SearchSpace.named("attention", reduction_dimx=16)
    assert own.resolve(_attention(8, 64, 32, 64)).reduction_dimx == 16


def test_an_attention_of_unseen_shapes_is_found_with_the_headers():
    """A head dim of 32 and 64 keys: with the headers (and the head dim's strided accumulator), the
    search verifies fused two-kernel µGraphs whose exps the online-softmax rewrite stabilises (the
    frontend's filter cuts the others before verification); each is checked again here."""
    from mirage.optimizer.softmax import StableExps, unstable_exps

    reference = _attention(8, 64, 32, 64)
    result = search(reference, "attention", budget=Budget(time_s=120), progress=False, cache=False,
                    workers=1, stop_when=lambda graph: True, keep_when=StableExps(0, 1),
                    **flash_decoding.overrides(reference))
    assert result.graphs and result.stats.pruned["keep_when"] > 0, result.stats.summary()
    for graph in result.graphs:
        assert sum(n.op.value == "customized" for n in graph.nodes) == 2
        assert unstable_exps(graph) == 0 and verify(reference, graph).equivalent


def test_a_one_kernel_attention_is_found_with_the_headers():
    """Many heads and queries, few keys: FlashAttention's one kernel of (heads, 1, query groups)
    blocks, dividing by the row sums after its loop, is in the space (10 block ops) and verified;
    the online-softmax rewrite stabilises its exps."""
    reference = _attention(8, 128, 32, 64)

    def one_kernel(graph):
        return sum(n.op.value == "customized" for n in graph.nodes) == 1 and len(graph.nodes) == 4

    _assert_one_kernel_found(reference, one_kernel)


def _assert_one_kernel_found(reference, one_kernel) -> None:
    """A search under the headers stops at a µGraph that ``one_kernel`` accepts; every such µGraph it
    kept has stable exps and is equivalent to ``reference``."""
    from mirage.optimizer.softmax import StableExps, unstable_exps

    result = search(reference, "attention", budget=Budget(time_s=120), progress=False, cache=False,
                    workers=1, stop_when=one_kernel, keep_when=StableExps(0, 1),
                    **flash_decoding.overrides(reference))
    found = [g for g in result.graphs if one_kernel(g)]
    assert found, result.stats.summary()
    for graph in found:
        assert unstable_exps(graph) == 0 and verify(reference, graph).equivalent


def _one_kernel(graph) -> bool:
    return sum(n.op.value == "customized" for n in graph.nodes) == 1


def _first_one_kernel(reference, states: int, **space) -> dict:
    """Per ``complete_first``: why a search stopped at its first one-kernel µGraph or at ``states``,
    and whether it found one."""
    from mirage.optimizer.softmax import StableExps

    stops = {}
    for complete_first in (True, False):
        result = search(reference, "attention", budget=Budget(states=states), progress=False, cache=False,
                        workers=1, stop_when=_one_kernel, keep_when=StableExps(0, 1),
                        complete_first=complete_first, **{**flash_decoding.overrides(reference), **space})
        stops[complete_first] = result.stop_reason, any(_one_kernel(g) for g in result.graphs)
    return stops


def test_bodies_that_complete_the_graph_close_before_those_that_need_a_second_kernel():
    """256 keys and a small shared memory: the one-kernel header loops over the keys, and its block
    search also finds the bodies of two-kernel µGraphs (the sums divided in a combine kernel) before
    the division. With ``complete_first`` (the default) their combine subtrees wait for the block
    search's end, and the one-kernel µGraph comes within 2,000 states; in turn, it does not."""
    stops = _first_one_kernel(_attention(8, 128, 32, 256), 2000, shared_memory_bytes=24 * 1024)
    assert stops == {True: (StopReason.TARGET, True), False: (StopReason.STATES, False)}


def test_partial_bodies_of_a_fitting_header_wait_for_its_one_kernel_bodies():
    """64-row query groups of a head dim of 64: the tiles admit ``V @ exp(S)`` too, and its partial
    bodies (no output of the reference's type) took their combine subtrees first. The one-kernel
    header fits the reference's tiling, so with ``complete_first`` every partial body of it waits,
    and the one-kernel µGraph comes within 200,000 states; in turn, it does not."""
    stops = _first_one_kernel(_attention(4, 256, 64, 256), 200_000, griddims=[(4, 1, 4), (4, 16, 1)],
                              franges=[4])
    assert stops == {True: (StopReason.TARGET, True), False: (StopReason.STATES, False)}


def test_a_unit_stops_once_its_results_fill_the_budget():
    """The first one-kernel attention comes at state 161 of a unit of hundreds of thousands; with a
    result budget of one, the unit stops there instead of running to its state cap (300,000)."""
    from mirage.optimizer.softmax import StableExps

    reference = _attention(8, 128, 32, 256)
    result = search(reference, "attention", budget=Budget(results=1, states=300_000), progress=False,
                    cache=False, workers=1, keep_when=StableExps(0, 1), shared_memory_bytes=24 * 1024,
                    **flash_decoding.overrides(reference))
    assert result.stop_reason is StopReason.RESULTS and len(result.graphs) == 1
    assert result.stats.states < 1000, result.stats.summary()


def test_the_module_example_runs():
    import doctest

    result = doctest.testmod(flash_decoding)
    assert result.attempted > 0 and result.failed == 0


def test_grid_axes_of_one_block_map_nothing():
    """Decoding (one query: one query group) and a single head put one block on an axis: the headers'
    maps leave that axis unmapped, as the search's canonical form wants (``dims._imap_fits`` drops a
    dim mapped on such an axis), so that every grid keeps input and output maps it accepts."""
    from mirage.generator.dims import _imap_fits, omap_candidates
    from mirage.generator.space import SearchSpace

    for heads, queries in ((8, 1), (1, 256), (2, 16)):
        reference = _attention(heads, queries, 64, 1024)
        layout = flash_decoding.overrides(reference)
        qkv = [reference.nodes[i].outputs[0] for i in reference.input_nodes]
        space = SearchSpace(omaps=tuple(layout["omaps"]))
        for grid in layout["griddims"][:-1]:  # the first kernel's grids: Q, K and V's maps fit
            assert any(all(_imap_fits(t, m, grid) for t, m in zip(qkv, combo, strict=True))
                       for combo in layout["imap_combos"] if len(combo) == 3), (heads, queries, grid)
        for grid in layout["griddims"]:  # every grid, the combine's too: an output map
            assert omap_candidates(grid, space), (heads, queries, grid)
    assert flash_decoding.overrides(_attention(8, 1, 64, 1024))["imap_combos"][0] == [
        (0, -1, -1), (0, 2, -1), (0, 1, -1)]  # Q whole along its one query


def test_a_decoding_attention_is_found_with_the_headers():
    """One query a head (decoding): before its headers left the query axis unmapped, the search
    exhausted its space without a single µGraph; now it verifies FlashDecoding's two kernels."""
    from mirage.optimizer.softmax import StableExps

    reference = _attention(2, 1, 64, 1024)
    result = search(reference, "attention", budget=Budget(time_s=120), progress=False, cache=False,
                    workers=1, stop_when=lambda graph: True, keep_when=StableExps(0, 1),
                    **flash_decoding.overrides(reference))
    assert result.graphs, result.stats.summary()
    assert all(verify(reference, graph).equivalent for graph in result.graphs)


def _softcapped(heads: int, queries: int, dim: int, keys: int, cap: float = 50.0) -> mi.KernelGraph:
    """Gemma 2's attention: ``cap · tanh(S / (sqrt(dim) · cap))`` as the scores."""
    g = mi.new_kernel_graph()
    q = g.new_input(dims=(heads, queries, dim), dtype=mi.float16)
    k = g.new_input(dims=(heads, dim, keys), dtype=mi.float16)
    v = g.new_input(dims=(heads, keys, dim), dtype=mi.float16)
    scores = g.mul_scalar(g.tanh(g.mul_scalar(g.matmul(q, k), dim ** -0.5 / cap)), cap)
    e = g.exp(scores)
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
    return g.freeze()


def test_the_block_budget_holds_the_scores_extra_ops():
    """A soft cap's tanh and product by a number are block ops of the one-kernel form too: the budget
    is plain attention's plus them (before, 10 left that form out of the space: never found)."""
    assert flash_decoding.overrides(_attention(8, 256, 64, 256))["max_block_ops"] == 10
    assert flash_decoding.overrides(_softcapped(8, 256, 64, 256))["max_block_ops"] == 12


def test_a_soft_capped_attention_is_found_as_one_kernel():
    reference = _softcapped(8, 128, 32, 64)

    def one_kernel(graph):
        blocks = [n.attrs for n in graph.nodes if n.op.value == "customized"]
        capped = len(blocks) == 1 and any(n.op.value == "tanh" for n in blocks[0].nodes)
        return capped and len(graph.nodes) == 4

    _assert_one_kernel_found(reference, one_kernel)


def test_queries_that_no_group_divides_get_uneven_one_kernel_grids():
    """ViT's 197 tokens (a prime): beside the block per head, blocks of 16 query rows with the last one
    overlapping (``grid_spans``), and 4 blocks of 50 rows (the online-softmax chain runs 64, padded),
    the keys whole in one step."""
    layout = flash_decoding.overrides(_attention(12, 197, 64, 197))
    assert layout["griddims"] == [(12, 1, 1), (12, 1, 13), (12, 1, 4)]
    assert layout["grid_spans"] == [(0, 0, 0), (0, 0, 197), (0, 0, 197)]
    assert "grid_spans" not in flash_decoding.overrides(_attention(16, 128, 64, 1024))


def test_uneven_grids_of_enough_blocks_stay_beside_the_key_splits():
    """A 100-token prompt of 12 heads: 5 even groups of 20 rows give 60 blocks, too few beside the key
    splits, but 7 uneven blocks of 15 rows a head give 84, so that one-kernel grid stays (with the
    block ops a one-kernel body needs); 2 blocks of 50 rows a head (24) do not."""
    layout = flash_decoding.overrides(_attention(12, 100, 64, 100))
    assert layout["griddims"] == [(12, 1, 7), (12, 4, 5), (12, 5, 1)]
    assert layout["grid_spans"][0] == (0, 0, 100)
    assert layout["max_block_ops"] == flash_decoding.WHOLE_BLOCK_OPS


def test_the_search_verifies_an_uneven_one_kernel_attention():
    reference = _attention(2, 47, 16, 32)  # 47 queries: 3 blocks of 16 rows a head (the last at 31)
    layout = flash_decoding.overrides(reference)
    assert layout["griddims"] == [(2, 1, 1), (2, 1, 3)]
    layout.update(griddims=layout["griddims"][1:], grid_spans=layout["grid_spans"][1:])  # the uneven grid
    result = search(reference, "attention", budget=Budget(time_s=60, results=1), cache=False, **layout)
    assert result.graphs, result.stop_reason
    blocks = [n.attrs for g in result.graphs for n in g.nodes if n.op.value == "customized"]
    uneven = [b for b in blocks if any(b.spans)]
    assert uneven and all(b.spans == (0, 0, 47) and b.grid_dim == (2, 1, 3) for b in uneven)
    graph = next(g for g in result.graphs if any(any(n.attrs.spans) for n in g.nodes
                                                   if n.op.value == "customized"))
    assert verify(reference, graph).equivalent
