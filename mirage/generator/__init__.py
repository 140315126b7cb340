"""The µGraph generator: expression-guided search for fused µGraphs equivalent to a reference.

>>> import mirage as mi
>>> from mirage.generator import search, Budget
>>> g = mi.new_kernel_graph()
>>> x = g.new_input(dims=(8, 256), dtype=mi.float16)
>>> w = g.new_input(dims=(256, 64), dtype=mi.float16)
>>> g.mark_output(g.exp(g.matmul(x, w)))
>>> result = search(g, griddims=[(8, 1, 1)], franges=[4], workers=1, progress=False, cache=False,
...                 checkpoint=False, budget=Budget(results=1))
>>> result.stop_reason.name, len(result)
('RESULTS', 1)

``search(reference, config=None, **overrides)``: ``config`` is ``"mlp"`` (the default),
``"attention"`` or ``"lora"``; overrides are search-space options (``griddims``, ``imaps``,
``omaps``, ``fmaps``, ``franges``, ``kernel_ops``, ``block_ops``, ``max_kernel_ops``,
``max_block_ops``, ``max_graph_defined``, ``max_block_outputs``, ... see ``SearchSpace``) or search
options (``budget``, ``time_limit_s``, ``workers``, ``backend``, ``seed``, ``disabled_rules``,
``checkpoint``, ``resume``, ``cache``, ``progress``).  See ``docs/search.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mirage.generator.budget import Budget, StopReason
from mirage.generator.checks import SEARCH_CHECKS
from mirage.generator.result import FoundGraph, SearchResult
from mirage.generator.space import CONFIGS, OpChoice, SearchSpace, SearchSpaceError
from mirage.generator.stats import SearchStatistics

_OPTION_NAMES = {f.name for f in dataclasses.fields(SearchSpace)}


def search(
    reference_graph,
    config: str | SearchSpace | None = None,
    *,
    budget: Budget | None = None,
    time_limit_s: float | None = None,
    **overrides: Any,
) -> SearchResult:
    """Search µGraphs equivalent to ``reference_graph``; verified ones are ranked by the cost model."""
    from mirage.generator.driver import SearchOptions, run_search
    from mirage.mugraph.builder import as_graph
    from mirage.mugraph.check import check

    reference = as_graph(reference_graph)
    check(reference)
    option_fields = {f.name for f in dataclasses.fields(SearchOptions)}
    search_options = {k: overrides.pop(k) for k in list(overrides) if k in option_fields}
    if "disabled_rules" in search_options:
        rules = search_options["disabled_rules"]
        search_options["disabled_rules"] = (rules,) if isinstance(rules, str) else tuple(rules)  # one name
    if budget is None:
        budget = Budget(time_s=time_limit_s)
    elif time_limit_s is not None:
        budget = dataclasses.replace(budget, time_s=time_limit_s)
    if isinstance(config, SearchSpace):
        space = config.with_overrides(**overrides) if overrides else config
    else:
        space = SearchSpace.named(config, **overrides)
    return run_search(reference, space, SearchOptions(budget=budget, **search_options))


def check_settings(config: str | SearchSpace | None, overrides: dict[str, Any]) -> None:
    """Raise :class:`SearchSpaceError` for what :func:`search` would reject once it runs: an unknown
    config or option, or an option value of the wrong kind (so that callers can check up front)."""
    from mirage.generator.driver import SearchOptions

    option_fields = {f.name for f in dataclasses.fields(SearchOptions)}
    space = {k: v for k, v in overrides.items() if k not in option_fields}
    if isinstance(config, SearchSpace):
        config.with_overrides(**space)
    else:
        SearchSpace.named(config, **space)
    try:
        SearchOptions(**{k: v for k, v in overrides.items() if k in option_fields})
    except TypeError as error:
        raise SearchSpaceError(f"a search option has a value of the wrong kind: {error}") from None


__all__ = [
    "Budget",
    "CONFIGS",
    "FoundGraph",
    "OpChoice",
    "SEARCH_CHECKS",
    "SearchResult",
    "SearchSpace",
    "SearchSpaceError",
    "SearchStatistics",
    "StopReason",
    "check_settings",
    "search",
]
