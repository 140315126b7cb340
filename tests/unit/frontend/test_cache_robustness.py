"""The on-disk caches never cost a search result or a wrong answer: unwritable folders, malformed
files, tampered entries, interrupted searches, ``cache clear`` and ``search=False``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import mirage as mi
from mirage.frontend import optimize
from mirage.frontend.optimize import SearchSettings, choose
from mirage.generator import Budget, StopReason, search
from mirage.generator.checkpoint import ResultCache
from mirage.mugraph.ops import Op
from mirage.mugraph.serialize import dumps

SETTINGS = SearchSettings(config="mlp", time_limit_s=1.0)


def matmul_graph(relu: bool = False, double: bool = False):
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    w = g.new_input(dims=(8, 16), dtype=mi.float32)
    y = g.matmul(x, w)
    if relu:
        y = g.relu(y)
    if double:
        y = g.add(y, y)
    g.mark_output(y)
    return g.freeze()


def twice_graph():
    """matmul + itself: another structure, not the reference's function (2·x@w)."""
    return matmul_graph(double=True)


@pytest.fixture
def fake_search(monkeypatch):
    calls: list = []

    def run_search(reference, settings, progress=True):
        calls.append(reference)
        return reference, "1 verified µGraph(s); search stopped: test", [reference], False

    monkeypatch.setattr(optimize, "run_search", run_search)
    return calls


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.json"))


# ---- bug 1: an unwritable cache folder costs a warning, never the result ---------------------------


def test_an_unwritable_frontend_cache_keeps_the_search_result(fake_search, tmp_path, caplog):
    blocker = tmp_path / "notadir"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        choice = choose(matmul_graph(), SETTINGS, cache_dir=blocker / "search")
    assert choice.source == "search" and len(fake_search) == 1
    warnings = [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()]
    assert len(warnings) == 1 and str(blocker) in warnings[0] and "MIRAGE_NO_CACHE" in warnings[0]


SPACE = {"griddims": [(4, 1, 1)], "franges": [4], "kernel_ops": ["matmul", "exp"],
         "block_ops": ["matmul", "exp", "accum", "accum_sum"], "max_block_ops": 5, "max_kernel_ops": 5}


def tiny():
    g = mi.new_kernel_graph("tiny")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(x, w)))
    return g.freeze()


def _search(**options):
    options.setdefault("budget", Budget(time_s=60))
    return search(tiny(), workers=1, progress=False, checkpoint_every_s=0, **SPACE, **options)


def test_an_unwritable_generator_cache_keeps_the_search_result(monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "notadir"
    blocker.write_text("")
    expected = _search(cache=False)
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(blocker))
    with caplog.at_level(logging.WARNING, logger="mirage.generator"):
        result = _search()
    assert result.hashes == expected.hashes and len(result) > 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("could not write" in m for m in messages) == 2  # the checkpoint once, the result once
    assert all(str(blocker) in m for m in messages if "could not write" in m)


def test_without_the_cache_no_checkpoints_are_written(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    _search(cache=False, budget=Budget(time_s=60, results=1))  # stopped early: a checkpoint would stay
    assert not (tmp_path / "cache").exists()
    _search(budget=Budget(time_s=60, results=1))
    assert list((tmp_path / "cache" / "checkpoints").glob("*.json"))  # with the cache: kept to resume


# ---- bug 2: valid JSON of the wrong shape in the generator's files ----------------------------------


@pytest.mark.parametrize("content", ["[1]", "null", '{"format": "mirage.search-result", "version": 2}',
                                     "BAD_STOP", "FOUND_LIST"])
def test_a_malformed_result_file_is_ignored_and_rewritten(monkeypatch, tmp_path, caplog, content):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    first = _search()
    path = ResultCache().directory(first.key) / "result.json"
    document = json.loads(path.read_text())
    if content == "BAD_STOP":
        content = json.dumps({**document, "stop_reason": "no such reason"})
    elif content == "FOUND_LIST":
        content = json.dumps({**document, "found": [[1]]})
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="mirage.generator"):
        again = _search()
    assert again.hashes == first.hashes
    if content not in ('{"format": "mirage.search-result", "version": 2}',):
        assert any("corrupt cache file" in r.getMessage() and "rewritten" in r.getMessage()
                   for r in caplog.records)
    assert json.loads(path.read_text())["format"] == "mirage.search-result"  # rewritten


