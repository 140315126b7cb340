"""The options of ``superoptimize`` and of the ``torch.compile`` backend, checked in one place.

>>> Options.parse(max_subprogram_ops=8).max_subprogram_ops
8
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirage import config
from mirage.frontend.errors import OptionError
from mirage.frontend.optimize import SearchSettings
from mirage.frontend.partition import UPCAST_MODES, Budget


@dataclass(frozen=True)
class Options:
    search: bool = True  # False: run the reference graphs, no search
    config: str | None = None  # named search space ("mlp", "attention", "lora"); None: chosen per subprogram
    time_limit_s: float = 30.0  # search budget per subprogram
    max_results: int | None = None  # stop a search after this many verified µGraphs
    search_overrides: tuple[tuple[str, str], ...] = ()  # passed to mirage.generator.search
    max_subprogram_ops: int = 16  # kernel-graph ops per subprogram
    # rounds of splitting subprograms that no µGraph beat, each searching the new parts (frontend.runtime):
    # a second splits a fruitless part again (a projection from its residual and norm), at its search cost
    split_rounds: int = 1
    executor: str = "auto"  # "auto", "interpret" or "cuda"
    use_cache: bool = True  # read and write the on-disk search cache
    cache_dir: Path | None = None  # default: $MIRAGE_CACHE_DIR/search
    progress: bool = True
    sass_tune: bool = False  # on CUDA: tune each generated kernel's SASS schedule (minutes per kernel)
    candidates: tuple = ()  # µGraphs to consider besides the search's (verified per subprogram first)
    upcasts: str = "exact"  # float16 → float32 casts: "exact" or "input_precision" (frontend.partition)
    whole_program_check: bool = True  # on CUDA: run the program as given where it is faster (frontend.guard)
    # a CUDA graph captured around the module reads the copies of transposed parameters that calls made,
    # instead of copying in every replay; a parameter updated in place is seen after the next call
    reuse_copies_in_graphs: bool = False
    # on CUDA: repeated calls of positional tensors replay a CUDA graph of their own, their inputs copied
    # into its buffers and its outputs copied out (frontend.graphs.GraphedCall): less host time a call
    cuda_graphs: bool = False
    # sibling products only reshaped (q, k, v) run as one product of their stacked weights, whose rows
    # the parameters become (one storage: frontend.products); False keeps them apart
    merge_products: bool = True

    @classmethod
    def parse(cls, **options: Any) -> Options:
        """Options from keyword arguments; defaults for executor, cache and progress from the
        environment (mirage.config)."""
        settings = config.settings()
        names = [f.name for f in dataclasses.fields(cls)]
        values: dict[str, Any] = {"executor": settings.executor, "use_cache": settings.use_cache,
                                  "progress": settings.progress}
        for name, value in options.items():
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise OptionError(f"unknown option {name!r}{hint} Known options: {', '.join(names)}")
            values[name] = value
        values["search_overrides"] = _search_overrides(values.pop("search_overrides", ()))
        values["candidates"] = _candidate_graphs(values.get("candidates", ()))
        if values.get("cache_dir") is not None:
            if not isinstance(values["cache_dir"], (str, os.PathLike)):
                raise OptionError(f"cache_dir must be a folder's path (a str or Path), got "
                                  f"{values['cache_dir']!r}")
            values["cache_dir"] = Path(values["cache_dir"]).expanduser()
        options_ = cls(**values)
        options_.validate()
        return options_

    def validate(self) -> None:
        for name, least in (("max_subprogram_ops", 1), ("split_rounds", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OptionError(f"{name} must be an integer of at least {least}, got {value!r}")
        if (isinstance(self.time_limit_s, bool) or not isinstance(self.time_limit_s, (int, float))
                or not math.isfinite(self.time_limit_s) or self.time_limit_s <= 0):
            raise OptionError(f"time_limit_s must be a finite positive number of seconds (such as 30), got "
                              f"{self.time_limit_s!r}")
        results = self.max_results
        if results is not None and (isinstance(results, bool) or not isinstance(results, int) or results < 1):
            raise OptionError(f"max_results must be None or a positive integer, got {self.max_results!r}")
        if self.executor not in config.EXECUTORS:
            raise OptionError(f"executor must be one of {', '.join(config.EXECUTORS)}, got {self.executor!r}")
        if self.config is not None and not isinstance(self.config, str):
            raise OptionError(f"config must be a search-space name such as 'mlp', got {self.config!r}")
        if self.upcasts not in UPCAST_MODES:
            raise OptionError(
                f"upcasts must be one of {', '.join(map(repr, UPCAST_MODES))}, got {self.upcasts!r}: 'exact' "
                "keeps values the program widens to float32 in float32 (cutting subprograms where they "
                "would be stored narrower), 'input_precision' holds them at the inputs' precision")
        for name in ("search", "use_cache", "progress", "sass_tune", "whole_program_check",
                     "reuse_copies_in_graphs", "cuda_graphs", "merge_products"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.cache_dir is not None and self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise OptionError(f"cache_dir {str(self.cache_dir)!r} is a file, not a folder: pass a folder (it "
                              "is made where missing) or use_cache=False")
        self._check_search_settings()

    def _check_search_settings(self) -> None:
        """The search's config and overrides, checked now rather than when a search starts."""
        try:
            from mirage.generator import SearchSpaceError, check_settings
        except ImportError:  # an installation without the generator searches nothing
            return
        try:
            check_settings(self.config, {name: json.loads(value) for name, value in self.search_overrides})
        except SearchSpaceError as error:
            raise OptionError(f"config / search_overrides: {error}") from None

    @property
    def budget(self) -> Budget:
        return Budget(max_ops=self.max_subprogram_ops, upcasts=self.upcasts)

    @property
    def search_settings(self) -> SearchSettings:
        return SearchSettings(self.config, float(self.time_limit_s), self.search_overrides, self.max_results,
                              tuple(sorted(g.content_hash() for g in self.candidates)))

    @property
    def search_cache_dir(self) -> Path | None:
        if not self.use_cache:
            return None
        return self.cache_dir if self.cache_dir is not None else config.settings().search_cache_dir


