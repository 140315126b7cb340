import json
import logging
import pickle

import pytest
import torch
import torch.nn.functional as F

import mirage as mi
from mirage.frontend import optimize
from mirage.frontend.optimize import SearchSettings, SearchUnavailable, cache_key, choose
from mirage.mugraph.ops import Op
from mirage.optimizer import softmax as softmax_rewrite
from mirage.optimizer.softmax import StableExps


def program(x, w):
    return F.silu(x @ w) * 2.0


def renamed_program(a, b):  # the same computation, other names
    return F.silu(a @ b) * 2.0


INPUTS = (torch.randn(4, 8), torch.randn(8, 6))


def _rewritten(reference):
    """An equivalent graph of another structure (s + s for 2·s): shows which graph was chosen."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    w = g.new_input(dims=(8, 6), dtype=mi.float32)
    s = g.silu(g.matmul(x, w))
    g.mark_output(g.add(s, s))
    return g.freeze()


@pytest.fixture
def fake_search(monkeypatch):
    calls = []

    def run_search(reference, settings, progress=True):
        calls.append(reference)
        rewritten = _rewritten(reference)
        found = rewritten if reference.input_types == rewritten.input_types else reference
        return found, "1 verified µGraph(s); search stopped: test", [found], False

    monkeypatch.setattr(optimize, "run_search", run_search)
    return calls


def test_second_call_does_no_search(fake_search, isolated_cache):
    first = mi.superoptimize(program, INPUTS)
    assert len(fake_search) == 1
    assert first.specializations[0].choices["sp0"].source == "search"
    second = mi.superoptimize(renamed_program, INPUTS)  # same program up to names: same cache entry
    assert len(fake_search) == 1
    choice = second.specializations[0].choices["sp0"]
    assert choice.source == "cache" and "cached search result" in choice.detail
    assert choice.graph.nodes[-1].op is Op.ADD  # the rewritten graph, not the reference
    runner = second.specializations[0].module.sp0
    assert runner.executor(torch.device("cpu")).graph is choice.graph
    torch.testing.assert_close(second(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)
    assert len(list((isolated_cache / "search").glob("*.json"))) == 1


def test_cache_can_be_switched_off(fake_search):
    mi.superoptimize(program, INPUTS, use_cache=False)
    mi.superoptimize(program, INPUTS, use_cache=False)
    assert len(fake_search) == 2


def test_without_the_cache_the_generator_keeps_no_store_of_searches_either(monkeypatch):
    """``use_cache=False`` reaches the generator: a search is run again, not read from its store."""
    seen = []

    def run_search(reference, settings, progress=True):
        seen.append(dict(settings.overrides))
        return reference, "0 verified µGraph(s); search stopped: test", [], False

    monkeypatch.setattr(optimize, "run_search", run_search)
    mi.superoptimize(program, INPUTS, use_cache=False)
    assert seen[-1].get("cache") == "false"
    mi.superoptimize(program, INPUTS, use_cache=False, search_overrides={"cache": True})
    assert seen[-1].get("cache") == "true"  # the user's own setting wins


def test_environment_switches_the_cache_off(fake_search, monkeypatch):
    monkeypatch.setenv("MIRAGE_NO_CACHE", "1")
    mi.superoptimize(program, INPUTS)
    mi.superoptimize(program, INPUTS)
    assert len(fake_search) == 2


@pytest.mark.parametrize(("function", "shapes", "config"), [
    (lambda q, k, v: torch.softmax(q @ k, -1) @ v, ((2, 4), (4, 8), (8, 4)), "attention"),
    # a softmax that ends the program: its one-kernel µGraphs need whole rows, which mlp's maps give
    (lambda q, k: torch.softmax(q @ k, -1), ((2, 4), (4, 8)), "mlp"),
    (lambda x, w, a, b: x @ w + (x @ a) @ b, ((2, 8), (8, 8), (8, 2), (2, 8)), "lora"),
    (program, ((4, 8), (8, 6)), "mlp"),
])
def test_search_space_is_chosen_per_subprogram(function, shapes, config, fake_search):
    seen = []
    original = optimize.run_search

    def recording(reference, settings, progress=True):
        seen.append(settings.config)
        return original(reference, settings, progress)

    optimize.run_search = recording
    try:
        mi.superoptimize(function, tuple(torch.randn(*s) for s in shapes))
        mi.superoptimize(function, tuple(torch.randn(*s) for s in shapes), config="mlp")
    finally:
        optimize.run_search = original
    assert seen[0] == config
    assert seen[1:] == ([] if config == "mlp" else ["mlp"])  # an explicit config is a new search


def test_search_settings_are_part_of_the_key():
    graph = mi.superoptimize(program, INPUTS, search=False).partition.subprograms[0].graph
    keys = {cache_key(graph, SearchSettings()), cache_key(graph, SearchSettings(config="mlp")),
            cache_key(graph, SearchSettings(time_limit_s=5.0)),
            cache_key(graph, SearchSettings(overrides=(("workers", "1"),)))}
    assert len(keys) == 4


def test_corrupt_cache_entry_is_ignored_and_rewritten(fake_search, isolated_cache, caplog):
    mi.superoptimize(program, INPUTS)
    (entry,) = (isolated_cache / "search").glob("*.json")
    entry.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        again = mi.superoptimize(program, INPUTS)
    assert len(fake_search) == 2
    assert again.specializations[0].choices["sp0"].source == "search"
    assert any("corrupt cache file" in r.getMessage() and "unreadable search-cache entry" in r.getMessage()
               for r in caplog.records)
    assert json.loads(entry.read_text())["source"] == "search"


def test_a_found_graph_with_another_signature_is_rejected(monkeypatch, caplog):
    def wrong(reference, settings, progress=True):
        g = mi.new_kernel_graph()
        g.mark_output(g.exp(g.new_input(dims=(3, 3), dtype=mi.float32)))
        return g.freeze(), "1 verified µGraph(s)", [], False

    monkeypatch.setattr(optimize, "run_search", wrong)
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        fast = mi.superoptimize(program, INPUTS)
    assert fast.specializations[0].choices["sp0"].source == "reference"
    assert any("does not take the reference's inputs" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)


def test_a_found_graph_that_computes_something_else_is_rejected(monkeypatch, caplog):
    pytest.importorskip("mirage.verifier")

    def wrong(reference, settings, progress=True):
        g = mi.new_kernel_graph()
        x = g.new_input(dims=(4, 8), dtype=mi.float32)
        w = g.new_input(dims=(8, 6), dtype=mi.float32)
        g.mark_output(g.mul_scalar(g.relu(g.matmul(x, w)), 2.0))  # relu, not silu
        return g.freeze(), "1 verified µGraph(s)", [], False

    monkeypatch.setattr(optimize, "run_search", wrong)
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        fast = mi.superoptimize(program, INPUTS)
    detail = fast.specializations[0].choices["sp0"].detail
    assert detail == "fallback: the searched µGraph failed the float check"
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)


def test_real_search_finds_a_fused_graph_and_caches_it():
    pytest.importorskip("mirage.generator")

    def function(x, w):
        return torch.exp(x @ w)

    inputs = (torch.randn(8, 256) * 0.1, torch.randn(256, 64) * 0.1)
    options = {"time_limit_s": 8, "max_results": 1, "search_overrides": {
        "griddims": [[8, 1, 1]], "franges": [4], "workers": 1, "checkpoint": False, "cache": False}}
    fast = mi.superoptimize(function, inputs, **options)
    choice = fast.specializations[0].choices["sp0"]
    assert choice.source == "search", choice.detail
    assert choice.detail.startswith("1 verified µGraph(s)")
    torch.testing.assert_close(fast(*inputs), function(*inputs), rtol=1e-4, atol=1e-5)
    again = mi.superoptimize(function, inputs, **options)
    assert again.specializations[0].choices["sp0"].source == "cache"
    assert again.specializations[0].choices["sp0"].graph == choice.graph


def test_missing_search_falls_back_to_the_reference_and_caches_nothing(monkeypatch, isolated_cache):
    def unavailable(reference, settings, progress=True):
        raise SearchUnavailable("mirage.generator offers no search (test)")

    monkeypatch.setattr(optimize, "run_search", unavailable)
    monkeypatch.setattr(optimize, "rowwise_candidates", lambda reference: [])  # nor a generated one
    fast = mi.superoptimize(program, INPUTS)
    choice = fast.specializations[0].choices["sp0"]
    assert choice.source == "reference" and choice.detail.startswith("fallback:")
    assert choice.graph == fast.partition.subprograms[0].graph
    assert not (isolated_cache / "search").exists()
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)


def test_failed_search_falls_back_with_a_warning(monkeypatch, caplog):
    def broken(reference, settings, progress=True):
        raise RuntimeError("worker died")

    monkeypatch.setattr(optimize, "run_search", broken)
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        fast = mi.superoptimize(program, INPUTS)
    detail = fast.specializations[0].choices["sp0"].detail
    assert detail == "fallback: search failed: RuntimeError: worker died"
    assert any("worker died" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)


def test_a_dead_search_worker_names_what_to_do(monkeypatch, isolated_cache):
    """A worker process that dies (out of memory, killed) breaks the search's pool: the fallback's
    reason says so and how to search in this process instead."""
    from concurrent.futures.process import BrokenProcessPool

    def broken(reference, settings, progress=True):
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(optimize, "run_search", broken)
    detail = mi.superoptimize(program, INPUTS).specializations[0].choices["sp0"].detail
    assert detail.startswith("fallback: search failed: BrokenProcessPool: A process in the process pool")
    assert "search_overrides={'workers': 1}" in detail


def test_nothing_found_is_cached_as_the_reference(monkeypatch, isolated_cache):
    calls = []

    def finds_nothing(reference, settings, progress=True):
        calls.append(1)
        return None, "0 verified µGraph(s); search stopped: time budget spent", [], False

    monkeypatch.setattr(optimize, "run_search", finds_nothing)
    graph = mi.superoptimize(program, INPUTS, search=False).partition.subprograms[0].graph
    cache = isolated_cache / "search"
    first = choose(graph, SearchSettings(), cache_dir=cache)
    second = choose(graph, SearchSettings(), cache_dir=cache)
    assert (first.source, second.source, len(calls)) == ("reference", "cache", 1)
    assert second.graph == graph


def test_list_and_clear_entries(fake_search, isolated_cache):
    mi.superoptimize(program, INPUTS)
    mi.superoptimize(lambda x: torch.exp(x) * 3.0, (torch.randn(2, 2),))
    rows = optimize.list_entries(isolated_cache / "search")
    assert len(rows) == 2 and {r["source"] for r in rows} == {"search"}
    assert all(len(r["key"]) == 64 and r["bytes"] > 0 for r in rows)
    assert optimize.clear_entries(isolated_cache / "search") == 2
    assert optimize.list_entries(isolated_cache / "search") == []


def test_profiling_picks_among_all_verified_graphs_and_keys_the_cache_per_gpu(monkeypatch, tmp_path):
    reference = mi.superoptimize(program, INPUTS, search=False).partition.subprograms[0].graph
    other = _rewritten(reference)
    seen = []

    def search(ref, settings, progress=True):
        return reference, "2 verified µGraph(s); search stopped: test", [reference, other], False

    def timed(ref, candidates):
        seen.append(candidates)
        build = {"stages": 3, "dependent_launch": False}
        return candidates[-1], "fastest of 2 GPU builds: 1.00 µs", build, 1.0, frozenset()

    monkeypatch.setattr(optimize, "run_search", search)
    monkeypatch.setattr(optimize, "profile_choice", timed)
    monkeypatch.setattr(optimize, "pytorch_us", lambda ref, runner=None: 5.0)
    settings = optimize.SearchSettings(config="mlp")
    plain = optimize.choose(reference, settings, cache_dir=tmp_path)
    profiled = optimize.choose(reference, settings, cache_dir=tmp_path, profile_on="Some GPU")
    assert seen and len(seen[0]) == 2
    assert profiled.graph == optimize._rename(other, reference) and "GPU builds" in profiled.detail
    assert plain.key != profiled.key  # the fastest graph depends on the GPU
    cached = optimize.choose(reference, settings, cache_dir=tmp_path, profile_on="Some GPU")
    assert cached.source == "cache" and cached.graph == profiled.graph
    assert cached.build == profiled.build == {"stages": 3, "dependent_launch": False}  # how it was timed
    assert plain.build is None


def test_when_no_build_matches_on_the_gpu_none_runs(monkeypatch, tmp_path):
    """Every searched µGraph failed the GPU float check (an fp16 overflow, say): the reference is
    chosen, not the cost model's pick; any other profiling failure keeps the pick."""
    from mirage.codegen.select import SelectionError

    reference = mi.superoptimize(program, INPUTS, search=False).partition.subprograms[0].graph
    other = _rewritten(reference)

    def search(ref, settings, progress=True):
        return other, "1 verified µGraph(s); search stopped: test", [other], False

    def mismatched(ref, candidates):
        raise SelectionError("none of 2 candidate builds compiled, ran and matched the reference")

    def broken(ref, candidates):
        raise RuntimeError("no CUDA driver")

    monkeypatch.setattr(optimize, "run_search", search)
    settings = optimize.SearchSettings(config="mlp")
    monkeypatch.setattr(optimize, "profile_choice", mismatched)
    choice = optimize.choose(reference, settings, profile_on="Some GPU")
    assert choice.source == "reference" and "none matched the reference on the GPU" in choice.detail
    monkeypatch.setattr(optimize, "profile_choice", broken)
    assert optimize.choose(reference, settings, profile_on="Some GPU").source == "search"