@pytest.mark.parametrize("done", [[1], None, {"0": [1]}, {"0": {"index": 0, "stop": "bogus"}}])
def test_a_malformed_checkpoint_is_ignored(monkeypatch, tmp_path, caplog, done):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    path = tmp_path / "ckpt.json"
    first = _search(cache=False, checkpoint=path, budget=Budget(time_s=60, results=1))
    document = json.loads(path.read_text())
    document["done"] = done
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="mirage.generator"):
        again = _search(cache=False, checkpoint=path, budget=Budget(time_s=60, results=1))
    assert again.hashes == first.hashes
    assert any("corrupt cache file" in r.getMessage() for r in caplog.records)


def test_a_list_checkpoint_is_ignored(monkeypatch, tmp_path, caplog):
    path = tmp_path / "ckpt.json"
    path.write_text("[1, 2]")
    with caplog.at_level(logging.WARNING, logger="mirage.generator"):
        assert len(_search(cache=False, checkpoint=path)) > 0
    assert any("corrupt cache file" in r.getMessage() for r in caplog.records)


# ---- bug 3: a frontend entry holding null or a list ------------------------------------------------


@pytest.mark.parametrize("content", ["null", "[1, 2]", '"text"',
                                     '{"format": "mirage.search-cache", "version": 1}'])
def test_a_malformed_entry_is_searched_again_and_listed(fake_search, tmp_path, caplog, content):
    cache = tmp_path / "search"
    choose(matmul_graph(), SETTINGS, cache_dir=cache)
    (entry,) = _entries(cache)
    entry.write_text(content)
    (cache / "settings.json").write_text('{"a": 1}')  # not an entry: neither listed nor a crash
    (cache / "list.json").write_text("[1]")
    rows = optimize.list_entries(cache)
    assert [r["key"] for r in rows] == [entry.stem]
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        again = choose(matmul_graph(), SETTINGS, cache_dir=cache)
    assert again.source == "search" and len(fake_search) == 2
    assert any("corrupt cache file" in r.getMessage() and str(entry) in r.getMessage()
               for r in caplog.records)
    assert json.loads(entry.read_text())["source"] == "search"
    assert optimize.list_entries(cache)[0]["source"] == "search"


# ---- bug 4: a cache hit is checked before it runs --------------------------------------------------


def test_a_tampered_entry_is_not_trusted(fake_search, tmp_path, caplog):
    cache = tmp_path / "search"
    reference = matmul_graph()
    choose(reference, SETTINGS, cache_dir=cache)
    (entry,) = _entries(cache)
    document = json.loads(entry.read_text())
    document["chosen"] = dumps(matmul_graph(relu=True))  # same signature, another function
    entry.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="mirage.frontend"):
        choice = choose(reference, SETTINGS, cache_dir=cache)
    assert choice.source == "search" and len(fake_search) == 2
    assert all(n.op is not Op.RELU for n in choice.graph.nodes)
    assert any("does not match the program" in r.getMessage() and str(entry) in r.getMessage()
               for r in caplog.records)
    assert choose(reference, SETTINGS, cache_dir=cache).source == "cache"  # rewritten, now trusted


def test_an_equivalent_cached_graph_is_used(fake_search, tmp_path):
    cache = tmp_path / "search"
    reference = matmul_graph()
    choose(reference, SETTINGS, cache_dir=cache)
    (entry,) = _entries(cache)
    document = json.loads(entry.read_text())
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(4, 8), dtype=mi.float32)
    w = g.new_input(dims=(8, 16), dtype=mi.float32)
    g.mark_output(g.matmul(x, w))
    document["chosen"] = dumps(g.freeze())
    entry.write_text(json.dumps(document))
    assert choose(reference, SETTINGS, cache_dir=cache).source == "cache" and len(fake_search) == 1


# ---- bug 5: an interrupted search is not cached as final --------------------------------------------


