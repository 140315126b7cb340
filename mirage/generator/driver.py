"""The search driver: setup, work units, budgets, checkpoints, the result cache and statistics.

``run_search`` is what ``mirage.generator.search`` calls.  Phases (timed in the statistics):

1. *setup*: resolve the search space against the reference, saturate the target's abstract
   expression, fingerprint the reference, answer from the result cache if it holds this search;
2. *search*: visit the root, split its subtrees into work units, run them (serially, on worker
   processes or on Ray), commit their results in unit order (so budgets on states and results cut
   the same place for any number of workers), and write a checkpoint every few seconds; when the
   time budget runs out, start no unit and keep what the units in flight report;
3. *rank*: order the verified µGraphs by the cost model, save the result and statistics.
"""

from __future__ import annotations

import logging
import numbers
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirage.config import warn_corrupt, warn_unwritable
from mirage.generator.budget import Budget, StopReason
from mirage.generator.checkpoint import (
    Checkpoint,
    ResultCache,
    checkpoint_path,
    search_key,
)
from mirage.generator.checks import make_rules, registered_rules
from mirage.generator.executors import make_executor
from mirage.generator.explore import Explorer, SearchContext, StopSearch, root_state
from mirage.generator.expressions import output_terms
from mirage.generator.progress import Progress
from mirage.generator.result import FoundGraph, SearchResult
from mirage.generator.space import SearchSpace, SearchSpaceError
from mirage.generator.stats import SearchStatistics
from mirage.generator.units import split
from mirage.generator.verification import make_checker
from mirage.mugraph.algebra import NotInterpretable
from mirage.mugraph.graph import KernelGraph

logger = logging.getLogger(__name__)

DRAIN_S = 5.0  # seconds past the time budget to wait for the records of the units in flight
# of the time left, what listing the root's work units may take: a subprogram of many inputs has
# millions of block headers, and a listing that took the whole budget would search nothing
LISTING_SHARE = 0.25


BACKENDS = ("auto", "serial", "processes", "ray")
CHECKERS = ("auto", "verifier", "float")