def _wrong(reference):
    """Same signature, another function (silu(x·w) without the factor 2)."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    w = g.new_input(dims=(8, 6), dtype=mi.float32)
    g.mark_output(g.silu(g.matmul(x, w)))
    return g.freeze()


def test_given_candidates_are_verified_and_used_without_a_search(isolated_cache):
    fast = mi.superoptimize(program, INPUTS, search=False, candidates=[_rewritten(None)])
    choice = fast.specializations[0].choices["sp0"]
    assert choice.source == "candidate" and "1 of 1 given candidate(s) verified" in choice.detail
    assert choice.graph.nodes[-1].op is Op.ADD
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)


def test_a_wrong_candidate_is_refused(isolated_cache, caplog):
    with caplog.at_level(logging.WARNING, logger="mirage"):
        fast = mi.superoptimize(program, INPUTS, search=False, candidates=[_wrong(None)])
    assert fast.specializations[0].choices["sp0"].source == "reference"
    assert "not equivalent" in caplog.text
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)


def test_candidates_must_be_kernel_graphs():
    with pytest.raises(mi.MirageError, match=r"candidates\[0\] is a str"):
        mi.superoptimize(program, INPUTS, candidates=["not a graph"])


def test_a_failing_search_keeps_the_given_candidates(isolated_cache, monkeypatch, caplog):
    """A search that raises falls back to the verified candidates, not straight to the reference."""
    def broken(ref, settings, progress=True):
        raise RuntimeError("search exploded")

    monkeypatch.setattr(optimize, "run_search", broken)
    with caplog.at_level(logging.WARNING, logger="mirage"):
        fast = mi.superoptimize(program, INPUTS, candidates=[_rewritten(None)])
    choice = fast.specializations[0].choices["sp0"]
    assert choice.source == "candidate" and "search failed: RuntimeError" in choice.detail
    assert "running the verified candidates" in caplog.text
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS), rtol=1e-5, atol=1e-6)


def test_a_fruitless_search_leaves_the_subprogram_in_pytorch(monkeypatch, isolated_cache):
    """Nothing better than the reference graph: the torch ops stay (faster than the reference graph
    op by op); with search=False the reference graph runs as mirage code, as before."""
    from mirage.frontend.runtime import SubprogramModule

    def finds_nothing(reference, settings, progress=True):
        return None, "0 verified µGraph(s); search stopped: test", [], False

    monkeypatch.setattr(optimize, "run_search", finds_nothing)
    monkeypatch.setattr(optimize, "rowwise_candidates", lambda reference: [])  # nor a generated one
    fast = mi.superoptimize(program, INPUTS)
    spec = fast.specializations[0]
    assert spec.choices["sp0"].source == "reference"
    assert not [m for m in spec.module.modules() if isinstance(m, SubprogramModule)]
    assert "runs in PyTorch, as nothing beat its reference graph" in fast.report()
    # with no µGraph to run, the program as given runs, not the captured graph (whose composite ops,
    # decomposed at capture, would run slower in pieces: GroupNorm at Stable Diffusion's size)
    assert spec.module is fast.program and "no µGraph runs: the program runs as given" in fast.report()
    torch.testing.assert_close(fast(*INPUTS), program(*INPUTS))
    plain = mi.superoptimize(program, INPUTS, search=False)
    assert [m for m in plain.specializations[0].module.modules() if isinstance(m, SubprogramModule)]


def _small_searches_only(monkeypatch, most_ops: int) -> list[int]:
    """Searches that find the reference itself for graphs of at most ``most_ops`` ops and nothing for
    larger ones; returns the list the op counts of the searched graphs go into, in order."""
    searched: list[int] = []

    def small_only(reference, settings, progress=True):
        ops = sum(1 for n in reference.nodes if n.op is not Op.INPUT)
        searched.append(ops)
        return (None if ops > most_ops else reference), "test", [], False

    monkeypatch.setattr(optimize, "run_search", small_only)
    return searched


def test_a_fruitless_subprogram_is_split_before_its_next_layer_and_the_parts_searched(monkeypatch):
    """x + (silu(x·Wg) · (x·Wu))·Wd: no µGraph for all six ops, so the subprogram is split before
    the down projection (a product of a value computed inside it) and each part is searched."""
    import torch.nn.functional as F

    from mirage.frontend.capture import as_module, capture
    from mirage.frontend.partition import PRODUCTS, partition, product_cuts

    searched = _small_searches_only(monkeypatch, 4)

    def block(x, wg, wu, wd):
        return x + (F.silu(x @ wg) * (x @ wu)) @ wd

    inputs = (torch.randn(16, 8), torch.randn(8, 12), torch.randn(8, 12), torch.randn(12, 8))
    fast = mi.superoptimize(block, inputs, use_cache=False, progress=False)
    spec = fast.specializations[0]
    assert searched == [6, 4, 2]
    assert [len(s.nodes) for s in spec.partition.subprograms] == [4, 2]
    assert {c.source for c in spec.choices.values()} == {"search"}
    # what the search of the whole gave stays in the report
    assert spec.split == ("6 torch ops (matmul, silu, matmul, mul, matmul, add): "
                          "search found nothing better (test)",)
    assert f"before a split: {spec.split[0]}" in fast.report()
    torch.testing.assert_close(fast(*inputs), block(*inputs), rtol=1e-4, atol=1e-4)
    gm = capture(as_module(block), inputs, {})
    (only,) = partition(gm).subprograms
    (cut,) = product_cuts(gm, only)
    assert only.ops[only.nodes.index(cut)] in PRODUCTS and only.nodes.index(cut) == 4


def _epilogue_reference(ops: int) -> mi.KernelGraph:
    """x @ w followed by ``ops`` element-wise ops (a scale and tanh in turn)."""
    g = mi.new_kernel_graph()
    y = g.matmul(g.new_input(dims=(4, 8), dtype=mi.float32), g.new_input(dims=(8, 6), dtype=mi.float32))
    for k in range(ops):
        y = g.tanh(y) if k % 2 else g.mul_scalar(y, 0.5)
    g.mark_output(y)
    return g.freeze()


def _budget(settings: SearchSettings) -> int | None:
    value = dict(settings.overrides).get("max_block_ops")
    return None if value is None else json.loads(value)


@pytest.mark.parametrize(("ops", "budget"), [(2, None), (5, None), (6, 10), (8, 12), (9, 13), (20, 13)])
def test_a_long_epilogue_raises_the_block_budget_to_one_kernel(ops, budget):
    """Two inputs, the product, its accumulator and the epilogue's ops: over the mlp space's 9, the
    budget is raised to that count, at most 13."""
    reference = _epilogue_reference(ops)
    assert optimize.one_kernel_block_ops(reference) == ops + 4
    assert _budget(optimize.with_block_budget(reference, SearchSettings(config="mlp"))) == budget


def test_the_one_kernel_count_has_an_accumulator_per_output_and_per_input_read_after_a_product():
    """LayerNorm with weight and bias (3 inputs, 6 ops) needs an accumulator before its output: 10
    block ops, over the default 9; a product's bias is read past the product's accumulator and needs
    one of its own."""
    module = torch.nn.LayerNorm(16)
    layernorm = mi.superoptimize(module, (torch.randn(4, 16),), search=False).partition.subprograms[0].graph
    assert optimize.one_kernel_block_ops(layernorm) == 10
    assert _budget(optimize.with_block_budget(layernorm, SearchSettings(config="mlp"))) == 10
    g = mi.new_kernel_graph()
    y = g.matmul(g.new_input(dims=(4, 8), dtype=mi.float32), g.new_input(dims=(8, 6), dtype=mi.float32))
    g.mark_output(g.relu(g.add(y, g.new_input(dims=(1, 6), dtype=mi.float32))))
    # inputs, ops, and the accumulators of the product and of the bias
    assert optimize.one_kernel_block_ops(g.freeze()) == 3 + 3 + 1 + 1


def test_an_attention_is_searched_with_flash_decoding_headers_of_its_shapes():
    g = mi.new_kernel_graph()
    q, k, v = (g.new_input(dims=d, dtype=mi.float16) for d in ((8, 64, 32), (8, 32, 64), (8, 64, 32)))
    e = g.exp(g.mul_scalar(g.matmul(q, k), 0.125))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
    reference = g.freeze()
    settings = optimize.with_attention_layout(reference, SearchSettings(config="attention"))
    assert json.loads(dict(settings.overrides)["griddims"]) == [[8, 4, 4], [8, 4, 1]]
    own = SearchSettings(config="attention", overrides=(("griddims", "[[8, 16, 4]]"),))
    assert optimize.with_attention_layout(reference, own) == own  # the caller's grids stand
    assert optimize.with_attention_layout(reference, SearchSettings(config="mlp")).overrides == ()


def test_five_inputs_raise_the_kernel_budget_to_room_for_one_kernel():
    """Mirage's kernel budget counts inputs (5): a gated product with two biases has five inputs and
    no room for an op; the budget becomes six. Three inputs leave it alone, as does the caller's."""
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 16), dtype=mi.float32)
    a, b = (g.add(g.matmul(x, g.new_input(dims=(16, 32), dtype=mi.float32)),
                  g.new_input(dims=(1, 32), dtype=mi.float32)) for _ in range(2))
    g.mark_output(g.mul(g.silu(a), b))
    biased = g.freeze()
    raised = optimize.with_kernel_budget(biased, SearchSettings(config="mlp"))
    assert json.loads(dict(raised.overrides)["max_kernel_ops"]) == 6
    own = SearchSettings(config="mlp", overrides=(("max_num_kernel_graph_op", "5"),))
    assert optimize.with_kernel_budget(biased, own) == own
    assert optimize.with_kernel_budget(_epilogue_reference(2), SearchSettings(config="mlp")).overrides == ()