def test_an_interrupted_search_stops_superoptimize_and_is_not_cached(monkeypatch, tmp_path):
    """Ctrl-C in a search (which the driver turns into a partial result, its checkpoint saved) stops
    the whole call: before, the partial result ran, or, where it held nothing, the subprogram was
    split and each part searched again with a full budget, one Ctrl-C a search."""
    def interrupted(reference, settings, progress=True):
        return reference, "0 verified µGraph(s); search stopped: interrupted", [], True

    monkeypatch.setattr(optimize, "run_search", interrupted)
    cache = tmp_path / "search"
    with pytest.raises(KeyboardInterrupt, match="resumes it from its checkpoint"):
        choose(matmul_graph(), SETTINGS, cache_dir=cache)
    assert _entries(cache) == []


def test_run_search_reports_an_interruption(monkeypatch):
    import mirage.generator as generator

    real = generator.search

    def interrupted_search(reference, config=None, **kwargs):
        result = real(reference, "mlp", **{**kwargs, "budget": Budget(time_s=0.5)})
        result.stop_reason = StopReason.INTERRUPTED
        return result

    monkeypatch.setattr(generator, "search", interrupted_search)
    *_, flag = optimize.run_search(matmul_graph(), dataclasses_replace(SETTINGS), progress=False)
    assert flag is True


def dataclasses_replace(settings):
    import dataclasses

    return dataclasses.replace(settings, overrides=(("cache", "false"), ("workers", "1")))


# ---- bug 6: cache clear removes mirage's entries only, the result cache included -------------------


def test_clear_removes_entries_and_results_but_not_other_files(fake_search, tmp_path):
    cache = tmp_path / "search"
    choose(matmul_graph(), SETTINGS, cache_dir=cache)
    results = cache / ("ab" * 16)
    results.mkdir()
    (results / "result.json").write_text('{"format": "mirage.search-result", "version": 2}')
    (results / "stats.json").write_text("{}")
    corrupt = cache / ("cd" * 32 + ".json")
    corrupt.write_text("null")
    (cache / "settings.json").write_text('{"a": 1}')
    (cache / "notes").mkdir()
    (cache / "notes" / "result.json").write_text("{}")
    assert optimize.clear_entries(cache) == 3
    assert sorted(p.name for p in cache.iterdir()) == ["notes", "settings.json"]
    assert (cache / "notes" / "result.json").exists()
    assert optimize.clear_entries(tmp_path / "missing") == 0


def test_clear_removes_the_generators_result_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    first = _search()
    assert (ResultCache().directory(first.key) / "result.json").exists()
    assert optimize.clear_entries(tmp_path / "search") == 1
    assert not ResultCache().directory(first.key).exists()


# ---- bug 8: search=False runs the reference, whatever the cache holds -------------------------------


def test_search_false_never_uses_a_cached_result(monkeypatch, tmp_path):
    def finds(reference, settings, progress=True):
        return twice_graph(), "1 verified µGraph(s); search stopped: test", [twice_graph()], False

    cache = tmp_path / "search"
    reference = matmul_graph()
    monkeypatch.setattr(optimize, "_float_checked", lambda reference, candidate: True)
    monkeypatch.setattr(optimize, "_cached_graph_checked", lambda *args: True)
    monkeypatch.setattr(optimize, "run_search", finds)
    assert choose(reference, SETTINGS, cache_dir=cache).source == "search"
    assert choose(reference, SETTINGS, cache_dir=cache).source == "cache"
    choice = choose(reference, SETTINGS, search=False, cache_dir=cache)
    assert choice.source == "reference" and choice.graph == reference


def test_a_cache_dir_holds_the_generators_finished_searches_too(tmp_path, monkeypatch):
    """superoptimize(cache_dir=X): the generator's finished search lands in X beside the entry (where
    ``mirage cache clear --dir X`` removes it), none in the configured cache."""
    configured, chosen = tmp_path / "configured", tmp_path / "chosen"
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(configured))
    choose(matmul_graph(), SearchSettings(config="mlp", time_limit_s=1.0,
                                          overrides=(("workers", "1"),)), cache_dir=chosen, progress=False)
    finished = [d for d in chosen.iterdir() if (d / "result.json").is_file()]
    assert len(finished) == 1 and len(list(chosen.glob("*.json"))) == 1  # and the frontend's entry
    assert not list(configured.rglob("result.json")) and not list(configured.rglob("checkpoints/*.json"))
    assert optimize.clear_entries(chosen) == 2
