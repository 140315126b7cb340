"""The driver: the result cache, statistics saved beside the results, and the search entry point."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time

import pytest

import mirage as mi
from mirage.errors import GraphError
from mirage.generator import Budget, SearchResult, StopReason, driver, search
from mirage.generator.budget import Budget as BudgetRecord
from mirage.generator.checkpoint import ResultCache, cache_dir, search_key
from mirage.generator.executors import SerialExecutor
from mirage.generator.explore import UnitStats
from mirage.generator.stats import SearchStatistics
from mirage.mugraph.serialize import dumps

SPACE = {
    "griddims": [(4, 1, 1)],
    "franges": [4],
    "kernel_ops": ["matmul", "exp"],
    "block_ops": ["matmul", "exp", "accum", "accum_sum"],
    "max_block_ops": 5,
    "max_kernel_ops": 4,
}


def reference():
    g = mi.new_kernel_graph("tiny")
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(x, w)))
    return g.freeze()


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_finished_search_is_answered_from_the_cache(isolated_cache, caplog):
    first = search(reference(), workers=1, progress=False, **SPACE)
    assert first.stop_reason is StopReason.COMPLETE and cache_dir() == isolated_cache
    stored = isolated_cache / "search" / first.key
    assert (stored / "result.json").exists() and (stored / "stats.json").exists()
    with caplog.at_level(logging.INFO, logger="mirage.generator"):
        second = search(reference(), workers=1, progress=False, budget=Budget(time_s=1), **SPACE)
    assert any("answered from the result cache" in r.getMessage() for r in caplog.records)
    assert second.hashes == first.hashes and second.key == first.key
    assert [f.graph for f in second.found] == [f.graph for f in first.found]
    other = search(reference(), workers=1, progress=False, **{**SPACE, "max_block_ops": 4})
    assert other.key != first.key  # the space's hash is part of the key


def test_statistics_are_saved_beside_the_results(isolated_cache, tmp_path):
    result = search(reference(), workers=1, progress=False, **SPACE)
    stats = json.loads((isolated_cache / "search" / result.key / "stats.json").read_text())
    for field in (
        "states_per_level",
        "states_per_depth",
        "pruned",
        "verified",
        "verify_calls",
        "phase_seconds",
        "stop_reason",
        "space_hash",
        "graph_hash",
        "machine",
        "states_per_second",
    ):
        assert field in stats, field
    assert stats["verified"] == len(result) > 0
    assert stats["states"] == sum(stats["states_per_level"].values()) == result.stats.states
    assert set(stats["phase_seconds"]) >= {"setup", "search", "verify", "rank"}
    assert stats["states_per_depth"]["kernel:0"] == 1
    saved = result.save(tmp_path / "out")
    document = json.loads((saved / "result.json").read_text())
    assert len(document["found"]) == len(result) and (saved / "stats.json").exists()
    assert SearchStatistics.from_dict(json.loads((saved / "stats.json").read_text())).verified == len(result)


def test_cached_result_of_a_budgeted_search_answers_only_the_same_budget(isolated_cache):
    budget = Budget(results=2)
    first = search(reference(), workers=1, progress=False, budget=budget, **SPACE)
    assert first.stop_reason is StopReason.RESULTS
    cache = ResultCache()
    assert cache.load(first.key)["budget"] == BudgetRecord(results=2).to_dict()
    again = search(reference(), workers=1, progress=False, budget=budget, **SPACE)
    assert again.hashes == first.hashes
    whole = search(reference(), workers=1, progress=False, **SPACE)
    assert whole.stop_reason is StopReason.COMPLETE and len(whole) > len(first)


def test_a_search_stopped_by_its_time_answers_shorter_times():
    """A longer search's result answers a later, shorter request (it searched at least as far); not a
    longer one, nor one with other limits; a complete search answers any budget."""
    stopped = {"stop_reason": StopReason.TIME.value, "budget": BudgetRecord(time_s=8.0).to_dict()}
    assert driver._covers(stopped, BudgetRecord(time_s=8.0))
    assert driver._covers(stopped, BudgetRecord(time_s=3.0))
    assert not driver._covers(stopped, BudgetRecord(time_s=12.0))
    assert not driver._covers(stopped, BudgetRecord())  # no limit: only a complete search answers
    assert not driver._covers(stopped, BudgetRecord(time_s=3.0, results=1))
    by_results = {"stop_reason": StopReason.RESULTS.value,
                  "budget": BudgetRecord(time_s=8.0, results=2).to_dict()}
    assert not driver._covers(by_results, BudgetRecord(time_s=3.0, results=2))
    assert driver._covers({"stop_reason": StopReason.COMPLETE.value, "budget": {}}, BudgetRecord(time_s=1.0))


def test_search_takes_a_builder_graph_and_checks_it():
    g = mi.new_kernel_graph()
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    w = g.new_input(dims=(64, 32), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(x, w)))
    result = search(
        g, workers=1, progress=False, cache=False, checkpoint=False, budget=Budget(results=1), **SPACE
    )
    assert isinstance(result, SearchResult) and len(result) == 1
    broken = mi.new_kernel_graph()
    broken.new_input(dims=(8, 64), dtype=mi.float16)
    with pytest.raises(GraphError, match="no outputs"):
        search(broken, **SPACE)


def test_search_key_depends_on_graph_space_and_options():
    base = search_key("g", "s", {"seed": 0})
    assert base == search_key("g", "s", {"seed": 0})
    assert (
        len(
            {
                base,
                search_key("h", "s", {"seed": 0}),
                search_key("g", "t", {"seed": 0}),
                search_key("g", "s", {"seed": 1}),
            }
        )
        == 4
    )


class _LateExecutor:
    """Stands in for worker processes whose unit, in flight at the deadline, reports after it."""

    name = "late"
    live_states = 0

    def __init__(self, found_graph, startup_s: float = 0.0) -> None:
        self.found_graph = found_graph
        self.startup_s = startup_s
        self.deadline: float | None = None

    def start(self) -> float:
        time.sleep(self.startup_s)
        return self.startup_s

    def results(self, units, deadline, cap):
        self.deadline = deadline
        time.sleep(max(0.0, deadline - time.time()) + 0.05)
        yield None  # a tick past the deadline, before the unit's record
        found = [{"graph": dumps(self.found_graph), "position": 3, "elapsed_s": 0.1}]
        stats = {**dataclasses.asdict(UnitStats()), "pruned": {}, "states_per_depth": {}}
        yield {"index": 0, "states": 10, "stop": StopReason.TIME.value, "found": found, "stats": stats}

    def close(self) -> None:
        """Nothing to release: no processes were started."""


def test_what_the_units_in_flight_found_by_the_deadline_is_kept(monkeypatch):
    graph = reference()
    monkeypatch.setattr(driver, "make_executor", lambda *args: _LateExecutor(graph))
    result = search(graph, progress=False, cache=False, checkpoint=False, budget=Budget(time_s=0.2), **SPACE)
    assert result.stop_reason is StopReason.TIME
    assert [f.graph.content_hash() for f in result.found] == [graph.content_hash()]


def test_the_workers_start_up_is_not_counted_against_the_budget(monkeypatch):
    """A fork server's imports took most of an 8 s budget on a 16-core host (2 states visited): the
    time the executor takes to ready its workers moves the deadline by as much."""
    graph = reference()
    executor = _LateExecutor(graph, startup_s=0.6)
    monkeypatch.setattr(driver, "make_executor", lambda *args: executor)
    begun = time.time()
    result = search(graph, progress=False, cache=False, checkpoint=False, budget=Budget(time_s=0.3), **SPACE)
    assert result.stats.phase_seconds["workers"] >= 0.6
    assert executor.deadline is not None and executor.deadline >= begun + 0.3 + 0.6
    assert [f.graph.content_hash() for f in result.found] == [graph.content_hash()]


def test_a_process_pool_starts_every_worker_before_its_first_unit():
    from mirage.generator import executors

    executor = executors.ProcessExecutor(context=None, workers=2)
    try:
        waited = executor.start()
        assert waited > 0.0
        assert len(executor._pool._processes) == 2
        assert all(p.is_alive() for p in executor._pool._processes.values())
    finally:
        executor.close()


def test_workers_end_when_the_searching_process_is_killed(tmp_path):
    """A killed search (out of memory, a scheduler's timeout, SIGKILL) used to leave its workers and
    the fork server waiting for more units, for good; they now end with it."""
    import os
    import signal
    import subprocess

    script = tmp_path / "searching.py"
    script.write_text(
        "import time\n"
        "from mirage.generator import executors\n"
        "if __name__ == '__main__':\n"
        "    executor = executors.ProcessExecutor(context=None, workers=2)\n"
        "    executor.start()\n"
        "    print(*executor._pool._processes, flush=True)\n"
        "    time.sleep(120)\n")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[3])
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": root})
    workers = [int(pid) for pid in process.stdout.readline().split()]
    assert len(workers) == 2
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    def alive(pid: int) -> bool:  # an exited process no one reaps (a zombie) counts as ended
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
        except OSError:  # no /proc: ask the kernel
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return True

    deadline = time.time() + 20
    while any(alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in workers)


def test_a_rule_module_imported_after_start_up_rules_the_workers_too(tmp_path, monkeypatch):
    """Worker processes rebuild the rule table from their own registry: a rule whose module the
    program imported late was missing there, so 2 workers found 12 µGraphs that 1 worker's rule cut."""
    import importlib
    import os

    from mirage.generator.pruning import RULES

    (tmp_path / "late_rule_module.py").write_text(
        "from mirage.generator.pruning import pruning_rule\n"
        "@pruning_rule('late_cut_all', 'cuts every candidate')\n"
        "def late_cut_all(candidate, context):\n"
        "    return False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    try:
        importlib.import_module("late_rule_module")
        found = {w: len(search(reference(), workers=w, progress=False, cache=False, checkpoint=False,
                               **SPACE)) for w in (1, 2)}
    finally:
        RULES.pop("late_cut_all", None)
        sys.modules.pop("late_rule_module", None)
    assert found == {1: 0, 2: 0}


def test_no_unit_starts_past_the_deadline():
    ran = SerialExecutor(context=None).results(["a unit"], time.time() - 1.0, lambda: None)
    assert list(ran) == []


def test_a_program_read_from_standard_input_searches_in_this_process(monkeypatch, tmp_path, caplog):
    """Worker processes start by running the main program's file again, which a program piped into
    ``python -`` does not have (its file is ``<stdin>``): the search then runs in this process, with a
    warning that says why, instead of every worker failing. A script's file, a ``python -m`` module
    and an interpreter without a file keep the worker processes."""
    import types

    from mirage.generator import executors

    def main(**attrs):
        module = types.ModuleType("__main__")
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, "__main__", module)

    main(__file__="<stdin>", __spec__=None)
    assert not executors.main_importable()
    monkeypatch.setattr(executors, "_SERIAL_FALLBACK_SAID", [])
    with caplog.at_level("WARNING", logger="mirage.generator.executors"):
        executors.make_executor(None, "processes", 4)
        executor = executors.make_executor(None, "processes", 4)
    assert isinstance(executor, executors.SerialExecutor)
    assert caplog.text.count("read from standard input") == 1  # said once, not once a search

    script = tmp_path / "script.py"
    script.write_text("")
    main(__file__=str(script), __spec__=None)
    assert executors.main_importable()
    main(__file__=str(tmp_path / "gone.py"), __spec__=types.SimpleNamespace(name="package.tool"))
    assert executors.main_importable()
    main(__spec__=None)
    assert executors.main_importable()


def test_search_workers_limit_their_blas_threads():
    """Each worker process holds the BLAS pool that the verifier's products use to its share of the
    cores (16 workers each at 16 threads starved the searches on a 16-core host)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from threadpoolctl import threadpool_info

    from mirage.generator import executors

    assert executors.threads_per_worker(os.cpu_count() or 1) == 1
    assert executors.threads_per_worker(1) == (os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context, initializer=executors._init_worker,
                             initargs=(None, None, None, 1)) as pool:
        pools = pool.submit(threadpool_info).result()
    blas = [p["num_threads"] for p in pools if p["user_api"] == "blas"]
    assert blas and set(blas) == {1}, pools


def test_a_listing_past_its_share_of_the_budget_searches_what_it_listed(isolated_cache, monkeypatch, caplog):
    """The root's listing of units stops at its share of the time budget (none here): the search
    runs the units listed so far and, though they all finish, does not claim the space exhausted."""
    whole = search(reference(), workers=1, progress=False, cache=False, budget=Budget(time_s=60), **SPACE)
    assert whole.stop_reason is StopReason.COMPLETE and not whole.stats.units_listing_truncated
    monkeypatch.setattr(driver, "LISTING_SHARE", 0.0)
    with caplog.at_level(logging.INFO, logger="mirage.generator"):
        cut = search(reference(), workers=1, progress=False, cache=False, budget=Budget(time_s=60), **SPACE)
    assert cut.stats.units_listing_truncated and cut.stop_reason is StopReason.TIME
    assert cut.stats.units_total < whole.stats.units_total
    assert any("not the rest" in r.getMessage() for r in caplog.records)
    unlimited = search(reference(), workers=1, progress=False, cache=False, **SPACE)  # no deadline: no cut
    assert unlimited.stop_reason is StopReason.COMPLETE
    assert unlimited.stats.units_total == whole.stats.units_total


def test_one_rule_name_as_a_string_switches_that_rule_off():
    """`disabled_rules="abstract_expression"` was read letter by letter ("unknown rules ['_', 'a', ...]")."""
    whole = search(reference(), workers=1, progress=False, cache=False, checkpoint=False, **SPACE)
    off = search(reference(), workers=1, progress=False, cache=False, checkpoint=False,
                 disabled_rules="abstract_expression", **SPACE)
    assert off.hashes == whole.hashes and off.stats.states > whole.stats.states