def test_the_block_budget_is_left_to_the_caller_and_to_other_spaces():
    reference = _epilogue_reference(9)
    own = SearchSettings(config="mlp", overrides=(("max_num_threadblock_graph_op", "7"),))
    assert optimize.with_block_budget(reference, own) == own
    attention = SearchSettings(config="attention")
    assert optimize.with_block_budget(reference, attention) == attention


def test_choose_searches_with_the_raised_budget(monkeypatch):
    seen = []
    monkeypatch.setattr(optimize, "run_search",
                        lambda reference, settings, progress=True:
                        (seen.append(settings), (None, "", [], False))[1])
    choose(_epilogue_reference(9), SearchSettings(time_limit_s=1.0), cache_dir=None)
    assert seen and _budget(seen[0]) == 13 and seen[0].config == "mlp"


def _one_profiled_build(monkeypatch, us: float) -> mi.KernelGraph:
    """The test program's subprogram, whose search finds one rewritten µGraph and whose profiling
    times its one build at ``us``."""
    reference = mi.superoptimize(program, INPUTS, search=False).partition.subprograms[0].graph
    other = _rewritten(reference)
    monkeypatch.setattr(optimize, "run_search",
                        lambda ref, settings, progress=True: (other, "1 verified µGraph(s)", [other], False))
    monkeypatch.setattr(optimize, "profile_choice",
                        lambda ref, candidates: (other, f"fastest of 1 GPU builds: {us:.2f} µs",
                                                 {"stages": 2}, us, frozenset()))
    return reference