def _search_overrides(overrides: Any) -> tuple[tuple[str, str], ...]:
    """``search_overrides`` (a dict of generator settings) as sorted (name, JSON text) pairs."""
    if overrides is None or (isinstance(overrides, tuple) and not overrides):
        return ()
    if not isinstance(overrides, Mapping):
        raise OptionError(f"search_overrides must be a dict of generator settings, such as search_overrides="
                          f"{{'workers': 1}}; got a {type(overrides).__name__}: {overrides!r}")
    try:
        return tuple(sorted((str(k), json.dumps(v)) for k, v in overrides.items()))
    except TypeError as error:
        raise OptionError(f"search_overrides values must be JSON data (numbers, strings, lists): "
                          f"{error}") from None


def _candidate_graphs(candidates: Any) -> tuple:
    """``candidates`` as frozen kernel graphs (builders are frozen); anything else is an error."""
    from mirage.mugraph.builder import KNGraph
    from mirage.mugraph.graph import KernelGraph

    if isinstance(candidates, (KernelGraph, KNGraph)):
        candidates = (candidates,)
    if not isinstance(candidates, (list, tuple)) and candidates is not None:
        raise OptionError(f"candidates must be a list of kernel graphs, got {candidates!r} "
                          f"({type(candidates).__name__})")
    graphs = []
    for k, candidate in enumerate(candidates or ()):
        if isinstance(candidate, KNGraph):
            candidate = candidate.freeze()
        if not isinstance(candidate, KernelGraph):
            raise OptionError(f"candidates[{k}] is a {type(candidate).__name__}, not a kernel graph: pass "
                              "µGraphs built with mirage.new_kernel_graph() (or frozen KernelGraphs)")
        graphs.append(candidate)
    return tuple(graphs)