@dataclass(frozen=True)
class SearchOptions:
    budget: Budget = Budget()
    workers: int | None = None  # None: every core
    backend: str = "auto"  # auto (processes when workers > 1), serial, processes, ray
    ray_address: str | None = None
    seed: int = 0
    checker: str = "auto"  # auto (the verifier, or float64 where it cannot), verifier, float
    verify_delta: float = 1e-9  # the verifier's error target per candidate
    disabled_rules: tuple[str, ...] = ()
    oracle_config: Any = None  # a pruning.SubexpressionConfig (e-graph back end and limits)
    checkpoint: str | Path | bool | None = None  # None: under the cache dir (none without cache); False: none
    checkpoint_every_s: float = 30.0
    resume: bool = True
    cache: bool = True
    # the folder of finished searches (checkpoints in its "checkpoints" folder); None: the configured
    # cache's (<cache>/search, <cache>/checkpoints), the folder of superoptimize's entries too
    cache_dir: str | Path | None = None
    progress: bool = True
    machine: dict[str, Any] = field(default_factory=dict)
    # stop once a found µGraph satisfies it (a picklable callable when workers are processes)
    stop_when: Callable[[KernelGraph], bool] | None = None
    # verify only the complete candidates it accepts (picklable likewise): what a caller would
    # discard after the search costs no verification and takes no place among the results
    keep_when: Callable[[KernelGraph], bool] | None = None

    def __post_init__(self) -> None:
        workers = self.workers
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise SearchSpaceError(f"workers must be None (every core) or a positive integer, "
                                   f"got {workers!r}")
        for name, allowed in (("backend", BACKENDS), ("checker", CHECKERS)):
            if getattr(self, name) not in allowed:
                raise SearchSpaceError(f"{name} must be one of {', '.join(allowed)}, "
                                       f"got {getattr(self, name)!r}")
        if not isinstance(self.budget, Budget):
            raise SearchSpaceError(f"budget must be a mirage.generator.Budget, such as Budget(time_s=30), "
                                   f"got {self.budget!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise SearchSpaceError(f"seed must be an integer ≥ 0, got {self.seed!r}")
        delta = self.verify_delta
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise SearchSpaceError(f"verify_delta must be a probability strictly between 0 and 1, such as "
                                   f"1e-9, got {delta!r}")
        every = self.checkpoint_every_s
        if isinstance(every, bool) or not isinstance(every, numbers.Real) or not every >= 0:
            raise SearchSpaceError(f"checkpoint_every_s must be a number of seconds ≥ 0 (0: after every "
                                   f"unit), got {every!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise SearchSpaceError(f"cache_dir must be a folder's path or None (the configured cache), got "
                                   f"{self.cache_dir!r}")
        if self.checkpoint is not None and not isinstance(self.checkpoint, (bool, str, os.PathLike)):
            raise SearchSpaceError(f"checkpoint must be a file's path, True (under the cache folder), False "
                                   f"(none) or None (the default), got {self.checkpoint!r}")

    def key_options(self, checker_name: str) -> dict[str, Any]:
        options = {"seed": self.seed, "checker": checker_name, "disabled_rules": sorted(self.disabled_rules)}
        extra = registered_rules(self.disabled_rules)
        if extra:  # rules registered with pruning_rule: keys of searches without them stay as they were
            options["rules"] = extra
        return options


def machine_description() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


class _Committer:
    """Commits unit records in index order and applies the state and result budgets there."""

    def __init__(self, budget: Budget, offset: int) -> None:
        self.budget = budget
        self.offset = offset  # logical states of everything committed
        self.next = 0
        self.found: list[dict[str, Any]] = []
        self.stop: StopReason | None = None
        self.records: dict[int, dict[str, Any]] = {}

    def add(self, record: dict[str, Any]) -> None:
        self.records[record["index"]] = record
        while self.stop is None and self.next in self.records:
            self._commit(self.records[self.next])

    def _commit(self, record: dict[str, Any]) -> None:
        budget = self.budget
        for found in record["found"]:
            if budget.states is not None and self.offset + found["position"] > budget.states:
                self.stop = StopReason.STATES
                return
            self.found.append(found)
            if budget.results is not None and len(self.found) >= budget.results:
                self.stop = StopReason.RESULTS
                return
        if record["stop"] is not None:
            self.stop = StopReason(record["stop"])
            return
        self.offset += record["states"]
        self.next += 1
        if budget.states is not None and self.offset >= budget.states:
            self.stop = StopReason.STATES

    def remaining_states(self) -> int | None:
        return None if self.budget.states is None else max(0, self.budget.states - self.offset)


def run_search(reference: KernelGraph, space: SearchSpace, options: SearchOptions) -> SearchResult:
    wall = time.perf_counter()
    started_at = time.time()
    stats = SearchStatistics(machine=options.machine or machine_description())
    space = space.resolve(reference)
    checker = make_checker(reference, options.seed, options.checker, options.verify_delta)
    key = search_key(reference.content_hash(), space.content_hash(), options.key_options(checker.name))
    stats.space_hash, stats.graph_hash, stats.checker = (
        space.content_hash(),
        reference.content_hash(),
        checker.name,
    )
    cache = ResultCache(directory=options.cache_dir) if options.cache else None
    cached = cache.load(key) if cache is not None else None
    if cached is not None and _covers(cached, options.budget):
        try:
            answer = SearchResult.from_document(reference, space, cached, key)
        except Exception as error:  # noqa: BLE001 - a malformed file is searched again, never an error
            warn_corrupt(cache.directory(key) / "result.json", f"{type(error).__name__}: {error}")
        else:
            logger.info("search %s answered from the result cache", key)
            return answer

    try:
        targets = output_terms(reference)
    except NotInterpretable as error:  # a max: no abstract expression, so no target to prune against
        logger.warning("the reference has no abstract expression (%s): the search runs without the "
                       "abstract-expression rule", error)
        targets = None
    disabled = options.disabled_rules
    if targets is None and "abstract_expression" not in disabled:
        disabled = (*disabled, "abstract_expression")
    rules = make_rules(targets or (), space, disabled, options.oracle_config)
    stats.oracle = rules.oracle_report
    context = SearchContext(reference, space, rules, checker, started_at, options.stop_when,
                            options.keep_when, max_results=options.budget.results)
    stats.phase_seconds["setup"] = time.perf_counter() - wall
    logger.info("search space: %s", space.describe())

    search_start = time.perf_counter()
    deadline = None if options.budget.time_s is None else started_at + options.budget.time_s
    explorer = Explorer(context, deadline)
    root = root_state(reference, space.order == "complete")
    explorer.visit("kernel", 0)
    explorer.stats.kernel_states += 1
    root_found = explorer.verify(root)
    listed = True
    if deadline is not None:
        explorer.listing_deadline = time.time() + LISTING_SHARE * max(deadline - time.time(), 0.0)
    try:
        units = [] if root_found else split(explorer, root)
    except StopSearch:  # the budget ran out while the root's children were listed: no unit runs
        logger.warning("the search's time budget ran out while its work units were listed (%d inputs); "
                       "nothing was searched", len(reference.input_types))
        units, listed = [], False
    explorer.listing_deadline = None
    stats.units_listing_truncated = explorer.listing_truncated
    if explorer.listing_truncated:  # routine for subprograms of many inputs: the result's stop reason says it
        logger.info("listing the search's work units took %.0f %% of its time budget (%d inputs): the "
                    "search runs the %d listed (block headers that tile the reference first), not the "
                    "rest", 100 * LISTING_SHARE, len(reference.input_types), len(units))
    stats.add_unit(_unit_stats(explorer))
    stats.units_total = len(units)
    committer = _Committer(options.budget, explorer.position)
    committer.found = [
        {"graph": f.graph, "position": f.position, "elapsed_s": f.elapsed_s} for f in explorer.found
    ]

    path = _checkpoint_file(options, key)
    checkpoint = Checkpoint(key, len(units))
    if path is not None and options.resume:
        loaded = Checkpoint.load(path, key, len(units))
        if loaded is not None:
            checkpoint = loaded
            stats.units_resumed = len(loaded.done)
            logger.info(
                "resuming search from checkpoint %s (%d of %d units done)", path, len(loaded.done), len(units)
            )
    for index in sorted(checkpoint.done):
        committer.add(checkpoint.done[index])
    pending = [u for u in units if u.index not in checkpoint.done]

    progress = Progress(len(units), len(checkpoint.done), enabled=options.progress)
    workers = options.workers or os.cpu_count() or 1
    started = time.time()
    executor = make_executor(
        context, _backend(options, workers), workers, progress.refresh_soon, options.ray_address
    )
    stop: StopReason | None = committer.stop if listed else StopReason.TIME
    # starting workers (a fork server's imports, a Ray connection) is not search time
    try:
        startup_s = time.time() - started + (executor.start() if stop is None and pending else 0.0)
    except BaseException:  # workers that cannot search (rules they lack): stop them, then say why
        executor.close()
        progress.close()
        raise
    stats.phase_seconds["workers"] = startup_s
    if deadline is not None:
        deadline += startup_s
    stats.workers, stats.backend = workers, executor.name
    progress.bind(executor, committer, stats)
    last_checkpoint = time.time()
    try:
        if stop is None:
            for record in executor.results(pending, deadline, committer.remaining_states):
                if record is not None:
                    if record["stop"] is None:
                        checkpoint.done[record["index"]] = record
                    committer.add(record)
                    progress.unit_done(record)
                    if record["stop"] == StopReason.TARGET.value:
                        stop = StopReason.TARGET
                        break
                progress.refresh()
                if path is not None and time.time() - last_checkpoint > options.checkpoint_every_s:
                    path = _save_checkpoint(checkpoint, path)
                    last_checkpoint = time.time()
                stop = committer.stop
                if stop is None and deadline is not None and time.time() > deadline:
                    stop = StopReason.TIME
                # past the deadline no unit starts: the units in flight stop at their next clock
                # check and their records (with what they found) still arrive; wait a little for them
                if stop is StopReason.TIME and time.time() < (deadline or 0.0) + DRAIN_S:
                    continue
                if stop is not None:
                    break
    except KeyboardInterrupt:
        stop = StopReason.INTERRUPTED
        logger.warning("search interrupted; the checkpoint keeps the finished units")
    finally:
        executor.close()
        progress.close()
    if path is not None:
        path = _save_checkpoint(checkpoint, path)
    if stop is StopReason.TIME and committer.stop is None and committer.next == len(units) and listed:
        stop = None  # every unit finished while the last ones drained
    stop = stop or committer.stop or StopReason.COMPLETE
    if stop is StopReason.COMPLETE and explorer.listing_truncated:
        stop = StopReason.TIME  # the listed units are done, but not the space: units were left unlisted
    stats.phase_seconds["search"] = time.perf_counter() - search_start

    found = committer.found
    if stop in (StopReason.TIME, StopReason.INTERRUPTED, StopReason.TARGET):  # uncommitted units' finds too
        extra = [f for i, r in sorted(committer.records.items()) if i >= committer.next for f in r["found"]]
        found = found + extra
    for record in committer.records.values():
        stats.add_unit(record["stats"])
    stats.units_done = sum(1 for r in committer.records.values() if r["stop"] is None)
    stats.stop_reason = stop.value
    rank_start = time.perf_counter()
    result = SearchResult.build(
        reference, space, [FoundGraph.from_record(f) for f in found], stats, stop, key
    )
    stats.phase_seconds["rank"] = time.perf_counter() - rank_start
    stats.wall_seconds = time.perf_counter() - wall
    stats.verified = len(result.found)
    stats.first_found_s = min((f.elapsed_s for f in result.found), default=None)
    logger.info("search finished: %s", stats.summary())
    if cache is not None and stop not in (StopReason.INTERRUPTED, StopReason.TARGET):
        cache.store(key, result.to_document(options.budget), stats.to_dict())
    if path is not None and stop is StopReason.COMPLETE:
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            logger.warning("could not remove the finished search's checkpoint %s: %s", path, error)
    return result


def _save_checkpoint(checkpoint: Checkpoint, path: Path) -> Path | None:
    """Write the checkpoint; when that fails (a read-only cache folder) warn once and write no more
    checkpoints in this search (``None``): the search goes on and its result is still returned."""
    try:
        checkpoint.save(path)
    except OSError as error:
        warn_unwritable(path, error)
        return None
    return path


def _unit_stats(explorer: Explorer) -> dict[str, Any]:
    from mirage.generator.units import _stats_dict

    return _stats_dict(explorer)


def _backend(options: SearchOptions, workers: int) -> str:
    if options.backend == "auto":
        return "processes" if workers > 1 else "serial"
    return options.backend


def _checkpoint_file(options: SearchOptions, key: str) -> Path | None:
    if options.checkpoint is False:
        return None
    if options.checkpoint is None and not options.cache:
        return None  # no on-disk cache (use_cache=False, MIRAGE_NO_CACHE=1): no checkpoints under it either
    if options.checkpoint is None or options.checkpoint is True:
        return checkpoint_path(key, options.cache_dir)
    return Path(options.checkpoint)


def _covers(document: dict[str, Any], budget: Budget) -> bool:
    """A finished search answers any budget; one stopped by its budget answers the same budget, and
    one stopped by its time answers a shorter time under the same other limits (it searched at least
    as far: `mirage search --time-limit 120` answers a later call's default 30 s)."""
    if document.get("stop_reason") == StopReason.COMPLETE.value:
        return True
    cached = Budget.from_dict(document.get("budget", {}))
    if cached == budget:
        return True
    return (document.get("stop_reason") == StopReason.TIME.value
            and (cached.states, cached.results) == (budget.states, budget.results)
            and cached.time_s is not None and budget.time_s is not None and budget.time_s <= cached.time_s)


__all__ = ["SearchOptions", "StopSearch", "run_search"]