def test_a_pick_slower_than_pytorch_leaves_the_subprogram_to_pytorch(monkeypatch, tmp_path):
    """The fastest build is compared with the subprogram's own torch ops on the same GPU:
    where PyTorch is faster, the subprogram stays in PyTorch and the report says why; where the
    comparison cannot be made, the fastest build stands."""
    reference = _one_profiled_build(monkeypatch, 14.48)
    settings = optimize.SearchSettings(config="mlp")
    monkeypatch.setattr(optimize, "pytorch_us", lambda ref, runner=None: 9.5)
    slower = optimize.choose(reference, settings, cache_dir=tmp_path, profile_on="Some GPU")
    assert slower.source == "reference" and slower.build is None
    assert "PyTorch runs the subprogram in 9.50 µs, faster" in slower.detail
    monkeypatch.setattr(optimize, "pytorch_us", lambda ref, runner=None: None)
    kept = optimize.choose(reference, settings, profile_on="Some GPU")
    assert kept.source == "search" and kept.build == {"stages": 2}
    monkeypatch.setattr(optimize, "pytorch_us", lambda ref, runner=None: 20.0)
    assert optimize.choose(reference, settings, profile_on="Some GPU").source == "search"
    # the copies a build adds around its kernels are charged to it: 14.48 + 6 µs against 20; the
    # runner of those copies learns which inputs the kept build reads in place (none here)
    asked = []

    def copies(in_place):
        asked.append(in_place)
        return "copies"

    monkeypatch.setattr(optimize, "pytorch_us",
                        lambda ref, runner=None: 6.0 if runner is not None and runner() == "copies" else 20.0)
    charged = optimize.choose(reference, settings, profile_on="Some GPU", boundary_runner=copies)
    assert charged.source == "reference" and "its copies around the kernels: 6.00 µs" in charged.detail
    assert asked == [frozenset()]


