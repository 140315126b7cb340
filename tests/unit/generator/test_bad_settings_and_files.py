"""Search options, budgets, result files and checkpoints outside the other tests: a value the search
cannot use is a SearchSpaceError named up front, a cache or checkpoint file whose numbers are unusable is
ignored with a warning (never a crash mid-search, never a search wrongly ended), and the generator's
cache folder is the one ``mirage cache`` lists."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mirage import config
from mirage.generator import Budget, SearchSpaceError, StopReason, check_settings, search
from mirage.generator.checkpoint import Checkpoint, ResultCache, cache_dir
from tests.unit.frontend.test_cache_robustness import SPACE, _search, tiny  # a small search of one

# ---- options and budgets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("budget", "words"), [
    ({"time_s": "2"}, ["time budget", "'2'"]),
    ({"time_s": float("nan")}, ["time budget", "nan"]),
    ({"time_s": -1}, ["time budget", "-1"]),
    ({"states": "10"}, ["states must be None", "'10'"]),
    ({"states": -3}, ["states must be None", "-3"]),
    ({"results": 0}, ["results must be None", "≥ 1"]),
    ({"results": True}, ["results must be None"]),
], ids=["time str", "time nan", "time negative", "states str", "states negative", "results 0",
        "results bool"])
def test_a_budget_out_of_range_is_named(budget, words):
    with pytest.raises(SearchSpaceError) as info:
        Budget(**budget)
    for word in words:
        assert word in str(info.value)


def test_a_time_limit_that_is_not_a_number_is_named_before_the_search():
    with pytest.raises(SearchSpaceError, match="time budget"):
        search(tiny(), time_limit_s="2", workers=1, progress=False, cache=False, checkpoint=False, **SPACE)


@pytest.mark.parametrize(("option", "words"), [
    ({"budget": 5}, ["budget must be a mirage.generator.Budget"]),
    ({"seed": "a"}, ["seed must be an integer"]),
    ({"verify_delta": 0}, ["verify_delta must be a probability"]),
    ({"verify_delta": 2}, ["verify_delta must be a probability"]),
    ({"checkpoint": 5}, ["checkpoint must be a file's path"]),
    ({"checkpoint_every_s": "x"}, ["checkpoint_every_s must be a number of seconds"]),
], ids=["budget int", "seed str", "delta 0", "delta 2", "checkpoint int", "checkpoint_every_s str"])
def test_search_options_out_of_range_are_named_up_front(option, words):
    with pytest.raises(SearchSpaceError) as info:
        check_settings(None, option)  # what superoptimize checks when it is called
    for word in words:
        assert word in str(info.value)
    with pytest.raises(SearchSpaceError):
        search(tiny(), **{"workers": 1, "progress": False, "cache": False, **option}, **SPACE)


# ---- the result cache --------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [{"time_s": "x"}, {"time_s": 1, "states": "many"}, {"results": -2}])
def test_a_cached_result_with_an_unusable_budget_is_searched_again(monkeypatch, tmp_path, caplog, budget):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path))
    first = _search(budget=Budget(time_s=60, results=3))
    path = ResultCache().directory(first.key) / "result.json"
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "budget": budget}))
    with caplog.at_level(logging.WARNING, logger="mirage.cache"):
        again = _search(budget=Budget(time_s=60, results=3))
    assert again.hashes == first.hashes
    assert any("corrupt cache file" in r.getMessage() and "budget" in r.getMessage() for r in caplog.records)
    assert json.loads(path.read_text())["budget"]["results"] == 3  # rewritten


# ---- checkpoints --------------------------------------------------------------------------------


def _unit_edits():
    def stats(key, value):
        return lambda record: record["stats"].__setitem__(key, value)

    def found(key, value):
        return lambda record: record["found"][0].__setitem__(key, value)

    return {
        "stopped unit": lambda record: record.__setitem__("stop", StopReason.COMPLETE.value),
        "states str": lambda record: record.__setitem__("states", "7"),
        "states negative": lambda record: record.__setitem__("states", -5),
        "kernel_states str": stats("kernel_states", "x"),
        "verify_s str": stats("verify_s", "x"),
        "pruned list": stats("pruned", [1]),
        "position str": found("position", "3"),
        "elapsed nan": found("elapsed_s", float("nan")),
    }


@pytest.mark.parametrize("edit", list(_unit_edits()))
def test_a_checkpoint_unit_with_unusable_values_is_ignored(tmp_path, caplog, edit):
    path = tmp_path / "ckpt.json"
    first = _search(cache=False, checkpoint=path, budget=Budget(time_s=60, results=5))
    document = json.loads(path.read_text())
    unit = next(r for r in document["done"].values() if r["found"])
    _unit_edits()[edit](unit)
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="mirage.cache"):
        loaded = Checkpoint.load(path, document["key"], document["units_total"])
    assert loaded is None
    assert any("corrupt cache file" in r.getMessage() for r in caplog.records)
    again = _search(cache=False, checkpoint=path, budget=Budget(time_s=60, results=5))
    assert again.hashes == first.hashes and again.stop_reason is StopReason.RESULTS


# ---- where the generator's files go ---------------------------------------------------------------------


def test_the_generator_uses_the_configured_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MIRAGE_CACHE_DIR", "~/mirage-cache")
    assert cache_dir() == config.cache_dir() == tmp_path / "home" / "mirage-cache"  # not ./~/mirage-cache
    monkeypatch.delenv("MIRAGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "mirage"
    assert ResultCache().root == config.settings().search_cache_dir  # what `mirage cache` lists and clears
    monkeypatch.chdir(tmp_path)
    first = _search(budget=Budget(time_s=60, results=1))
    assert (tmp_path / "xdg" / "mirage" / "search" / first.key / "result.json").is_file()
    assert not Path("~").exists()