def test_a_failed_pytorch_timing_skips_the_guard(caplog):
    """Where the subprogram cannot be run through PyTorch (no CUDA, say), or there is no runner, the
    guard gives no time (and says why), and the fastest build stands (the choice above)."""
    reference = mi.superoptimize(program, INPUTS, search=False).partition.subprograms[0].graph

    def unavailable():
        raise RuntimeError("no CUDA device")

    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        assert optimize.pytorch_us(reference, unavailable) is None
    assert "RuntimeError: no CUDA device" in caplog.text and "keeping the fastest build" in caplog.text
    assert optimize.pytorch_us(reference, None) is None


def test_the_guard_times_the_runner_it_is_given(monkeypatch, caplog):
    """``choose`` hands the frontend's runner of the subprogram's own torch ops to the guard, which
    builds and times it."""
    reference = _one_profiled_build(monkeypatch, 3.0)
    built = []

    def runner():
        built.append(True)
        raise RuntimeError("the torch ops' runner")

    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        kept = optimize.choose(reference, optimize.SearchSettings(config="mlp"), profile_on="Some GPU",
                               pytorch_runner=runner)
    assert built and kept.source == "search"
    assert "the torch ops' runner" in caplog.text


def test_a_search_with_exps_verifies_only_candidates_whose_exps_can_be_stabilised(monkeypatch):
    import mirage.generator as generator

    seen = []

    def fake_search(reference, config, **kwargs):
        seen.append(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(generator, "search", fake_search)
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    e = g.exp(x)
    g.mark_output(g.div(e, g.reduction(e, 1)))
    softmax = g.freeze()
    for reference in (softmax, _epilogue_reference(2)):
        with pytest.raises(RuntimeError, match="stop here"):
            optimize.run_search(reference, SearchSettings(config="mlp"), progress=False)
    keep = seen[0]["keep_when"]
    assert keep == StableExps(0, 1) and pickle.loads(pickle.dumps(keep)) == keep
    assert keep(softmax) and "keep_when" not in seen[1]


def test_search_workers_unpickle_the_stability_filter_without_torch():
    """Each search worker unpickles the filter: importing torch there cost every search of the frontend
    seconds of its time budget before its first unit (16 workers on one host took 10 s)."""
    import subprocess
    import sys

    code = ("import pickle, sys; keep = pickle.loads(sys.stdin.buffer.read()); "
            "assert keep.allowed == 0 and 'torch' not in sys.modules, sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(StableExps(0, 1)),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_the_stability_filter_analyses_only_candidates_with_extra_exps(monkeypatch):
    def softmax(exps: int) -> mi.KernelGraph:
        g = mi.new_kernel_graph()
        x = g.new_input(dims=(4, 8), dtype=mi.float32)
        e = g.exp(x)
        g.mark_output(g.div(e, g.reduction(e if exps == 1 else g.exp(x), 1)))  # or an exp of its own
        return g.freeze()

    reference, apart = softmax(1), softmax(2)
    keep = StableExps.of(reference)
    assert keep == StableExps(softmax_rewrite.unstable_exps(reference), 1)
    assert softmax_rewrite.unstable_exps(apart) > keep.allowed and not keep(apart)
    monkeypatch.setattr(softmax_rewrite, "unstable_exps", lambda graph: pytest.fail("analysed"))
    assert keep(reference)  # as many exps as the reference: verified without the analysis


def test_a_search_whose_units_cannot_be_listed_in_its_budget_stops_on_time():
    """A subprogram of many inputs (a residual MLP half-block: 10 tensors) has so many block headers
    that listing the search's work units alone used to take hours, past any budget: the listing keeps
    the clock too: it stops at a quarter of the budget, the units listed by then are searched, and the
    search stops at its budget with the reason."""
    import time

    class Half(torch.nn.Module):
        def __init__(self, d=64):
            super().__init__()
            self.proj, self.ln = torch.nn.Linear(d, d), torch.nn.LayerNorm(d)
            self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x, y):
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln(x))))

    torch.manual_seed(0)
    model, inputs = Half().eval(), (torch.randn(2, 16, 64), torch.randn(2, 16, 64))
    start = time.perf_counter()
    fast = mi.superoptimize(model, inputs, time_limit_s=1, use_cache=False, progress=False)
    assert time.perf_counter() - start < 60
    whole = [line for line in fast.report().splitlines() if "before a split: 7 torch ops" in line]
    assert whole and "search stopped: time budget spent" in whole[0]
    with torch.no_grad():
        torch.testing.assert_close(fast(*inputs), model(*inputs))


def test_given_candidates_of_a_batched_program_are_verified_on_one_slice(monkeypatch):
    """A batched product and scale: the right candidate passes and a scale applied twice fails, each
    checked on index 0 of the batch alone (no verifier of the whole program is built), and the
    verdicts are those of whole verifications."""
    from mirage.verifier import verify
    from mirage.verifier.verify import Verifier

    def batched(scales):
        g = mi.new_kernel_graph()
        x = g.new_input(dims=(8, 16, 32), dtype=mi.float16)
        w = g.new_input(dims=(8, 32, 16), dtype=mi.float16)
        y = g.matmul(x, w)
        for s in scales:
            y = g.mul_scalar(y, s)
        g.mark_output(y)
        return g.freeze()

    reference, right, wrong = batched([0.5]), batched([0.25, 2.0]), batched([0.5, 0.5])
    built = []
    original = Verifier.__init__

    def counted(self, graph, *args, **kwargs):
        built.append(graph.nodes[0].outputs[0].shape[0])
        original(self, graph, *args, **kwargs)

    monkeypatch.setattr(Verifier, "__init__", counted)
    assert optimize.verified_candidates(reference, [wrong, right]) == [right]
    assert built == [1]  # one verifier, of the slice
    monkeypatch.setattr(Verifier, "__init__", original)
    assert verify(reference, right).equivalent and not verify(reference, wrong).equivalent


def _rotary_reference() -> mi.KernelGraph:
    """q·cos + r·sin at rotary embedding's shapes: 32 heads of (256, 64), tables broadcast over heads."""
    g = mi.new_kernel_graph()
    q, r = (g.new_input(dims=(32, 256, 64), dtype=mi.float16) for _ in range(2))
    cos, sin = (g.new_input(dims=(1, 256, 64), dtype=mi.float16) for _ in range(2))
    g.mark_output(g.add(g.mul(q, cos), g.mul(r, sin)))
    return g.freeze()


def test_element_wise_subprograms_are_searched_with_finer_grids():
    settings = SearchSettings("mlp", 5.0)
    widened = optimize.with_element_grids(_rotary_reference(), settings)
    grids = json.loads(dict(widened.overrides)["grid_dims"])
    assert [256, 1, 1] in grids and [32, 1, 1] in grids and all(32 <= g[0] <= 4096 for g in grids)
    assert optimize.with_element_grids(_epilogue_reference(1), settings) == settings  # a product: as it was
    given = SearchSettings("mlp", 5.0, (("griddims", "[[64, 1, 1]]"),))
    assert optimize.with_element_grids(_rotary_reference(), given) == given  # the caller's grids stand


def test_the_rotary_product_finds_a_mugraph_with_the_finer_grids():
    """With the space's own grids every tiling of it needed more shared memory than allowed."""
    settings = SearchSettings("mlp", 60.0, (("workers", "1"),), max_results=1)
    found, note, graphs, _ = optimize.run_search(_rotary_reference(),
                                                 optimize.with_element_grids(_rotary_reference(), settings),
                                                 progress=False)
    assert found is not None, note
    (block,) = [n.attrs for n in found.nodes if n.op is Op.CUSTOMIZED]
    assert block.grid_dim[0] > 32  # a grid only the finer tiles give


def test_a_fruitless_part_splits_again_after_its_product(monkeypatch):
    """LayerNorm(relu(h·Wa)·Wb + x): the whole splits before the second product, then that part, a
    product with a residual and a norm, splits after its product: the residual and the norm become
    a search of their own (a second round, with ``split_rounds=2``)."""
    searched = _small_searches_only(monkeypatch, 7)
    norm = torch.nn.LayerNorm(8)

    def block(h, x, wa, wb):
        return norm(torch.relu(h @ wa) @ wb + x)

    inputs = (torch.randn(16, 12), torch.randn(16, 8), torch.randn(12, 12), torch.randn(12, 8))
    one = mi.superoptimize(block, inputs, use_cache=False, progress=False).specializations[0]
    assert searched == [10, 2, 8] and len(one.partition.subprograms) == 2  # the default: one round
    searched.clear()
    fast = mi.superoptimize(block, inputs, use_cache=False, progress=False, split_rounds=2)
    spec = fast.specializations[0]
    assert searched == [10, 2, 8, 1, 7]
    parts = [s.ops for s in spec.partition.subprograms]
    assert parts == [("matmul", "relu"), ("matmul",), ("add", "layer_norm")]
    assert len(spec.split) == 2 and spec.split[1].startswith("3 torch ops (matmul, add, layer_norm)")
    torch.testing.assert_close(fast(*inputs), block(*inputs), rtol=1e-4, atol=1e-4)


def test_a_timed_build_is_described_by_its_grids_loops_and_forms():
    """The report's "fastest of N GPU builds" note says what the fastest build was."""
    from benchmarks.mugraphs import CASES
    from mirage.codegen.select import Trial, Variant

    graph = CASES["gqa_b1"].fused()
    grids = [tuple(b.grid_dim) for b in graph.block_graphs()]
    shape = optimize.build_shape(Trial(Variant(graph, stages=3, warpgroup_softmax=True, tma_copies=True)))
    assert shape.startswith(f"grid {grids[0]} loop ") and f"grid {grids[1]}" in shape
    assert shape.endswith(", warpgroup, TMA")
    assert optimize.build_shape(Trial(Variant(graph))).count("grid") == len(grids)
